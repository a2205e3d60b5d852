"""The run page's context (what its files say, gathered once) and its lower sections: stages,
convergence, notes, every step. The provenance section lives in launcher/pages/provenance.py.

Why a context object: the same few facts (the window, the GPUs, the tolerance, the price) feed
several sections, and each has a fallback when a file is missing (the recipe's window when
result.yaml is absent, the verdict module's tolerance when verdict.json is); deciding that once
keeps the sections consistent with each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.inputs.recipe import Claim, Hardware, Sections
from launcher.judge.measure import gpu_hours_from_timeline
from launcher.judge.split import PARALLEL_PART, stage_split
from launcher.judge.timeline import RunTimeline
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT
from launcher.pages import svg
from launcher.pages.html import badge, duration, esc, not_recorded, num, number, section, table
from launcher.pages.rundata import RunFiles
from launcher.records.plan_record import RecordedPlan
from launcher.records.rundir import Files
from launcher.records.verdict_record import RecordedVerdict


def _map(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class Context:
    files: RunFiles
    card: Sections  # recipe.yaml's typed sections (read back: a field not of its type is None)
    claim: Claim  # the card's result block, else the verdict's `claimed`
    result: dict[str, Any]
    prov: dict[str, Any]
    unrounded: dict[str, Any]
    verdict: RecordedVerdict  # verdict.json (judged False: none, or an empty one)
    timeline: RunTimeline
    plan: RecordedPlan  # plan.json
    slug: str
    run_id: str
    cluster: str
    title: str
    window: tuple[int, int] = (0, -1)
    window_known: bool = False
    gpus: int | None = None
    nodes: int | None = None
    usd_per_hour: float | None = None  # per node
    claimed_step_time: float | None = None
    tolerance: tuple[float, float] = (DEFAULT_TOLERANCE_PERCENT, DEFAULT_TOLERANCE_PERCENT)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, files: RunFiles) -> Context:
        verdict = RecordedVerdict.of(files.get(Files.VERDICT))
        card = Sections.of_copy(files.get(Files.RECIPE))
        claim = (
            card.claim
            if card.claim.written
            else (verdict.claim if verdict.claim is not None else Claim.of_block({}))
        )
        result = files.mapping(Files.RESULT)
        prov = _map(result.get("provenance"))
        run = files.mapping(Files.RUN)
        plan = RecordedPlan.of(files.get(Files.PLAN))
        gpu = card.hardware
        slug = str(run.get("slug") or plan.slug or files.path.parent.name)
        cluster_kind = plan.profile_kind or _map(run.get("cluster")).get("kind")
        cluster = " ".join(
            str(x) for x in (plan.profile_name, cluster_kind and f"({cluster_kind})") if x
        )
        model = card.model
        if model and gpu.stated:
            title = f"{model} on {_or(gpu.count)} \u00d7 {_or(gpu.type)}" + (
                f" ({gpu.instance})" if gpu.instance else ""
            )
        else:
            title = f"Reproduction of {slug}"
        ctx = cls(
            files=files,
            card=card,
            claim=claim,
            result=result,
            prov=prov,
            unrounded=_map(prov.get("unrounded")),
            verdict=verdict,
            timeline=RunTimeline.of(files.mapping(Files.TIMELINE)),
            plan=plan,
            slug=slug,
            run_id=str(run.get("run_id") or plan.run_id or files.path.name),
            cluster=cluster,
            title=title,
        )
        ctx._derive(gpu)
        return ctx

    def _derive(self, gpu: Hardware) -> None:
        claimed = list(self.claim.window) if self.claim.window is not None else None
        window = self.result.get("window") or claimed
        if (
            isinstance(window, list)
            and len(window) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window)
        ):
            self.window, self.window_known = (window[0], window[1]), True
        gpus = number(self.prov.get("gpus")) or number(gpu.count)
        self.gpus = int(gpus) if gpus else None
        plan_nodes = number(self.plan.nodes)
        per_node = number(gpu.per_node)
        if plan_nodes:
            self.nodes = int(plan_nodes)
        elif self.gpus and per_node:
            self.nodes = max(1, math.ceil(self.gpus / per_node))
        self.usd_per_hour = number(_map(self.prov.get("price")).get("usd_per_hour"))
        tokens = number(self.prov.get("tokens_per_step"))
        if tokens is None:
            work = self.card.workload
            gb, rt = number(work.global_batch), number(work.row_tokens)
            tokens = gb * rt if gb and rt else None
        card = number(self.claim.tokens_per_s_per_gpu)
        if tokens and card and self.gpus:
            self.claimed_step_time = tokens / card / self.gpus
        slower, faster = self.verdict.slower_percent, self.verdict.faster_percent
        self.tolerance = (
            abs(slower) if slower is not None else DEFAULT_TOLERANCE_PERCENT,
            abs(faster) if faster is not None else DEFAULT_TOLERANCE_PERCENT,
        )


def guard(anchor: str, title: str, fn: Callable[[Context], str], ctx: Context) -> str:
    """One section; a section that cannot be drawn says why, and the rest of the page stands."""
    try:
        body = fn(ctx)
    except Exception as err:  # noqa: BLE001 - one odd file must not cost the whole page
        body = not_recorded(
            f"This section could not be shown from the recorded files ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'})."
        )
    return section(anchor, title, body)


def rel(measured: object, claimed: object) -> float | None:
    m, c = number(measured), number(claimed)
    if m is None or c is None or c == 0:
        return None
    return 100.0 * (m - c) / c


def _or(value: object) -> str:
    return "?" if value is None else str(value)


def window_text(window: object) -> str:
    if isinstance(window, list) and len(window) == 2:
        return f"{window[0]}–{window[1]}"
    return "—" if window is None else str(window)


def step_of(record: dict[str, Any]) -> int | None:
    s = record.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def _value(raw: object) -> tuple[bool, float | None]:
    """(present, finite value): steps.jsonl writes NaN and inf as the strings 'nan', 'inf'."""
    if raw is None:
        return False, None
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            return True, None
    return True, number(raw)


def series_of(steps: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float | None]]:
    """(step, value) for each step that logged `key`; a NaN or inf value is None."""
    out: list[tuple[int, float | None]] = []
    for rec in steps:
        s = step_of(rec)
        present, value = _value(rec.get(key))
        if s is not None and present:
            out.append((s, value))
    return sorted(out, key=lambda p: p[0])


def clip_range(
    inside: Sequence[float | None], implied: float | None, every: Sequence[float | None]
) -> tuple[float, float] | None:
    """A y range that keeps the window readable when a start-up step is many times slower."""
    base = [v for v in inside if v is not None] + ([implied] if implied else [])
    allv = [v for v in every if v is not None]
    if not base or not allv:
        return None
    lo, hi = min(base), max(base)
    pad = max((hi - lo) * 0.6, abs(hi) * 0.06, 1e-9)
    if max(allv) <= hi + 3 * pad and min(allv) >= lo - 3 * pad:
        return None
    return max(lo - pad, 0.0 if lo >= 0 else lo - pad), hi + pad


def extra_verdict_fields(others: Sequence[tuple[str, object]]) -> str:
    """Lists in verdict.json beyond the fields read (RecordedVerdict.others: e.g. a mismatch's
    disagreements), as tables: a verdict's evidence is shown whatever shape it takes."""
    out = []
    for key, value in others:
        if not value:
            continue
        if isinstance(value, list) and all(isinstance(x, dict) for x in value):
            cols: list[str] = []
            for item in value:
                cols += [k for k in item if k not in cols]
            rows = [[esc(_short(item.get(c))) for c in cols] for item in value[:50]]
            out.append(
                f"<h3>{esc(key.replace('_', ' '))}</h3>" + table([esc(c) for c in cols], rows)
            )
        elif isinstance(value, list):
            out.append(
                f"<h3>{esc(key.replace('_', ' '))}</h3><ul>"
                + "".join(f"<li>{esc(_short(x))}</li>" for x in value[:50])
                + "</ul>"
            )
        elif isinstance(value, (str, int, float)):
            out.append(
                f'<p class="dim" style="margin:4px 0">{esc(key.replace("_", " "))}: '
                f"{esc(value)}</p>"
            )
    return "".join(out)


def _short(value: object, limit: int = 300) -> str:
    text = "—" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Stages


def stage_rows(
    timeline: RunTimeline, window_s: float | None = None
) -> list[tuple[str, float, str, float | None]]:
    """(name, seconds, status, start) from acquisition to release: the measured split
    (measure.stage_split, the same parts as result.yaml's gpu_hours_by_stage: acquire, each
    stage, the window inside training, collect, release), then any stage that never ended."""
    acquired = timeline.acquired_at
    by_name = {str(s.name): s for s in timeline.stages}
    rows: list[tuple[str, float, str, float | None]] = []
    split_names: set[str] = set()
    for name, secs in stage_split(timeline, window_s).items():
        # a part of stages that ran at once starts with the first of them (judge/split.py)
        members = name.removeprefix(PARALLEL_PART).split("+")
        stage = by_name.get("train" if name == "window" else members[0])
        start = stage.start if stage else (acquired if name == "acquire" else None)
        statuses = [(m.status if (m := by_name.get(n)) else None) or "ok" for n in members]
        own = (stage.status if stage else None) or "ok"
        status = next((st for st in statuses if st == "failed"), own)
        rows.append((name, secs, status, start))
        split_names.update(members)
    for s in timeline.stages:  # started, never ended (the run was stopped in it): shown, 0 s
        name = s.name or "?"
        if name not in split_names:
            rows.append((name, 0.0, s.status or "?", s.start))
    return rows


def _overlapped(timeline: RunTimeline, part: str, acquired: float | None) -> list[list[str]]:
    """The rows under a part of stages that ran at once: each stage's own start and time (the
    work per stage; the part above counts the node's wall time once: judge/split.py)."""
    if not part.startswith(PARALLEL_PART):
        return []
    members = part.removeprefix(PARALLEL_PART).split("+")
    rows = []
    for s in timeline.stages:
        start, end = s.start, s.end
        if s.name not in members or start is None or end is None:
            continue
        at = f"+{duration(start - acquired)}" if acquired is not None else "—"
        rows.append(
            [f"&nbsp;&nbsp;↳ {esc(s.name)}", esc(at), esc(duration(end - start)),
             "(at once)", "", "", esc(s.status or "?")]
        )  # fmt: skip
    return rows


def stages(ctx: Context) -> str:
    if not ctx.timeline.recorded:
        return not_recorded(ctx.files.why_not(Files.TIMELINE))
    window_gh = number(ctx.prov.get("window_gpu_hours"))
    window_s = window_gh * 3600 / ctx.gpus if window_gh is not None and ctx.gpus else None
    rows = stage_rows(ctx.timeline, window_s)
    if not rows:
        return not_recorded("timeline.json records no stage.")
    total_s = sum(r[1] for r in rows)
    acquired = ctx.timeline.acquired_at
    gpus, nodes, price = ctx.gpus, ctx.nodes or 1, ctx.usd_per_hour
    body, attrs, segments = [], [], []
    for i, (name, secs, status, start) in enumerate(rows):
        color = svg.STAGE_COLORS.get(name) or svg.PALETTE[i % len(svg.PALETTE)]
        if status == "failed":
            color = svg.RED
        gh = gpus * secs / 3600 if gpus else None
        usd = price * nodes * secs / 3600 if price is not None else None
        share = 100 * secs / total_s if total_s else 0.0
        cls = "ok" if status == "ok" else ("no" if status == "failed" else "warn")
        at = f"+{duration(start - acquired)}" if start is not None and acquired is not None else "—"
        body.append(
            [
                f'<i style="display:inline-block;width:10px;height:10px;border-radius:2px;'
                f'background:{color};margin-right:6px"></i>{esc(name)}',
                esc(at),
                esc(duration(secs)),
                f'<span data-stage-hours="{esc(name)}">{esc(num(gh, 4))}</span>',
                esc(f"${usd:,.2f}" if usd is not None else "—"),
                esc(f"{share:.1f}%"),
                f'<span class="{cls}">{esc(status)}</span>',
            ]
        )
        attrs.append(' class="fail"' if status == "failed" else "")
        segments.append(
            (name, secs, color, f"{name}: {duration(secs)}, {num(gh, 4)} GPU-h, {share:.1f}%")
        )
        for sub in _overlapped(ctx.timeline, name, acquired):  # each one's own time, not added
            body.append(sub)
            attrs.append(' class="sub"')
    total_gh = number(ctx.unrounded.get("gpu_hours"))
    if total_gh is None and gpus:  # not measured: the measurement's formula, on the timeline
        total_gh = gpu_hours_from_timeline(ctx.timeline, gpus)[0]
    total_usd = price * nodes * total_s / 3600 if price is not None else None
    body.append(
        [
            "<b>total (acquired to released)</b>",
            "",
            f"<b>{esc(duration(total_s))}</b>",
            f"<b>{esc(num(total_gh, 4))}</b>",
            f"<b>{esc(f'${total_usd:,.2f}' if total_usd is not None else '—')}</b>",
            "<b>100%</b>",
            "",
        ]
    )
    attrs.append("")
    note = [
        f"{gpus} GPUs" if gpus else "GPU count unknown",
        f"{nodes} node(s) at ${price:,.3f} per node-hour"
        if price is not None
        else "no price recorded",
    ]
    after = ""
    if window_gh is not None and "window" not in {r[0] for r in rows}:
        after = (
            f'<p class="sub" style="margin-top:8px">The measured window itself (the sum of its '
            f"step times) is {esc(num(window_gh, 4))} GPU-hours.</p>"
        )
    source = ctx.result.get("gpu_hours_note")
    if source:
        after += f'<p class="sub">GPU-hours: {esc(source)}.</p>'
    return (
        f'<p class="sub">From timeline.json: {esc("; ".join(note))}. Hover a segment for its '
        "figures.</p>"
        + svg.stacked_bar(segments)
        + table(
            ["stage", "started", "took", "GPU-hours", "cost", "share", "status"],
            body,
            numeric=(1, 2, 3, 4, 5),
            row_attrs=attrs,
        )
        + after
    )


# ---------------------------------------------------------------------------------------------
# Convergence


def recipe_card(ctx: Context) -> str:
    """The informational fields the recipe states (inputs/recipe_fields.py: SHOWN), verbatim."""
    rows = ctx.card.shown
    if not rows:
        return not_recorded("The recipe states none of its informational fields.")
    return (
        '<p class="dim">What the recipe says that reproduce does not act on: shown as written '
        "(docs/recipe-fields.md lists how every field is honoured).</p>"
        + table(["field", "as written"], [[esc(k), esc(v)] for k, v in rows])
    )


# ---------------------------------------------------------------------------------------------
# Convergence


def _stated(value: object) -> object:
    """A figure the card states, or a dash where it states none."""
    return "—" if value is None else value


def convergence(ctx: Context) -> str:
    card = ctx.card.convergence
    conv = ctx.files.mapping(Files.CONVERGENCE)
    if not conv:
        text = (
            ctx.files.why_not(Files.CONVERGENCE)
            + ": this run was measured without a reference run."
        )
        if card.stated:
            text += " The card's own check is shown for reference."
        body = not_recorded(text)
        if card.stated:
            body += table(
                ["criterion", "published card"],
                [
                    ["correlation", esc(_stated(card.correlation))],
                    ["final loss difference", esc(_stated(card.final_loss_difference))],
                    ["pointwise failures", esc(_stated(card.pointwise_failures))],
                    ["steps", esc(_stated(card.steps))],
                    ["result", esc(_stated(card.result))],
                ],
                numeric=(1,),
                cls="compact",
            )
        return body
    t = _map(conv.get("thresholds"))
    passed = conv.get("passed")

    def ok(flag: bool | None) -> str:
        return (
            ""
            if flag is None
            else ('<span class="ok">pass</span>' if flag else '<span class="no">fail</span>')
        )

    corr = number(conv.get("correlation"))
    final = number(conv.get("final_loss_difference"))
    pw = number(conv.get("pointwise_failure_fraction"))
    out_f = number(conv.get("outlier_fraction"))

    def at_most(v: float | None, limit: object) -> bool | None:
        lim = number(limit)
        return None if v is None or lim is None else v <= lim

    rows = [
        [
            "correlation",
            esc(_stated(card.correlation)),
            esc(num(corr, 7)),
            esc(f"≥ {t.get('min_correlation', '—')}"),
            ok(
                None
                if corr is None or number(t.get("min_correlation")) is None
                else corr >= (number(t.get("min_correlation")) or 0)
            ),
        ],
        [
            "final loss difference",
            esc(_stated(card.final_loss_difference)),
            esc(num(final, 6)),
            esc(f"≤ {t.get('max_final_loss_difference', '—')}"),
            ok(at_most(final, t.get("max_final_loss_difference"))),
        ],
        [
            "pointwise failures",
            esc(_stated(card.pointwise_failures)),
            esc(f"{conv.get('pointwise_failures', '—')} ({num(pw, 3)})"),
            esc(f"≤ {t.get('max_pointwise_failure_fraction', '—')} of the steps"),
            ok(at_most(pw, t.get("max_pointwise_failure_fraction"))),
        ],
        [
            "residual outliers",
            "—",
            esc(f"{conv.get('outliers', '—')} ({num(out_f, 3)})"),
            esc(f"≤ {t.get('max_outlier_fraction', '—')} of the steps"),
            ok(at_most(out_f, t.get("max_outlier_fraction"))),
        ],
        [
            "steps compared",
            esc(_stated(card.steps)),
            esc(
                f"{conv.get('steps_compared', '—')} "
                f"(first {conv.get('steps_skipped', '—')} skipped)"
            ),
            "",
            "",
        ],
        [
            "missing / NaN steps",
            "—",
            esc(f"{len(conv.get('missing_steps') or [])} / {len(conv.get('nan_steps') or [])}"),
            "none",
            "",
        ],
    ]
    reasons = [r for r in (conv.get("reasons") or []) if isinstance(r, str)]
    return (
        f"<p>{badge('pass' if passed else 'fail', attr=' data-convergence')} "
        f'<span class="dim">loss curve against the reference run: '
        f"{'all criteria pass' if passed else 'at least one criterion fails'}</span></p>"
        + table(["criterion", "published card", "this run", "threshold", ""], rows, numeric=(1, 2))
        + (
            "<ul class='notes'>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>"
            if reasons
            else ""
        )
    )


# ---------------------------------------------------------------------------------------------
# Notes, steps


def notes(ctx: Context) -> str:
    parts = []
    result_notes = [n for n in (ctx.prov.get("notes") or []) if isinstance(n, str)]
    if result_notes:
        parts.append(
            "<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in result_notes) + "</ul>"
        )
    cross = _map(ctx.prov.get("cross_checks"))
    if cross:
        rows = []
        ts, perf = cross.get("timestamp_mean_step_time_s"), cross.get("perf_mean_step_time_s")
        if ts is not None or perf is not None:
            rows.append(
                [
                    "mean step time: log timestamps vs perf/step_time",
                    esc(f"{num(ts, 3)} s vs {num(perf, 3)} s"),
                    esc(
                        num(_pct(cross.get("timestamp_vs_perf_relative_difference")), 2, suffix="%")
                    ),
                ]
            )
        if cross.get("logged_tokens_per_step_mean") is not None:
            rows.append(
                [
                    "tokens per step: logged by miles vs the recipe",
                    esc(
                        f"{num(cross.get('logged_tokens_per_step_mean'), 0)} vs "
                        f"{num(ctx.prov.get('tokens_per_step'), 0)}"
                    ),
                    esc(
                        num(
                            _pct(cross.get("logged_tokens_vs_recipe_relative_difference")),
                            2,
                            suffix="%",
                        )
                    ),
                ]
            )
        if rows:
            parts.append(
                table(
                    ["cross-check (reported, not used in the figures)", "values", "difference"],
                    rows,
                    numeric=(2,),
                )
            )
    parse = _map(ctx.prov.get("parse"))
    if parse:
        parts.append(
            '<p class="sub" style="margin-top:10px">Log parsing: '
            + esc(
                f"{num(parse.get('lines'), 0)} lines, "
                f"{num(parse.get('step_lines'), 0)} step lines, "
                f"{num(parse.get('unparseable'), 0)} unparseable, {num(parse.get('truncated'), 0)} "
                f"truncated, {num(parse.get('duplicates'), 0)} duplicates"
            )
            + ".</p>"
        )
    if not parts:
        return not_recorded(
            "No notes." if ctx.files.has(Files.RESULT) else ctx.files.why_not(Files.RESULT)
        )
    return "".join(parts)


def _pct(v: object) -> float | None:
    n = number(v)
    return None if n is None else 100 * n


def steps_table(ctx: Context) -> str:
    steps = ctx.files.steps
    if not steps:
        return not_recorded(
            ctx.files.why_not(Files.STEPS)
            if not ctx.files.has(Files.STEPS)
            else "No step was parsed."
        )
    first, last = ctx.window
    rows, attrs = [], []
    for r in sorted(steps, key=lambda r: _order(step_of(r))):
        s = step_of(r)
        inside = s is not None and first <= s <= last
        _, loss = _value(r.get("loss"))
        _, st = _value(r.get("step_time"))
        rows.append(
            [
                esc(s if s is not None else "?") + (" ●" if inside else ""),
                esc(num(loss, 4, missing=_raw(r.get("loss")))),
                esc(num(number(r.get("grad_norm")), 3)),
                esc(f"{r['lr']:.2e}" if number(r.get("lr")) is not None else "—"),
                esc(num(st, 3, missing=_raw(r.get("step_time")))),
                esc(num(number(r.get("tokens")), 0)),
            ]
        )
        attrs.append(' class="window"' if inside else "")
    return (
        f"<details><summary>{len(rows)} steps parsed from the log (● and green: in the "
        "measured window)</summary>"
        + table(
            ["step", "loss", "grad norm", "lr", "step time (s)", "tokens"],
            rows,
            numeric=(0, 1, 2, 3, 4, 5),
            row_attrs=attrs,
        )
        + "</details>"
    )


def _order(step: int | None) -> int:
    return -1 if step is None else step


def _raw(v: object) -> str:
    return "—" if v is None else str(v)
