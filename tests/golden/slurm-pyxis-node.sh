# ---- node script (node.sh), run detached on the node ----
#!/usr/bin/env bash
# reproduce node script for qwen3-30b-a3b/h200/tp1-pp1-ep8-dp8-792ce676cc
#   recipe file sha256 2ebf9d797b88d718cfa5d4042d03dd1e9fda24084a0e86116ef67e1ac81ff011
#   run 20261201T120000Z-golden on cluster profile slurm-profile (kind slurm), 1 x 8 H200
# Plain bash, runnable by hand on the node: bash node.sh
# Stages print '##reproduce stage=NAME event=start|end' markers; the launcher builds the timeline from them.
# bash reads the whole { ... } group before running any of it: text added to this file later never runs.
{
set -euo pipefail
_REPRODUCE_NONCE="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"; printf '##reproduce nonce=%s\n' "$_REPRODUCE_NONCE"  # first: the launcher learns it here

RUN_ID=20261201T120000Z-golden
NODE_RUN_DIR=/shared/reproduce/runs/20261201T120000Z-golden
CACHE_DIR=/var/tmp/reproduce-cache
IMAGE=radixark/miles@sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca
IMAGE_DIGEST=sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca
CONTAINER=reproduce-20261201T120000Z-golden
HF_CKPT=/var/tmp/reproduce-cache/hf/Qwen--Qwen3-30B-A3B@ad44e777bcd1
TORCH_DIST=/var/tmp/reproduce-cache/torch_dist/Qwen--Qwen3-30B-A3B@ad44e777bcd1
SFT_DATA=/var/tmp/reproduce-cache/rows/qwen3-tulu3-fixed8192-v1-7ea7f5dca51f.parquet
REPRODUCE_OUT_DIR="$NODE_RUN_DIR/out"  # the only one a container may write
export RUN_ID NODE_RUN_DIR REPRODUCE_OUT_DIR HF_CKPT TORCH_DIST SFT_DATA

# Secrets (HF_TOKEN) arrive in a 0600 file that is read first and deleted; never echoed, never exported:
# only the host's asset commands (resolve, fetch) get HF_TOKEN, no container does.
HF_TOKEN="${HF_TOKEN:-}"
export -n HF_TOKEN
if [ -f "$NODE_RUN_DIR/.secrets.env" ]; then . "$NODE_RUN_DIR/.secrets.env"; rm -f "$NODE_RUN_DIR/.secrets.env"; fi

# The directories the run writes to and trusts must be ours and writable by no one else (shared hosts);
# a missing one is made 0700 (on a disk only root can write to, such as the DLAMI's /opt/dlami/nvme, by sudo -n).
_trusted_dir() {
  local me owner mode link_owner
  me="$(id -u)"
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then
    mkdir -p -m 700 "$1" 2>/dev/null \
      || sudo -n install -d -m 700 -o "$me" -g "$(id -g)" "$1" \
      || { echo "reproduce: cannot create $1" >&2; return 1; }
  fi
  owner="$(stat -L -c %u "$1" 2>/dev/null)" && mode="$(stat -L -c %a "$1" 2>/dev/null)" \
    && link_owner="$(stat -c %u "$1" 2>/dev/null)" \
    || { echo "reproduce: cannot inspect $1" >&2; return 1; }
  if [ ! -d "$1" ] || [ "$owner" != "$me" ] || [ "$link_owner" != "$me" ] \
    || (( 8#$mode & 8#022 )); then
    echo "reproduce: refusing $1: it must be a directory owned by uid $me and writable" \
      "by no one else, but its owner is uid $owner and its mode $mode;" \
      "remove it or fix its owner and mode" >&2
    return 1
  fi
}
for dir in "$NODE_RUN_DIR" "$CACHE_DIR" "$CACHE_DIR/.incoming" "$(dirname "$HF_CKPT")" "$(dirname "$TORCH_DIST")" "$(dirname "$SFT_DATA")"; do
  _trusted_dir "$dir" || exit 1
done
# the cache is mounted into every container: it may hold only what runs make there
_foreign="$(ls -Aq "$CACHE_DIR" | grep -vxE '\.incoming|hf|rows|tokenizers|torch_dist' | head -n 3 | tr '\n' ' ')" || true
if [ -n "$_foreign" ]; then echo "reproduce: refusing cache_dir $CACHE_DIR: it holds what no run put there (${_foreign}...) and every container would see it; give cache_dir a directory of its own" >&2; exit 1; fi
# what a container makes for the cache (rows, a conversion) lands in a fresh directory of this run's,
# which the host checks before it moves anything into the cache (read-only in every container)
ASSET_NEW="$CACHE_DIR/.incoming/$RUN_ID-${NODE_RANK:-0}"
REPRODUCE_HOST_IDS="$(id -u):$(id -g)"
export REPRODUCE_HOST_IDS
[ ! -L "$CACHE_DIR/.incoming" ] && mkdir -m 700 "$ASSET_NEW" || { echo "reproduce: cannot make a fresh $ASSET_NEW" >&2; exit 1; }
mkdir -p -m 700 "$REPRODUCE_OUT_DIR" "$NODE_RUN_DIR/state"
cd "$NODE_RUN_DIR"
# the finished runs beside this one leave their out/ to no one: emptied (or, root's, refused: exit 3)
python3 "$NODE_RUN_DIR/scripts/node_leftovers.py" between --runs "$(dirname "$NODE_RUN_DIR")" --self "$NODE_RUN_DIR" || exit 3
# the asset stages' programs, spec and plan (resolve writes them to state/, which
# containers read but cannot write; docs/assets.md)
ASSETS_PY="$NODE_RUN_DIR/scripts/node_assets.py"
ASSET_SPEC="$NODE_RUN_DIR/state/assets.json"
ASSET_PLAN="$NODE_RUN_DIR/state/assets-plan.json"

_stage_begin() { _STAGE=$1; export REPRODUCE_STAGE=$1; printf '##reproduce stage=%s event=start t=%s n=%s\n' "$1" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; }
_stage_end() { printf '##reproduce stage=%s event=end status=ok t=%s n=%s\n' "$_STAGE" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; _STAGE=''; REPRODUCE_STAGE=''; }
_on_exit() {
  local rc=$? status=failed
  if [ -n "${_STAGE:-}" ]; then
    [ -e "$NODE_RUN_DIR/state/cancelled" ] && status=cancelled  # `reproduce cancel` marks the run first
    printf '##reproduce stage=%s event=end status=%s rc=%s t=%s n=%s\n' "$_STAGE" "$status" "$rc" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"
  fi
  _cleanup; "${_AFTER_CLEANUP:-:}"  # the container's leftovers (plan/leftovers.py)
  exit "$rc"
}
STAGES_DIR="$NODE_RUN_DIR/stages"  # one log per background stage, added whole to node.log
mkdir -m 700 "$STAGES_DIR"
_BG_NAMES=() _BG_PIDS=() _BG_DONE=() _BG_SHOWN=()
_bg() {  # _bg NAME FUNCTION [AFTER...]: FUNCTION as stage NAME, once each AFTER ended ok
  local name=$1 fn=$2
  shift 2
  set -m  # a process group of its own
  (
    _BG_NAME=$name
    trap 'exit 143' TERM
    trap 'exit 130' INT
    trap '_bg_exit "$?"' EXIT
    _await "$@"
    _stage_begin "$name"
    "$fn"
    _stage_end
  ) > "$STAGES_DIR/$name.log" 2>&1 < /dev/null &
  _BG_PIDS+=("$!")
  set +m
  _BG_NAMES+=("$name")
}
_await() {  # until each named stage ended ok; when one did not, this one never starts
  local s rc
  for s in "$@"; do
    until [ -e "$STAGES_DIR/$s.rc" ]; do sleep 0.2; done
    read -r rc _ < "$STAGES_DIR/$s.rc"
    [ "$rc" = 0 ] || { _BG_SKIPPED=1; exit 0; }
  done
}
_bg_exit() {  # a background stage ended: its end marker unless ok, its result for _join
  local rc=$1 status=failed
  if [ -n "${_STAGE:-}" ]; then
    if [ -e "$NODE_RUN_DIR/state/cancelled" ]; then status=cancelled
    elif [ -e "$STAGES_DIR/stopped" ]; then status=stopped; fi
    printf '##reproduce stage=%s event=end status=%s rc=%s t=%s n=%s\n' \
      "$_STAGE" "$status" "$rc" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"
  fi
  [ -z "${_BG_SKIPPED:-}" ] || rc=skipped
  echo "$rc $(date +%s.%N)" > "$STAGES_DIR/$_BG_NAME.rc.tmp"
  mv -f "$STAGES_DIR/$_BG_NAME.rc.tmp" "$STAGES_DIR/$_BG_NAME.rc"
}
_bg_ended() {  # have the stages of these indexes all ended (their result written)?
  local i
  for i in "$@"; do [ -e "$STAGES_DIR/${_BG_NAMES[$i]}.rc" ] || return 1; done
}
_bg_collect() {  # stage $1 (an index) ended: reaped, its whole log added to this one
  wait "${_BG_PIDS[$1]}" 2>/dev/null || true
  cat "$STAGES_DIR/${_BG_NAMES[$1]}.log"
  _BG_DONE[$1]=1
}
_bg_progress() {  # the newest complete progress line of each running stage, for the console
  local i line
  for i in "${!_BG_NAMES[@]}"; do
    [ -z "${_BG_DONE[$i]:-}" ] || continue
    line="$(tail -c 8192 "$STAGES_DIR/${_BG_NAMES[$i]}.log" | sed '$d' \
      | grep -a '^##reproduce progress ' | tail -n 1)" || true
    if [ -n "$line" ] && [ "$line" != "${_BG_SHOWN[$i]:-}" ]; then
      echo "$line"
      _BG_SHOWN[$i]=$line
    fi
  done
}
_join() {  # the one wait: every background stage ends ok, or the first to fail ends the run
  local i rc t first="" first_rc=0 first_t="" left
  while :; do
    left=0
    for i in "${!_BG_NAMES[@]}"; do
      [ -z "${_BG_DONE[$i]:-}" ] || continue
      if ! _bg_ended "$i"; then left=$((left + 1)); continue; fi
      _bg_collect "$i"
      read -r rc t < "$STAGES_DIR/${_BG_NAMES[$i]}.rc"
      [ "$rc" != 0 ] && [ "$rc" != skipped ] || continue
      # the earliest failure counts (the times have one width: they compare as text)
      if [ -z "$first" ] || [[ "$t" < "$first_t" ]]; then
        first=${_BG_NAMES[$i]} first_rc=$rc first_t=$t
      fi
    done
    if [ -n "$first" ]; then
      echo "reproduce: stage $first failed (exit $first_rc); the stages beside it stop" >&2
      _bg_stop
      exit "$first_rc"
    fi
    [ "$left" -gt 0 ] || return 0
    _bg_progress
    sleep 0.5
  done
}
_bg_stop() {  # stop each background stage still running (its group, its container); keep its log
  local i sig running
  [ -n "${_BG_NAMES[*]:-}" ] || return 0
  touch "$STAGES_DIR/stopped"
  for sig in TERM TERM KILL; do  # each after up to 5 s
    running=()
    for i in "${!_BG_NAMES[@]}"; do
      [ -n "${_BG_DONE[$i]:-}" ] || _bg_ended "$i" || running+=("$i")
    done
    [ "${#running[@]}" -gt 0 ] || break
    for i in "${running[@]}"; do
      kill -"$sig" -- "-${_BG_PIDS[$i]}" 2>/dev/null || true
      docker rm -f "$CONTAINER-${_BG_NAMES[$i]}" >/dev/null 2>&1 || true
    done
    [ "$sig" != KILL ] || break
    for _ in $(seq 50); do _bg_ended "${running[@]}" && break; sleep 0.1; done
  done
  for i in "${!_BG_NAMES[@]}"; do [ -n "${_BG_DONE[$i]:-}" ] || _bg_collect "$i"; done
}
# every in-image command is one more step of this node's job (srun --overlap), in a container pyxis makes from
# the image this run imported and checked ($IMAGE_SQSH, never a named container); a cancel's scancel ends every
# step of the job, so the EXIT trap has no container to remove
_cleanup() { _bg_stop; :; }
trap _on_exit EXIT
IMAGE_SQSH="$NODE_RUN_DIR/image.sqsh"
# the GPUs each step asks for: the job's own option (--gpus-per-node=N or --gres=gpu:N), set by its batch script
GPU_ARGS=("${REPRODUCE_GPU_OPTION:?set by the batch script of the job}")
# what a container gets of this script's environment (names only; HF_TOKEN to none), and its mounts: the run's
# out dir, read-only its state dir, the cache and scripts/
PYXIS_ENV=RUN_ID,NODE_RUN_DIR,REPRODUCE_OUT_DIR,HF_CKPT,TORCH_DIST,SFT_DATA,REPRODUCE_NEW_DIR,REPRODUCE_HOST_IDS
PYXIS_MOUNTS="$NODE_RUN_DIR/out:$NODE_RUN_DIR/out,$NODE_RUN_DIR/state:$NODE_RUN_DIR/state:ro,"/var/tmp/reproduce-cache:/var/tmp/reproduce-cache:ro",$NODE_RUN_DIR/scripts:/opt/reproduce/scripts:ro"
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

# ---- stage preflight: node health before any download: GPUs, driver, ECC, Xid, NVLink, EFA, disk
_preflight_stage() {
python3 "$NODE_RUN_DIR/scripts/preflight.py" --json --gpu-type H200 --gpus 8 --gpu-memory-gb 141 --driver-min 580.65.06 --cuda 13.0 --disk-path /var/tmp/reproduce-cache --disk-min-gb 300 --no-bench > "$NODE_RUN_DIR/preflight.json"
}

# ---- stage resolve: where every asset will come from (cache, store, Hub, build, convert); nothing downloaded, in seconds (a failure stops the image pull beside it)
_resolve_stage() {
# the node programs' spec (launcher/plan/asset_spec.py)
cat > "$ASSET_SPEC" <<'REPRODUCE_ASSET_SPEC'
{
 "assets": [
  {
   "field": "workload.dataset.build.tokenizer",
   "files": {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101"
   },
   "kind": "hf-files",
   "name": "tokenizer",
   "notes": [
    "Qwen3-32B: owner Qwen taken from the checkpoint's repo"
   ],
   "path": "/var/tmp/reproduce-cache/tokenizers/Qwen--Qwen3-32B@9216db5781bf",
   "sources": [
    {
     "repo": "Qwen/Qwen3-32B",
     "revision": "9216db5781bf21249d130ec9da846c4624c16137"
    },
    {
     "repo": "Qwen/Qwen3-30B-A3B",
     "revision": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
    }
   ]
  },
  {
   "field": "workload.dataset.source/revision",
   "include": [
    "*.parquet"
   ],
   "kind": "hf-snapshot",
   "name": "dataset",
   "path": "/var/tmp/reproduce-cache/hf/datasets/allenai--tulu-3-sft-mixture@b14afda60f1b",
   "repo": "allenai/tulu-3-sft-mixture",
   "repo_type": "dataset",
   "revision": "b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"
  },
  {
   "build_problem": null,
   "field": "workload.dataset.build",
   "hash_fields": {
    "parquet_sha256": "workload.dataset.build.parquet_sha256",
    "rows_sha256": "workload.dataset.rows_sha256"
   },
   "kind": "rows",
   "loss_mask": "qwen3",
   "messages_column": "messages",
   "name": "rows",
   "parquet_sha256": "7ea7f5dca51f6be280e2f7cd7ee786ac05f546570e5ac1b07236c920338241fe",
   "path": "/var/tmp/reproduce-cache/rows/qwen3-tulu3-fixed8192-v1-7ea7f5dca51f.parquet",
   "row_tokens": 8192,
   "rows": 6400,
   "rows_sha256": "8f76b822a284adbe24faaf3cfe725e65cb5e94f98ba54aceade45b275345f983",
   "seed": 42
  },
  {
   "field": "result.active_params.source/revision",
   "include": null,
   "kind": "hf-snapshot",
   "name": "hf_ckpt",
   "path": "/var/tmp/reproduce-cache/hf/Qwen--Qwen3-30B-A3B@ad44e777bcd1",
   "repo": "Qwen/Qwen3-30B-A3B",
   "repo_type": "model",
   "revision": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
  },
  {
   "field": "the conversion of result.active_params' checkpoint",
   "identity": {
    "converter": "miles tools/convert_hf_to_torch_dist.py",
    "from": {
     "repo": "Qwen/Qwen3-30B-A3B",
     "revision": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
    },
    "image": "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca",
    "model_args": "qwen3-30B-A3B",
    "ranks": 8
   },
   "kind": "converted",
   "name": "torch_dist",
   "path": "/var/tmp/reproduce-cache/torch_dist/Qwen--Qwen3-30B-A3B@ad44e777bcd1"
  }
 ],
 "format": "reproduce-asset-spec/1",
 "store": null
}
REPRODUCE_ASSET_SPEC
# manifests, the Hub's listings and one byte per repo: exit 1 names an asset nobody
# can supply and every source tried (3: the Hub or the store is unreachable). Cached
# files are checked by size here and by sha256 when fetched, before they are used.
HF_TOKEN="$HF_TOKEN" python3 "$ASSETS_PY" resolve --spec "$ASSET_SPEC" --verify sizes --out "$NODE_RUN_DIR/assets-plan.json" > "$ASSET_PLAN"
}

# ---- stage image: pull the training image by digest and verify the digest
_image_stage() {
command -v enroot >/dev/null || { echo 'enroot is not installed on this node (profile container_runtime: pyxis)' >&2; exit 1; }
for tool in curl jq sha256sum; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed on this node (the image check needs it)" >&2; exit 1; }
done
# 1. the manifest by digest, hashed here: enroot checks each blob against the manifest, never the manifest
_IMG_DIR="$NODE_RUN_DIR/image.check"
rm -rf "$_IMG_DIR" && mkdir -m 700 "$_IMG_DIR" "$_IMG_DIR/cache"
_IMG_REGISTRY=registry-1.docker.io
_IMG_NAME=radixark/miles
_IMG_ACCEPT='Accept: application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.index.v1+json'
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
_uri=docker://radixark/miles@sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca
if [ "$(printf '%s\n' 4.0 "$(enroot version)" | sort -V | head -n 1)" != 4.0 ]; then
  _uri=docker://radixark/miles:v0.1.0
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
}

# ---- stage preflight-gpu: GPU benchmarks in the image: bf16 matmul, memory bandwidth, NCCL all-reduce
_preflight_gpu_stage() {
_in_image "$CONTAINER-preflight-gpu" --gpus -- bash -c 'export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; python3 "/opt/reproduce/scripts/preflight.py" --json --gpu-type H200 --gpus 8 --gpu-memory-gb 141 --driver-min 580.65.06 --cuda 13.0 --disk-path /var/tmp/reproduce-cache --disk-min-gb 300' > "$NODE_RUN_DIR/preflight-gpu.json"
}

# ---- stage stack: check the image's software versions against the recipe's stack
_stack_stage() {
_in_image "$CONTAINER-stack" --gpus -- bash -c 'python3 "/opt/reproduce/scripts/stack_probe.py" --json --policy fail --expect '"'"'{"cuda": "13.0", "deepep": "1.2.1", "megatron_commit": "37f91617", "miles_commit": "78527b91", "nccl": "2.28.9", "python": "3.12.3", "torch": "2.11.0", "transformer_engine": "2.17.0"}'"'"'' > "$NODE_RUN_DIR/stack.json"
}

# ---- stage rows: the training rows: fetched and checked, or built in the image (CPU), then every row through the rollout function's checks
_rows_stage() {
# a verified cache, the store, or built from the tokenizer and dataset fetched here, in
# the image (no network, no GPU, no token, the host's uid), into a fresh directory of
# its own; the host checks them against the recipe's parquet_sha256 before they take
# $SFT_DATA (the build checks rows_sha256 too)
HF_TOKEN="$HF_TOKEN" python3 "$ASSETS_PY" fetch --spec "$ASSET_SPEC" --plan "$ASSET_PLAN" rows
if [ "$(python3 "$ASSETS_PY" source --plan "$ASSET_PLAN" rows)" = build ]; then
  export REPRODUCE_NEW_DIR="$ASSET_NEW/rows" && mkdir -m 700 "$REPRODUCE_NEW_DIR"
  _in_image "$CONTAINER-rows" --new --host-user -- bash -c 'HOME=/tmp HF_HUB_OFFLINE=1 PYTHONPATH=/root/miles:/root/Megatron-LM:"/opt/reproduce/scripts" python3 "/opt/reproduce/scripts/node_assets.py" build-rows --spec "$NODE_RUN_DIR/state/assets.json" --plan "$NODE_RUN_DIR/state/assets-plan.json" --out "$REPRODUCE_NEW_DIR"'
  python3 "$ASSETS_PY" adopt --spec "$ASSET_SPEC" rows --from "$REPRODUCE_NEW_DIR"
fi
# every row through the rollout function's own checks (length, loss mask) before a GPU minute
_in_image "$CONTAINER-rows" -- bash -c 'python3 "/opt/reproduce/scripts/pretokenized_sft_rollout.py" --check "$SFT_DATA" --row-tokens 8192'
}

# ---- stage assets: the checkpoint (and a converted one) from the cache, the store or the Hub, on the host; every file checked
_assets_stage() {
# the checkpoint (and a converted one when the cache or the store has it), each file
# checked against the Hub's listing or the store's manifest
HF_TOKEN="$HF_TOKEN" python3 "$ASSETS_PY" fetch --spec "$ASSET_SPEC" --plan "$ASSET_PLAN" hf_ckpt torch_dist
}

# ---- these stages run at once, each once the stages named after it ended ok
# (launcher/plan/stage_graph.py); _join fails the run naming the first that failed
_bg preflight _preflight_stage
_bg resolve _resolve_stage
_bg image _image_stage
_bg preflight-gpu _preflight_gpu_stage image
_bg stack _stack_stage image
_bg rows _rows_stage resolve image
_bg assets _assets_stage resolve
_join

# ---- stage convert: the checkpoint converted for Megatron on the GPUs, only when no converted one could be fetched
_stage_begin convert
# resolve chose: a converted checkpoint from the cache or the store (fetched above), or
# this conversion, into a fresh directory of its own (a conversion cut short is redone,
# never trusted); the host checks it, seals it (its manifest, from the bytes the host
# hashed) and only then moves it to $TORCH_DIST, so later runs on this node trust it
if [ "$(python3 "$ASSETS_PY" source --plan "$ASSET_PLAN" torch_dist)" = convert ]; then
  export REPRODUCE_NEW_DIR="$ASSET_NEW/torch_dist" && mkdir -m 700 "$REPRODUCE_NEW_DIR"
  _in_image "$CONTAINER-convert" --gpus --new -- bash -c 'export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; (cd /root/miles && MODEL_ARGS_LINE="$(python3 miles/utils/external_utils/model_args_utils.py qwen3-30B-A3B)" && read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE" && PYTHONPATH=/root/miles:/root/Megatron-LM torchrun --nproc-per-node 8 tools/convert_hf_to_torch_dist.py "${MODEL_ARGS[@]}" --hf-checkpoint "$HF_CKPT" --save "$REPRODUCE_NEW_DIR/torch_dist") && chown -R "$REPRODUCE_HOST_IDS" "$REPRODUCE_NEW_DIR"'
  python3 "$ASSETS_PY" adopt --spec "$ASSET_SPEC" torch_dist --from "$REPRODUCE_NEW_DIR/torch_dist"
fi
rm -rf "$ASSET_NEW"  # what the containers made is in the cache now, checked
_stage_end

# ---- stages ray + train, inside the training container (this text runs verbatim there)
IFS= read -r -d '' CONTAINER_SCRIPT <<'REPRODUCE_CONTAINER_SCRIPT' || true
set -euo pipefail
exec 2>&1  # one stream: the markers stay where they were printed among the log lines
_stage_begin() { _STAGE=$1; export REPRODUCE_STAGE=$1; printf '##reproduce stage=%s event=start t=%s n=%s\n' "$1" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; }
_stage_end() { printf '##reproduce stage=%s event=end status=ok t=%s n=%s\n' "$_STAGE" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; _STAGE=''; REPRODUCE_STAGE=''; }
_on_exit() {
  local rc=$? status=failed
  if [ -n "${_STAGE:-}" ]; then
    [ -e "$NODE_RUN_DIR/state/cancelled" ] && status=cancelled  # `reproduce cancel` marks the run first
    printf '##reproduce stage=%s event=end status=%s rc=%s t=%s n=%s\n' "$_STAGE" "$status" "$rc" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"
  fi
  _cleanup; "${_AFTER_CLEANUP:-:}"  # the container's leftovers (plan/leftovers.py)
  exit "$rc"
}
_cleanup() { :; }
trap _on_exit EXIT
# what this container leaves in the host's IPC and /dev/shm (--ipc host) is removed at its end,
# and its out/ given to the host's user (scripts/node_leftovers.py)
python3 "/opt/reproduce/scripts/node_leftovers.py" snapshot --out /tmp/.reproduce-ipc-before.json >/dev/null 2>&1 || true
_leftovers() { python3 "/opt/reproduce/scripts/node_leftovers.py" clean --before /tmp/.reproduce-ipc-before.json --out-dir "$REPRODUCE_OUT_DIR" || echo "reproduce: leftovers not removed: the image's python3 could not run the check ($?)"; }
_AFTER_CLEANUP=_leftovers
export PYTHONPATH=/root/miles:/root/Megatron-LM:"/opt/reproduce/scripts"
# every step line reaches the log: Ray's dedup would fold lines that differ only in numbers
export RAY_DEDUP_LOGS=0
# each line leaves when printed: through a pipe Python holds stdout in 8 KiB blocks, and the host's clock (check 6) stamps lines as they arrive
export PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export HF_CKPT=/var/tmp/reproduce-cache/hf/Qwen--Qwen3-30B-A3B@ad44e777bcd1
export TORCH_DIST=/var/tmp/reproduce-cache/torch_dist/Qwen--Qwen3-30B-A3B@ad44e777bcd1
export SFT_DATA=/var/tmp/reproduce-cache/rows/qwen3-tulu3-fixed8192-v1-7ea7f5dca51f.parquet
export REPRODUCE_ROW_TOKENS=8192  # checked by pretokenized_sft_rollout

# ---- stage ray: start Ray in the training container
_stage_begin ray
NODE_IP=127.0.0.1
_cleanup() { local p; for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] && continue; tr "\0" "\n" < "$p/environ" 2>/dev/null | grep -qxF "SLURM_STEP_ID=$SLURM_STEP_ID" && tr "\0" "\n" < "$p/environ" 2>/dev/null | grep -qxF "SLURM_JOB_ID=$SLURM_JOB_ID" && kill -9 "${p#/proc/}" 2>/dev/null; done; true; }
ray start --head --node-ip-address "$NODE_IP" --port 6379 --num-gpus 8 --disable-usage-stats --log-color false --include-dashboard=false
export RAY_ADDRESS="$NODE_IP:6379"
_stage_end

# ---- stage train: the recipe's run block, verbatim, from the miles checkout
_stage_begin train
cd /root/miles
# ----- recipe run block (verbatim) -----
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False

MODEL_ARGS_LINE="$(python3 miles/utils/external_utils/model_args_utils.py qwen3-30B-A3B)"
read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE"
python3 train.py \
  --actor-num-nodes 1 \
  --actor-num-gpus-per-node 8 \
  --num-gpus-per-node 8 \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "$HF_CKPT" \
  --ref-load "$TORCH_DIST" \
  --loss-type sft_loss \
  --calculate-per-token-loss \
  --disable-compute-advantages-and-returns \
  --debug-train-only \
  --rollout-function-path pretokenized_sft_rollout.generate_rollout \
  --prompt-data "$SFT_DATA" \
  --input-key messages \
  --metadata-key metadata \
  --num-rollout 20 \
  --rollout-batch-size 128 \
  --global-batch-size 128 \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --context-parallel-size 1 \
  --expert-model-parallel-size 8 \
  --expert-tensor-parallel-size 1 \
  --recompute-granularity full \
  --recompute-method uniform \
  --recompute-num-layers 1 \
  --use-dynamic-batch-size \
  --max-tokens-per-gpu 16384 \
  --optimizer adam --lr 1e-5 --lr-decay-style cosine --min-lr 1e-6 \
  --lr-warmup-fraction 0.1 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 \
  --use-precision-aware-optimizer \
  --attention-dropout 0.0 --hidden-dropout 0.0 \
  --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32 \
  --attention-backend flash \
  --distributed-timeout-minutes 30
# ----- end of recipe run block -----
_stage_end
REPRODUCE_CONTAINER_SCRIPT
# the host watches the GPUs while the container trains (scripts/gpu_sampler.py: nvidia-smi about once a second,
# on the host clock's clock) into the node run directory, which no container mounts
python3 "$NODE_RUN_DIR/scripts/gpu_sampler.py" --out "$NODE_RUN_DIR/gpu-samples.csv" --while-pid "$$" </dev/null >/dev/null 2>&1 &
_GPU_SAMPLER=$!
# the training step is named after the run; pyxis removes its container when it ends
# its output, both streams, passes the host's clock (scripts/host_clock.py): a clock line with this script's
# nonce, which the container never gets, before each line that begins 0.5 s or more after the last one
_in_image "$CONTAINER" --gpus -- bash -c "$CONTAINER_SCRIPT" 2>&1 \
  | ( trap '' TERM INT HUP; REPRODUCE_CLOCK_NONCE="$_REPRODUCE_NONCE" exec python3 "$NODE_RUN_DIR/scripts/host_clock.py" --gap 0.5 ) \
  || { _rc=("${PIPESTATUS[@]}"); kill "$_GPU_SAMPLER" 2>/dev/null || true; wait "$_GPU_SAMPLER" 2>/dev/null || true; exit "$(( _rc[0] != 0 ? _rc[0] : _rc[1] ))"; }
kill "$_GPU_SAMPLER" 2>/dev/null || true; wait "$_GPU_SAMPLER" 2>/dev/null || true

echo '##reproduce done'
exit
}
