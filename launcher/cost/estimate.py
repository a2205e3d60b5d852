"""The GPU-hours a run is expected to spend, stage by stage, before it is paid for.

Why: on a fresh node most of a reproduction's bill can go to provisioning, downloads and the
checkpoint's conversion, not to the training the recipe claims. The dry run shows, from stated
sizes and bandwidths, where a cold node, a node fed by a warm asset store and a node with a warm
cache land against the recipe's claim, so a user sees what `reproduce prepare` and
`assets.store` save before paying (docs/measurement.md, "Where the GPU-hours go"). A launch also
gets a fourth column, a fresh node from a baked AMI (`reproduce image bake`, `ami: baked`) with a
warm store: the image costs the check of a present image instead of the pull, and the GPU
preflight and the stack probe pay for the EBS volume's lazy loading (its blocks come from S3 on
first read) instead.

Every figure below says where it comes from; most are assumptions (nobody measured them for this
launcher yet), and they are written as such. Sizes come from the recipe where it states them
(the rows' parquet_bytes), from CHECKPOINTS (a model's total parameters x 2 bytes in bf16), or
are assumptions. The stages are the measured split's (measure.stage_split), so an estimate and a
run's result.yaml can be read side by side. Pure: no I/O, nothing imported but the recipe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.cost.figures import FIGURES, GB, MIB
from launcher.inputs.profile import AwsProfile
from launcher.inputs.recipe import Recipe
from launcher.plan import stage_graph

if TYPE_CHECKING:
    from launcher.catalog import Price
    from launcher.inputs.profile import Profile

GOAL_OVERHEAD_HOURS = 0.30  # the goal for our own overhead on a fresh node with a warm store

# Checkpoints whose size a recipe does not state: TOTAL parameters (bf16: 2 bytes each). A
# mixture of experts stores every expert, so its checkpoint is sized by its total parameters,
# never by the active ones the recipe states for MFU (a 235B-A22B model: 470 GB, not 44).
CHECKPOINTS: dict[str, tuple[float, str]] = {
    "Qwen/Qwen3-30B-A3B": (30.5e9, "30.5B parameters in total (the model card)"),
    "Qwen/Qwen3-235B-A22B": (
        235e9,
        "235B parameters in total, 22B activated (the model card, huggingface.co/Qwen/"
        "Qwen3-235B-A22B)",
    ),
}
# "<total>B-A<active>B" in a model's name (Qwen3-30B-A3B, Qwen3.5-397B-A17B): the publisher's own
# rounded total, used when the table above does not know the model.
_TOTAL_IN_NAME = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)B-A[0-9]+(?:\.[0-9]+)?B", re.I)
BF16_BYTES = 2
SCENARIOS = ("cold node", "warm store", "warm cache")
BAKED = "baked AMI"  # a fresh node from `reproduce image bake`'s AMI, warm store (launches only)


@dataclass(frozen=True)
class Estimate:
    """Seconds per stage for each scenario, the GPUs they are paid for, and the sizes used. A
    stage's seconds are its work; the `overlapped` entry (zero or negative) takes back what ran
    at the same time as other stages, so the stages add up to the node's wall time."""

    seconds: dict[str, dict[str, float]]  # scenario -> stage -> seconds
    gpus: int
    sizes: list[str]  # "what: size (where from)"
    claim_hours: float | None
    critical: dict[str, str]  # scenario -> the chain of stages that sets the wall time

    def gpu_hours(self, scenario: str) -> dict[str, float]:
        return {k: self.gpus * v / 3600.0 for k, v in self.seconds[scenario].items()}

    def total(self, scenario: str) -> float:
        return sum(self.gpu_hours(scenario).values())

    def overhead(self, scenario: str, *, provision: float) -> float:
        """Our own GPU-hours: everything but the cloud's provisioning (PROVISION seconds of the
        acquire stage) and the recipe's own ray+train and window."""
        h = self.gpu_hours(scenario)
        own = self.total(scenario) - h.get("ray+train", 0.0) - h.get("window", 0.0)
        return own - self.gpus * provision / 3600.0


def checkpoint_bytes(recipe: Recipe) -> tuple[float | None, str]:
    """The Hugging Face checkpoint's size in bytes, and where that figure comes from."""
    repo = (recipe.hf_model or ("", None))[0]
    if repo in CHECKPOINTS:
        params, source = CHECKPOINTS[repo]
        return params * BF16_BYTES, f"{repo}: {source} x {BF16_BYTES} bytes (bf16)"
    for name in (repo.rsplit("/", 1)[-1], str(recipe.model)):
        m = _TOTAL_IN_NAME.search(name)
        if m:
            total = float(m.group(1)) * 1e9
            return (
                total * BF16_BYTES,
                f"{m.group(1)}B parameters in total, read from the model's name {name!r} "
                f"x {BF16_BYTES} bytes (bf16; the node's resolve reads the Hub's exact sizes)",
            )
    if recipe.active_params:
        experts = (recipe.layout.ep or 1) > 1 or "--num-experts" in recipe.run_script
        if not experts:
            return (
                recipe.active_params * BF16_BYTES,
                "result.active_params.count x 2 bytes (layout.ep 1 and no --num-experts: read "
                "as a dense model, every parameter active)",
            )
        return (
            recipe.active_params * BF16_BYTES,
            "result.active_params.count x 2 bytes: a lower bound, the total parameters are not "
            "known (a mixture of experts stores every expert, the active ones are a fraction)",
        )
    return None, "unknown: the recipe states no parameter count"


def _train_seconds(recipe: Recipe) -> tuple[float, float] | None:
    """(ray + train outside the window, the window) from the recipe's claim: its GPU-hours with
    the assets on the node, and the window's steps at the claimed throughput."""
    hours = recipe.claimed_gpu_hours
    tps = recipe.claim.tokens_per_s_per_gpu
    if not hours or not tps:
        return None
    first, last = recipe.window
    window = (last - first + 1) * recipe.tokens_per_step / (float(tps) * recipe.gpu_count)
    total = float(hours) * 3600.0 / recipe.gpu_count
    return max(0.0, total - window), min(window, total)


# The node's stages before training as node.sh runs them: the parallel part of the one stage graph
# (launcher/plan/stage_graph.py: each starts once what it waits for ended), then the conversion
# (after the join). The estimate reads the graph, so it models the order a run really has.
BEFORE_TRAINING: tuple[str, ...] = (*stage_graph.PARALLEL, "convert")


def _node_wall(work: dict[str, float]) -> tuple[float, str]:
    """The wall time from staging to training of BEFORE_TRAINING run as the stage graph says, and
    the chain of stages that sets it."""
    ends: dict[str, tuple[float, str]] = {}
    for stage in BEFORE_TRAINING:
        start, via = max((ends[d] for d in stage_graph.waits_for(stage)), default=(0.0, ""))
        took = work.get(stage, 0.0)
        chain = (f"{via} -> {stage}" if via else stage) if took else via
        ends[stage] = (start + took, chain)
    return max(ends.values())


def estimate(
    recipe: Recipe, *, fresh_instance: bool, runs: int = 1, ebs_mibs: int | None = None
) -> Estimate:
    """Seconds per stage for a cold node (nothing cached, no store), a warm store (the store
    holds the rows, the checkpoint and its conversion: they come over S3, nothing is built or
    converted) and a warm cache (a node that kept its cache and image: nothing moves), the node's
    stages overlapped as node.sh runs them (BEFORE_TRAINING); and BAKED: a warm store on a fresh
    node from a baked AMI (the image present: checked, not pulled; its first reads from the
    restored EBS volume at the `ebs_init` rate, or at `ebs_mibs`, the profile's
    volume_initialization_rate, when it asks for one). `fresh_instance`: the cluster launches
    the node (provisioning is paid). `runs`: K measured runs (launcher/plan/claimruns.py) train K
    times on the one node: ray+train and the window count K times, everything before them once."""
    f = {k: v.value for k, v in FIGURES.items()}
    ckpt, ckpt_from = checkpoint_bytes(recipe)
    ckpt = ckpt or 0.0
    converted = ckpt * f["converted_ratio"]
    build = recipe.dataset.build
    rows = float(build.parquet_bytes or 0)
    tokens = float(build.rows or 0) * float(build.row_tokens or recipe.row_tokens)
    train = _train_seconds(recipe)
    sizes = [
        f"checkpoint {ckpt / GB:.1f} GB ({ckpt_from})",
        f"converted {converted / GB:.1f} GB ({FIGURES['converted_ratio'].source})",
        f"rows {rows / 1e6:.1f} MB (workload.dataset.build.parquet_bytes)"
        if rows
        else "rows: size not stated",
        f"dataset {f['dataset_bytes'] / GB:.1f} GB, image {f['image_bytes'] / GB:.0f} GB (assumed)",
    ]
    from_store = min(f["s3"], f["fetch"])  # S3 in-region, or our fetch, whichever is slower
    common = {
        "preflight": f["preflight"],
        "resolve": f["resolve"],
        "image": f["image_bytes"] / f["pull"],
        "preflight-gpu": f["preflight-gpu"],
        "stack": f["stack"],
    }
    dataset_s = f["dataset_bytes"] / f["hub"]
    # the image's first reads from a restored volume: at the rate asked for, else the floor
    lazy = f["lazy_bytes"] / (ebs_mibs * MIB if ebs_mibs else f["ebs_init"])
    works = {
        "cold node": {
            **common,
            "assets": ckpt / f["hub"],  # the checkpoint, on the host
            "rows": dataset_s + tokens / f["rows_build"],  # the dataset, then the build
            "convert": f["convert_fixed"] + ckpt / f["convert"],
        },
        "warm store": {
            **common,
            "assets": (rows + ckpt + converted) / from_store,
            "rows": 0.0,
            "convert": 0.0,
        },  # fmt: skip
        "warm cache": {
            **common,
            "image": f["image_present"],
            "assets": (rows + ckpt + converted) / f["nvme"],
            "rows": 0.0,
            "convert": 0.0,
        },  # fmt: skip
        BAKED: {
            **common,
            "image": f["image_check"],  # present on the AMI: no pull
            "preflight-gpu": f["preflight-gpu"] + lazy,  # the first reads wait for S3
            "stack": f["stack"] + lazy,
            "assets": (rows + ckpt + converted) / from_store,  # the cache is local NVMe
            "rows": 0.0,
            "convert": 0.0,
        },  # fmt: skip
    }
    middle = {"ray+train": train[0] * runs, "window": train[1] * runs} if train else {}
    seconds: dict[str, dict[str, float]] = {}
    critical: dict[str, str] = {}
    for scenario, work in works.items():
        kept = scenario == "warm cache"
        wall, chain = _node_wall(work)
        seconds[scenario] = {
            "acquire": (f["provision"] if fresh_instance and not kept else 0.0) + f["staging"],
            **work,
            "overlapped": wall - sum(work.values()),
            **middle,
            "collect": f["collect"],
            "release": f["release"] if fresh_instance and not kept else f["release_kept"],
        }
        critical[scenario] = chain
    return Estimate(
        seconds,
        recipe.gpu_count,
        sizes,
        float(recipe.claimed_gpu_hours) if recipe.claimed_gpu_hours else None,
        critical,
    )


def dry_run_lines(
    recipe: Recipe,
    *,
    fresh_instance: bool,
    store: str | None,
    usd_per_hour: float | None,
    runs: int = 1,
    baked: bool = False,
    ebs_mibs: int | None = None,
) -> list[str]:
    """The dry run's table: GPU-hours per stage and scenario, the totals against the claim. A
    launch (`fresh_instance`) shows the baked-AMI column too; `baked`: the profile uses one;
    `ebs_mibs`: the root volume's initialization rate it asks for."""
    est = estimate(recipe, fresh_instance=fresh_instance, runs=runs, ebs_mibs=ebs_mibs)
    columns = (*SCENARIOS, BAKED) if fresh_instance else SCENARIOS
    hours = {s: est.gpu_hours(s) for s in columns}
    lines = [
        "# ---- expected GPU-hours by stage, before paying (estimates: launcher/cost/estimate.py "
        "says "
        "where each figure comes from) ----",
        "#   stage           " + "".join(f"{s:>12}" for s in columns),
    ]
    for stage in hours["cold node"]:
        lines.append(f"#   {stage:<15} " + "".join(f"{hours[s][stage]:>12.3f}" for s in columns))
    totals = [est.total(s) for s in columns]
    lines.append("#   total           " + "".join(f"{t:>12.2f}" for t in totals))
    if usd_per_hour is not None:
        nodes = recipe.nodes
        cost = [t / recipe.gpus_per_node * usd_per_hour for t in totals]
        lines.append(
            "#   cost            "
            + "".join(f"{'$' + format(c, '.2f'):>12}" for c in cost)
            + f"   ({nodes} node(s) x ${usd_per_hour:g}/h)"
        )
    claim = (
        f"the recipe claims {est.claim_hours:g} GPU-hours with its assets already on the node "
        "(ray+train and window above)"
        if est.claim_hours
        else "the recipe claims no GPU-hours: Ray, training and the window are not estimated"
    )
    if runs > 1:
        claim += f"; ray+train and window count {runs} times: {runs} measured runs"
    lines += [
        f"#   {claim}",
        "#   cold node: "
        + ("a new instance, " if fresh_instance else "")
        + "rows built, the checkpoint from the Hub and converted on the GPUs; warm store: the "
        "rows, the checkpoint and its conversion from the store, nothing converted; warm "
        "cache: a node that kept its cache and image (no provisioning)"
        + (
            f"; {BAKED}: a new instance from `reproduce image bake`'s AMI with the store warm "
            "(the image checked, not pulled; its first reads from the restored EBS volume at "
            + (
                f"{ebs_mibs} MiB/s, the profile's volume_initialization_rate)"
                if ebs_mibs
                else f"{FIGURES['ebs_init'].value / MIB:g} MiB/s, the provisioned rate's floor: "
                "volume_initialization_rate asks for one)"
            )
            + (" - this profile's `ami: baked`" if baked else "")
            if fresh_instance
            else ""
        ),
        "#   store: "
        + (
            f"{store} (after a conversion the node keeps it there)"
            if store
            else "none (profile assets.store; `reproduce prepare RECIPE --store ...` fills one)"
        ),
        "#   sizes: " + "; ".join(est.sizes),
        "#   overlapped: the stages run at once as the `# stages` line says "
        "(launcher/plan/stage_graph.py); the wall time follows "
        + "; ".join(f"{s}: {est.critical[s]}" for s in columns),
        "#   rates: "
        + ", ".join(
            f"{label} {FIGURES[key].value / GB:.3g} GB/s ({FIGURES[key].source.split(':', 1)[0]})"
            for label, key in (
                ("Hub", "hub"),
                ("S3 in-region", "s3"),
                ("store fetch with sha256", "fetch"),
                ("cache sha256", "nvme"),
                ("image pull", "pull"),
                ("EBS first reads", "ebs_init"),
            )
        )
        + "; launcher/cost/figures.py names each figure's measurement or source",
        overhead_line(est, fresh_instance=fresh_instance),
    ]
    lines += nightly_lines(recipe, fresh_instance=fresh_instance, store=store)
    return lines


NIGHTLY_SIZES = (2, 5)  # the nightlies the dry run shows: N recipes of this shape, one node


def nightly_split(est: Estimate, n: int, first: str = "warm store") -> dict[str, float]:
    """GPU-hours of a nightly of `n` recipes like this one on one node (launcher/runner/held.py):
    the first pays `first` less what the group shares (the provisioning and the one release,
    i.e. what a fresh node costs over a node that stays: `first` vs "warm cache"), each next
    one the warm cache (its image and assets already on the node), the shared part once."""
    one = est.gpu_hours(first)
    kept = est.gpu_hours("warm cache")
    shared = sum(max(0.0, one.get(k, 0.0) - kept.get(k, 0.0)) for k in ("acquire", "release"))
    own_first = est.total(first) - shared
    each_next = est.total("warm cache")
    total = shared + own_first + (n - 1) * each_next
    return {
        "shared": shared,
        "first": own_first,
        "each_next": each_next,
        "total": total,
        "per_recipe": total / n,
        "alone": est.total(first),
    }


def nightly_lines(recipe: Recipe, *, fresh_instance: bool, store: str | None) -> list[str]:
    """The dry run's nightly rows: what N recipes of this shape cost on one node, per recipe."""
    if not fresh_instance:  # a node that stays: nothing to share
        return []
    est = estimate(recipe, fresh_instance=True)
    first = "warm store" if store else "cold node"
    parts = []
    for n in NIGHTLY_SIZES:
        x = nightly_split(est, n, first)
        parts.append(
            f"N={n}: {x['total']:.2f} = {x['shared']:.3f} shared + {x['first']:.2f} first + "
            f"{n - 1} x {x['each_next']:.2f}, {x['per_recipe']:.2f} per recipe"
        )
    return [
        f"#   nightly on one node ({first} first, then warm cache; provisioning and one release "
        "shared): " + "; ".join(parts) + f" (vs {est.total(first):.2f} alone)"
    ]


def overhead_line(est: Estimate, *, fresh_instance: bool) -> str:
    """Our own overhead with a warm store against GOAL_OVERHEAD_HOURS: everything but provisioning
    and the recipe's own ray+train and window, as the estimate above builds it; on a launch for
    both ways a fresh node gets its image: pulled, or present on a baked AMI."""
    provision = FIGURES["provision"].value if fresh_instance else 0.0

    def part(scenario: str) -> tuple[float, str, str]:
        own = est.overhead(scenario, provision=provision)
        minutes = own * 3600 / max(1, est.gpus) / 60
        verdict = "met" if own <= GOAL_OVERHEAD_HOURS else "NOT met"
        return own, f"{own:.2f} GPU-hours ({minutes:.1f} node-minutes)", verdict

    _, pulled, verdict = part("warm store")
    line = (
        f"#   our overhead, warm store (all but provisioning, ray+train and window): {pulled}; "
        f"goal {GOAL_OVERHEAD_HOURS:.2f}: {verdict} (the wall time follows "
        f"{est.critical['warm store']})"
    )
    if not fresh_instance:
        return line
    _, baked, verdict = part(BAKED)
    return (
        f"{line}; from a baked AMI (`reproduce image bake`, `ami: baked`): {baked}; goal "
        f"{GOAL_OVERHEAD_HOURS:.2f}: {verdict} (the wall time follows {est.critical[BAKED]})"
    )


def likely_lines(
    recipe: Recipe,
    *,
    fresh_instance: bool,
    store: str | None,
    usd_per_hour: float | None,
    max_usd: float | None = None,
    runs: int = 1,
    baked: bool = False,
    ebs_mibs: int | None = None,
) -> list[str]:
    """What this run will likely cost, all stages included (the claim counts none of the
    provisioning and downloads), and a warning when a --max-usd budget is under it: a budget
    that stops the run before its window is measured buys nothing. Lines without the '# '.
    `runs`: K measured runs, the training counted K times."""
    est = estimate(recipe, fresh_instance=fresh_instance, runs=runs, ebs_mibs=ebs_mibs)
    cold, warm_store, warm_cache = (est.total(s) for s in SCENARIOS)

    def cost(hours: float) -> str:
        if usd_per_hour is None:
            return f"{hours:.2f} GPU-hours"
        return f"{hours:.2f} GPU-hours (${hours / recipe.gpus_per_node * usd_per_hour:.2f})"

    if fresh_instance and store and baked:
        main = est.total(BAKED)
        text = (
            f"{cost(main)} on a new node from the baked AMI with the asset store warm, "
            f"{cost(warm_store)} if the image is pulled"
        )
    elif fresh_instance and store:
        main = warm_store
        text = (
            f"{cost(warm_store)} on a new node with the asset store warm, {cost(cold)} if it is not"
        )
    elif fresh_instance:
        main = cold
        text = (
            f"{cost(cold)} on a new node (provisioning, the image, the assets from the Hub and "
            f"the conversion); with a warm asset store {cost(warm_store)}"
        )
    else:
        main = cold
        text = f"{cost(warm_cache)} if the node kept its cache and image, up to {cost(cold)} cold"
    lines = [f"likely    {text}  [estimate by stage: launcher/cost/estimate.py, the dry run]"]
    if max_usd is not None and usd_per_hour is not None:
        likely_usd = main / recipe.gpus_per_node * usd_per_hour
        if max_usd < likely_usd:
            lines.append(
                f"WARNING   --max-usd {max_usd:g} is under this estimate (${likely_usd:.2f}): the "
                "budget may stop the run before its window is measured"
            )
    return lines


def cache_bytes(recipe: Recipe) -> float:
    """What a cold node writes to its cache before training: the checkpoint, its conversion, the
    rows and the dataset (the image is docker's, elsewhere)."""
    ckpt = checkpoint_bytes(recipe)[0] or 0.0
    rows = float(recipe.dataset.build.parquet_bytes or 0)
    converted = ckpt * FIGURES["converted_ratio"].value
    return ckpt + converted + rows + FIGURES["dataset_bytes"].value


def disk_lines(recipe: Recipe, disk_min_gb: float | None) -> list[str]:
    """The dry run's line on the cache's disk: what a cold node writes there, against the free
    space the host preflight requires (the profile's preflight.disk_min_gb). A requirement under
    it is called out: the preflight would pass a disk the downloads then fill, hours in."""
    need = cache_bytes(recipe) / GB
    source = checkpoint_bytes(recipe)[1]
    bound = " at least" if "lower bound" in source else ""
    lines = [
        f"#   disk: a cold node writes{bound} {need:.0f} GB to its cache (the checkpoint, its "
        "conversion, the rows and the dataset)"
        + (f"; the preflight requires {disk_min_gb:g} GB free" if disk_min_gb is not None else "")
    ]
    if disk_min_gb is not None and disk_min_gb < need:
        lines.append(
            f"#   WARNING the profile's preflight.disk_min_gb {disk_min_gb:g} is under the "
            f"{need:.0f} GB a cold node writes: raise it, or the downloads may fill the disk"
        )
    return lines


def target_args(profile: Profile, price: Price | None) -> dict[str, Any]:
    """What the estimate needs of a target: whether the run launches its node (provisioning is
    paid), the profile's asset store, and the node's price (launcher.catalog.Price or None)."""
    return {
        "fresh_instance": isinstance(profile, AwsProfile) and not profile.instance_id,
        "store": profile.assets.store,
        "usd_per_hour": price.value if price is not None else None,
        "baked": isinstance(profile, AwsProfile) and profile.ami == "baked",
        "ebs_mibs": profile.volume_initialization_rate if isinstance(profile, AwsProfile) else None,
    }
