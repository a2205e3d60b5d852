"""The asset stages of node.sh: resolve, assets and convert, cheapest first.

Why this order (docs/assets.md): a run whose assets cannot be supplied must fail in the node's
first minute, not after a 61 GB download and an 8-GPU conversion. So the node first writes the
asset spec (launcher/plan/asset_spec.py) and resolves every asset on the host, before the image pull
(`resolve`: manifests, the Hub's listings, one byte per repo; nothing downloaded). Once the image
and the stack are checked, the rows come first (CPU: fetched, or built in the image from the
tokenizer and dataset fetched on the host), then the checkpoint from the cache, the store or the
Hub (`assets`), and the GPUs convert it only when no converted checkpoint could be fetched
(`convert`). What the node built or converted goes to the profile's `assets.store`, so no later
run builds or converts it again.

HF_TOKEN reaches host commands only (resolve, fetch): no container of the run gets it. The spec
and the resolve plan live in the node run dir's `state/`, which containers see read-only (the
rows build reads them there), while the host writes them. The cache is read-only in every
container: the rows build and the conversion write into a fresh directory of this run's
($REPRODUCE_NEW_DIR under $ASSET_NEW), which the host checks (`node_assets.py adopt`: no links,
regular files of its own, the rows against the recipe's parquet_sha256) before it moves the
result into the cache (docs/architecture.md, "The trust boundary"). The rendering is separate from
node_script.py so that the node script's other stages and these can change independently.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from launcher.inputs.recipe import Recipe
from launcher.plan import multinode
from launcher.plan.asset_spec import build_spec, converter_identity
from launcher.plan.node_script import (
    MILES_DIR,
    MILES_PYTHONPATH,
    ScriptContext,
    _heredoc_tag,
    _with_nvls_off,
    q,
)
from launcher.plan.placement import Stage
from launcher.plan.protocol import ASSET_PLAN_FILE as PLAN_RESULT
from launcher.plan.protocol import STATE_DIR

# Tests only: the rows are built with this encoder instead of the recipe's tokenizer (the test
# tokenizer of scripts/build_sft_rows.py). It is read from the launcher's environment when the
# Plan is built, so it shows in node.sh; rows built with it never match a real recipe's hashes.
TEST_ENCODER_ENV = "REPRODUCE_TEST_ROWS_ENCODER"
_PY = 'python3 "$ASSETS_PY"'


@dataclass(frozen=True)
class AssetStages:
    """The spec the node resolves, the three stages, and stage push after training (the
    uploads to the store finish before the node is released; None without a store)."""

    spec: dict[str, Any]
    resolve: Stage
    rows: Stage
    assets: Stage
    convert: Stage
    push: Stage | None
    # the names every asset stage uses, set once before they start (they run in subshells)
    header: tuple[str, ...] = ()

    @property
    def after_training(self) -> tuple[str, ...]:
        """Stage push as node.sh runs it, once the training container ended."""
        if self.push is None:
            return ()
        return (
            "",
            f"# ---- stage push: {self.push.title}",
            "_stage_begin push",
            *self.push.commands,
            "_stage_end",
        )


def model_args_name(recipe: Recipe) -> str:
    """The model-arguments name the run block gives miles (the conversion must use the same)."""
    m = re.search(r"model_args_utils\.py\s+([A-Za-z0-9_.-]+)", recipe.run_script)
    return m.group(1) if m else recipe.model


def asset_spec(ctx: ScriptContext) -> dict[str, Any]:
    """The node programs' spec for this run (the Plan's cache paths and the profile's store)."""
    spec = build_spec(
        ctx.recipe,
        cache_dir=ctx.cache_dir,
        hf_ckpt=ctx.assets.hf_ckpt,
        sft_data=ctx.assets.sft_data,
        torch_dist=ctx.assets.torch_dist,
        converter=converter_identity(ctx.recipe, model_args_name(ctx.recipe)),
        store=ctx.profile.assets.store,
    )
    if not ctx.profile.assets.verify_sha256:
        # the profile asks for rows unchecked: then they are neither checked nor kept in a store
        for asset in spec["assets"]:
            if asset["name"] == "rows":
                asset["parquet_sha256"] = asset["rows_sha256"] = None
    return spec


def render(ctx: ScriptContext) -> AssetStages:
    spec = asset_spec(ctx)
    names = {a["name"] for a in spec["assets"]}
    store = spec.get("store")
    return AssetStages(
        spec,
        Stage(
            "resolve",
            "where every asset will come from (cache, store, Hub, build, convert); nothing "
            "downloaded, in seconds (a failure stops the image pull beside it)",
            "node",
            tuple(_resolve_lines(spec)),
        ),
        Stage(
            "rows",
            "the training rows: fetched and checked, or built in the image (CPU), then every row "
            "through the rollout function's checks",
            "container",
            tuple(_rows_lines(ctx, store)),
        ),
        Stage(
            "assets",
            "the checkpoint (and a converted one) from the cache, the store or the Hub, on the "
            "host; every file checked",
            "node",
            tuple(_checkpoint_lines(names)),
        ),
        Stage(
            "convert",
            "the checkpoint converted for Megatron on the GPUs, only when no converted one could "
            "be fetched",
            "container",
            tuple(_convert_lines(ctx, names, store)),
        ),
        _push_stage(names, store),
        (
            "# the asset stages' programs, spec and plan (resolve writes them to state/, which",
            "# containers read but cannot write; docs/assets.md)",
            'ASSETS_PY="$NODE_RUN_DIR/scripts/node_assets.py"',
            f'ASSET_SPEC="$NODE_RUN_DIR/{STATE_DIR}/assets.json"',
            f'ASSET_PLAN="$NODE_RUN_DIR/{STATE_DIR}/{PLAN_RESULT}"',
        ),
    )


def _resolve_lines(spec: dict[str, Any]) -> list[str]:
    body = json.dumps(spec, indent=1, sort_keys=True)
    tag = _heredoc_tag(body, "REPRODUCE_ASSET_SPEC")
    return [
        "# the node programs' spec (launcher/plan/asset_spec.py)",
        f"cat > \"$ASSET_SPEC\" <<'{tag}'",
        body,
        tag,
        "# manifests, the Hub's listings and one byte per repo: exit 1 names an asset nobody",
        "# can supply and every source tried (3: the Hub or the store is unreachable). Cached",
        "# files are checked by size here and by sha256 when fetched, before they are used.",
        f'HF_TOKEN="$HF_TOKEN" {_PY} resolve --spec "$ASSET_SPEC" --verify sizes '
        f'--out "$NODE_RUN_DIR/{PLAN_RESULT}" > "$ASSET_PLAN"',
    ]


def _rows_lines(ctx: ScriptContext, store: str | None) -> list[str]:
    scripts = ctx.scripts
    build = (
        f'HOME=/tmp HF_HUB_OFFLINE=1 PYTHONPATH={MILES_PYTHONPATH}:"{scripts}" '
        f'python3 "{scripts}/node_assets.py" build-rows '
        f'--spec "$NODE_RUN_DIR/{STATE_DIR}/assets.json" '
        f'--plan "$NODE_RUN_DIR/{STATE_DIR}/{PLAN_RESULT}" --out "$REPRODUCE_NEW_DIR"'
    )
    encoder = os.environ.get(TEST_ENCODER_ENV)
    if encoder:
        build += f" --encoder {q(encoder)}"
    lines = [
        "# a verified cache, the store, or built from the tokenizer and dataset fetched here, in",
        "# the image (no network, no GPU, no token, the host's uid), into a fresh directory of",
        "# its own; the host checks them against the recipe's parquet_sha256 before they take",
        "# $SFT_DATA (the build checks rows_sha256 too)",
        f'HF_TOKEN="$HF_TOKEN" {_PY} fetch --spec "$ASSET_SPEC" --plan "$ASSET_PLAN" rows',
        f'if [ "$({_PY} source --plan "$ASSET_PLAN" rows)" = build ]; then',
        '  export REPRODUCE_NEW_DIR="$ASSET_NEW/rows" && mkdir -m 700 "$REPRODUCE_NEW_DIR"',
        "  "
        + ctx.in_image(build, stage="rows", gpus=False, host_user=True, makes=True, offline=True),
        f'  {_PY} adopt --spec "$ASSET_SPEC" rows --from "$REPRODUCE_NEW_DIR"',
    ]
    if store:
        lines += _on_node0(
            ctx,
            f'{_PY} push --spec "$ASSET_SPEC" rows '
            '|| echo "warning: the rows were built but not kept in the store" >&2',
        )
    lines.append("fi")
    lines.append(
        "# every row through the rollout function's own checks (length, loss mask) before a "
        "GPU minute"
    )
    check = (
        f'python3 "{scripts}/pretokenized_sft_rollout.py" --check "$SFT_DATA" '
        f"--row-tokens {ctx.recipe.row_tokens}"
    )
    lines.append(ctx.in_image(check, stage="rows", gpus=False, offline=True))
    return lines


def _checkpoint_lines(names: set[str]) -> list[str]:
    ckpt = [n for n in ("hf_ckpt", "torch_dist") if n in names]
    if not ckpt:
        return [
            "# the recipe names no Hugging Face checkpoint at a revision: $HF_CKPT and "
            "$TORCH_DIST are used as they are"
        ]
    return [
        "# the checkpoint (and a converted one when the cache or the store has it), each file",
        "# checked against the Hub's listing or the store's manifest",
        f'HF_TOKEN="$HF_TOKEN" {_PY} fetch --spec "$ASSET_SPEC" --plan "$ASSET_PLAN" '
        + " ".join(ckpt),
    ]


def _convert_lines(ctx: ScriptContext, names: set[str], store: str | None) -> list[str]:
    if "torch_dist" not in names:
        return [
            "# nothing to convert: the recipe names no Hugging Face checkpoint at a revision",
            'rm -rf "$ASSET_NEW"',
        ]
    convert = (
        f'cd {MILES_DIR} && MODEL_ARGS_LINE="$(python3 '
        "miles/utils/external_utils/model_args_utils.py "
        f'{q(model_args_name(ctx.recipe))})" && read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE" && '
        f"PYTHONPATH={MILES_PYTHONPATH} torchrun --nproc-per-node {ctx.recipe.gpus_per_node} "
        f'tools/convert_hf_to_torch_dist.py "${{MODEL_ARGS[@]}}" --hf-checkpoint "$HF_CKPT" '
        f'--save "$REPRODUCE_NEW_DIR/torch_dist"'
    )
    if ctx.docker:  # the container's root made the files: the host's user must own them
        convert = f'({convert}) && chown -R "$REPRODUCE_HOST_IDS" "$REPRODUCE_NEW_DIR"'
    lines = [
        "# resolve chose: a converted checkpoint from the cache or the store (fetched above), or",
        "# this conversion, into a fresh directory of its own (a conversion cut short is redone,",
        "# never trusted); the host checks it, seals it (its manifest, from the bytes the host",
        "# hashed) and only then moves it to $TORCH_DIST, so later runs on this node trust it",
        f'if [ "$({_PY} source --plan "$ASSET_PLAN" torch_dist)" = convert ]; then',
        '  export REPRODUCE_NEW_DIR="$ASSET_NEW/torch_dist" && mkdir -m 700 "$REPRODUCE_NEW_DIR"',
        f"  {ctx.in_image(_with_nvls_off(convert), stage='convert', makes=True)}",
        f'  {_PY} adopt --spec "$ASSET_SPEC" torch_dist --from "$REPRODUCE_NEW_DIR/torch_dist"',
    ]
    if store:
        lines += [
            "  # kept in the store while Ray and training run (niced, in the background), so no",
            "  # later run converts again; a failed upload is a warning, never a failed run",
            *_on_node0(
                ctx,
                f'nice -n 19 {_PY} push --spec "$ASSET_SPEC" torch_dist '
                '> "$NODE_RUN_DIR/push-torch_dist.log" 2>&1 &',
                "PUSH_PIDS+=($!)",
            ),
        ]
    lines.append("fi")
    if store and "hf_ckpt" in names:
        lines += [
            "# a checkpoint this node fetched from the Hub goes to the store too (same way)",
            f'if {_node0(ctx)}[ "$({_PY} source --plan "$ASSET_PLAN" hf_ckpt)" = hub ]; then',
            f'  nice -n 19 {_PY} push --spec "$ASSET_SPEC" hf_ckpt '
            '> "$NODE_RUN_DIR/push-hf_ckpt.log" 2>&1 &',
            "  PUSH_PIDS+=($!)",
            "fi",
        ]
    lines.append('rm -rf "$ASSET_NEW"  # what the containers made is in the cache now, checked')
    if store:
        lines.insert(0, "PUSH_PIDS=()")
    return lines


def _node0(ctx: ScriptContext) -> str:
    """On several nodes only node 0 fills the store: every node fetched or made the same bytes,
    and N writers of one store object (a shared directory's partial files) would collide."""
    return '[ "${NODE_RANK:-0}" = 0 ] && ' if multinode.spans_nodes(ctx.recipe, ctx.profile) else ""


def _on_node0(ctx: ScriptContext, *commands: str) -> list[str]:
    if not _node0(ctx):
        return [f"  {c}" for c in commands]
    return ['  if [ "${NODE_RANK:-0}" = 0 ]; then', *(f"    {c}" for c in commands), "  fi"]


def _push_stage(names: set[str], store: str | None) -> Stage | None:
    """Stage push: the uploads started in stage convert end before the node is released (a
    stage of its own, so that the GPU-hours they hold the node for show as such)."""
    if not store or not names & {"hf_ckpt", "torch_dist"}:
        return None
    return Stage(
        "push",
        "the uploads to the asset store started in stage convert finish",
        "node",
        (
            'for pid in "${PUSH_PIDS[@]}"; do',
            '  wait "$pid" || echo "warning: an asset was not kept in the store (see '
            '$NODE_RUN_DIR/push-*.log)" >&2',
            "done",
        ),
    )
