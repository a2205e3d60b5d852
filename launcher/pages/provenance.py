"""The run page's provenance: what exactly ran, set against what the card pins.

Why it matters to a reader: a reproduction is only evidence about the card when it ran the card's
image (by digest), the card's software stack, the card's data and checkpoint (by hash and
revision), and when its dollar and MFU figures used a known price and peak. Each of those is shown
with its source file, and with "not recorded" where the run has no such record.
"""

from __future__ import annotations

from typing import Any

from launcher.pages.html import code, esc, not_recorded, num, number, table
from launcher.pages.run_sections import Context
from launcher.records.rundir import Files

_CHECK_FILES = ((Files.PREFLIGHT, "host preflight"), (Files.PREFLIGHT_GPU, "GPU preflight"))


def _map(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _digest(ref: object) -> str | None:
    if not isinstance(ref, str) or "sha256:" not in ref:
        return None
    return "sha256:" + ref.split("sha256:", 1)[1][:64]


def provenance(ctx: Context) -> str:
    return (
        _facts(ctx)
        + "<h3>Software stack: the card against the image</h3>"
        + _stack(ctx)
        + "<h3>Node checks</h3>"
        + _checks(ctx)
        + "<h3>Assets: data, tokenizer, checkpoint</h3>"
        + _assets(ctx)
    )


def _facts(ctx: Context) -> str:
    plan = ctx.plan
    image_facts = ctx.files.mapping(Files.IMAGE)
    facts: list[tuple[str, str]] = []
    facts.append(
        (
            "recipe",
            esc(ctx.slug)
            + (f"<br>file sha256 {code(plan.recipe_sha256)}" if plan.recipe_sha256 else "")
            + (f"<br>card status: {esc(ctx.card.status)}" if ctx.card.status else ""),
        )
    )
    gpus_per_node = plan.gpus_per_node
    facts.append(
        (
            "cluster",
            esc(ctx.cluster or "not recorded")
            + (
                f" · {esc(ctx.nodes)} node(s) × {esc(gpus_per_node)} GPUs"
                if ctx.nodes and gpus_per_node
                else ""
            ),
        )
    )
    pinned = plan.image
    verified = image_facts.get("image") or image_facts.get("digest")
    if pinned or verified:
        same = _digest(pinned) is not None and _digest(pinned) == _digest(verified)
        mark = ""
        if verified and pinned:
            mark = (
                '<span class="ok" data-image-match="yes">✓ the node ran the pinned digest</span>'
                if same
                else '<span class="no" data-image-match="no">✗ the digests differ</span>'
            )
        facts.append(
            (
                "training image",
                f"pinned by the recipe: {code(pinned or 'not recorded')}<br>"
                f"verified on the node: "
                + (code(verified) if verified else esc(ctx.files.why_not(Files.IMAGE)))
                + (f"<br>{mark}" if mark else ""),
            )
        )
    else:
        facts.append(("training image", esc(ctx.files.why_not(Files.PLAN))))
    price = _map(ctx.prov.get("price"))
    if price:
        facts.append(
            (
                "price used",
                f'<span data-price="{esc(price.get("usd_per_hour"))}">'
                f"${esc(num(price.get('usd_per_hour'), 3))} per node-hour</span>"
                + (f" × {esc(ctx.nodes)} node(s)" if ctx.nodes else "")
                + (
                    f"<br><span class='dim' data-price-source=\"{esc(price.get('source'))}\">"
                    f"{esc(_price_words(price))}</span>"
                    if price.get("source")
                    else ""
                ),
            )
        )
    else:
        facts.append(
            (
                "price used",
                esc(
                    "none recorded: no $ / 1M tokens"
                    if ctx.result
                    else ctx.files.why_not(Files.RESULT)
                ),
            )
        )
    peak = number(ctx.prov.get("mfu_peak_flops"))
    if peak:
        facts.append(
            (
                "peak used (MFU)",
                f'<span data-peak="{peak}">{peak / 1e12:g} TFLOP/s</span>'
                + (
                    f" · {esc(ctx.prov.get('mfu_peak_source'))}"
                    if ctx.prov.get("mfu_peak_source")
                    else ""
                )
                + (
                    f"<br><span class='dim'>MFU = {esc(ctx.prov.get('mfu_formula'))}</span>"
                    if ctx.prov.get("mfu_formula")
                    else ""
                ),
            )
        )
    else:
        facts.append(("peak used (MFU)", esc(ctx.result.get("mfu_note") or "not recorded")))
    if ctx.prov.get("std_kind"):
        facts.append(
            (
                "step-time CV",
                esc(
                    f"{ctx.prov.get('std_kind')} standard deviation / mean over the window; mean "
                    f"{num(ctx.prov.get('mean_step_time_s'), 3)} s"
                ),
            )
        )
    items = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    return f'<dl class="facts">{items}</dl>'


def _stack(ctx: Context) -> str:
    stack = ctx.files.mapping(Files.STACK)
    card = ctx.card.stack
    out = []
    if not stack:
        out.append(not_recorded(ctx.files.why_not(Files.STACK)))
    elif stack.get("skipped") or not stack.get("checks"):
        out.append(
            not_recorded(
                "The image's stack was not probed"
                + (f": {stack.get('note')}" if stack.get("note") else "")
                + (f" (policy {stack.get('policy')})" if stack.get("policy") else "")
                + "."
            )
        )
    else:
        rows, attrs = [], []
        for c in stack["checks"]:
            if not isinstance(c, dict):
                continue
            ok = c.get("ok")
            rows.append(
                [
                    esc(c.get("name")),
                    code(c.get("expected") or "—"),
                    code(c.get("value") or "—"),
                    '<span class="ok">match</span>' if ok else '<span class="no">differs</span>',
                    f'<span class="dim">{esc(c.get("note") or "")}</span>',
                ]
            )
            attrs.append("" if ok else ' class="fail"')
        failed = sum(1 for a in attrs if a)
        out.append(
            f'<p class="sub">{len(rows) - failed} of {len(rows)} versions match the card'
            + (f" (policy {esc(stack.get('policy'))})" if stack.get("policy") else "")
            + ".</p>"
            + table(
                ["component", "the card", "found in the image", "", "note"], rows, row_attrs=attrs
            )
        )
    if card.stated:
        rows = [[esc(k), esc(v)] for k, v in card.versions]
        out.append(
            "<details><summary>The card's stack, as published</summary>"
            + table(["field", "as the card states it"], rows)
            + (f'<p class="sub">{esc(card.source)}</p>' if card.source else "")
            + "</details>"
        )
    return "".join(out)


def _checks(ctx: Context) -> str:
    out = []
    for name, label in _CHECK_FILES:
        data = ctx.files.mapping(name)
        if not data:
            if name == Files.PREFLIGHT or ctx.files.problems.get(name, "missing") != "missing":
                out.append(
                    f"<p><b>{esc(label)}</b>: "
                    f"<span class='dim'>{esc(ctx.files.why_not(name))}</span></p>"
                )
            continue
        checks = [c for c in (data.get("checks") or []) if isinstance(c, dict)]
        failed = [c for c in checks if not c.get("ok")]
        warned = [c for c in checks if c.get("ok") and c.get("warning")]
        ok = data.get("ok")
        verdict = '<span class="ok">passed</span>' if ok else '<span class="no">failed</span>'
        summary = (
            f"<b>{esc(label)}</b>: {verdict}, {len(checks) - len(failed)} of {len(checks)} checks"
            + (f", {len(warned)} warning(s)" if warned else "")
        )
        rows, attrs = [], []
        for c in checks:
            unit = c.get("unit")
            value = c.get("value")
            shown = f"{num(value, 3) if isinstance(value, float) else value}"
            shown += f" {unit}" if unit else ""
            result = (
                '<span class="ok">pass</span>' if c.get("ok") else '<span class="no">FAIL</span>'
            )
            if c.get("ok") and c.get("warning"):
                result = '<span class="warn">warning</span>'
            rows.append(
                [
                    esc(c.get("name")),
                    esc(shown if value is not None else "—"),
                    esc(c.get("expected") or "—"),
                    result
                    + (
                        f'<span class="why">{esc(c.get("warning"))}</span>'
                        if c.get("warning")
                        else ""
                    ),
                ]
            )
            attrs.append(' class="fail"' if not c.get("ok") else "")
        opened = " open" if failed else ""
        out.append(
            f"<details{opened}><summary>{summary}</summary>"
            + table(["check", "value", "expected", "result"], rows, row_attrs=attrs)
            + "</details>"
        )
    return "".join(out)


def _assets(ctx: Context) -> str:
    data = ctx.card.workload.dataset
    build = data.build
    claim = ctx.card.claim
    rows: list[list[str]] = []
    if data.stated:
        rows.append(
            [
                "dataset",
                esc(f"{data.source or '—'} @ {data.revision or '—'}"),
                esc(data.license or ""),
            ]
        )
        if data.rows_sha256:
            rows.append(["rows sha256", code(data.rows_sha256), esc(build.name or "")])
        if build.parquet_sha256:
            rows.append(
                [
                    "rows parquet sha256",
                    code(build.parquet_sha256),
                    esc(f"{num(build.parquet_bytes, 0)} bytes"),
                ]
            )
        if build.tokenizer:
            rows.append(["tokenizer", esc(build.tokenizer), ""])
    source, revision = claim.active_params_source, claim.active_params_revision
    if any(v is not None for v in (claim.active_params, source, revision)):
        rows.append(
            [
                "checkpoint",
                esc(f"{source or '—'} @ {revision or '—'}"),
                esc(f"{num(claim.active_params, 0)} active parameters"),
            ]
        )
    used = [[esc(k), code(v)] for k, v in ctx.plan.assets if v is not None]
    out = []
    if rows:
        out.append(table(["pinned by the card", "value", ""], rows, cls="kv"))
    else:
        out.append(
            not_recorded(
                ctx.files.why_not(Files.RECIPE)
                if not ctx.card.stated
                else "The recipe pins no asset hash."
            )
        )
    status = {str(s.name): s.status for s in ctx.timeline.stages}
    if "assets" in status:
        word = status["assets"]
        out.append(
            '<p class="sub" style="margin-top:8px">The node\'s assets stage, which fetches '
            "these and checks their hashes: "
            + (
                '<span class="ok">ok</span>'
                if word == "ok"
                else f'<span class="no">{esc(word)}</span>'
            )
            + ".</p>"
        )
    if used:
        out.append(
            "<details><summary>Where the run kept them (plan.json)</summary>"
            + table(["asset", "value"], used)
            + "</details>"
        )
    return "".join(out)


def _price_words(price: dict[str, Any]) -> str:
    """Where the run's price came from, in the words every $ figure carries (catalog.Price)."""
    from launcher.catalog import Price

    parsed = Price.from_dict(price)
    return parsed.describe() if parsed is not None else str(price.get("source"))
