"""The page of one night: every recipe's outcome, verdict, figures against its claim and trend,
its regressions, and a small trend line per recipe.

The entries are the night's records (launcher/records/night.py), which the nightly
(launcher/runner/nightly.py) fills and this page reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.pages import svg
from launcher.pages.history_page import day, regression_badge, report_links, trust_mark
from launcher.pages.html import (
    badge,
    esc,
    link,
    num,
    number,
    page,
    section,
    signed,
    status_of,
    table,
)
from launcher.records.atomic import write_atomic
from launcher.records.history import History, RunRow
from launcher.records.night import NightlyEntry
from launcher.records.rundir import Files


@dataclass(frozen=True)
class NodeGroupView:
    """One node a nightly held for recipes of one shape, as its summary says it
    (launcher/runner/nightly_groups.py group_lines: the one wording of it): its label, the run
    ids it ran, its lines (acquired, released, the GPU-hour split) and the split's figures."""

    label: str
    run_ids: list[str]
    lines: list[str]
    held_gpu_hours: float | None = None
    shared_gpu_hours: float | None = None
    own: dict[str, float] = field(default_factory=dict)


def page_path(root: Path, stamp: float) -> Path:
    return Path(root) / f"nightly-{time.strftime('%Y-%m-%d', time.gmtime(stamp))}.html"


def write_nightly_page(
    root: Path,
    entries: Sequence[NightlyEntry],
    *,
    cluster: str,
    stamp: float,
    exit_code: int,
    history_path: Path | None = None,
    started: float | None = None,
    groups: Sequence[NodeGroupView] = (),
) -> Path:
    """runs/nightly-<UTC date>.html (a second nightly on the same date replaces it), with each
    recipe's recent history read from `history_path` for its trend line."""
    path = page_path(root, stamp)
    path.parent.mkdir(parents=True, exist_ok=True)
    histories: dict[str, list[RunRow]] = {}
    if history_path is not None and Path(history_path).is_file():
        with History(history_path) as hist:
            for e in entries:
                if e.row.slug not in histories:
                    histories[e.row.slug] = hist.runs(
                        e.row.slug, limit=30, cluster=e.row.cluster_name
                    )
    links = report_links([e.row for e in entries], path.parent.resolve())
    costs: dict[str, float | None] = {}
    for e in entries:  # what each run cost, from its run directory (the cost gate's price)
        costs[e.row.run_id] = _cost_of(e.row.run_dir)
    text = render_nightly_page(
        entries,
        cluster=cluster,
        stamp=stamp,
        exit_code=exit_code,
        history_path=history_path,
        histories=histories,
        links=links,
        started=started,
        costs=costs,
        groups=groups,
    )
    write_atomic(path, text)
    return path


def _cost_of(run_dir: str | None) -> float | None:
    """A run's cost (launcher/records/runs.py, as `reproduce runs` shows it); None when unknown."""
    if not run_dir or not (Path(run_dir) / Files.RUN).is_file():
        return None
    from launcher.records.runs import summarize

    try:
        return summarize(Path(run_dir)).cost_usd
    except Exception:  # noqa: BLE001 - a damaged run directory costs its figure, not the page
        return None


def totals_line(
    entries: Sequence[NightlyEntry], costs: Mapping[str, float | None]
) -> tuple[float, float, int]:
    """(GPU-hours, US$, runs without a known cost) of the night."""
    hours = sum(number(e.row.gpu_hours) or 0.0 for e in entries)
    known = [costs.get(e.row.run_id) for e in entries]
    usd = sum(c for c in known if c is not None)
    return hours, usd, sum(c is None for c in known)


def render_nightly_page(
    entries: Sequence[NightlyEntry],
    *,
    cluster: str,
    stamp: float,
    exit_code: int,
    history_path: Path | None = None,
    histories: Mapping[str, Sequence[RunRow]] | None = None,
    links: Mapping[str, str] | None = None,
    started: float | None = None,
    costs: Mapping[str, float | None] | None = None,
    groups: Sequence[NodeGroupView] = (),
) -> str:
    """The night as one HTML string. `stamp`: when it ended; `started`: when it began."""
    costs = costs or {}
    histories = histories or {}
    links = links or {}
    date = day(stamp, "%Y-%m-%d")
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.outcome] = counts.get(e.outcome, 0) + 1
    regressions = sum(1 for e in entries if e.assessment.regression)
    hours, usd, unpriced = totals_line(entries, costs)
    meta = [
        f"<span>cluster {esc(cluster)}</span>",
        f'<span data-started="{started if started is not None else ""}">started '
        f"{esc(day(started, '%Y-%m-%d %H:%M:%S') if started is not None else 'not recorded')}"
        " UTC</span>",
        f'<span data-ended="{stamp}">ended {esc(day(stamp, "%Y-%m-%d %H:%M:%S"))} UTC</span>',
        f"<span>{len(entries)} recipe(s)</span>",
        f'<span data-gpu-hours="{hours:.4f}">{num(hours, 2)} GPU-hours</span>',
        f'<span data-total-usd="{usd:.4f}">${num(usd, 2)} in all'
        + (f" ({unpriced} run(s) without a known cost)" if unpriced else "")
        + "</span>",
        f'<span data-exit-code="{exit_code}">exit code {exit_code}</span>',
    ]
    header = (
        '<p class="kicker">reproduce · nightly</p>'
        f'<h1>Nightly {esc(date)}</h1><p class="meta">{" ".join(meta)}</p>'
    )
    chips = "".join(
        f'<span data-outcome-count="{esc(k)}">{badge(k)} <b>{v}</b></span>'
        for k, v in sorted(counts.items(), key=lambda kv: (kv[0] != "reproduced", kv[0]))
    )
    summary = (
        f'<div class="counts">{chips}</div>'
        + (
            f'<p class="sub"><b style="color:#a40e26">{regressions} regression(s)</b> tonight.</p>'
            if regressions
            else '<p class="sub">No regression tonight.</p>'
        )
        + _table(entries, histories, links)
    )
    details = "".join(_detail(e, links) for e in entries)
    foot = (
        "<p>Outcome: what `reproduce RECIPE` would have exited with (reproduced, check failed, "
        "invalid, infra, error, interrupted), or regression when the run is below its claim or "
        "its trend (docs/measurement.md). Trend line: the recipe's last runs on this cluster, "
        "coloured by verdict, tonight's the larger dot.</p>"
        + (f"<p>History database: <code>{esc(history_path)}</code>.</p>" if history_path else "")
    )
    nodes = _nodes(groups, entries) if groups else ""
    return page(
        f"Nightly {date} ({cluster})",
        header,
        section("summary", "Tonight", summary)
        + (section("nodes", "Nodes", nodes) if nodes else "")
        + section("recipes", "Each recipe", details),
        foot,
    )


def _nodes(groups: Sequence[NodeGroupView], entries: Sequence[NightlyEntry]) -> str:
    """Each node the night held: which recipes ran on it and where its GPU-hours went."""
    slugs = {e.row.run_id: e.row.slug for e in entries}
    out = []
    for g in groups:
        ran = "".join(
            f"<li>{link(f'#r-{rid}', slugs.get(rid, rid))}"
            + (
                f' <span class="dim" data-own-gpu-hours="{g.own[rid]:.6f}">'
                f"{num(g.own[rid], 3)} GPU-hours of its own</span>"
                if rid in g.own
                else ""
            )
            + "</li>"
            for rid in g.run_ids
        )
        held = (
            f' data-held-gpu-hours="{g.held_gpu_hours:.6f}"' if g.held_gpu_hours is not None else ""
        )
        shared = (
            f' data-shared-gpu-hours="{g.shared_gpu_hours:.6f}"'
            if g.shared_gpu_hours is not None
            else ""
        )
        notes = "".join(f"<li>{esc(line.strip())}</li>" for line in g.lines[1:])
        out.append(
            f'<div class="node-group" data-node-group="{esc(g.label)}"{held}{shared}>'
            f"<h3>{esc(g.lines[0] if g.lines else g.label)}</h3>"
            f'<ul class="notes">{notes}</ul><ol>{ran}</ol></div>'
        )
    return "".join(out)


def _table(
    entries: Sequence[NightlyEntry],
    histories: Mapping[str, Sequence[RunRow]],
    links: Mapping[str, str],
) -> str:
    body, attrs = [], []
    for e in entries:
        r, a = e.row, e.assessment
        trend = (
            signed(a.trend.difference_percent)
            if a.judged and a.trend.difference_percent is not None
            else "—"
        )
        past = list(histories.get(r.slug) or [])
        spark = (
            svg.sparkline(
                [x.tokens_per_s_per_gpu for x in past],
                [status_of(x.verdict).fg if x.verdict else svg.GREY for x in past],
                title=f"tokens/s per GPU of the last {len(past)} runs of {r.slug}",
            )
            if past
            else '<span class="dim">—</span>'
        )
        href = links.get(r.run_id)
        report = "<br>" + link(href, "run report" if href else "no run report", cls="dim")
        reg = regression_badge(a)
        body.append(
            [
                f'<span class="recipe">{link(f"#r-{r.run_id}", r.slug)}{report}</span>',
                badge(e.outcome, attr=f' data-outcome="{esc(e.outcome)}"'),
                (badge(r.verdict) if r.verdict else '<span class="dim">—</span>') + trust_mark(r),
                f'<span data-figure="tokens_per_s_per_gpu">'
                f"{esc(num(r.tokens_per_s_per_gpu))}</span>",
                esc(signed(r.difference_percent)),
                esc(trend),
                reg,
                spark,
            ]
        )
        attrs.append(' class="regression"' if a.regression else "")
    return table(
        [
            "recipe",
            "outcome",
            "verdict",
            "tokens/s/GPU",
            "vs claim",
            "vs trend",
            "regression",
            "trend",
        ],
        body,
        numeric=(3, 4, 5),
        row_attrs=attrs,
    )


def _detail(e: NightlyEntry, links: Mapping[str, str]) -> str:
    r, a = e.row, e.assessment
    href = links.get(r.run_id)
    where = (
        f"in {link(href, r.run_dir)}"
        if href
        else (f"in <code>{esc(r.run_dir)}</code>" if r.run_dir else "(no run directory)")
    )
    facts = [
        ("recipe file", f"<code>{esc(e.recipe)}</code>"),
        ("run", f"<span class='mono'>{esc(r.run_id)}</span> {where}"),
        (
            "outcome",
            f"{badge(e.outcome)} <span class='dim'>exit {esc(e.run.code)}</span>{trust_mark(r)}",
        ),
    ]
    if r.detail:
        facts.append(("state", esc(f"{r.state or '—'}: {r.detail}")))
    if e.run.error:
        facts.append(
            ("error", f"<span class='no'>{esc(e.run.error.strip().splitlines()[0])}</span>")
        )
    figures = (
        f"{num(r.tokens_per_s_per_gpu)} tokens/s per GPU ({signed(r.difference_percent)} vs the "
        f"claim {num(r.claimed_tokens_per_s_per_gpu)}), MFU {num(r.mfu, 4)}, "
        f"${num(r.usd_per_million_tokens, 3)} / 1M tokens, {num(r.gpu_hours, 2)} GPU-hours"
    )
    if r.tokens_per_s_per_gpu is not None:
        facts.append(("figures", esc(figures)))
    facts.append(
        (
            "assessment",
            "<ul class='notes'>" + "".join(f"<li>{esc(x)}</li>" for x in a.reasons) + "</ul>",
        )
    )
    items = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    mark = badge("regression") if a.regression else ""
    return f'<h3 id="r-{esc(r.run_id)}">{esc(r.slug)} {mark}</h3><dl class="facts">{items}</dl>'
