"""The pieces every page shares: escaping, the stylesheet, the verdict's colours, tables, figures.

Why one stylesheet inlined in every page: a page must open from a file, an e-mail attachment or a
CI artifact with no network and no neighbouring files, so nothing is linked; the same rules keep
the three pages (run, history, nightly) looking like one product. No JavaScript: the pages are
documents to read and share, and tooltips are SVG <title> elements.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from launcher import __version__
from launcher.excerpt import printable


def esc(value: object) -> str:
    """Text for HTML (quotes included, so the result is also safe inside an attribute), made
    printable first (launcher/excerpt.py): a page shows text the node, the log or a stranger's
    bundle carried, and an ESC, a NUL or a bidi override (U+202E turns the rest of a line around)
    is shown as its escape, never as itself. Line breaks stay: a log excerpt is lines."""
    return html.escape(printable("" if value is None else str(value), keep="\n"), quote=True)


# Links (every <a href> of every page is built by `link`): a page links only to files beside it
# (a relative path, each segment percent-encoded, so a run directory named "javascript:..." stays
# a file name), to an anchor of itself, or to a web page (http, https, mailto). Anything else,
# and any href with a control character or a space (browsers drop those before reading the
# scheme: "java\tscript:" is javascript:), is shown as text, never as a link.
SAFE_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_UNSAFE_IN_HREF = re.compile(r"[\x00-\x20\x7f-\x9f\\]")


def rel_href(target: Path, page_dir: Path) -> str:
    """The href from a page in PAGE_DIR to the file TARGET: relative, percent-encoded, and
    starting with "./" or "../", so its first segment can never be read as a scheme."""
    rel = Path(os.path.relpath(target, page_dir)).as_posix()
    encoded = "/".join(quote(part, safe="") for part in rel.split("/"))
    return encoded if encoded.startswith("../") else f"./{encoded}"


def safe_href(href: str | None) -> str | None:
    """HREF when a page may link to it (see above), else None."""
    if not href or _UNSAFE_IN_HREF.search(href) or href.startswith("//"):
        return None
    m = _SCHEME.match(href)
    if m and m.group(1).lower() not in SAFE_SCHEMES:
        return None
    if m and m.group(1).lower() != "mailto" and not href[m.end() :].startswith("//"):
        return None  # "http:host" is read as http://host from a page that is a file
    if not m and ":" in href.split("/", 1)[0].split("#", 1)[0].split("?", 1)[0]:
        return None  # "a:b/..." has no valid scheme, but a reader might still take it for one
    return href


def link(href: str | None, text: object, *, cls: str = "") -> str:
    """<a href> to HREF when it is safe (escaped); otherwise TEXT alone, in a <span>."""
    klass = f' class="{esc(cls)}"' if cls else ""
    safe = safe_href(href)
    if safe is None:
        return f"<span{klass}>{esc(text)}</span>"
    return f'<a href="{esc(safe)}"{klass}>{esc(text)}</a>'


@dataclass(frozen=True)
class Status:
    """How a verdict or an outcome is shown: its label, colours and one line on what it means."""

    label: str
    fg: str
    bg: str
    meaning: str


# Every verdict status (launcher/judge/verdict.py, docs/measurement.md), the nightly outcomes and
# the
# run states a page can meet. An unknown word is shown as is, in grey: never hidden.
STATUSES: dict[str, Status] = {
    "reproduced": Status(
        "reproduced", "#116329", "#dafbe1", "the claim holds: throughput within the tolerance"
    ),
    "faster": Status(
        "faster", "#0550ae", "#ddf4ff", "faster than the card claims, beyond the tolerance"
    ),
    "slower": Status(
        "slower", "#953800", "#fff1e5", "slower than the card claims, beyond the tolerance"
    ),
    "unstable": Status(
        "unstable", "#7d4e00", "#fff8c5", "step times vary far more than the card's step-time CV"
    ),
    "incomplete": Status(
        "incomplete", "#424a53", "#eaeef2", "the run did not cover the measured window: not judged"
    ),
    "failed": Status(
        "failed",
        "#a40e26",
        "#ffebe9",
        "training failed (no steps, NaN, a failed stage): not judged",
    ),
    "mismatch": Status(
        "mismatch",
        "#6639ba",
        "#fbefff",
        "the log is not a run of this recipe as written: its evidence disagrees with the recipe",
    ),
    "unreadable": Status(
        "unreadable", "#424a53", "#eaeef2", "no metric line of the log could be read: not judged"
    ),
    "pass": Status("pass", "#116329", "#dafbe1", "every criterion passes"),
    "fail": Status("fail", "#a40e26", "#ffebe9", "at least one criterion fails"),
    "regression": Status("regression", "#a40e26", "#ffebe9", "below the claim or the trend"),
    "check failed": Status(
        "check failed", "#953800", "#fff1e5", "a check failed or the verdict is not reproduced"
    ),
    "invalid": Status("invalid", "#a40e26", "#ffebe9", "the recipe could not be loaded"),
    "infra": Status("infra", "#7d4e00", "#fff8c5", "infrastructure failure: not measured"),
    "error": Status("error", "#a40e26", "#ffebe9", "an unexpected error: not measured"),
    "interrupted": Status("interrupted", "#424a53", "#eaeef2", "interrupted"),
    "cancelled": Status("cancelled", "#424a53", "#eaeef2", "cancelled"),
    "detached": Status("detached", "#424a53", "#eaeef2", "the run went on without the launcher"),
    "running": Status("running", "#0550ae", "#ddf4ff", "still running"),
}
_UNKNOWN = ("#424a53", "#eaeef2")


def status_of(word: str | None) -> Status:
    if not word:
        return Status("not judged", *_UNKNOWN, "no verdict was recorded")
    known = STATUSES.get(word)
    return known if known is not None else Status(word, *_UNKNOWN, word)


def badge(word: str | None, *, big: bool = False, attr: str = "") -> str:
    s = status_of(word)
    cls = "badge big" if big else "badge"
    return (
        f'<span class="{cls}" style="color:{s.fg};background:{s.bg};border-color:{s.fg}33"'
        f' title="{esc(s.meaning)}"{attr}>{esc(s.label)}</span>'
    )


def number(value: object) -> float | None:
    """A finite number, or None (bools, text, NaN and inf are not figures)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def num(value: object, digits: int = 2, *, missing: str = "—", suffix: str = "") -> str:
    """A figure as people read it: thousands separators, fixed decimals; NaN/inf said so."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    v = number(value)
    if v is None:
        return missing
    return f"{v:,.{digits}f}{suffix}"


def signed(value: object, digits: int = 2, *, suffix: str = "%", missing: str = "—") -> str:
    v = number(value)
    if v is None:
        return missing
    text = f"{v:+.{digits}f}{suffix}"
    return text.replace("-", "\u2212")  # a real minus sign: it reads as one


def duration(seconds: object) -> str:
    s = number(seconds)
    if s is None:
        return "—"
    if s < 1:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    cls: str = "",
    numeric: Sequence[int] = (),
    row_attrs: Sequence[str] | None = None,
) -> str:
    """A table of already-escaped cells; `numeric` columns are right-aligned."""
    head = "".join(
        f'<th class="{"num" if i in numeric else ""}">{h}</th>' for i, h in enumerate(header)
    )
    body = []
    for n, row in enumerate(rows):
        attrs = row_attrs[n] if row_attrs is not None and n < len(row_attrs) else ""
        cells = "".join(
            f'<td class="{"num" if i in numeric else ""}">{c}</td>' for i, c in enumerate(row)
        )
        body.append(f"<tr{attrs}>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def not_recorded(what: str) -> str:
    return f'<p class="missing">{esc(what)}</p>'


def section(anchor: str, title: str, body: str, *, note: str = "") -> str:
    sub = f'<p class="sub">{note}</p>' if note else ""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{sub}{body}</section>'


def code(value: object) -> str:
    return f"<code>{esc(value)}</code>"


def page(title: str, header: str, body: str, footer: str) -> str:
    """A complete HTML document: the stylesheet inline, nothing fetched."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="reproduce ' + esc(__version__) + '">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f'<body><header class="top">{header}</header><main>{body}</main>'
        f'<footer class="foot"><div>{footer}</div></footer></body></html>\n'
    )


CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;--accent:#0969da;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;color:var(--fg);background:#fff;font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"Liberation Sans","DejaVu Sans",Helvetica,Arial,sans-serif}
header.top,main,footer.foot{max-width:1180px;margin:0 auto;padding:0 28px}
header.top{padding-top:28px;padding-bottom:8px}
.kicker{font-size:12px;letter-spacing:.08em;text-transform:uppercase;color:var(--muted);margin:0}
h1{font-size:28px;line-height:1.25;margin:4px 0 6px;font-weight:650}
h2{font-size:19px;margin:0 0 4px;font-weight:650}
h3{font-size:15px;margin:18px 0 6px;font-weight:650}
.meta{color:var(--muted);margin:0;font-size:14px}
.meta span{white-space:nowrap}
.meta span+span:before{content:"\\00b7";margin:0 8px;color:#8c959f}
section{margin:30px 0;padding-top:6px;border-top:1px solid var(--line)}
section>h2{margin-top:14px}
p.sub{color:var(--muted);margin:0 0 14px;font-size:14px}
p.missing{color:var(--muted);font-style:italic;background:var(--soft);border:1px dashed var(--line);
border-radius:6px;padding:10px 14px;margin:8px 0}
code,.mono{font:12.5px/1.4 ui-monospace,SFMono-Regular,"DejaVu Sans Mono",Menlo,Consolas,monospace}
code{background:var(--soft);padding:1px 5px;border-radius:4px;overflow-wrap:anywhere}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
p,li,dd,dt,h1,h2,h3{overflow-wrap:anywhere}  /* a long id never widens the page */
.badge{display:inline-block;border:1px solid;border-radius:999px;padding:1px 10px;font-size:12.5px;
font-weight:650;letter-spacing:.02em;white-space:nowrap;text-transform:uppercase}
.badge.big{font-size:17px;padding:4px 16px}
.verdict{display:flex;gap:18px;align-items:flex-start;border-radius:10px;padding:16px 20px;
margin:18px 0 6px;border:1px solid}
.verdict .what{font-size:16px;font-weight:600;margin:2px 0 4px}
.verdict ul{margin:6px 0 0;padding-left:18px}.verdict li{margin:2px 0}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(190px,100%),1fr));
gap:12px;margin:14px 0}
.tile{border:1px solid var(--line);border-radius:10px;padding:12px 14px 10px;background:#fff}
.tile .label{font-size:12.5px;color:var(--muted);text-transform:uppercase;letter-spacing:.05em}
.tile .value{font-size:26px;font-weight:650;line-height:1.2;margin:4px 0 2px;
font-variant-numeric:tabular-nums}
.tile .claim{font-size:13.5px;color:var(--muted);font-variant-numeric:tabular-nums}
.tile .claim b{color:var(--fg);font-weight:600}
.tile .gauge{margin-top:6px}
.chip{display:inline-block;font-size:12.5px;border-radius:5px;padding:0 6px;margin-left:4px;
background:var(--soft);color:var(--muted);font-variant-numeric:tabular-nums}
.chip.good{background:#dafbe1;color:#116329}.chip.bad{background:#ffebe9;color:#a40e26}
.chip.warn{background:#fff1e5;color:#953800}
table{border-collapse:collapse;width:100%;font-size:14px;margin:8px 0 4px}
table.compact{width:auto;min-width:50%}
.scroll{overflow-x:auto}.nowrap{white-space:nowrap}
.recipe{display:inline-block;min-width:200px}
table.kv td:first-child{white-space:nowrap;color:var(--muted)}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12.5px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);
font-weight:600;background:var(--soft)}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.window td{background:#f0faf2}
tr.fail td{background:#fff5f5}
tr.regression td{background:#fff5f5}
td .why{display:block;color:var(--muted);font-size:12.5px}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(440px,100%),1fr));gap:18px}
figure{margin:6px 0;border:1px solid var(--line);border-radius:10px;padding:10px 12px 6px}
figure svg{display:block;width:100%;height:auto}
svg{max-width:100%}
figcaption{font-size:13px;color:var(--muted);margin:2px 0 4px}
figcaption b{color:var(--fg);font-weight:650;font-size:14px}
dl.facts{display:grid;grid-template-columns:minmax(110px,220px) minmax(0,1fr);gap:6px 18px;
margin:8px 0}
dl.facts dt{color:var(--muted);font-size:14px}dl.facts dd{margin:0;min-width:0}
.ok{color:var(--ok);font-weight:600}.no{color:var(--bad);font-weight:600}
.warn{color:var(--warn);font-weight:600}.dim{color:var(--muted)}
details{margin:10px 0}summary{cursor:pointer;color:var(--accent);font-size:14px}
ul.notes{margin:6px 0;padding-left:20px}ul.notes li{margin:3px 0}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;font-size:13px;color:var(--muted);margin:4px 0}
.legend i{display:inline-block;width:11px;height:11px;border-radius:3px;margin-right:5px;
vertical-align:-1px}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:14px 0}
footer.foot{color:var(--muted);font-size:13px;padding-bottom:36px;margin-top:36px}
footer.foot>div{border-top:1px solid var(--line);padding-top:12px}
@media (max-width:640px){header.top,main,footer.foot{padding-left:14px;padding-right:14px}
h1{font-size:22px}.verdict{flex-direction:column;gap:8px}}
@media print{section{break-inside:avoid}}
"""
