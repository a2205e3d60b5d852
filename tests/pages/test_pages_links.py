"""Links on the pages: a run directory's name is a file name, never a URL (issue 19).

A run directory named `javascript:alert(1)` used to become `<a href="javascript:alert(1)/...">` on
the history page. Every href of every page now comes from launcher/pages/html.py's `link`, which
only emits relative paths (percent-encoded, starting with ./ or ../), anchors, or http(s)/mailto.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from support.page_read import parse
from support.pages import SLUG, make_run

from launcher.pages import write_history_page, write_nightly_page, write_run_page
from launcher.pages.html import link, rel_href, safe_href
from launcher.records.history import History
from launcher.runner.nightly import RecipeRun

# names a run directory may really have on a POSIX file system, each hostile to a naive href
HOSTILE = [
    "javascript:alert(1)",
    "JaVaScRiPt:alert(document.cookie)",
    "data:text,html;<script>alert(1)<",
    "vbscript:msgbox(1)",
    'x" onmouseover="alert(1)',
    "a b#frag?q=1&r=<i>",
    "%2e%2e%2fsecret",
    "\tjavascript:alert(1)",
    "java\nscript:alert(1)",
    "http:evil.example",
    "//evil.example",
]


def _hrefs(html: str) -> list[str]:
    return [d["href"] for tag, d in parse(html).attrs if tag == "a" and "href" in d]


def _assert_points_at_the_report(href: str, page_dir: Path, report: Path) -> None:
    parts = urlsplit(href)
    assert parts.scheme == "" and parts.netloc == "", href
    assert href.startswith(("./", "../")), href
    assert (page_dir / unquote(parts.path)).resolve() == report.resolve(), href


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_run_directory_name_is_a_relative_link_to_its_report(tmp_path, name):
    if "/" in name.replace("//", "x/"):
        name = name.replace("/", "_")  # a name cannot hold '/': keep the rest of it
    rd = make_run(tmp_path, name)
    report = write_run_page(rd)
    with History(tmp_path / "history.sqlite") as hist:
        hist.record(rd)
        rows = hist.runs(SLUG)
    # the page beside the run directories: the relative path starts with the hostile name
    page = write_history_page(rd.parent / "history.html", SLUG, rows)
    hrefs = _hrefs(page.read_text())
    assert hrefs
    for href in hrefs:
        _assert_points_at_the_report(href, page.parent, report)

    class Entry:
        recipe = Path("recipes/x.yaml")
        run = RecipeRun(recipe, 0, rd, None)
        outcome = "reproduced"

        def __init__(self) -> None:
            self.row = rows[-1]
            from launcher.records.history import check_regression

            self.assessment = check_regression(rows[-1], [])

    night = write_nightly_page(
        rd.parent, [Entry()], cluster="local", stamp=time.time(), exit_code=0
    )
    files = [h for h in _hrefs(night.read_text()) if not h.startswith("#")]
    assert files
    for href in files:
        _assert_points_at_the_report(href, night.parent, report)


UNSAFE_HREFS = [h for h in HOSTILE if ":" in h or h.startswith("//") or " " in h] + [
    "",
    None,
    " https://x",
    "https://x\u0085y",
    "file:///etc/passwd",
    "a:b/report.html",
]


@pytest.mark.parametrize("href", UNSAFE_HREFS)
def test_link_never_emits_an_unsafe_href(href):
    assert safe_href(href) is None
    html = link(href, "<run>")
    assert "<a" not in html and "&lt;run&gt;" in html


@pytest.mark.parametrize(
    "href", ["./a/report.html", "../b%3Ac/report.html", "#r-1", "https://example.com/x?a=1"]
)
def test_link_keeps_relative_paths_anchors_and_web_pages(href):
    assert safe_href(href) == href
    assert link(href, "t").startswith(f'<a href="{href.replace("&", "&amp;")}"')


def test_rel_href_encodes_every_segment(tmp_path):
    target = tmp_path / "javascript:x" / 'a"b' / "report.html"
    assert rel_href(target, tmp_path) == "./javascript%3Ax/a%22b/report.html"
    assert rel_href(target, tmp_path / "pages").startswith("../javascript%3Ax/")
