"""The history page of one recipe: tokens/s per GPU, MFU and $ / 1M tokens across its runs, with
the regressions marked.

Why each run is assessed here against the runs before it: the history module's regression rules
(launcher/records/history.py, docs/measurement.md) judge one run against its trailing baseline;
applying the same `check_regression` to every run in turn shows when a regression happened, not
only whether the latest run is one. The rules themselves are not restated here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.clusters import trust
from launcher.pages import svg
from launcher.pages.html import (
    Status,
    badge,
    esc,
    link,
    not_recorded,
    num,
    number,
    page,
    rel_href,
    section,
    signed,
    status_of,
    table,
)
from launcher.pages.run_page import PAGE_NAME
from launcher.pages.rundata import read_run_dir
from launcher.records.atomic import write_atomic
from launcher.records.history import JUDGED_VERDICTS, Assessment, RunRow, check_regression
from launcher.records.rundir import Files
from launcher.records.verdict_record import RecordedVerdict

_TREND_KEYS = ("tokens_per_s_per_gpu", "mfu", "usd_per_million_tokens")

NO_REGRESSION = Status("no regression", "#116329", "#dafbe1", "within the claim and the trend")


def assess_each(rows: Sequence[RunRow]) -> list[Assessment]:
    """Every run (oldest first) assessed against the earlier runs of its own cluster profile."""
    out = []
    for i, row in enumerate(rows):
        earlier = [r for r in rows[:i] if r.cluster_name == row.cluster_name]
        out.append(check_regression(row, earlier))
    return out


def day(ts: float | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(fmt, time.gmtime(ts)) if ts is not None else "—"


def report_links(rows: Sequence[RunRow], page_dir: Path) -> dict[str, str]:
    """run id -> the run's report.html, relative to the page's directory, where one exists."""
    links = {}
    for r in rows:
        if not r.run_dir:
            continue
        target = Path(r.run_dir) / PAGE_NAME
        if target.is_file():
            links[r.run_id] = rel_href(target, page_dir)
    return links


def write_history_page(
    path: Path,
    slug: str,
    rows: Sequence[RunRow],
    *,
    claims: Mapping[str, float | None] | None = None,
    history_path: Path | None = None,
) -> Path:
    """Write the history page of `slug` to `path`, linking each run's report.html."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_history_page(
        slug,
        rows,
        claims=claims if claims is not None else claims_of(rows),
        links=report_links(rows, path.parent.resolve()),
        history_path=history_path,
    )
    write_atomic(path, text)
    return path


def claims_of(rows: Sequence[RunRow]) -> dict[str, float | None]:
    """The card's figures as the latest run that recorded them holds them (its verdict.json)."""
    for r in reversed(rows):
        if not r.run_dir:
            continue
        files = read_run_dir(Path(r.run_dir), (Files.VERDICT,))
        claim = RecordedVerdict.of(files.get(Files.VERDICT)).claim
        if claim is not None:
            return {k: number(claim.figure(k)) for k in _TREND_KEYS}
    return {}


def _claims(rows: Sequence[RunRow], given: Mapping[str, float | None] | None) -> dict[str, float]:
    out = {k: v for k, v in (given or {}).items() if number(v) is not None}
    if "tokens_per_s_per_gpu" not in out:
        for r in reversed(rows):
            if number(r.claimed_tokens_per_s_per_gpu) is not None:
                out["tokens_per_s_per_gpu"] = float(r.claimed_tokens_per_s_per_gpu or 0.0)
                break
    return {k: float(v or 0.0) for k, v in out.items()}


def render_history_page(
    slug: str,
    rows: Sequence[RunRow],
    assessments: Sequence[Assessment] | None = None,
    *,
    claims: Mapping[str, float | None] | None = None,
    links: Mapping[str, str] | None = None,
    history_path: Path | None = None,
) -> str:
    """The page as one HTML string. `rows` oldest first; `assessments` one per row (default:
    each run assessed against the ones before it)."""
    rows = list(rows)
    judged = list(assessments) if assessments is not None else assess_each(rows)
    card = _claims(rows, claims)
    links = links or {}
    clusters = sorted({r.cluster_name or "?" for r in rows})
    starts = [r.started_at for r in rows if r.started_at is not None]
    meta = [f"<span>{len(rows)} run(s)</span>", f"<span>cluster {esc(', '.join(clusters))}</span>"]
    if starts:
        meta.append(
            f"<span>{esc(day(min(starts), '%Y-%m-%d'))} to "
            f"{esc(day(max(starts), '%Y-%m-%d'))} (UTC)</span>"
        )
    header = (
        '<p class="kicker">reproduce · history</p>'
        f'<h1>{esc(slug)}</h1><p class="meta">{" ".join(meta)}</p>'
    )
    if not rows:
        body = section("latest", "Latest run", not_recorded("No run of this recipe is recorded."))
    else:
        body = (
            section("latest", "Latest run", _latest(rows[-1], judged[-1], links))
            + section(
                "trend",
                "Trend",
                _charts(rows, judged, card),
                note="Each point is a run, oldest on the left, coloured by its verdict; a red "
                "ring marks a regression. Hover a point for its run.",
            )
            + section("runs", "Every run", _table(rows, judged, links), note="Newest first.")
        )
    foot = (
        "<p>Regressions follow the rules of docs/measurement.md: below the card's claim by more "
        "than the verdict's tolerance, or below the trailing median of the last good runs on the "
        "same cluster by more than max(tolerance, 3 × spread). Failed and incomplete runs are "
        "not judged.</p>"
        + (f"<p>History database: <code>{esc(history_path)}</code>.</p>" if history_path else "")
        + f"<p>Regenerate: <code>reproduce history {esc(slug)} --html PATH</code>.</p>"
    )
    return page(f"History of {slug}", header, body, foot)


def regression_badge(a: Assessment) -> str:
    """A short mark for tables: REGRESSION, suspect, no, or n/a (not judged)."""
    if a.regression:
        return badge("regression")
    if a.suspect:  # one miss: flagged, a regression only when the next judged run misses too
        return badge("suspect")
    if not a.judged:
        return '<span class="dim">n/a</span>'
    s = NO_REGRESSION
    return (
        f'<span class="badge" style="color:{s.fg};background:{s.bg};border-color:{s.fg}33">'
        "no</span>"
    )


def _latest(row: RunRow, a: Assessment, links: Mapping[str, str]) -> str:
    s = (
        status_of("regression")
        if a.regression
        else (NO_REGRESSION if a.judged else status_of(None))
    )
    run = _run_link(row, links)
    lines = [
        f'<p class="what">Run {run} on {esc(day(row.started_at))} UTC: verdict '
        f"{badge(row.verdict or row.state)}{trust_mark(row)}</p>",
        "<ul>" + "".join(f"<li>{esc(r)}</li>" for r in a.reasons) + "</ul>",
    ]
    t = a.trend
    if not t.skipped and t.median is not None:
        lines.append(
            '<p class="dim" style="margin:6px 0 0;font-size:13.5px">'
            + esc(
                f"Baseline: median {num(t.median)} tokens/s per GPU of the last {len(t.points)} "
                f"good runs; spread {num(t.spread_percent)}% (1.4826 × MAD / median); threshold "
                f"−{num(t.threshold_percent)}%."
            )
            + "</p>"
        )
    return (
        f'<div class="verdict" style="background:{s.bg}33;border-color:{s.fg}55" '
        f'data-regression="{"yes" if a.regression else ("no" if a.judged else "n/a")}">'
        f'<div><span class="badge big" style="color:{s.fg};background:{s.bg};'
        f'border-color:{s.fg}33">{esc(s.label)}</span></div><div>{"".join(lines)}</div></div>'
    )


def trust_mark(row: RunRow) -> str:
    """A row's trust mark (launcher/clusters/trust.py decides it): a run whose cluster vouched for
    itself says so in every table and summary that shows it, not only on its own page. The row's
    recorded kind, else its run directory's records (a row of a run that failed early)."""
    words = trust.line(row.cluster_kind) or (
        trust.run_line(Path(row.run_dir)) if row.run_dir else None
    )
    level = row.assurance or "assurance not recorded"
    mark = f' <span class="dim" data-assurance="{esc(level)}">{esc(level)}</span>'
    if row.verdict is None:
        mark = ""
    if words is None:
        return mark
    return (
        f' <span class="no" data-trust="unverified" title="{esc(words)}">{esc(trust.MARK)}</span>'
        + mark
    )


def _run_link(row: RunRow, links: Mapping[str, str]) -> str:
    return link(links.get(row.run_id), row.run_id, cls="mono")


# Verdicts whose figures are evidence: a run that failed, ended incomplete, did not match the
# recipe or could not be read is drawn as a mark (a cross on the axis), never as a figure.
FIGURE_VERDICTS = ("reproduced", "faster", "slower", "unstable")


def has_figures(row: RunRow) -> bool:
    return row.verdict in FIGURE_VERDICTS and row.state in (None, "done")


def time_ticks(rows: Sequence[RunRow]) -> tuple[list[tuple[float, str]], str]:
    """x tick labels (one per run, by index: readable for many runs a day) and the axis label.
    Runs all of one UTC day: the time; else the date and time; a run without a time: #index."""
    days = {day(r.started_at, "%Y-%m-%d") for r in rows if r.started_at is not None}
    fmt, label = ("%H:%M", f"run (UTC time, {min(days)})") if len(days) == 1 else (
        "%m-%d %H:%M", "run (UTC date and time)"
    )  # fmt: skip
    ticks = [
        (float(i), day(r.started_at, fmt) if r.started_at is not None else f"#{i + 1}")
        for i, r in enumerate(rows)
    ]
    return ticks, label


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def _charts(rows: Sequence[RunRow], judged: Sequence[Assessment], card: Mapping[str, float]) -> str:
    ticks, x_label = time_ticks(rows)
    colors = [status_of(r.verdict).fg if r.verdict else svg.GREY for r in rows]
    charts = []
    for key, label, digits, unit in (
        ("tokens_per_s_per_gpu", "tokens/s per GPU", 1, ""),
        ("mfu", "MFU", 2, ""),
        ("usd_per_million_tokens", "$ / 1M tokens", 3, "$"),
    ):
        scale = _percent if key == "mfu" else (lambda v: v)
        suffix = "%" if key == "mfu" else ""
        # Only a judged run's figure is a point of the trend; a failed, incomplete or mismatched
        # run is the cross on the axis, whatever figure its log gave.
        values = [
            scale(number(getattr(r, key)))
            if has_figures(r) and r.verdict in JUDGED_VERDICTS
            else None
            for r in rows
        ]
        titles = [
            f"{r.run_id} ({day(r.started_at)} UTC, {r.cluster_name or '?'}): "
            + (
                f"{unit}{v:,.{digits}f}{suffix}"
                if v is not None
                else f"no figure ({r.verdict or r.state or 'not judged'})"
            )
            + (f", verdict {r.verdict}" if r.verdict else "")
            + (" — REGRESSION" if a.regression else "")
            for r, v, a in zip(rows, values, judged, strict=True)
        ]
        hlines, bands = [], []
        claim = card.get(key)
        if claim is not None and key == "mfu":
            claim = claim * 100.0
        if claim is not None:
            hlines.append(svg.HLine(claim, f"the card's claim: {unit}{claim:,.{digits}f}{suffix}"))
        rings = []
        series = [
            svg.Series(
                label,
                [(float(i), v) for i, v in enumerate(values)],
                svg.BLUE,
                titles=titles,
                colors=colors,
                data_key=key,
            )
        ]
        if key == "tokens_per_s_per_gpu":
            if claim is not None:
                tol = (
                    next((r.tolerance_percent for r in reversed(rows) if r.tolerance_percent), None)
                    or 3.0
                )
                bands.append(
                    svg.Band(
                        claim * (1 - tol / 100),
                        claim,
                        f"within the tolerance below the claim ({tol:g}%)",
                        svg.ORANGE,
                        "y",
                        0.10,
                    )
                )
            floor = [
                (float(i), a.trend.median * (1 - a.trend.threshold_percent / 100))
                if a.trend.median is not None and a.trend.threshold_percent is not None
                else (float(i), None)
                for i, a in enumerate(judged)
            ]
            if any(v is not None for _, v in floor):
                series.insert(
                    0, svg.Series("trend floor", floor, svg.RED, dashed=True, markers=False)
                )
        for i, (v, a) in enumerate(zip(values, judged, strict=True)):
            if a.regression and v is not None:
                rings.append(svg.Ring(float(i), v, "regression"))
        chart = svg.line_chart(
            svg.Chart(
                f"{label} across runs",
                x_label,
                f"{label} ({suffix})" if suffix else label,
                series,
                hlines,
                bands,
                rings,
                x_ticks=ticks,
                width=1060,
                height=250,
                # MFU from 0: the claim and every run on one honest scale, so a 0.03% gap looks
                # like one (an axis fitted to the values would fill the chart with it)
                y_zero=key == "mfu",
            )
        )
        charts.append(f"<figure>{chart}<figcaption><b>{esc(label)}</b></figcaption></figure>")
    legend = (
        '<div class="legend">'
        + "".join(
            f'<span><i style="background:{status_of(w).fg}"></i>{esc(w)}</span>'
            for w in ("reproduced", "faster", "slower", "unstable", "mismatch")
        )
        + '<span><i style="background:#bc4c00"></i>the card\'s claim (band: tolerance)</span>'
        '<span><i style="background:#cf222e"></i>trend floor (regression below)</span>'
        '<span style="color:#cf222e">× run without a figure (failed, incomplete, '
        "mismatch: a mark, not a figure)</span></div>"
    )
    return legend + "".join(charts)


def _table(rows: Sequence[RunRow], judged: Sequence[Assessment], links: Mapping[str, str]) -> str:
    several = len({r.cluster_name for r in rows}) > 1
    body, attrs, regressions = [], [], []
    for r, a in reversed(list(zip(rows, judged, strict=True))):
        trend = (
            signed(a.trend.difference_percent)
            if a.judged and a.trend.difference_percent is not None
            else "—"
        )
        cells = [
            _run_link(r, links),
            f'<span class="nowrap">{esc(day(r.started_at))}</span>',
            badge(r.verdict or r.state) + trust_mark(r),
            f'<span data-run="{esc(r.run_id)}" data-figure="tokens_per_s_per_gpu">'
            f"{esc(num(r.tokens_per_s_per_gpu))}</span>",
            esc(signed(r.difference_percent)),
            esc(trend),
            esc(num(_percent(r.mfu), 2, suffix="%")),
            esc(num(r.usd_per_million_tokens, 3)),
            esc(num(r.gpu_hours, 2)),
            f'<span title="{esc("; ".join(a.reasons))}">{regression_badge(a)}</span>',
        ]
        if several:
            cells.insert(2, f'<span class="nowrap">{esc(r.cluster_name or "—")}</span>')
        body.append(cells)
        attrs.append(' class="regression"' if a.regression else "")
        if a.regression:
            regressions.append(
                f"<li>{_run_link(r, links)} ({esc(day(r.started_at))} UTC): "
                + "; ".join(esc(x) for x in a.reasons)
                + "</li>"
            )
    header = [
        "run",
        "started (UTC)",
        "verdict",
        "tokens/s/GPU",
        "vs claim",
        "vs trend",
        "MFU",
        "$ / 1M",
        "GPU-h",
        "regression",
    ]
    numeric: tuple[int, ...] = (3, 4, 5, 6, 7, 8)
    if several:
        header.insert(2, "cluster")
        numeric = tuple(n + 1 for n in numeric)
    out = table(header, body, numeric=numeric, row_attrs=attrs)
    if regressions:
        out += "<h3>Regressions</h3><ul class='notes'>" + "".join(reversed(regressions)) + "</ul>"
    return out
