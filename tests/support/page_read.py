"""Reading a rendered page back, as a person would read it: every element's text and data-*
attributes (the figures and the claims the page shows), and the checks the page tests share (the
figures equal result.yaml's; nothing is fetched from elsewhere)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from support.pages import CLAIMED_TPS


class Collect(HTMLParser):
    """Every element's attributes and text, by data-* key."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[dict[str, str | None]] = []
        self.figures: dict[str, str] = {}
        self.claims: dict[str, str] = {}
        self.attrs: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        self.attrs.append((tag, d))
        if tag not in ("br", "meta", "img", "input", "link"):
            self.stack.append(d | {"__text": ""})

    def handle_endtag(self, tag):
        if self.stack:
            d = self.stack.pop()
            if d.get("data-figure") and "data-run" not in d:
                self.figures.setdefault(str(d["data-figure"]), str(d["__text"]).strip())
            if d.get("data-claim"):
                self.claims[str(d["data-claim"])] = str(d["__text"]).strip()

    def handle_data(self, data):
        self.text.append(data)
        for d in self.stack:
            d["__text"] = str(d["__text"]) + data


def parse(html: str) -> Collect:
    c = Collect()
    c.feed(html)
    return c


def shown_number(text: str) -> float:
    """A figure as the page writes it ('6,913.08', '$0.32', '12.76%') as a number."""
    return float(re.sub(r"[,$%\s]", "", text))


def assert_figures_match_result_yaml(html: str, run_dir: Path) -> None:
    c = parse(html)
    assert_shown_figures_match(c.figures, run_dir)
    assert shown_number(c.claims["tokens_per_s_per_gpu"]) == CLAIMED_TPS


def assert_shown_figures_match(figures: dict[str, str], run_dir: Path) -> None:
    """The figures as the page shows them (data-figure key -> text) equal result.yaml's."""
    result = yaml.safe_load((run_dir / "result.yaml").read_text())
    for key in ("tokens_per_s_per_gpu", "usd_per_million_tokens", "step_time_cv_percent"):
        assert shown_number(figures[key]) == pytest.approx(result[key], abs=0.005), key
    assert shown_number(figures["mfu"]) / 100 == pytest.approx(result["mfu"], abs=5e-5)
    assert shown_number(figures["gpu_hours"]) == pytest.approx(result["gpu_hours"], abs=0.005)
    assert figures["window"] == "{}–{}".format(*result["window"])
    assert shown_number(figures["window_tokens"]) == result["window_tokens"]
    assert shown_number(figures["steps_per_run"]) == result["steps_per_run"]


def assert_self_contained(html: str) -> None:
    """Nothing to fetch: no script, no stylesheet link, no external src/href, no url()."""
    low = html.lower()
    assert "<script" not in low and "<link" not in low and "@import" not in low
    assert "url(" not in low
    for tag, attrs in parse(html).attrs:
        for name in ("src", "href"):
            value = attrs.get(name)
            if value is not None and tag != "a":
                pytest.fail(f"<{tag} {name}={value!r}> would be fetched")
            if tag == "a" and value is not None:
                assert not re.match(r"^[a-z]+://", value) or value.startswith("https://"), value
