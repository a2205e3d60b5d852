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
##@ block pyxis_setup: kind slurm, container_runtime pyxis (launcher/plan/enroot_image.py)
# every in-image command is one more step of this node's job (srun --overlap), in a container pyxis makes from
# the image this run imported and checked ($IMAGE_SQSH, never a named container); a cancel's scancel ends every
# step of the job, so the EXIT trap has no container to remove
_cleanup() { @@{bg_stop}:; }
trap _on_exit EXIT
IMAGE_SQSH="$NODE_RUN_DIR/@@{sqsh}"
# the GPUs each step asks for: the job's own option (--gpus-per-node=N or --gres=gpu:N), set by its batch script
GPU_ARGS=("${REPRODUCE_GPU_OPTION:?set by the batch script of the job}")
# what a container gets of this script's environment (names only; HF_TOKEN to none), and its mounts: the run's
# out dir, read-only its state dir, the cache and scripts/
PYXIS_ENV=@@{env_names}
PYXIS_MOUNTS="$NODE_RUN_DIR/@@{out_dir}:$NODE_RUN_DIR/@@{out_dir},$NODE_RUN_DIR/@@{state_dir}:$NODE_RUN_DIR/@@{state_dir}:ro,"@@{cache_mount}",$NODE_RUN_DIR/scripts:@@{scripts_at}:ro"
# _in_image NAME [--gpus] [--new] [--host-user] -- COMMAND...: COMMAND in the image, as step NAME (sharing the
# node's network: enroot 4.1.2 has no network namespace of its own for pyxis's --container-unshare=net)
_in_image() {
  local name=$1 gpus=() mounts=$PYXIS_MOUNTS user=(--container-remap-root); shift
  while [ "$1" != -- ]; do
    case $1 in
      --gpus) gpus=("${GPU_ARGS[@]}") ;;
      --new) mounts+=",$REPRODUCE_NEW_DIR:$REPRODUCE_NEW_DIR" ;;
      --host-user) user=(--no-container-remap-root) ;;
    esac
    shift
  done
  shift
  srun --jobid="$SLURM_JOB_ID" --overlap --nodes=1 --ntasks=1 --nodelist="$SLURMD_NODENAME" --job-name="$name" \
    --kill-on-bad-exit=1 --quiet ${gpus[@]+"${gpus[@]}"} --export="$PYXIS_ENV" --container-image="$IMAGE_SQSH" \
    --container-mounts="$mounts" --no-container-mount-home "${user[@]}" "$@"
}
EFA_ARGS=()
##@ block pyxis_image: the image stage on pyxis: the pinned image into a fresh .sqsh, its content checked
command -v enroot >/dev/null || { echo 'enroot is not installed on this node (profile container_runtime: pyxis)' >&2; exit 1; }
for tool in curl jq sha256sum; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed on this node (the image check needs it)" >&2; exit 1; }
done
# 1. the manifest by digest, hashed here: enroot checks each blob against the manifest, never the manifest
_IMG_DIR="$NODE_RUN_DIR/image.check"
rm -rf "$_IMG_DIR" && mkdir -m 700 "$_IMG_DIR" "$_IMG_DIR/cache"
_IMG_REGISTRY=@@{registry}
_IMG_NAME=@@{name}
_IMG_ACCEPT=@@{accept}
_proto=https; [ "${ENROOT_ALLOW_HTTP:-}" = yes ] && _proto=http
_manifest() {  # DIGEST -> $_IMG_DIR/manifest.json, which must hash to DIGEST
  local url="$_proto://$_IMG_REGISTRY/v2/$_IMG_NAME/manifests/$1" code auth=() realm service token
  code=$(curl -sS -o "$_IMG_DIR/manifest.json" -D "$_IMG_DIR/headers" -w '%{http_code}' -H "$_IMG_ACCEPT" "$url") || return 1
  if [ "$code" = 401 ]; then  # an anonymous token, as docker and enroot get one
    realm=$(tr -d '\r' < "$_IMG_DIR/headers" | sed -n 's/^[Ww][Ww][Ww]-[Aa]uthenticate: *Bearer .*realm="\([^"]*\)".*/\1/p')
    service=$(tr -d '\r' < "$_IMG_DIR/headers" | sed -n 's/^[Ww][Ww][Ww]-[Aa]uthenticate: .*service="\([^"]*\)".*/\1/p')
    [ -n "$realm" ] || { echo "image: $url wants credentials this check does not have" >&2; return 1; }
    token=$(curl -sS -G "$realm" --data-urlencode "service=$service" --data-urlencode "scope=repository:$_IMG_NAME:pull" \
      | jq -r '.token // .access_token // empty') || return 1
    auth=(-H "Authorization: Bearer $token")
    code=$(curl -sS -o "$_IMG_DIR/manifest.json" -w '%{http_code}' "${auth[@]}" -H "$_IMG_ACCEPT" "$url") || return 1
  fi
  [ "$code" = 200 ] || { echo "image: $url answered HTTP $code" >&2; return 1; }
  [ "sha256:$(sha256sum < "$_IMG_DIR/manifest.json" | cut -d' ' -f1)" = "$1" ] \
    || { echo "image: the registry's manifest for $1 does not hash to $1: refused" >&2; return 1; }
}
_manifest "$IMAGE_DIGEST" || exit 1
_arch=$(uname -m); case "$_arch" in x86_64) _arch=amd64 ;; aarch64) _arch=arm64 ;; esac
_entry=$(jq -r --arg a "$_arch" '(.manifests // [])[] | select(.platform.architecture == $a) | .digest' "$_IMG_DIR/manifest.json" | head -n 1)
if [ -n "$_entry" ]; then _manifest "$_entry" || exit 1; fi
jq -r '.config.digest, .layers[].digest' "$_IMG_DIR/manifest.json" | sed 's/^sha256://' | sort -u > "$_IMG_DIR/expected"
# 2. imported with a cache of its own, made fresh: it ends holding exactly the blobs this import used,
# each named by the sha256 enroot checked it against (enroot before 4.0 cannot parse @sha256: the tag)
_uri=@@{by_digest}
if [ "$(printf '%s\n' 4.0 "$(enroot version)" | sort -V | head -n 1)" != 4.0 ]; then
  _uri=@@{by_tag}
  [ -n "$_uri" ] || { echo "enroot $(enroot version) cannot import by digest (4.0 or newer can), and the recipe names no tag" >&2; exit 1; }
fi
rm -f "$IMAGE_SQSH"
ENROOT_CACHE_PATH="$_IMG_DIR/cache" enroot import --output "$IMAGE_SQSH" "$_uri"
# 3. the blobs enroot used must be the pinned manifest's config and layers, no more and no fewer
ls "$_IMG_DIR/cache" | sort -u > "$_IMG_DIR/imported"
if ! cmp -s "$_IMG_DIR/expected" "$_IMG_DIR/imported"; then
  echo "image $IMAGE: enroot imported other blobs than the manifest of $IMAGE_DIGEST names (expected: $(tr '\n' ' ' < "$_IMG_DIR/expected"); imported: $(tr '\n' ' ' < "$_IMG_DIR/imported"))" >&2
  rm -f "$IMAGE_SQSH"; exit 1
fi
# image.json: what ran (the digest checked, the blobs, the file made from them); renamed into place whole
printf '{"image": "%s", "digest": "%s", "runtime": "pyxis", "enroot": "%s", "sqsh_sha256": "%s", "blobs": %s}\n' \
  "$IMAGE" "$IMAGE_DIGEST" "$(enroot version)" "$(sha256sum < "$IMAGE_SQSH" | cut -d' ' -f1)" \
  "$(jq -R . < "$_IMG_DIR/imported" | jq -s -c .)" > "$NODE_RUN_DIR/image.json.tmp"
rm -rf "$_IMG_DIR"
mv -f "$NODE_RUN_DIR/image.json.tmp" "$NODE_RUN_DIR/image.json"
