"""Every field of the recipe schema, and how reproduce honours it: one table.

Why: a recipe field nobody reads is a claim nobody checks (a `patches` list that was never
applied, a `runs: 3` never mentioned). Each leaf of schema/recipe.schema.yaml is here, exactly
once, as one of:

- READ: code uses its value to decide what runs or how it is judged (`by` names the code);
- CHECKED: `validate` compares it with another statement of the same fact and refuses a
  contradiction (the run block, the catalog, another field);
- SHOWN: informational prose or figures that change nothing reproduce does; they are printed
  verbatim on the run's report page (report.html, "The recipe card as written"), so a reader of
  the verdict sees them beside it.

tests/inputs/test_recipe_fields.py walks the schema and fails when a leaf is missing here or a
path here is not in the schema, and checks each entry by behaviour: a READ field changed changes
the plan or the verdict, a CHECKED one contradicted is refused, a SHOWN one appears on the page.
It lives in inputs/, the one folder that reads the recipe's mapping: `card_rows` is what
`Sections.shown` holds, and the page shows that.
docs/recipe-fields.md is the same table in prose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

READ, CHECKED, SHOWN = "read", "checked", "shown"


@dataclass(frozen=True)
class Honoured:
    how: str  # READ, CHECKED or SHOWN
    by: str  # the code that reads or checks it, or what the page shows


def _r(by: str) -> Honoured:
    return Honoured(READ, by)


def _c(by: str) -> Honoured:
    return Honoured(CHECKED, by)


def _s(by: str = "the recipe card on report.html") -> Honoured:
    return Honoured(SHOWN, by)


_RUNARGS = "validate: the run block's option (runargs.ARGS, both ways); the log's printed arguments"

# Paths: dots between mapping keys, `[]` for every item of a list, `*` for a mapping's further
# keys (stack components, env variables).
FIELDS: dict[str, Honoured] = {
    "schema_version": _c(
        "validate: only the supported versions (recipe.SUPPORTED_SCHEMA_VERSIONS)"
    ),
    "model": _r("recipe.recipe_slug (the run's identity and history), the report's title"),
    "gpu.type": _r("the GPU preflight (nvidia-smi's name), MFU's peak (catalog.gpu); catalog"),
    "gpu.memory_gb": _r("the GPU preflight (--gpu-memory-gb); validate: the catalog's instance"),
    "gpu.count": _r("nodes = count / per_node (plan, multinode), per-GPU figures (measure)"),
    "gpu.per_node": _c("validate: the catalog's instance, the run block's GPUs per node"),
    "gpu.instance": _r("the price (catalog.price_per_hour), the AWS instance type, the EFA count"),
    "author.name": _s("the report page's header; the recipe card"),
    "author.url": _s(),
    "status": _s("the report page's provenance ('card status'); the recipe card"),
    "stack.framework": _r("the stack probe's miles commit (stack.expected_versions)"),
    "stack.megatron_lm": _r("the stack probe's Megatron commit (stack.expected_versions)"),
    "stack.transformer_engine": _r("the stack probe (stack.expected_versions)"),
    "stack.pytorch": _r("the stack probe (stack.expected_versions)"),
    "stack.cuda": _r("the stack probe; the preflight's driver minimum (preflight)"),
    "stack.nccl": _r("the stack probe (stack.expected_versions)"),
    "stack.deepep": _r("the stack probe (stack.expected_versions)"),
    "stack.python": _r("the stack probe (stack.expected_versions)"),
    "stack.network": _s(),
    "stack.source": _r(
        "the image and its digest when stack.image is absent (recipe.extract_image)"
    ),
    "stack.image.repository": _r("the image pulled (recipe.extract_image)"),
    "stack.image.tag": _s(),
    "stack.image.digest": _r("the image pulled and its RepoDigests check (node.sh)"),
    "stack.*": _s(),
    "workload.row_tokens": _r("tokens per step (measure), REPRODUCE_ROW_TOKENS (node.sh)"),
    "workload.rows": _s(),
    "workload.global_batch": _c("validate: the run block's batch and rollout rows; the log"),
    "workload.precision": _s(),
    "workload.dataset.name": _r("the rows file's name in the cache (plan._assets)"),
    "workload.dataset.source": _r("the dataset downloaded to build the rows (assets.spec)"),
    "workload.dataset.revision": _r("the dataset revision downloaded (assets.spec)"),
    "workload.dataset.license": _s(),
    "workload.dataset.rows_sha256": _s(),
    "workload.dataset.build.name": _r("the rows file's name in the cache (plan._assets)"),
    "workload.dataset.build.tokenizer": _r("the tokenizer fetched for the rows (assets.spec)"),
    "workload.dataset.build.loss_mask": _r("the rows' build (assets.spec, build_sft_rows)"),
    "workload.dataset.build.rows": _r("the rows' build (assets.spec), the estimate"),
    "workload.dataset.build.row_tokens": _c("validate: equal to workload.row_tokens"),
    "workload.dataset.build.padding_tokens": _s(),
    "workload.dataset.build.seed": _r("the rows' build (assets.spec)"),
    "workload.dataset.build.packing": _s(),
    "workload.dataset.build.supervised_token_ratio": _s(),
    "workload.dataset.build.parquet_sha256": _r("the rows checked before training (node.sh)"),
    "workload.dataset.build.parquet_bytes": _r("the estimate's sizes (estimate)"),
    "workload.dataset.build.builder": _s(),
    "layout.label": _r("recipe.recipe_slug (the run's identity and history)"),
    "layout.summary": _s(),
    "layout.highlights": _s(),
    "layout.tp": _c(_RUNARGS),
    "layout.pp": _c(_RUNARGS),
    "layout.vpp": _c(_RUNARGS),
    "layout.cp": _c(_RUNARGS),
    "layout.ep": _c(_RUNARGS),
    "layout.etp": _c(_RUNARGS),
    "layout.dp": _c("validate: tp x pp x cp x dp = gpu.count"),
    "layout.sequence_parallel": _c(_RUNARGS),
    "layout.layer_split": _s(),
    "layout.max_tokens_per_gpu": _c(_RUNARGS),
    "layout.rows_per_microbatch": _s(),
    "layout.recompute.granularity": _c(_RUNARGS),
    "layout.recompute.method": _c(_RUNARGS),
    "layout.recompute.num_layers": _c(_RUNARGS),
    "layout.offload": _s(),
    "layout.dispatcher": _s(),
    "result.tokens_per_s_per_gpu": _r("the verdict's comparison (verdict.judge)"),
    "result.usd_per_million_tokens": _r("the verdict's claimed figures; the report's card tile"),
    "result.step_time_cv_percent": _r("the verdict's 'unstable' limit (verdict.judge)"),
    "result.mfu": _r("the verdict's claimed figures; the report's card tile"),
    "result.mfu_note": _s(),
    "result.active_params.count": _r("MFU's N (measure)"),
    "result.active_params.source": _r("the checkpoint downloaded (assets), its size (estimate)"),
    "result.active_params.revision": _r("the checkpoint's revision (assets)"),
    "result.measured": _s("the report page's provenance; the recipe card"),
    "result.steps_per_run": _c("validate: the run block's --num-rollout; the window inside it"),
    "result.window": _r("the measured steps (measure), the verdict"),
    "result.window_tokens": _c("validate: window steps x global_batch x row_tokens"),
    "result.runs": _r("K measured runs on one node, the verdict on their mean (claimruns)"),
    "result.profiler": _s(),
    "result.gpu_hours": _r("the expected cost and the budget (costgate, estimate, budget)"),
    "result.gpu_hours_note": _s(),
    "correctness.result": _s(),
    "correctness.summary": _s(),
    "correctness.reference": _s(),
    "correctness.configuration": _s(),
    "correctness.component_tests[].test": _s(),
    "correctness.component_tests[].shape": _s(),
    "correctness.component_tests[].gpu": _s(),
    "correctness.component_tests[].date": _s(),
    "correctness.component_tests[].result": _s(),
    "correctness.component_tests[].detail": _s(),
    "correctness.component_tests[].note": _s(),
    "correctness.convergence.steps": _s(),
    "correctness.convergence.result": _s(),
    "correctness.convergence.correlation": _s(),
    "correctness.convergence.final_loss_difference": _s(),
    "correctness.convergence.pointwise_failures": _s(),
    "correctness.convergence.note": _s(),
    "correctness.rules": _s(),
    "env.*": _r("exported in the training container, in order (node_script.container_env)"),
    "patches[].name": _r("printed when applied; plan.json (patches)"),
    "patches[].checkout": _r("the checkout the node applies it to (patches)"),
    "patches[].diff": _r("the bytes the node applies (patches)"),
    "patches[].file": _r("the bytes the node applies, read beside the recipe (patches)"),
    "patches[].sha256": _c("validate: the hash of the patch's bytes; node.sh again (patches)"),
    "patches[].source": _s(),
    "run": _r("the training script, verbatim in the container (node.sh)"),
    "notes": _s(),
}


def values_at(raw: object, path: str) -> list[tuple[str, Any]]:
    """(concrete path, value) for every place `path` (with [] and *) names in a recipe."""
    found: list[tuple[str, Any]] = [("", raw)]
    for part in path.split("."):
        nxt: list[tuple[str, Any]] = []
        items = part.endswith("[]")
        key = part[:-2] if items else part
        for where, node in found:
            if not isinstance(node, dict):
                continue
            if key == "*":
                known = set(_known_keys(path))
                for k, v in node.items():
                    if k not in known:
                        nxt.append((f"{where}.{k}" if where else k, v))
                continue
            if key not in node:
                continue
            here = f"{where}.{key}" if where else key
            if items and isinstance(node[key], list):
                nxt += [(f"{here}[{i}]", v) for i, v in enumerate(node[key])]
            elif not items:
                nxt.append((here, node[key]))
        found = nxt
    return found


def _known_keys(star_path: str) -> list[str]:
    """The named keys beside a `*` (stack.* excludes stack.framework, ...)."""
    prefix = star_path[: -len("*")]
    return [
        p[len(prefix) :].split(".")[0] for p in FIELDS if p.startswith(prefix) and p != star_path
    ]


def card_rows(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The SHOWN fields a recipe states, as (path, text), in the table's order: the report page's
    recipe card (Sections.shown)."""
    rows: list[tuple[str, str]] = []
    for path, honoured in FIELDS.items():
        if honoured.how != SHOWN:
            continue
        for where, value in values_at(raw, path):
            if value is None or isinstance(value, (dict, list)) and not value:
                continue
            rows.append((where, " ".join(str(value).split())))
    return rows
