"""Values miles and Megatron derive after printing their arguments, derived the same way here.

Why: a recipe may state a fact through an argument miles reads later (`--num-epoch` instead of
`--num-rollout`) or that Megatron turns into the printed one (`--num-layers-per-virtual-pipeline-
stage` into the virtual pipeline size). validate (from the run block) and the evidence gate (from
the printed listing) both hold the derived value to the recipe's field, by these functions, so an
honest recipe is accepted either way and a count that cannot be known before the run is refused.
Each function takes the recipe and a getter of arguments by miles' dest name (None: absent,
OPAQUE: only known at run time) and returns (value, how) or (None, why not); (None, "") where the
other way is not used at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from launcher.inputs.bashwords import OPAQUE


def coerce(value: object, kind: type) -> Any:
    """A printed or written value as the type miles parses it; ValueError when it cannot be."""
    if value is None or value is True and kind is bool:
        return value
    text = str(value).strip()
    if text == "None":
        return None
    if kind is bool:
        if text in ("True", "False"):
            return text == "True"
        raise ValueError(text)
    if kind is int:
        if not re.fullmatch(r"[-+]?\d+", text):
            raise ValueError(text)
        return int(text)
    return text


_DEFAULT_DATA_SOURCE = "miles.rollout.data_source.RolloutDataSourceWithBuffer"


def rollouts_from_epochs(raw: dict[str, Any], get: Callable[[str], Any]) -> tuple[Any, str]:
    """miles' rollout count when `--num-rollout` is absent: `num_rollout = num_rollout_per_epoch x
    num_epoch` (miles/ray/placement_group.py, create_rollout_manager), the epoch being
    `len(dataset) // rollout_batch_size` (rollout_manager.get_num_rollout_per_epoch). The
    dataset's length is the recipe's rows (workload.dataset.build.rows), known only where no
    filter drops rows at run time. (None, why) when the count cannot be known before the run."""
    epoch, batch = get("num_epoch"), get("rollout_batch_size")
    if epoch is None:
        return None, "neither --num-rollout nor --num-epoch is given"
    if epoch is OPAQUE or batch is OPAQUE:
        return None, "--num-epoch with an epoch count or rollout batch known only at run time"
    rows = ((raw["workload"].get("dataset") or {}).get("build") or {}).get("rows")
    why = ""
    if get("rollout_global_dataset") is False:
        why = "--disable-rollout-global-dataset, with which miles refuses --num-epoch"
    elif get("rollout_max_prompt_len") is not None:
        why = "--rollout-max-prompt-len, which drops rows at run time: an epoch's rows are unknown"
    elif get("data_source_path") not in (None, _DEFAULT_DATA_SOURCE):
        why = "--data-source-path, another data source: an epoch's rows are unknown"
    elif not isinstance(rows, int) or isinstance(rows, bool):
        why = "no workload.dataset.build.rows: an epoch's rows are unknown"
    if why or not isinstance(rows, int):
        return None, f"--num-epoch {epoch} with {why}"
    try:
        epochs, per_rollout = coerce(epoch, int), coerce(batch, int)
    except (ValueError, TypeError):
        return None, f"--num-epoch {epoch!r} and --rollout-batch-size {batch!r}, not integers"
    if not isinstance(per_rollout, int) or per_rollout <= 0 or not isinstance(epochs, int):
        return None, f"--num-epoch {epoch} without a rollout batch size known before the run"
    count = epochs * (rows // per_rollout)
    return count, (
        f"--num-epoch {epochs} x ({rows} rows // --rollout-batch-size {per_rollout}) = {count} "
        "rollouts, as miles derives them"
    )


_MAX_LAYOUT_CHARS = 100_000  # a layout string unrolled past this is no model's


def _layout_stages(layout: str) -> int | None:
    """The PP x VPP stages of `--pipeline-model-parallel-layout`, unrolled as Megatron does
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, parse_str_to_list); None when
    the unrolled text would pass _MAX_LAYOUT_CHARS."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        grown = sum(len(m.group(1)) * int(m.group(2)) for m in re.finditer(pattern, text))
        if len(text) + grown > _MAX_LAYOUT_CHARS:
            return None
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return text.count("|") + 1


def vpp_from_layers(raw: dict[str, Any], get: Callable[[str], Any]) -> tuple[Any, str]:
    """The virtual pipeline size Megatron derives when `--num-virtual-stages-per-pipeline-rank`
    is absent (megatron/training/arguments.py, validate_args, "Uneven virtual pipeline
    parallelism"): from `--pipeline-model-parallel-layout` (its stages // pp), or from
    `--num-layers-per-virtual-pipeline-stage` (layers, plus one for each of
    --account-for-embedding/loss-in-pipeline-split, // pp // layers per virtual stage); a size
    of 1 is no virtual pipeline. (None, "") where neither is given: the option's default holds."""
    per_stage, layout = (
        get("num_layers_per_virtual_pipeline_stage"),
        get("pipeline_model_parallel_layout"),
    )
    if per_stage is None and layout is None:
        return None, ""
    pp_word = get("pipeline_model_parallel_size")
    named = [w for w in (per_stage, layout, pp_word) if w is OPAQUE]
    layers = get("num_layers") if layout is None else None
    if named or layers is OPAQUE:
        return None, "the virtual pipeline is set from arguments only known at run time"
    try:
        pp = 1 if pp_word is None else coerce(pp_word, int)
        if layout is not None:
            stages = _layout_stages(str(layout))
            if stages is None:
                return None, f"--pipeline-model-parallel-layout unrolls past {_MAX_LAYOUT_CHARS}"
            if stages % pp:
                return None, f"its layout's {stages} stages, which Megatron refuses for pp {pp}"
            vpp = stages // pp
            return vpp, f"--pipeline-model-parallel-layout's {stages} stages // pp {pp} = {vpp}"
        if layers is None:
            return None, (
                f"--num-layers-per-virtual-pipeline-stage {per_stage} without --num-layers in "
                "the block's own words, from which Megatron derives it"
            )
        count = coerce(layers, int) + sum(
            get(f"account_for_{part}_in_pipeline_split") is True for part in ("embedding", "loss")
        )
        each = coerce(per_stage, int)
    except (ValueError, TypeError):
        return None, "the virtual pipeline is set by arguments that are not integers"
    if pp <= 0 or each <= 0 or count % pp or (count // pp) % each:
        return None, (
            f"{count} layers, pp {pp} and {each} layers per virtual stage, which Megatron "
            "refuses (layers must divide by pp, and each stage's by the virtual stage's)"
        )
    vpp = count // pp // each
    return vpp, (
        f"{count} layers // pp {pp} // --num-layers-per-virtual-pipeline-stage {each} = {vpp} "
        "virtual stages, as Megatron derives them"
    )
