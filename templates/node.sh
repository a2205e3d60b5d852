##@ The node script (node.sh), as a template: what the node runs, top to bottom, in one file.
##@
##@ Filled by launcher/plan/node_script.py (`render_node_script`), which supplies every value and
##@ decides which optional block is used; nothing else writes node.sh's skeleton. The format:
##@   - `##@` lines are notes on the template and never reach node.sh;
##@   - `##@ block NAME` starts a named block, which runs to the next one; `node.sh` is the script,
##@     the blocks after it are the optional parts it takes in where the filler says so;
##@   - a line that is only `@@NAME` is a slot: it becomes zero or more lines (another module's
##@     text, or an optional block below);
##@   - `@@{NAME}` inside a line is a value, already shell-quoted by the filler where it reaches
##@     the shell (values are never scanned again, so a recipe's text cannot fill a slot).
##@ A snippet added later goes where it runs: as text in its block, or as a slot named after what
##@ it does, filled by the module that owns it. tests/golden/ holds what this renders for the seed.
##@
##@ block node.sh
#!/usr/bin/env bash
# reproduce node script for @@{slug}
#   recipe file sha256 @@{recipe_sha256}
#   run @@{run_id_comment} on cluster profile @@{profile_name} (kind @@{kind}), @@{nodes} x @@{gpus_per_node} @@{gpu_type}
# Plain bash, runnable by hand on the node: bash node.sh
@@marker_help
# bash reads the whole { ... } group before running any of it: text added to this file later never runs.
{
set -euo pipefail
@@nonce_line

RUN_ID=@@{run_id}
@@run_dir_line
CACHE_DIR=@@{cache_dir}
IMAGE=@@{image}
IMAGE_DIGEST=@@{image_digest}
@@container_line
HF_CKPT=@@{hf_ckpt}
TORCH_DIST=@@{torch_dist}
SFT_DATA=@@{sft_data}
REPRODUCE_OUT_DIR="$NODE_RUN_DIR/@@{out_dir}"  # the only one a container may write
export RUN_ID NODE_RUN_DIR REPRODUCE_OUT_DIR HF_CKPT TORCH_DIST SFT_DATA

# Secrets (HF_TOKEN) arrive in a 0600 file that is read first and deleted; never echoed, never exported:
# only the host's asset commands (resolve, fetch) get HF_TOKEN, no container does.
HF_TOKEN="${HF_TOKEN:-}"
export -n HF_TOKEN
if [ -f "$NODE_RUN_DIR/@@{secrets_file}" ]; then . "$NODE_RUN_DIR/@@{secrets_file}"; rm -f "$NODE_RUN_DIR/@@{secrets_file}"; fi
@@multinode_header

# The directories the run writes to and trusts must be ours and writable by no one else (shared hosts);
# a missing one is made 0700 (on a disk only root can write to, such as the DLAMI's /opt/dlami/nvme, by sudo -n).
@@trusted_dir_fn
for dir in "$NODE_RUN_DIR" "$CACHE_DIR" "$CACHE_DIR/.incoming" "$(dirname "$HF_CKPT")" "$(dirname "$TORCH_DIST")" "$(dirname "$SFT_DATA")"; do
  _trusted_dir "$dir" || exit 1
done
@@cache_entries_check
# what a container makes for the cache (rows, a conversion) lands in a fresh directory of this run's,
# which the host checks before it moves anything into the cache (read-only in every container)
ASSET_NEW="$CACHE_DIR/.incoming/$RUN_ID-${NODE_RANK:-0}"
REPRODUCE_HOST_IDS="$(id -u):$(id -g)"
export REPRODUCE_HOST_IDS
[ ! -L "$CACHE_DIR/.incoming" ] && mkdir -m 700 "$ASSET_NEW" || { echo "reproduce: cannot make a fresh $ASSET_NEW" >&2; exit 1; }
mkdir -p -m 700 "$REPRODUCE_OUT_DIR" "$NODE_RUN_DIR/@@{state_dir}"
cd "$NODE_RUN_DIR"
##@ the finished runs' out/ beside this one emptied, or the run refused (plan/leftovers.py)
@@leftovers_between
@@asset_header

@@stage_functions
@@background_functions
##@ the EXIT trap's _cleanup and the docker flags: block docker_setup, or block host_setup
@@setup
##@ a Ray job also collects its result files itself (block ray_job)
@@ray_job
##@ the node's stages: those of stage_graph.PARALLEL at once (or one by one), then convert
@@node_stages

# ---- stages ray + train, inside the training container (this text runs verbatim there)
##@ heredoc_tag: a word that no line of the filled container script is (node_script._heredoc_tag)
IFS= read -r -d '' CONTAINER_SCRIPT <<'@@{heredoc_tag}' || true
@@container_script
@@{heredoc_tag}
##@ the container's run: under docker (plan/host_clock.py), else `bash -c` on this host
@@training_run
##@ once the container ended (the asset uploads finish: plan/asset_stages.py)
@@after_training

@@done_line
exit
}

##@ block container_script: what runs inside the training container (the heredoc above)
set -euo pipefail
##@ docker keeps no order between a container's stdout and stderr (two streams, copied apart):
##@ the stage markers (stdout) and miles' log (stderr) must be one stream
exec 2>&1  # one stream: the markers stay where they were printed among the log lines
@@stage_functions
_cleanup() { :; }
trap _on_exit EXIT
##@ what this container leaves in the host's IPC, /dev/shm and out/ (plan/leftovers.py)
@@leftovers_container
@@exports
@@patches

# ---- stage ray: @@{ray_title}
_stage_begin ray
@@ray_commands
_stage_end

@@train

##@ block docker_setup: the training container runs under docker
# on a cancel's TERM the container gets up to 5 s for its EXIT trap (its end marker)
_cleanup() { @@{bg_stop}timeout 5 docker wait "$CONTAINER" >/dev/null 2>&1 || true; docker rm -f "$CONTAINER" >/dev/null 2>&1 || true; }
trap _on_exit EXIT

# flags of every docker run below (miles' documented ones; mounts of the run's out and state dirs, the cache, scripts)
GPU_ARGS=(@@{gpu_args})
DOCKER_ARGS=(@@{docker_args})
NET_ARGS=(@@{net_args})
@@mount_words
# EFA devices go into the container when the node has them (p5en: 16)
EFA_ARGS=()
@@efa_devices
##@ block efa_devices: the profile's efa_devices is not `never`
for dev in /dev/infiniband/*; do
  [ -e "$dev" ] && EFA_ARGS+=(--device "$dev")
done
@@efa_required
##@ block efa_required: the profile's efa_devices is `always`
[ ${#EFA_ARGS[@]} -gt 0 ] || { echo 'profile says efa_devices: always, but the node has no /dev/infiniband devices' >&2; exit 1; }
##@ block host_setup: no container (runtime: host, or a Ray job)
_cleanup() { @@{cleanup_body}}
trap _on_exit EXIT
EFA_ARGS=()
##@ block ray_job: kind ray, where the launcher reads only the job's log: the result files end it
: "${REPRODUCE_SCRIPTS:?the directory of node.sh and the node programs (the job sets it)}"
# the node programs where the host's own commands look for them too
mkdir -p -m 700 "$NODE_RUN_DIR/scripts" && cp -R "$REPRODUCE_SCRIPTS/." "$NODE_RUN_DIR/scripts/"
@@results_block
_cleanup() { _results; }
