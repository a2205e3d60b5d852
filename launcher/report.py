"""report.md and plots for one measured run: the recipe's claim and the reproduction side by side.

Why this shape: the recipe's card shows one figure per line; the report puts the claimed and
the measured figure on the same line with the signed difference, then the verdict and every
reason, then where the GPU-hours went, then the plots (loss and step time per step, window
shaded) that let a reader see *why* a figure moved. matplotlib is imported here only, lazily,
with the Agg backend, so neither the CLI's start-up nor a headless node pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from launcher.measure import STD_KIND
from launcher.parse.miles import StepRecord

_FIGURES = (
    # key, label, digits
    ("tokens_per_s_per_gpu", "tokens/s per GPU", 2),
    ("usd_per_million_tokens", "$ per 1M tokens", 3),
    ("mfu", "MFU", 4),
    ("step_time_cv_percent", "step-time CV %", 2),
    ("gpu_hours", "GPU-hours", 2),
)


def _fmt(value, digits: int) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return f"{value:,.{digits}f}"
    return str(value)


def _peak(flops) -> str:
    return f"{flops / 1e12:g} TFLOP/s" if flops else "unknown"


def _diff(measured, claimed) -> str:
    if (
        not isinstance(measured, (int, float))
        or not isinstance(claimed, (int, float))
        or claimed == 0
    ):
        return ""
    if not math.isfinite(measured):
        return ""
    return f"{100.0 * (measured - claimed) / claimed:+.2f}%"


def plot_run(
    plots_dir: Path,
    records: Sequence[StepRecord],
    window: tuple[int, int],
    claimed_step_time: float | None = None,
) -> list[Path]:
    """loss.png and step_time.png, window shaded. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
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
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label="reproduction")
            bad = [(x, 0.0) for x, y in points if not math.isfinite(y)]
            if bad:
                ax.scatter(
                    [b[0] for b in bad], [0.0] * len(bad), color="red", marker="x", label="NaN/inf"
                )
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
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = plots_dir / name
        fig.savefig(path)
        plt.close(fig)
        out.append(path)
    return out


def _clip_warmup(ax, points, window: tuple[int, int]) -> None:
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


def render_markdown(
    result,
    verdict,
    recipe_raw: dict,
    records: Sequence[StepRecord],
    convergence=None,
    plots: Sequence[str] = (),
) -> str:
    """The report's text (pure: no I/O)."""
    claim = recipe_raw.get("result") or {}
    measured = result.to_dict()
    lines = [
        f"# Reproduction of {recipe_raw.get('model', '?')} on {(recipe_raw.get('gpu') or {}).get('count', '?')} x "
        f"{(recipe_raw.get('gpu') or {}).get('type', '?')} ({(recipe_raw.get('gpu') or {}).get('instance', '?')})",
        "",
        f"**Verdict: {verdict.status}**"
        + (
            f" ({verdict.difference_percent:+.2f}% tokens/s per GPU against the claim)"
            if verdict.difference_percent is not None
            else ""
        ),
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
            f"| {label} | {_fmt(claim.get(key), digits)} | {_fmt(measured.get(key), digits)} | "
            f"{_diff(measured.get(key), claim.get(key))} |"
        )
    win = claim.get("window")
    lines.append(
        f"| window | {win} | {list(result.window)} ({len(result.window_steps_present)} steps with a time) | |"
    )
    lines.append(f"| window tokens | {claim.get('window_tokens')} | {result.window_tokens} | |")
    lines.append(
        f"| steps per run | {claim.get('steps_per_run')} | {(result.last_step + 1) if result.last_step is not None else 0} | |"
    )
    lines.append("")
    lines += [
        "## How the figures were computed",
        "",
        f"- tokens/s per GPU = window tokens / sum of `perf/step_time` over the window / {result.gpus} GPUs; "
        f"{result.tokens_per_step:,} tokens per step (global_batch x row_tokens).",
        f"- step-time CV = {STD_KIND} standard deviation / mean; mean step time "
        f"{_fmt(result.mean_step_time_s, 3)} s.",
        f"- MFU = {measured['mfu_formula']}; N = {result.active_params}, peak = "
        f"{_peak(result.peak_flops)} ({result.peak_source}).",
        "- $ per 1M tokens = hourly price / (tokens/s per GPU x GPUs x 3600 / 1e6); price "
        + (f"${result.price.value}/h, {result.price.source}." if result.price else "unknown."),
        f"- GPU-hours: {result.gpu_hours_source}.",
        "",
    ]
    if result.gpu_hours_by_stage:
        lines += ["## Where the GPU-hours went", "", "| stage | GPU-hours |", "|---|---:|"]
        for name, hours in result.gpu_hours_by_stage.items():
            lines.append(f"| {name} | {hours:.3f} |")
        if result.window_gpu_hours is not None:
            lines.append(f"| (the measured window itself) | {result.window_gpu_hours:.3f} |")
        lines.append("")
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    if convergence is not None:
        lines += (
            [
                "## Convergence (loss curves)",
                "",
                f"**{'pass' if convergence.passed else 'fail'}**: correlation {_fmt(convergence.correlation, 7)}, "
                f"final loss difference {_fmt(convergence.final_loss_difference, 6)}, "
                f"{convergence.pointwise_failures} pointwise failure(s) over {convergence.steps_compared} steps, "
                f"outlier fraction {_fmt(convergence.outlier_fraction, 3)}.",
                "",
            ]
            + [f"- {r}" for r in convergence.reasons]
            + [""]
        )
    stats = result.parse_stats or {}
    if stats:
        lines += [
            "## Log parsing",
            "",
            f"{stats.get('lines', 0):,} lines; {len(records)} steps; {stats.get('unparseable', 0)} unparseable metric "
            f"line(s); {stats.get('truncated', 0)} truncated; {stats.get('duplicates', 0)} duplicate(s); "
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
            f"| {r.step}{mark} | {_fmt(r.loss, 4)} | {_fmt(r.grad_norm, 3)} | {_fmt(r.lr, 8)} | "
            f"{_fmt(r.step_time, 3)} | {_fmt(r.tokens, 0)} |"
        )
    lines += ["", "(* = in the measured window)", ""]
    return "\n".join(lines)


def write_report(
    run_dir: Path,
    result,
    verdict,
    recipe_raw: dict,
    records: Sequence[StepRecord],
    convergence=None,
    *,
    plots: bool = True,
) -> Path:
    """Write run_dir/report.md and run_dir/plots/*.png; return the report's path."""
    run_dir = Path(run_dir)
    names: list[str] = []
    if plots:
        claim = recipe_raw.get("result") or {}
        claimed_step_time = None
        tps = claim.get("tokens_per_s_per_gpu")
        if isinstance(tps, (int, float)) and tps > 0:
            claimed_step_time = result.tokens_per_step / tps / result.gpus
        written = plot_run(run_dir / "plots", records, result.window, claimed_step_time)
        names = [str(p.relative_to(run_dir)) for p in written]
    path = run_dir / "report.md"
    path.write_text(render_markdown(result, verdict, recipe_raw, records, convergence, names))
    return path


def render_summary(result, verdict) -> str:
    """The terminal text of `reproduce measure`: every figure, how it was made, the verdict."""
    m, c = result.to_dict(), verdict.claimed
    rows = [f"{'figure':<24}{'claimed':>14}{'reproduced':>14}{'difference':>12}"]
    for key, label, digits in _FIGURES:
        rows.append(
            f"{label:<24}{_fmt(c.get(key), digits):>14}{_fmt(m.get(key), digits):>14}"
            f"{_diff(m.get(key), c.get(key)):>12}"
        )
    price = f"${result.price.value}/h ({result.price.source})" if result.price else "none known"
    rows += [
        f"window                  steps {result.window[0]}-{result.window[1]}: "
        f"{len(result.window_steps_present)} with a step time, {result.window_tokens:,} tokens",
        f"steps parsed            {result.steps_parsed} (last step {result.last_step})",
        f"step-time std           {STD_KIND}",
        f"MFU                     {m['mfu_formula']}, peak {_peak(result.peak_flops)}",
        f"price used              {price}",
        f"GPU-hours               {result.gpu_hours_source}",
    ]
    stats = result.parse_stats or {}
    if stats:
        rows.append(
            f"log                     {stats.get('lines', 0):,} lines, {stats.get('unparseable', 0)} unparseable, "
            f"{stats.get('truncated', 0)} truncated, {stats.get('duplicates', 0)} duplicates"
        )
    rows += [f"note                    {n}" for n in result.notes]
    head = f"verdict: {verdict.status.upper()}"
    if verdict.difference_percent is not None:
        head += f" ({verdict.difference_percent:+.2f}% tokens/s per GPU)"
    rows += ["", head] + [f"  - {r}" for r in verdict.reasons]
    return "\n".join(rows)


def render_convergence(conv) -> str:
    """The terminal text of `reproduce compare`: every figure of the check."""
    t = conv.thresholds
    rows = [
        f"convergence: {'PASS' if conv.passed else 'FAIL'}",
        f"  steps compared         {conv.steps_compared} (first {conv.steps_skipped} skipped as warm-up)",
        f"  correlation            {_fmt(conv.correlation, 7)} (min {t.get('min_correlation')})",
        f"  final loss difference  {_fmt(conv.final_loss_difference, 6)} (max {t.get('max_final_loss_difference')})",
        f"  pointwise failures     {conv.pointwise_failures} ({_fmt(conv.pointwise_failure_fraction, 3)}; "
        f"max {t.get('max_pointwise_failure_fraction')})",
        f"  outliers               {conv.outliers} ({_fmt(conv.outlier_fraction, 3)}; max {t.get('max_outlier_fraction')})",
        f"  missing / NaN steps    {len(conv.missing_steps)} / {len(conv.nan_steps)}",
    ]
    rows += [f"  - {r}" for r in conv.reasons]
    return "\n".join(rows)
