"""Line framing is one rule: every line of every fixture log, wrapped in each prefix a capture
puts before it (docker's and kubectl's timestamps, kubectl's pod, journald's forms, `srun -l`,
Ray's actor, colour codes) and in nestings of them, is judged exactly as the bare log: the same
verdict, figures, checks run and not run, arguments and counters (launcher/judge/parse/frame.py,
docs/miles-log.md "Line framing").

The adversary: a prefix that hid one kind of line (the arguments listing, a dict's continuation,
bash's `Killed`) from one check while another check still saw the line changes what is checked
or the verdict, and fails here naming the fixture and the frame.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.frames import FRAMES, NESTINGS, wrap
from support.log_shapes import FIXTURES
from support.measure import seed_recipe

from launcher.judge.parse.frame import PREFIXES, payload, payload_start
from launcher.results.evaluate import measure_path, parse_log

LOGS = sorted(p.name for p in FIXTURES.glob("*.log"))


def outcome(path: Path) -> dict:
    """What a frame must not change: the verdict, its figures, what was checked, the arguments
    and the parser's counters (not the quoted lines, which carry the frame)."""
    result, verdict = measure_path(path, seed_recipe())
    _, stats = parse_log(path)
    counters = {
        k: v
        for k, v in vars(stats).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    ev = result.evidence
    return {
        "status": verdict.status,
        "difference": verdict.difference_percent,
        "tokens": result.tokens_per_s_per_gpu,
        "cv": result.step_time_cv_percent,
        "mfu": result.mfu,
        "checked": ev.checked,
        "not_checked": ev.not_checked,
        "disagreements": [(d.check, d.what, d.recipe, str(d.evidence)) for d in ev.disagreements],
        "arguments": dict(stats.arguments),
        "counters": counters,
        "signals": [(g["after_step"], g["kind"], g["lines"]) for g in stats.signal_groups],
        "error": verdict.error is not None,
    }


_BARE: dict[str, dict] = {}


def _bare(name: str) -> dict:
    if name not in _BARE:
        _BARE[name] = outcome(FIXTURES / name)
    return _BARE[name]


@pytest.mark.parametrize("name", LOGS)
def test_every_line_of_every_log_in_every_frame_is_judged_as_the_bare_log(name, tmp_path):
    want = _bare(name)
    text = (FIXTURES / name).read_text()
    for frames in NESTINGS:
        framed = tmp_path / f"{'-'.join(frames)}.log"
        framed.write_text(wrap(text, frames))
        got = outcome(framed)
        diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
        assert not diff, f"{name} behind {' > '.join(frames)}: {diff}"


@pytest.mark.parametrize("frames", NESTINGS, ids=lambda f: "-".join(f))
def test_a_framed_listing_of_another_layout_is_still_a_mismatch(frames, tmp_path):
    # The listing behind a prefix is read: TP 2 against the seed's TP 1 is a mismatch, never a
    # "not checked" followed by a speed verdict.
    text = (FIXTURES / "miles-v0.1.0.log").read_text()
    tp2 = text.replace(
        "  tensor_model_parallel_size ...................... 1",
        "  tensor_model_parallel_size ...................... 2",
    )
    assert tp2 != text
    framed = tmp_path / "tp2.log"
    framed.write_text(wrap(tp2, frames))
    _, verdict = measure_path(framed, seed_recipe())
    assert verdict.status == "mismatch", verdict.reasons
    assert any("tensor_model_parallel_size = 2" in r for r in verdict.reasons)


def test_each_prefix_is_recognised_alone_and_a_payload_is_never_eaten():
    lines = {
        "  global_batch_size ............................... 128": 0,
        "step 7: {'train/loss': 1.0}": 0,
        "[2026-10-21 10:00:00.123 main] train.py:1 - perf 7: {}": 0,
        "Killed": 0,
        "(core dumped)": 0,
        "": 0,
    }
    for text, start in lines.items():
        assert payload_start(text) == start, repr(text)
        for name, frame in FRAMES.items():
            line = frame(3) + text
            assert payload(line) == text, (name, line)
    assert {p.name for p in PREFIXES} == {"cri", "docker", "kubectl", "journald", "srun", "ray"}


def test_compare_of_a_framed_tp2_log_with_a_tp1_run_is_refused_as_another_recipe(tmp_path):
    import subprocess
    import sys

    from support.log_shapes import REPO

    text = (FIXTURES / "miles-v0.1.0.log").read_text()
    tp2 = text.replace(
        "  tensor_model_parallel_size ...................... 1",
        "  tensor_model_parallel_size ...................... 2",
    )
    framed = tmp_path / "docker-tp2.log"
    framed.write_text(wrap(tp2, ("docker",)))
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "compare", framed, FIXTURES / "miles-v0.1.0.log"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tensor_model_parallel_size: 2 vs 1" in proc.stderr
