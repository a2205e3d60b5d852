"""A failed or incomplete run on the pages: never the in-band mark, the error that ended it
shown, never a point of a trend (issue 20: an illegal-memory-access run showed the green in-band
dot, and `history` plotted a failed run's tokens/s)."""

from __future__ import annotations

import re

from support.history import CLAIM, row
from support.pages import SLUG, make_run

from launcher.pages import render_history_page
from launcher.pages.run_page import PAGE_NAME


def test_a_run_stopped_by_a_cuda_error_shows_the_error_and_no_in_band_mark(tmp_path):
    rd = make_run(tmp_path, fail_at=12)  # the stand-in's illegal memory access at step 12
    html = (rd / PAGE_NAME).read_text()
    assert 'data-status="failed"' in html
    assert "The error that ended it" in html and "illegal memory access" in html
    assert 'class="chip good"' not in html  # the in-band mark
    assert "within -3%" not in html and "within −3%" not in html


def test_a_run_whose_optimizer_steps_were_skipped_is_failed_on_its_page(tmp_path):
    rd = make_run(tmp_path, skip_from=8)
    html = (rd / PAGE_NAME).read_text()
    assert 'data-status="failed"' in html and "valid_step=false" in html
    assert 'class="chip good"' not in html


def test_history_draws_a_failed_or_incomplete_run_as_a_mark_never_a_point():
    rows = [row(i, 6905.0 + i, "reproduced") for i in range(4)]
    rows += [row(4, CLAIM, "failed"), row(5, CLAIM * 0.99, "incomplete")]
    html = render_history_page(SLUG, rows)
    for r in rows[4:]:
        # each chart's point of that run says it has no figure (drawn as the axis cross)
        titles = re.findall(rf"<title>{re.escape(r.run_id)}[^<]*</title>", html)
        assert titles and all("no figure" in t for t in titles), titles
    assert all(
        "no figure" not in t
        for r in rows[:4]
        for t in re.findall(rf"<title>{re.escape(r.run_id)}[^<]*</title>", html)
    )
