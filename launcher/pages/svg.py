"""Charts drawn as inline SVG text: a line chart, a stacked bar, a sparkline.

Why our own few hundred lines instead of a plotting library: the pages must render with no
network and no file beside them, stay small, and look the same in every browser; matplotlib's SVG
would do, but it costs about a second to import, embeds its fonts as paths, and cannot link a
point to a tooltip. These charts carry their numbers in <title> elements (hover) and in data-*
attributes (the browser tests read them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from launcher.pages.html import esc

GRID = "#e6e9ed"
AXIS = "#8c959f"
TEXT = "#59636e"
BLUE = "#0969da"
GREEN = "#1a7f37"
ORANGE = "#bc4c00"
RED = "#cf222e"
PURPLE = "#8250df"
GREY = "#8c959f"
# Stage colours (docs/architecture.md names the stages); training is green, the launcher's own
# time grey, and red is kept for a failed stage. Other names take the palette in turn.
STAGE_COLORS = {
    "acquire": "#8c959f",
    "preflight": "#54aeff",
    "resolve": "#80ccff",
    "image": "#0969da",
    "preflight-gpu": "#218bff",
    "stack": "#8250df",
    "rows": "#a475f9",
    "assets": "#bf8700",
    "convert": "#d4a72c",
    "ray": "#e16f24",
    "train": "#4ac26b",
    "window": "#1a7f37",
    "push": "#9a6700",
    "between": "#d0d7de",
    "collect": "#6e7781",
    "release": "#57606a",
}
PALETTE = ("#0550ae", "#6639ba", "#953800", "#116329", "#7d4e00", "#3192aa")


@dataclass
class Series:
    """One line of points; a None or non-finite y is drawn as a red cross on the x axis."""

    name: str
    points: Sequence[tuple[float, float | None]]
    color: str = BLUE
    line: bool = True
    dashed: bool = False
    markers: bool = True
    titles: Sequence[str] | None = None  # a tooltip per point
    colors: Sequence[str] | None = None  # a colour per point (marker only)
    data_key: str | None = None  # data-series on each marker, for the tests


@dataclass
class HLine:
    y: float
    label: str
    color: str = ORANGE
    dashed: bool = True


@dataclass
class Band:
    """A shaded range: of x (a window of steps) or of y (a tolerance)."""

    lo: float
    hi: float
    label: str
    color: str = GREEN
    axis: str = "x"
    opacity: float = 0.10


@dataclass
class Ring:
    """A circle around a point with a label under it (a regression)."""

    x: float
    y: float
    label: str
    color: str = RED


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    hlines: list[HLine] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    rings: list[Ring] = field(default_factory=list)
    y_clip: tuple[float, float] | None = None  # fix the y range; points beyond are clipped
    x_ticks: Sequence[tuple[float, str]] | None = None
    y_format: Callable[[float], str] | None = None
    y_zero: bool = False  # include 0 in the y range
    width: int = 560
    height: int = 270


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 x a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _tick_text(value: float, ticks: Sequence[float]) -> str:
    """A tick label with as many decimals as the tick step needs (0.25 -> two)."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    digits = 0
    while digits < 8 and abs(round(step, digits) - step) > step * 1e-6:
        digits += 1
    return f"{value:,.{digits}f}"


def _finite(y: float | None) -> bool:
    return y is not None and math.isfinite(y)


def line_chart(c: Chart) -> str:
    """The chart as one <svg> element."""
    w, h = c.width, c.height
    left, right, top, bottom = 66, 18, 14, 42
    pw, ph = w - left - right, h - top - bottom
    xs = [x for s in c.series for x, _ in s.points] + [r.x for r in c.rings]
    xs += [b.lo for b in c.bands if b.axis == "x"] + [b.hi for b in c.bands if b.axis == "x"]
    ys = [y for s in c.series for _, y in s.points if y is not None and math.isfinite(y)]
    if not xs:
        return _empty(w, h, "no data")
    x0, x1 = min(xs), max(xs)
    if x1 - x0 < 1:
        x0, x1 = x0 - 1, x1 + 1
    x_pad = (x1 - x0) * 0.03
    x0, x1 = x0 - x_pad, x1 + x_pad
    if c.y_clip is not None:
        y0, y1 = c.y_clip
    else:
        extra = [hl.y for hl in c.hlines] + [
            v for b in c.bands if b.axis == "y" for v in (b.lo, b.hi)
        ]
        pool = ys + [v for v in extra if math.isfinite(v)]
        if not pool:
            pool = [0.0, 1.0]
        y0, y1 = min(pool), max(pool)
        if c.y_zero:
            y0, y1 = min(y0, 0.0), max(y1, 0.0)
        span = (y1 - y0) or (abs(y1) * 0.1 or 1.0)
        y0, y1 = y0 - span * 0.08, y1 + span * 0.12
        if c.y_zero and min(pool) >= 0:
            y0 = 0.0

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="{esc(c.title)}" font-size="11" fill="{TEXT}">',
        f"<title>{esc(c.title)}</title>",
    ]
    # bands under everything
    for b in c.bands:
        if b.axis == "x":
            bx0, bx1 = px(max(b.lo, x0)), px(min(b.hi, x1))
            out.append(
                f'<rect x="{bx0:.1f}" y="{top}" width="{max(bx1 - bx0, 0):.1f}" height="{ph}" '
                f'fill="{b.color}" fill-opacity="{b.opacity}"><title>{esc(b.label)}</title></rect>'
            )
        else:
            lo, hi = max(b.lo, y0), min(b.hi, y1)
            if hi > lo:
                out.append(
                    f'<rect x="{left}" y="{py(hi):.1f}" width="{pw}" '
                    f'height="{py(lo) - py(hi):.1f}" fill="{b.color}" '
                    f'fill-opacity="{b.opacity}"><title>{esc(b.label)}</title></rect>'
                )
    # grid and y ticks
    yt = [t for t in nice_ticks(y0, y1, 6) if y0 <= t <= y1]
    fmt_y = c.y_format or (lambda v: _tick_text(v, yt))
    for t in yt:
        y = py(t)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
        )
        out.append(
            f'<text x="{left - 8}" y="{y + 3.5:.1f}" text-anchor="end">{esc(fmt_y(t))}</text>'
        )
    # x ticks
    if c.x_ticks is not None:
        xt = [(x, label) for x, label in c.x_ticks if x0 <= x <= x1]
        if len(xt) > 12:  # thin labels so they never overlap
            every = math.ceil(len(xt) / 12)
            xt = [p for i, p in enumerate(xt) if i % every == 0 or i == len(xt) - 1]
    else:
        xt = [
            (t, f"{t:g}") for t in nice_ticks(x0, x1, 8) if x0 <= t <= x1 and float(t).is_integer()
        ]
    for x, label in xt:
        cx = px(x)
        out.append(
            f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{top + ph}" y2="{top + ph + 4}" '
            f'stroke="{AXIS}"/>'
        )
        out.append(
            f'<text x="{cx:.1f}" y="{top + ph + 16}" text-anchor="middle">{esc(label)}</text>'
        )
    out.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="{AXIS}"/>'
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="{AXIS}"/>'
    )
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{h - 6}" text-anchor="middle">{esc(c.x_label)}</text>'
        f'<text transform="translate(14 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{esc(c.y_label)}</text>"
    )
    # reference lines
    for hl in c.hlines:
        if not (math.isfinite(hl.y) and y0 <= hl.y <= y1):
            continue
        y = py(hl.y)
        dash = ' stroke-dasharray="6 4"' if hl.dashed else ""
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{hl.color}" '
            f'stroke-width="1.5"{dash}><title>{esc(hl.label)}</title></line>'
        )
    # series
    for s in c.series:
        out.append(_series(s, px, py, y0, y1, top, ph))
    for r in c.rings:
        if not _finite(r.y):
            continue
        ry = min(max(r.y, y0), y1)
        below = py(ry) < top + ph * 0.6  # the label goes where the plot has room
        ly = py(ry) + 21 if below else py(ry) - 13
        out.append(
            f'<circle cx="{px(r.x):.1f}" cy="{py(ry):.1f}" r="8" fill="none" stroke="{r.color}" '
            f'stroke-width="2"><title>{esc(r.label)}</title></circle>'
            f'<text x="{px(r.x):.1f}" y="{ly:.1f}" text-anchor="middle" '
            f'fill="{r.color}" font-weight="600">{esc(r.label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _series(
    s: Series,
    px: Callable[[float], float],
    py: Callable[[float], float],
    y0: float,
    y1: float,
    top: float,
    ph: float,
) -> str:
    out: list[str] = []
    run: list[str] = []  # the current unbroken stretch of the line
    runs: list[list[str]] = []
    for x, y in s.points:
        if _finite(y) and y is not None:
            run.append(f"{px(x):.1f},{py(min(max(y, y0), y1)):.1f}")
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    if s.line:
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        for r in runs:
            if len(r) > 1:
                out.append(
                    f'<polyline points="{" ".join(r)}" fill="none" stroke="{s.color}" '
                    f'stroke-width="1.8" stroke-linejoin="round"{dash}/>'
                )
    if not s.markers:
        return "".join(out)
    key = f' data-series="{esc(s.data_key)}"' if s.data_key else ""
    for i, (x, y) in enumerate(s.points):
        tip = s.titles[i] if s.titles is not None and i < len(s.titles) else f"{x:g}: {y}"
        color = s.colors[i] if s.colors is not None and i < len(s.colors) else s.color
        cx = px(x)
        data = f'{key} data-x="{x:g}" data-y="{y if y is not None else ""}"'
        if not _finite(y) or y is None:
            cy = top + ph - 6
            out.append(
                f'<g{data}><path d="M{cx - 4:.1f},{cy - 4:.1f}l8,8m0,-8l-8,8" stroke="{RED}" '
                f'stroke-width="2"/><title>{esc(tip)}</title></g>'
            )
        elif y > y1 or y < y0:  # off the scale: a triangle at the edge, the value beside it
            up = y > y1
            cy = py(y1) + 6 if up else py(y0) - 6
            tri = f"M{cx:.1f},{cy - 5:.1f}l5,8h-10z" if up else f"M{cx:.1f},{cy + 5:.1f}l5,-8h-10z"
            out.append(
                f'<g{data}><path d="{tri}" fill="{color}"/><text x="{cx + 8:.1f}" '
                f'y="{cy + 4:.1f}" fill="{color}">{esc(_short(y))}</text>'
                f"<title>{esc(tip)} (off the scale)</title></g>"
            )
        else:
            out.append(
                f'<circle{data} cx="{cx:.1f}" cy="{py(y):.1f}" r="3.4" fill="{color}" '
                f'stroke="#fff" stroke-width="1"><title>{esc(tip)}</title></circle>'
            )
    return "".join(out)


def _short(y: float) -> str:
    return f"{y:,.3g}" if abs(y) < 1000 else f"{y:,.0f}"


def _empty(w: int, h: int, text: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="{esc(text)}"><rect x="0.5" y="0.5" width="{w - 1}" height="{h - 1}" '
        f'fill="#f6f8fa" stroke="#d1d9e0" rx="8"/><text x="{w / 2}" y="{h / 2}" '
        f'text-anchor="middle" fill="{TEXT}" font-size="13">{esc(text)}</text></svg>'
    )


def stacked_bar(
    segments: Sequence[tuple[str, float, str, str]], *, width: int = 1060, height: int = 46
) -> str:
    """One horizontal bar split into (label, value, colour, tooltip) segments by value."""
    total = sum(v for _, v, _, _ in segments if v > 0)
    if total <= 0:
        return _empty(width, height, "no stage times recorded")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="GPU-hours by stage" font-size="12">'
    ]
    x = 0.0
    for label, value, color, tip in segments:
        if value <= 0:
            continue
        seg = width * value / total
        out.append(
            f'<g data-stage="{esc(label)}"><rect x="{x:.1f}" y="0" width="{seg:.1f}" '
            f'height="{height}" fill="{color}"><title>{esc(tip)}</title></rect>'
        )
        share = f"{label} {100 * value / total:.0f}%"
        if seg > 7.2 * len(share) + 8:
            out.append(
                f'<text x="{x + seg / 2:.1f}" y="{height / 2 + 4:.1f}" text-anchor="middle" '
                f'fill="#fff" font-weight="600">{esc(share)}</text>'
            )
        out.append("</g>")
        x += seg
    out.append("</svg>")
    return "".join(out)


def sparkline(
    values: Sequence[float | None],
    colors: Sequence[str],
    *,
    width: int = 140,
    height: int = 30,
    title: str = "",
) -> str:
    """A small trend line; each point coloured (by verdict), the last one larger."""
    pts = [(i, v) for i, v in enumerate(values) if _finite(v) and v is not None]
    if not pts:
        return '<span class="dim">no figures</span>'
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi - lo < 1e-9 * max(abs(hi), 1):
        lo, hi = lo - 1, hi + 1
    n = max(len(values) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return 4 + (width - 8) * i / n, 4 + (height - 8) * (1 - (v - lo) / (hi - lo))

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in pts))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
        f"<title>{esc(title)}</title>"
        f'<polyline points="{line}" fill="none" stroke="{GREY}" stroke-width="1.3"/>'
    ]
    for i, v in pts:
        x, y = xy(i, v)
        r = 3.2 if i == len(values) - 1 else 2.2
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colors[i]}"/>')
    out.append("</svg>")
    return "".join(out)
