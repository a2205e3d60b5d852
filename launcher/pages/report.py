"""Rendering, and only rendering: figures, verdicts and histories as text, markdown and PNG bytes.

Why this shape: the recipe's card shows one figure per line; the report puts the claimed and
the measured figure on the same line with the signed difference, then the verdict and every
reason, then where the GPU-hours went, then the plots (loss and step time per step, window
shaded) that let a reader see *why* a figure moved. Nothing here computes a figure or touches a
file: launcher/results/evaluate.py writes what this renders, the command layer prints it. matplotlib
is
imported here only, lazily, with the Agg backend, so neither the CLI's start-up nor a headless
node pays for it.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.judge.assurance import shown
from launcher.judge.measure import STD_KIND
from launcher.judge.parse.miles import StepRecord
from launcher.judge.split import PARALLEL_PART
from launcher.judge.verdict import JUDGED

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from launcher.inputs.recipe import Recipe
    from launcher.judge.convergence import ConvergenceResult
    from launcher.judge.measure import Result
    from launcher.judge.verdict import Verdict
    from launcher.records.history import Assessment, RunRow

_FIGURES = (
    # key, label, digits
    ("tokens_per_s_per_gpu", "tokens/s per GPU", 2),
    ("usd_per_million_tokens", "$ per 1M tokens", 3),
    ("mfu", "MFU", 4),
    ("step_time_cv_percent", "step-time CV %", 2),
    ("gpu_hours", "GPU-hours", 2),
)
PLOTS = ("loss.png", "step_time.png")


def _or(value: object) -> str:
    return "?" if value is None else str(value)


def fmt(value: object, spec: str | int = ",.2f", *, missing: str = "n/a", suffix: str = "") -> str:
    """One figure for people: a float by `spec` (a format spec, or a number of decimals with
    thousands separators), NaN/inf as nan/inf, None as `missing`, any other value (an int as
    logged, a list) as written."""
    if value is None:
        return missing
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return f"{value:{f',.{spec}f' if isinstance(spec, int) else spec}}{suffix}"
    return f"{value}{suffix}"


def _peak(flops: float | None) -> str:
    return f"{flops / 1e12:g} TFLOP/s" if flops else "unknown"


def _assurance_lines(verdict: Verdict, label: str) -> list[str]:
    """How strong the verdict's evidence is (launcher/judge/assurance.py), one line."""
    a = verdict.assurance
    return [f"{label}{a.level}: {a.why}"] if a is not None else [f"{label}not recorded"]


def _diff(measured: object, claimed: object) -> str:
    if (
        not isinstance(measured, (int, float))
        or not isinstance(claimed, (int, float))
        or claimed == 0
    ):
        return ""
    if not math.isfinite(measured):
        return ""
    return f"{100.0 * (measured - claimed) / claimed:+.2f}%"


# --------------------------------------------------------------------------------------------
# Plots


def claimed_step_time(result: Result, recipe: Recipe) -> float | None:
    """The mean step time the claim implies (drawn beside the measured ones), or None."""
    tps = recipe.claim.tokens_per_s_per_gpu
    if tps is not None and tps > 0:
        return result.tokens_per_step / tps / result.gpus
    return None


def render_plots(
    records: Sequence[StepRecord],
    window: tuple[int, int],
    claimed_step_time: float | None = None,
) -> dict[str, bytes]:
    """loss.png and step_time.png (window shaded), as PNG bytes by file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out: dict[str, bytes] = {}
    series = (
        ("loss.png", "train/loss", [(r.step, r.loss) for r in records if r.loss is not None], None),
        (
            "step_time.png",
            "step time (s)",
            [(r.step, r.step_time) for r in records if r.step_time is not None],
            claimed_step_time,
        ),
    )
    for name, ylabel, points, reference in series:
        fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label="reproduction")
            bad = [x for x, y in points if not math.isfinite(y)]
            if bad:
                ax.scatter(bad, [0.0] * len(bad), color="red", marker="x", label="NaN/inf")
        ax.axvspan(
            window[0] - 0.5,
            window[1] + 0.5,
            color="tab:green",
            alpha=0.12,
            label=f"window {window[0]}-{window[1]}",
        )
        if reference:
            ax.axhline(
                reference,
                color="tab:orange",
                linestyle="--",
                linewidth=1,
                label=f"claimed mean {reference:.2f} s",
            )
        if name == "step_time.png":  # do not let start-up flatten the window
            _clip_warmup(ax, points, window)
        locator = ax.xaxis.get_major_locator()
        if isinstance(locator, MaxNLocator):  # the default AutoLocator is one: whole steps only
            locator.set_params(integer=True)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png")
        plt.close(fig)
        out[name] = png.getvalue()
    return out


def _clip_warmup(ax: Axes, points: list[tuple[int, float]], window: tuple[int, int]) -> None:
    """Keep the window readable: a start-up step many times slower would flatten it. Values off
    the scale are written at the top edge instead."""
    inside = [y for x, y in points if window[0] <= x <= window[1] and math.isfinite(y)]
    if not inside:
        return
    lo, hi = min(inside), max(inside)
    pad = max((hi - lo) * 0.5, abs(hi) * 0.05, 1e-9)
    top = hi + pad
    off = [(x, y) for x, y in points if math.isfinite(y) and y > top + pad]
    if not off:
        return
    ax.set_ylim(min(lo - pad, min(y for _, y in points if math.isfinite(y))), top + pad)
    for x, y in off:
        ax.annotate(
            f"{y:.3g}",
            (x, top + pad),
            xytext=(0, -10),
            textcoords="offset points",
            ha="center",
            fontsize=7,
            color="tab:red",
        )


# --------------------------------------------------------------------------------------------
# report.md


def render_markdown(
    result: Result,
    verdict: Verdict,
    recipe: Recipe,
    records: Sequence[StepRecord],
    convergence: ConvergenceResult | None = None,
    plots: Sequence[str] = (),
) -> str:
    """The report's text; `plots` are the image paths relative to the report."""
    claim, gpu = recipe.claim, recipe.hardware
    measured = result.to_dict()
    difference = (
        f" ({verdict.difference_percent:+.2f}% tokens/s per GPU against the claim)"
        if verdict.difference_percent is not None
        else ""
    )
    lines = [
        f"# Reproduction of {recipe.model} on {_or(gpu.count)} x "
        f"{_or(gpu.type)} ({_or(gpu.instance)})",
        "",
        f"**Verdict: {verdict.status}**{difference}",
        "",
        *_assurance_lines(verdict, "Assurance: "),
        "",
    ]
    lines += [f"- {r}" for r in verdict.reasons] + [""]
    lines += [
        "## Claim and reproduction",
        "",
        "| figure | claimed | reproduced | difference |",
        "|---|---:|---:|---:|",
    ]
    for key, label, digits in _FIGURES:
        lines.append(
            f"| {label} | {fmt(claim.figure(key), digits)} | {fmt(measured.get(key), digits)} | "
            f"{_diff(measured.get(key), claim.figure(key)) if verdict.status in JUDGED else '-'} |"
        )
    steps_run = (result.last_step + 1) if result.last_step is not None else 0
    lines += [
        f"| window | {list(claim.window) if claim.window else None} | {list(result.window)} "
        f"({len(result.window_steps_present)} steps with a time) | |",
        f"| window tokens | {claim.window_tokens} | {result.window_tokens} | |",
        f"| steps per run | {claim.steps_per_run} | {steps_run} | |",
        "",
    ]
    lines += measured_runs_lines(result.run_summary)
    price = f"${result.price.value}/h, {result.price.describe()}." if result.price else "unknown."
    lines += [
        "## How the figures were computed",
        "",
        "- tokens/s per GPU = window tokens / sum of `perf/step_time` over the window / "
        f"{result.gpus} GPUs; {result.tokens_per_step:,} tokens per step "
        "(global_batch x row_tokens).",
        f"- step-time CV = {STD_KIND} standard deviation / mean; mean step time "
        f"{fmt(result.mean_step_time_s, 3)} s.",
        f"- MFU = {measured['mfu_formula']}; N = {result.active_params}, peak = "
        f"{_peak(result.peak_flops)} ({result.peak_source}).",
        f"- {megatron_line(result)}",
        "- $ per 1M tokens = hourly price / (tokens/s per GPU x GPUs x 3600 / 1e6); price " + price,
        f"- GPU-hours: {result.gpu_hours_source}.",
        "",
    ]
    lines += gpu_hours_table(result)
    ev = result.evidence
    lines += ["## Evidence: is the log a run of this recipe?", ""]
    lines += [f"- disagrees: {d.detail}" for d in ev.disagreements]
    lines += [f"- checked: {c}" for c in ev.checked]
    lines += [f"- not checked: {n}" for n in ev.not_checked] + [""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    if convergence is not None:
        c = convergence
        lines += [
            "## Convergence (loss curves)",
            "",
            f"**{'pass' if c.passed else 'fail'}**: correlation {fmt(c.correlation, 7)}, "
            f"final loss difference {fmt(c.final_loss_difference, 6)}, "
            f"{c.pointwise_failures} pointwise failure(s) over {c.steps_compared} steps, "
            f"outlier fraction {fmt(c.outlier_fraction, 3)}.",
            "",
        ]
        lines += [f"- {r}" for r in c.reasons] + [""]
    stats = result.parse_stats or {}
    if stats:
        lines += [
            "## Log parsing",
            "",
            f"{stats.get('lines', 0):,} lines; {len(records)} steps; "
            f"{stats.get('unparseable', 0)} unparseable metric line(s); "
            f"{stats.get('truncated', 0)} truncated; {stats.get('duplicates', 0)} duplicate(s); "
            f"{stats.get('repeated', 0)} `[repeated Nx across cluster]` line(s).",
            "",
        ]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    lines += [
        "## Steps",
        "",
        "| step | loss | grad norm | lr | step time (s) | tokens |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        mark = " *" if result.window[0] <= r.step <= result.window[1] else ""
        lines.append(
            f"| {r.step}{mark} | {fmt(r.loss, 4)} | {fmt(r.grad_norm, 3)} | {fmt(r.lr, 8)} | "
            f"{fmt(r.step_time, 3)} | {fmt(r.tokens, 0)} |"
        )
    lines += ["", "(* = in the measured window)", ""]
    return "\n".join(lines)


def measured_runs_lines(summary: dict[str, Any] | None) -> list[str]:
    """The section of a mean of K measured runs (launcher/judge/aggregate.py): each run, its own
    report, the spread, how each figure aggregates. Nothing for one run."""
    if not summary:
        return []
    each = summary.get("each") or []
    lines = [
        f"## Measured runs: {summary.get('ran')} of {summary.get('measured')} "
        f"(the claim: a mean of {summary.get('claimed')})",
        "",
        "| run | status | tokens/s/GPU | vs claim | step-time CV % | MFU | $/1M tokens | "
        "GPU-hours (its training) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in each:
        lines.append(
            f"| [{e.get('run')}]({e.get('dir')}/report.md) | {e.get('status')} | "
            f"{fmt(e.get('tokens_per_s_per_gpu'))} | "
            f"{fmt(e.get('difference_percent'), '+.2f', suffix='%')} | "
            f"{fmt(e.get('step_time_cv_percent'))} | {fmt(e.get('mfu'), 4)} | "
            f"{fmt(e.get('usd_per_million_tokens'), 3)} | {fmt(e.get('gpu_hours'), 3)} |"
        )
    spread = summary.get("spread") or {}
    if summary.get("judged_on_mean"):
        lines += [
            "",
            f"Spread of tokens/s per GPU over the runs: min {fmt(spread.get('min'))}, max "
            f"{fmt(spread.get('max'))}, population stdev {fmt(spread.get('stdev'))} "
            f"(CV {fmt(spread.get('cv_percent'))}%).",
        ]
    else:
        lines += ["", "Not every run is whole: no mean is the reproduction's figure."]
    lines += ["", "How each figure of the mean aggregates the runs:", ""]
    lines += [f"- {k}: {v}" for k, v in (summary.get("aggregation") or {}).items()]
    return [*lines, ""]


# --------------------------------------------------------------------------------------------
# Terminal text of `reproduce measure` and `reproduce compare`


def megatron_line(result: Result) -> str:
    """Megatron's FLOP count of the same run, named as such, beside the recipe's 6 x N x tokens."""
    mg = result.megatron()
    if mg["mfu"] is None:
        return f"Megatron's count: not computed ({mg['not_computed'] or 'no throughput'})"
    ratio = (
        f", {mg['flops_per_token'] / mg['recipe_flops_per_token']:.2f} x the recipe's 6 x N"
        if mg["recipe_flops_per_token"]
        else ""
    )
    return (
        f"Megatron's count: MFU {mg['mfu']:.4f} from {mg['flops_per_token']:.4g} FLOP per token"
        f"{ratio} ({mg['formula']})"
    )


def render_summary(result: Result, verdict: Verdict) -> str:
    """Every figure, how it was made, the verdict."""
    m, c = result.to_dict(), verdict.claimed
    rows = [f"{'figure':<24}{'claimed':>14}{'reproduced':>14}{'difference':>12}"]
    for key, label, digits in _FIGURES:
        diff = _diff(m.get(key), c.get(key)) if verdict.status in JUDGED else "-"
        rows.append(
            f"{label:<24}{fmt(c.get(key), digits):>14}{fmt(m.get(key), digits):>14}{diff:>12}"
        )
    price = f"${result.price.value}/h ({result.price.describe()})" if result.price else "none known"
    rows += [
        f"window                  steps {result.window[0]}-{result.window[1]}: "
        f"{len(result.window_steps_present)} with a step time, {result.window_tokens:,} tokens",
        f"steps parsed            {result.steps_parsed} (last step {result.last_step})",
        f"step-time std           {STD_KIND}",
        f"MFU                     {m['mfu_formula']}, peak {_peak(result.peak_flops)}",
        f"Megatron's MFU          {megatron_line(result)}",
        f"price used              {price}",
        f"GPU-hours               {result.gpu_hours_source}",
    ]
    stats = result.parse_stats or {}
    if stats:
        rows.append(
            f"log                     {stats.get('lines', 0):,} lines, "
            f"{stats.get('unparseable', 0)} unparseable, {stats.get('truncated', 0)} truncated, "
            f"{stats.get('duplicates', 0)} duplicates"
        )
    rows += [f"note                    {n}" for n in result.notes]
    head = f"verdict: {verdict.status.upper()}"
    if verdict.difference_percent is not None:
        head += f" ({verdict.difference_percent:+.2f}% tokens/s per GPU)"
    rows += ["", head, *_assurance_lines(verdict, "assurance: ")]
    rows += [f"  - {r}" for r in verdict.reasons]
    return "\n".join(rows)


def render_convergence(conv: ConvergenceResult) -> str:
    """Every figure of the convergence check, with its threshold."""
    t = conv.thresholds
    rows = [
        f"convergence: {'PASS' if conv.passed else 'FAIL'}",
        f"  steps compared         {conv.steps_compared} "
        f"(first {conv.steps_skipped} skipped as warm-up)",
        f"  correlation            {fmt(conv.correlation, 7)} (min {t.get('min_correlation')})",
        f"  final loss difference  {fmt(conv.final_loss_difference, 6)} "
        f"(max {t.get('max_final_loss_difference')})",
        f"  pointwise failures     {conv.pointwise_failures} "
        f"({fmt(conv.pointwise_failure_fraction, 3)}; "
        f"max {t.get('max_pointwise_failure_fraction')})",
        f"  outliers               {conv.outliers} ({fmt(conv.outlier_fraction, 3)}; "
        f"max {t.get('max_outlier_fraction')})",
        f"  missing / NaN steps    {len(conv.missing_steps)} / {len(conv.nan_steps)}",
    ]
    rows += [f"  - {r}" for r in conv.reasons]
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Tables and the history of a recipe (`reproduce history`, `reproduce nightly`)


def text_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A plain aligned table (no colour: it goes into cron mail and logs)."""
    rows = [list(r) for r in body]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=False)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows
    ]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in body]
    return "\n".join(lines)


def utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def trend_lines(assessment: Assessment) -> list[str]:
    """The trend a run was judged against, and whether it is a regression, with every reason."""
    t = assessment.trend
    if t.skipped:
        trend = f"trend: {t.skipped}"
    else:
        pts = ", ".join(f"{v:,.1f}" for _, v in t.points)
        trend = (
            f"trend: median {t.median:,.2f} tokens/s/GPU of the last {len(t.points)} good runs "
            f"[{pts}]; spread {t.spread_percent:.2f}% (1.4826 x MAD / median); "
            f"threshold -{t.threshold_percent:.2f}%"
        )
    if assessment.regression:
        verdict = "REGRESSION"
    elif assessment.suspect:
        verdict = "SUSPECT (a first miss: a regression when the next judged run misses too)"
    else:
        verdict = "no regression" if assessment.judged else "not judged"
    return [
        trend,
        f"latest run {assessment.run_id}: {verdict}",
        *(f"  {r}" for r in assessment.reasons),
    ]


def history_report(slug: str, rows: Sequence[RunRow], assessment: Assessment | None) -> str:
    """The runs of a recipe, one a line, then the trend and the latest run's assessment."""
    header = [
        "run id",
        "started (UTC)",
        "cluster",
        "state",
        "verdict",
        "tokens/s/GPU",
        "vs claim",
        "$/1M",
        "image",
    ]
    body = [
        [
            r.run_id,
            utc(r.started_at),
            r.cluster_name or "-",
            r.state or "-",
            shown(r.verdict, r.assurance) if r.verdict else "-",
            fmt(r.tokens_per_s_per_gpu, missing="-")
            + (f" (mean of {r.measured_runs})" if r.measured_runs else ""),
            fmt(r.difference_percent, "+.2f", missing="-", suffix="%"),
            fmt(r.usd_per_million_tokens, ".3f", missing="-"),
            _short_image(r.image),
        ]
        for r in rows
    ]
    out = [f"history of {slug}: {len(rows)} run(s) shown", text_table(header, body)]
    if assessment is not None:
        out += trend_lines(assessment)
    return "\n".join(out) + "\n"


def _short_image(image: str | None) -> str:
    if not image:
        return "-"
    repo, _, digest = image.partition("@")
    return f"{repo.rsplit('/', 1)[-1]}@{digest[:19]}" if digest else repo


# What each part of the GPU-hour split is (measure.stage_split); a stage not named here is one of
# the node script's own, shown by its name.
SPLIT_LABELS = {
    "acquire": "provisioning, boot, staging",
    "preflight": "host checks",
    "resolve": "where each asset comes from",
    "image": "image pull",
    "preflight-gpu": "GPU benchmarks",
    "stack": "software versions",
    "rows": "the training rows (fetched or built, checked)",
    "assets": "the checkpoint",
    "convert": "checkpoint conversion (GPUs)",
    "ray": "Ray start",
    "train": "training outside the window (start-up, other steps)",
    "window": "the measured window's steps",
    "push": "uploads to the asset store finishing",
    "between": "between stages",
    "collect": "collecting the results",
    "release": "releasing the node(s)",
}


def _what(part: str) -> str:
    if part.startswith(PARALLEL_PART):
        return "stages that ran at once (wall time)"
    return SPLIT_LABELS.get(part, "")


def gpu_hours_table(result: Result) -> list[str]:
    """report.md's "Where the GPU-hours went": each part of the run, its minutes, its GPU-hours
    and its share of the total (the parts add up to the total)."""
    split = result.gpu_hours_by_stage
    if not split:
        return []
    total = sum(split.values())
    lines = [
        "## Where the GPU-hours went",
        "",
        "| stage | what | minutes | GPU-hours | share |",
        "|---|---|---:|---:|---:|",
    ]
    for name, hours in split.items():
        minutes = 60.0 * hours / result.gpus if result.gpus else float("nan")
        share = f"{100.0 * hours / total:.1f}%" if total > 0 else "-"
        what = _what(name)
        lines.append(f"| {name} | {what} | {minutes:.1f} | {hours:.3f} | {share} |")
    minutes = 60.0 * total / result.gpus if result.gpus else float("nan")
    lines.append(f"| **total** | acquired to released | {minutes:.1f} | {total:.3f} | 100% |")
    if "window" not in split and result.window_gpu_hours is not None:
        lines.append(f"\nThe measured window itself: {result.window_gpu_hours:.3f} GPU-hours.")
    for part, work in result.gpu_hours_overlapped.items():
        own = ", ".join(
            f"{name} {60.0 * hours / result.gpus if result.gpus else float('nan'):.1f} min"
            for name, hours in work.items()
        )
        lines.append(
            f"\n`{part}` ran at once: {own} (each stage's own time; the part counts the node's "
            "wall time once)."
        )
    return [*lines, ""]
