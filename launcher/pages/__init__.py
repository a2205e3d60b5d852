"""HTML pages people look at: a run's report.html, a recipe's history, a night's summary.

Why pages at all: recipe authors and their readers compare a published card with a reproduction,
and a self-contained file (inline CSS, inline SVG charts, no JavaScript, nothing fetched) opens
anywhere and can be shared. Each page is a pure function of data (render_*) plus a small writer
(write_*); the run page is made from the run directory's own files, so it can be regenerated
offline (`python -m launcher.pages RUN_DIR`). docs/report.md describes every page.
"""

from __future__ import annotations

from launcher.pages.history_page import render_history_page, write_history_page
from launcher.pages.nightly_page import NodeGroupView, render_nightly_page, write_nightly_page
from launcher.pages.run_page import (
    PAGE_NAME,
    render_run_page,
    write_run_page,
    write_run_page_safely,
)

__all__ = [
    "PAGE_NAME",
    "render_history_page",
    "NodeGroupView",
    "render_nightly_page",
    "render_run_page",
    "write_history_page",
    "write_nightly_page",
    "write_run_page",
    "write_run_page_safely",
]
