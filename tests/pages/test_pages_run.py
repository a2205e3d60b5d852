"""report.html from a run directory's files: the figures equal result.yaml's, every verdict status
is shown, missing or damaged files make their section say so, and the page fetches nothing.

The page's own browser test (a real Chromium) is tests/pages/test_pages_browser.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from support.page_read import (
    assert_figures_match_result_yaml,
    assert_self_contained,
    parse,
)
from support.pages import make_run, set_verdict
from support.paths import REPO

from launcher.pages import PAGE_NAME, render_run_page, write_run_page, write_run_page_safely
from launcher.pages.html import STATUSES
from launcher.pages.rundata import RUN_FILES, read_run_dir


def test_the_seed_run_page_shows_result_yaml_figures_beside_the_card(tmp_path):
    rd = make_run(tmp_path)
    path = write_run_page(rd)
    assert path == rd / PAGE_NAME
    html = path.read_text()
    assert_figures_match_result_yaml(html, rd)
    assert_self_contained(html)
    c = parse(html)
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "reproduced"
    assert any(d.get("data-status") == "reproduced" for _, d in c.attrs)
    text = "".join(c.text)
    for heading in (
        "Published card vs this reproduction",
        "Step time and loss",
        "Where the GPU-hours went",
        "Convergence check",
        "Provenance: what exactly ran",
    ):
        assert heading in text
    # provenance: the digest check, the price and the peak used, the stack found vs claimed
    assert any(d.get("data-image-match") == "yes" for _, d in c.attrs)
    assert any(d.get("data-price") == "63.296" for _, d in c.attrs)
    assert any(d.get("data-peak") == "989000000000000.0" for _, d in c.attrs)
    assert "8 of 8 versions match the card" in text
    assert "host preflight" in text and "4 of 4 checks, 1 warning(s)" in text
    assert "8f76b822a284adbe" in text  # the rows' sha256 the card pins
    # one marker per step in each chart; the stages of the timeline
    assert sum(1 for _, d in c.attrs if d.get("data-series") == "step_time") == 20
    assert sum(1 for _, d in c.attrs if d.get("data-series") == "loss") == 20
    # the stage bar and table are result.yaml's split (where the GPU-hours went), part for part
    result = yaml.safe_load((rd / "result.yaml").read_text())
    split = result["provenance"]["gpu_hours_by_stage"]
    stages = [d["data-stage"] for _, d in c.attrs if d.get("data-stage")]
    assert stages == list(split) and stages[0] == "acquire" and stages[-1] == "collect"
    assert stages[stages.index("train") + 1] == "window"
    shown = dict(re.findall(r'data-stage-hours="([^"]+)">([^<]+)<', html))
    for name, hours in split.items():
        assert float(shown[name]) == pytest.approx(hours, abs=1e-4), name
    assert "not recorded (no convergence.json" in text  # measured without a reference run


def test_convergence_and_a_stack_that_differs_are_shown(tmp_path):
    ref = make_run(tmp_path, "20261020T000000Z-ref000")
    rd = make_run(tmp_path, reference=ref, stack_differs="nccl")
    html = render_run_page(read_run_dir(rd))
    c = parse(html)
    text = "".join(c.text)
    assert any("data-convergence" in d for _, d in c.attrs)
    assert "0.9999984" in text  # the card's own figure beside this run's
    assert "7 of 8 versions match the card" in text and "2.28.9-other" in text


@pytest.mark.parametrize(
    ("name", "standin", "status"),
    [
        ("slower", {"step_time_s": 19.9}, "slower"),
        ("faster", {"step_time_s": 17.5}, "faster"),
        ("unstable", {"step_times": ",".join(["18.96", "24.0"] * 10)}, "unstable"),
        ("incomplete", {"cut_at": 12}, "incomplete"),
        ("failed", {"nan_at": 12}, "failed"),
    ],
)
def test_every_measured_status_is_shown_with_its_reasons(tmp_path, name, standin, status):
    rd = make_run(tmp_path, **standin)
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == status
    html = write_run_page(rd).read_text()
    c = parse(html)
    assert any(d.get("data-status") == status for _, d in c.attrs)
    text = "".join(c.text)
    assert STATUSES[status].label.upper() in text.upper()
    for reason in verdict["reasons"]:
        assert reason in text
    if status != "incomplete" or (rd / "result.yaml").is_file():
        assert_figures_match_result_yaml(html, rd)


def test_mismatch_and_unreadable_show_the_evidence_whatever_its_shape(tmp_path):
    rd = make_run(tmp_path)
    set_verdict(
        rd,
        "mismatch",
        reasons=["the log's global batch 64 differs from workload.global_batch 128"],
        mismatches=[
            {"field": "workload.global_batch", "recipe": 128, "log": 64},
            {"field": "gpu.per_node", "recipe": 8, "log": 4},
        ],
    )
    html = write_run_page(rd).read_text()
    text = "".join(parse(html).text)
    assert "MISMATCH" in text.upper() and "disagrees with the recipe" in text
    assert "workload.global_batch" in text and "gpu.per_node" in text and "64" in text
    assert "not counted" in text  # a throughput seen is not a verdict
    set_verdict(rd, "unreadable", reasons=["no miles metric line in logs/train.log"])
    text = "".join(parse(write_run_page(rd).read_text()).text)
    assert "UNREADABLE" in text.upper() and "no miles metric line" in text


def test_a_run_that_failed_before_training_says_not_recorded(tmp_path):
    rd = make_run(
        tmp_path, measure=False, state="failed", failed_stage="preflight-gpu", step_time_s=18.96
    )
    (rd / "steps.jsonl").unlink(missing_ok=True)
    html = write_run_page(rd).read_text()
    c = parse(html)
    text = "".join(c.text)
    assert any(d.get("data-status") == "failed" for _, d in c.attrs)
    assert "Not judged: the run was not measured" in text
    assert "not recorded (no result.yaml in the run directory)" in text
    assert "not recorded (no steps.jsonl in the run directory)" in text
    assert "stage preflight-gpu failed" in text
    assert "could not be shown" not in text
    # the GPU-hours of the failed run still come from its timeline, the failed stage marked
    assert re.search(r"total \(acquired to released\)", text)
    assert "failed" in [t.strip() for t in c.text]


def test_an_empty_directory_renders_and_every_section_says_not_recorded(tmp_path):
    html = render_run_page(read_run_dir(tmp_path))
    text = "".join(parse(html).text)
    assert "could not be shown" not in text
    for name in ("verdict.json", "result.yaml", "steps.jsonl", "timeline.json", "stack.json"):
        assert f"no {name} in the run directory" in text, name
    assert_self_contained(html)


def test_damaged_files_are_named_unreadable_and_the_page_stands(tmp_path):
    rd = make_run(tmp_path)
    for name in RUN_FILES:
        if (rd / name).is_file() and name != "recipe.yaml":
            (rd / name).write_bytes(b"\x00{not: [json or yaml\xff")
    html = write_run_page(rd).read_text()
    text = "".join(parse(html).text)
    assert "verdict.json is unreadable" in text and "timeline.json is unreadable" in text
    assert "Not judged" in text


@pytest.mark.parametrize(
    "garbage",
    [
        {"tokens_per_s_per_gpu": "fast", "window": "5-19", "provenance": ["x"]},
        {"mfu": [1, 2], "gpu_hours": {"a": 1}, "provenance": {"unrounded": 3, "price": "x"}},
        {"provenance": {"gpu_hours_by_stage": None, "cross_checks": [1], "parse": "y"}},
        ["not", "a", "mapping"],
    ],
)
def test_odd_values_in_the_files_never_crash_the_page(tmp_path, garbage):
    rd = make_run(tmp_path)
    (rd / "result.yaml").write_text(yaml.safe_dump(garbage))
    (rd / "timeline.json").write_text(json.dumps({"stages": [{"name": 3}, "x", {"start": "a"}]}))
    (rd / "steps.jsonl").write_text('{"step": "a"}\n{"step": 2, "loss": "nan", "step_time": []}\n')
    (rd / "verdict.json").write_text(json.dumps({"status": 5, "reasons": "x", "tolerance": []}))
    html = write_run_page(rd).read_text()
    assert "</html>" in html


def test_text_from_the_files_is_escaped(tmp_path):
    rd = make_run(tmp_path)
    raw = yaml.safe_load((rd / "recipe.yaml").read_text())
    raw["model"] = '<script>alert("x")</script>'
    (rd / "recipe.yaml").write_text(yaml.safe_dump(raw))
    set_verdict(rd, "reproduced", reasons=['<img src="http://example.invalid/x">'])
    html = write_run_page(rd).read_text()
    assert "<script>" not in html and '<img src="http' not in html
    assert "&lt;script&gt;" in html
    assert_self_contained(html)


def test_regenerate_offline_with_python_m_launcher_pages(tmp_path):
    rd = make_run(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "launcher.pages", str(rd)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(rd / PAGE_NAME)
    first = (rd / PAGE_NAME).read_text()
    assert write_run_page(rd).read_text() == first  # the page depends on the files only
    bad = subprocess.run(
        [sys.executable, "-m", "launcher.pages", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert bad.returncode == 2 and "not a directory" in bad.stderr


def test_the_run_path_writer_only_warns_when_the_page_cannot_be_written(tmp_path):
    rd = make_run(tmp_path)
    assert write_run_page_safely(rd) == rd / PAGE_NAME
    warnings: list[str] = []
    gone = tmp_path / "gone"
    assert write_run_page_safely(gone, warnings.append) is None
    assert len(warnings) == 1 and "report.html was not written" in warnings[0]
