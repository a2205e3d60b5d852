"""report.html: one run beside the published card it reproduces, in one self-contained file.

Why this order: a recipe's reader first wants the answer (the verdict and why), then the card's
figures next to the reproduced ones, then the pictures that show why a figure moved (step time and
loss per step), then where the money went and what exactly ran (image, stack, assets, price,
peak). Everything comes from the run directory's own files (launcher/pages/rundata.py), so a page
can be made again offline from a copied run directory, and a file the run never wrote makes its
section say "not recorded" instead of failing the page. docs/report.md describes the page.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.clusters import trust
from launcher.pages import run_sections as rs
from launcher.pages import svg
from launcher.pages.attestation import attestation_html, read_attestation
from launcher.pages.html import (
    badge,
    esc,
    not_recorded,
    num,
    number,
    page,
    signed,
    status_of,
    table,
)
from launcher.pages.provenance import provenance
from launcher.pages.rundata import RUN_FILES, RunFiles, read_run_dir
from launcher.records.atomic import write_atomic
from launcher.records.rundir import Files

PAGE_NAME = Files.REPORT_HTML
# Verdicts whose throughput was compared with the card (the others are not judged on it).
JUDGED = ("reproduced", "faster", "slower", "unstable")

# The card's figures: result key, label, how the page writes a value of result.yaml.
FIGURES: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("tokens_per_s_per_gpu", "Tokens/s per GPU", lambda v: num(v, 2)),
    ("usd_per_million_tokens", "$ / 1M tokens", lambda v: _dollars(v)),
    ("mfu", "MFU", lambda v: num(_times(v, 100), 2, suffix="%")),
    ("step_time_cv_percent", "Step-time CV", lambda v: num(v, 2, suffix="%")),
    ("gpu_hours", "GPU-hours", lambda v: num(v, 2)),
)


def _times(v: object, k: float) -> float | None:
    n = number(v)
    return None if n is None else n * k


def _dollars(v: object) -> str:
    n = number(v)
    return "—" if n is None else f"${n:,.2f}"


def write_run_page(
    run_dir: Path,
    out: Path | None = None,
    *,
    verified: dict[str, Any] | None = None,
    also: Path | None = None,
) -> Path:
    """Render the run directory's page and write it (run_dir/report.html unless `out`).
    `verified` ({"verified": bool, "error": str}): what `reproduce attest` just checked.

    `also`: a directory whose files stand in for those `run_dir` lacks (`measure RUN_DIR --out
    DIR`: the measurement in DIR, the run's own record in the run directory)."""
    run_dir = Path(run_dir)
    target = Path(out) if out is not None else run_dir / PAGE_NAME
    info = read_attestation(run_dir)
    if info is not None and verified is not None:
        info.update(verified)
    files = read_run_dir(run_dir)
    if also is not None:
        extra = read_run_dir(
            also, tuple(n for n in files.problems if files.problems[n] == "missing")
        )
        for name, value in extra.data.items():
            files.data[name] = value
            files.problems.pop(name, None)
    text = render_run_page(files, attestation=attestation_html(info, str(run_dir)))
    write_atomic(target, text)
    return target


def write_run_page_safely(run_dir: Path, warn: Callable[[str], Any] | None = None) -> Path | None:
    """write_run_page for the run path's exit: a page that cannot be written (a full disk, a
    removed directory) is a warning, never a change to the run's outcome or exit code."""
    try:
        return write_run_page(run_dir)
    except Exception as err:  # noqa: BLE001 - the run's own outcome matters more than its page
        if warn is not None:
            warn(f"warning: {Path(run_dir) / PAGE_NAME} was not written: {err}")
        return None


def render_run_page(files: RunFiles, attestation: str = "") -> str:
    """The whole page as one HTML string. Pure: the files were read before (`attestation`: the
    header's line from launcher/pages/attestation.py)."""
    ctx = rs.Context.of(files)
    parts = [
        rs.guard("verdict", "Verdict", _verdict, ctx),
        rs.guard("figures", "Published card vs this reproduction", _figures, ctx),
        rs.guard("plots", "Step time and loss", _plots, ctx),
        rs.guard("stages", "Where the GPU-hours went", rs.stages, ctx),
        rs.guard("convergence", "Convergence check", rs.convergence, ctx),
        rs.guard("provenance", "Provenance: what exactly ran", provenance, ctx),
        rs.guard("notes", "Notes and cross-checks", rs.notes, ctx),
        rs.guard("card", "The recipe card as written", rs.recipe_card, ctx),
        rs.guard("steps", "Every step", rs.steps_table, ctx),
    ]
    return page(
        f"{ctx.title} · reproduction {ctx.run_id}",
        _header(ctx) + attestation + _trust(ctx),
        "".join(parts),
        _footer(ctx),
    )


def _header(ctx: rs.Context) -> str:
    meta = [
        f"<span>recipe {esc(ctx.slug)}</span>",
        f"<span>run {esc(ctx.run_id)}</span>",
    ]
    if ctx.cluster:
        meta.append(f"<span>cluster {esc(ctx.cluster)}</span>")
    measured = ctx.result.get("measured")
    if measured:
        meta.append(f"<span>measured {esc(measured)}</span>")
    if ctx.card.author:
        meta.append(f"<span>card by {esc(ctx.card.author)}</span>")
    return (
        '<p class="kicker">reproduce · run report</p>'
        f"<h1>{esc(ctx.title)}</h1>"
        f'<p class="meta">{" ".join(meta)}</p>'
    )


def _kind(ctx: rs.Context) -> str | None:
    """The run's cluster kind as launcher/clusters/trust.py reads run.json and plan.json: known
    in every state, with a verdict or without one."""
    return trust.kind_of(ctx.files.mapping(Files.RUN), ctx.files.mapping(Files.PLAN))


def _trust(ctx: rs.Context) -> str:
    """The header's trust line, under the attestation's: on every page of a run whose cluster
    vouched for itself (the verdict's note is left out of its reasons: said once), else nothing."""
    line = trust.line(_kind(ctx))
    if line is None:
        return ""
    return f'<p class="meta" data-trust="unverified"><span class="no">{esc(line)}</span></p>'


def _verdict(ctx: rs.Context) -> str:
    v = ctx.verdict
    word = v.status if v.judged else None
    state = ctx.files.mapping(Files.STATUS)
    if not word:
        # Not judged: say what the run itself reports (failed at a stage, cancelled, ...).
        st = state.get("state")
        word = st if st in ("failed", "cancelled", "detached", "running") else None
    s = status_of(word)
    diff = v.difference_percent if v.judged else None
    slower, faster = ctx.tolerance
    band = f"tolerance \u2212{slower:g}% / +{faster:g}%"
    lines = []
    if not v.judged:
        lines.append(
            '<p class="what">Not judged: the run was not measured.</p>'
            f'<p class="dim" style="margin:0">{esc(ctx.files.why_not("verdict.json"))}.</p>'
        )
    elif word in JUDGED:
        what = (
            f"Tokens/s per GPU {esc(signed(diff))} against the published card ({esc(band)})"
            if diff is not None
            else "No throughput to compare with the card"
        )
        lines.append(f'<p class="what" data-difference="{esc(diff)}">{what}</p>')
        lines.append(f'<p class="dim" style="margin:0">{esc(s.meaning.capitalize())}.</p>')
    else:
        lines.append(f'<p class="what">{esc(s.meaning.capitalize())}.</p>')
        if diff is not None:
            lines.append(
                f'<p class="dim" style="margin:0" data-difference="{esc(diff)}">Throughput seen: '
                f"tokens/s per GPU {esc(signed(diff))} against the card, not counted.</p>"
            )
    error = v.error if v.judged else None
    if error:
        lines.append(
            f'<p class="what" data-error="1">The error that ended it: <code>{esc(error)}</code></p>'
        )
    reasons = list(v.reasons)
    reasons = trust.other_reasons(reasons, _kind(ctx))  # the header says it
    if reasons:
        lines.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>")
    if v.assurance_stated is not None:
        level, why = v.assurance_stated
        lines.append(
            f'<p class="dim" data-assurance="{esc(level)}">Assurance: '
            f"<b>{esc(level)}</b> — {esc(why)}</p>"
        )
    elif v.judged:
        lines.append('<p class="dim" data-assurance="">Assurance: not recorded.</p>')
    lines.append(rs.extra_verdict_fields(v.others))
    if state:
        detail = state.get("detail")
        code = state.get("exit_code")
        lines.append(
            '<p class="dim" style="margin:8px 0 0;font-size:13.5px">Run state: '
            f"<b>{esc(state.get('state') or 'unknown')}</b>"
            + (f" — {esc(detail)}" if detail else "")
            + (f" (exit code {esc(code)})" if code is not None else "")
            + "</p>"
        )
    return (
        f'<div class="verdict" style="background:{s.bg}33;border-color:{s.fg}55" '
        f'data-status="{esc(word or "")}">'
        f"<div>{badge(word, big=True)}</div><div>{''.join(lines)}</div></div>"
    )


def _figures(ctx: rs.Context) -> str:
    claim, result = ctx.claim, ctx.result
    if not ctx.files.has(Files.RESULT):
        head = not_recorded(
            ctx.files.why_not(Files.RESULT)
            + ": the run was not measured, so there is nothing to set beside the card."
        )
    else:
        head = ""
    unrounded = ctx.unrounded
    tol = ctx.tolerance
    tiles, rows = [], []
    for key, label, show in FIGURES:
        got, card = result.get(key), claim.figure(key)
        diff = rs.rel(unrounded.get(key, got), card)
        if key == "tokens_per_s_per_gpu" and ctx.verdict.difference_percent is not None:
            diff = ctx.verdict.difference_percent
        judged = ctx.verdict.status in JUDGED
        if ctx.verdict.status in ("failed", "incomplete") and key == "tokens_per_s_per_gpu":
            diff = None  # training stopped: no place against the band, no mark
        chip = _chip(key, diff, tol, judged)
        gauge = (
            _gauge(diff, tol, judged) if key == "tokens_per_s_per_gpu" and diff is not None else ""
        )
        value = show(got) if ctx.files.has(Files.RESULT) else "—"
        tiles.append(
            f'<div class="tile" data-tile="{key}"><div class="label">{esc(label)}</div>'
            f'<div class="value" title="unrounded: {esc(unrounded.get(key))}">{esc(value)}</div>'
            f'<div class="claim">card <b>{esc(show(card))}</b>{chip}</div>'
            f'<div class="gauge">{gauge}</div></div>'
        )
        rows.append(
            [
                esc(label),
                f'<span data-claim="{key}">{esc(show(card))}</span>',
                f'<span data-figure="{key}" data-value="{esc(got)}">{esc(value)}</span>',
                esc(signed(diff)) if diff is not None else "",
            ]
        )
    window = result.get("window")
    rows += [
        [
            "Measured window (steps)",
            esc(rs.window_text(list(claim.window) if claim.window else None)),
            f'<span data-figure="window">{esc(rs.window_text(window))}</span>',
            "",
        ],
        [
            "Window tokens",
            esc(num(claim.window_tokens, 0)),
            f'<span data-figure="window_tokens">{esc(num(result.get("window_tokens"), 0))}</span>',
            "",
        ],
        [
            "Steps per run",
            esc(num(claim.steps_per_run, 0)),
            f'<span data-figure="steps_per_run">{esc(num(result.get("steps_per_run"), 0))}</span>',
            "",
        ],
        ["Measured on", esc(claim.measured or "—"), esc(result.get("measured") or "—"), ""],
    ]
    explain = (
        "Each tile: the reproduction in large type, the card's figure under it, the difference "
        "beside it. The verdict compares tokens/s per GPU with the card (the bar: the tolerance "
        "band, the card at its centre) and the step-time CV with a limit; MFU and $ / 1M tokens "
        "follow from the throughput, the peak and the price, and GPU-hours count the whole time "
        "the node was held, start-up included."
    )
    return (
        head
        + f'<div class="tiles">{"".join(tiles)}</div>'
        + table(
            ["figure", "published card", "this reproduction", "difference"],
            rows,
            numeric=(1, 2, 3),
            cls="figures",
        )
        + f'<p class="sub" style="margin-top:8px">{esc(explain)}</p>'
        + _measured_runs(ctx)
    )


def _measured_runs(ctx: rs.Context) -> str:
    """A mean of K measured runs (docs/measurement.md): each run, its own report, the spread."""
    summary = (ctx.result.get("provenance") or {}).get("measured_runs")
    if not isinstance(summary, dict) or not isinstance(summary.get("each"), list):
        return ""
    rows = []
    for e in summary["each"]:
        if not isinstance(e, dict):
            continue
        where = str(e.get("dir") or "")
        rows.append(
            [
                f'<a href="{esc(where)}/report.md" data-run="{esc(e.get("run"))}">'
                f"{esc(e.get('run'))}</a>",
                badge(e.get("status")),
                esc(num(e.get("tokens_per_s_per_gpu"))),
                esc(signed(number(e.get("difference_percent"))))
                if number(e.get("difference_percent")) is not None
                else "",
                esc(num(e.get("step_time_cv_percent"))),
                esc(num(e.get("gpu_hours"), 3)),
            ]
        )
    spread = summary.get("spread") or {}
    if summary.get("judged_on_mean"):
        words = (
            f"The figures above are the mean of these {summary.get('ran')} runs; tokens/s per "
            f"GPU from {num(spread.get('min'))} to {num(spread.get('max'))}, stdev "
            f"{num(spread.get('stdev'))} (CV {num(spread.get('cv_percent'))}%)."
        )
    else:
        words = "Not every run is whole: no mean is the reproduction's figure (fail closed)."
    return (
        f'<h3 data-measured-runs="{esc(summary.get("ran"))}">Measured runs: '
        f"{esc(summary.get('ran'))} of {esc(summary.get('measured'))} (the card: a mean of "
        f"{esc(summary.get('claimed'))})</h3>"
        + table(
            ["run", "verdict alone", "tokens/s/GPU", "vs card", "step-time CV %", "GPU-hours"],
            rows,
            numeric=(2, 3, 4, 5),
            cls="figures",
        )
        + f'<p class="sub" style="margin-top:8px">{esc(words)}</p>'
    )


def _chip(key: str, diff: float | None, tol: tuple[float, float], judged: bool) -> str:
    if diff is None:
        return ""
    cls = ""
    if key == "tokens_per_s_per_gpu" and judged:
        slower, faster = tol
        cls = "good" if -slower <= diff <= faster else ("bad" if diff < -slower else "warn")
    return f'<span class="chip {cls}">{esc(signed(diff))}</span>'


def _gauge(diff: float, tol: tuple[float, float], judged: bool) -> str:
    """Where the throughput fell against the tolerance band (card at the centre)."""
    slower, faster = tol
    span = max(2 * max(slower, faster), abs(diff) * 1.15)
    w, h, pad = 180, 24, 6

    def x(p: float) -> float:
        return pad + (p + span) / (2 * span) * (w - 2 * pad)

    color = svg.GREEN if -slower <= diff <= faster else (svg.RED if diff < -slower else svg.ORANGE)
    if not judged:
        color = svg.GREY
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'role="img" aria-label="difference against the tolerance band">'
        f"<title>{esc(signed(diff))} against the card; "
        f"tolerance -{slower:g}% / +{faster:g}%</title>"
        f'<line x1="{pad}" x2="{w - pad}" y1="12" y2="12" stroke="#d1d9e0" stroke-width="4" '
        f'stroke-linecap="round"/><rect x="{x(-slower):.1f}" y="8" '
        f'width="{x(faster) - x(-slower):.1f}" height="8" rx="3" fill="{svg.GREEN}" '
        f'fill-opacity="0.25"/><line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="4" y2="20" '
        f'stroke="#59636e" stroke-width="1"/><circle cx="{x(diff):.1f}" cy="12" r="5" '
        f'fill="{color}" stroke="#fff" stroke-width="1.5"/>'
        "</svg>"
    )


def _plots(ctx: rs.Context) -> str:
    steps = ctx.files.steps
    if not steps:
        return not_recorded(
            ctx.files.why_not(Files.STEPS)
            if not ctx.files.has(Files.STEPS)
            else "steps.jsonl holds no step"
        )
    first, last = ctx.window
    band = (
        [svg.Band(first - 0.5, last + 0.5, f"measured window: steps {first}-{last}", opacity=0.07)]
        if ctx.window_known
        else []
    )
    times = rs.series_of(steps, "step_time")
    inside = [first <= s <= last for s, _ in times]
    colors = [svg.BLUE if w else svg.GREY for w in inside]
    titles = [
        f"step {s}: {num(t, 3, missing='NaN/inf')} s" + (" (in the window)" if w else "")
        for (s, t), w in zip(times, inside, strict=True)
    ]
    hlines: list[svg.HLine] = []
    tbands: list[svg.Band] = []
    implied = ctx.claimed_step_time
    if implied is not None:
        hlines.append(svg.HLine(implied, f"step time the card implies: {implied:.3f} s"))
        slower, faster = ctx.tolerance
        tbands.append(
            svg.Band(
                implied / (1 + faster / 100),
                implied / (1 - slower / 100),
                "the verdict's tolerance",
                svg.ORANGE,
                "y",
                0.08,
            )
        )
    mean = number(ctx.prov.get("mean_step_time_s"))
    if mean is not None:
        hlines.append(
            svg.HLine(mean, f"measured window mean: {mean:.3f} s", svg.BLUE, dashed=False)
        )
    clip = rs.clip_range(
        [t for (_, t), w in zip(times, inside, strict=True) if w], implied, [t for _, t in times]
    )
    step_chart = svg.line_chart(
        svg.Chart(
            "Step time per step",
            "step",
            "step time (s)",
            [
                svg.Series(
                    "step time", times, svg.BLUE, titles=titles, colors=colors, data_key="step_time"
                )
            ],
            hlines,
            band + tbands,
            y_clip=clip,
        )
    )
    losses = rs.series_of(steps, "loss")
    loss_chart = svg.line_chart(
        svg.Chart(
            "Training loss per step",
            "step",
            "train/loss",
            [
                svg.Series(
                    "loss",
                    losses,
                    svg.PURPLE,
                    titles=[f"step {s}: loss {num(v, 4, missing='NaN/inf')}" for s, v in losses],
                    data_key="loss",
                )
            ],
            [],
            band,
        )
    )
    card_tps = ctx.claim.tokens_per_s_per_gpu
    cap_time = (
        "<b>Step time</b> (miles' perf/step_time) for every step. Blue: the measured window"
        + (f" (steps {first}–{last}, shaded)" if ctx.window_known else "")
        + "; grey: warm-up. "
        + (
            f"Dashed orange: the {implied:.2f} s per step that the card's {num(card_tps)} "
            "tokens/s per GPU implies, with the verdict's tolerance band; solid blue: the "
            "window's mean."
            if implied is not None
            else ""
        )
        + " A step far off the scale (start-up) is drawn as a triangle at the edge with its value."
    )
    cap_loss = "<b>Loss</b> (train/loss) for every step; a red cross marks a NaN or infinite loss."
    legend = (
        '<div class="legend"><span><i style="background:#0969da"></i>window step</span>'
        '<span><i style="background:#8c959f"></i>warm-up step</span>'
        '<span><i style="background:#bc4c00"></i>card\'s implied step time</span>'
        '<span><i style="background:#1a7f37;opacity:.4"></i>measured window</span></div>'
    )
    return (
        '<div class="grid2">'
        f"<figure>{step_chart}<figcaption>{cap_time}</figcaption></figure>"
        f"<figure>{loss_chart}<figcaption>{cap_loss}</figcaption></figure>"
        f"</div>{legend}"
    )


def _footer(ctx: rs.Context) -> str:
    present = [n for n in RUN_FILES if ctx.files.has(n)]
    absent = [n for n in RUN_FILES if not ctx.files.has(n)]
    text = "Made from the run directory's files: " + (", ".join(present) or "none")
    if absent:
        text += f". Not recorded: {', '.join(absent)}"
    return (
        f"<p>{esc(text)}.</p><p>Regenerate offline: <code>python -m launcher.pages "
        f"{esc(ctx.files.path)}</code> (or <code>reproduce measure RUN_DIR</code>, which "
        "measures again). No part of this page is fetched from a network.</p>"
    )
