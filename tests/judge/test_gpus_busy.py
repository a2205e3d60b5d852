"""The GPUs at work (docs/measurement.md, the evidence gate, check 7), played as the adversary: a
container that prints its step lines at the claimed pace while the GPUs the host watches idle.

- The property: over runs drawn from the model (tests/support/log_shapes.py with the host clock,
  tests/support/gpu_samples.py for what the GPUs did), check 7 disagrees exactly when some GPU's
  median utilization over the window's host span, computed by the model, is under the threshold;
  such a run is never passed, and the disagreement names the GPU, its median and the threshold.
- Hostile sampler files (garbage, NaN, negative, huge, out of order, a GPU the recipe does not
  use, gigabytes, a FIFO, a link): never a crash, never a pass from a bad file.
- Where there is no file, no sample, no host clock or no cover of the window: not checked, said.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.gpu_samples import Load, medians, render_samples, stamp, window_span
from support.log_shapes import NONCE, Run, render
from support.measure import seed_recipe
from support.properties import PASSING, examples

from launcher.judge.evidence import (
    BUSY_UTIL_PERCENT,
    MAX_SAMPLE_GAP_S,
    NO_CLOCK_FOR_SAMPLES,
    NO_GPU_SAMPLES,
)
from launcher.judge.measure import measure
from launcher.judge.parse.gpu import GpuSamples, parse_samples
from launcher.judge.verdict import judge
from launcher.records.rundir import Files
from launcher.results.evaluate import parse_log
from launcher.results.readback import read_gpu_samples

SETTINGS = examples(40)
CHECKED = "the GPUs at work: the host's samples over steps 5-19"


def judged(run: Run, samples: GpuSamples | None, nonce: str | None = NONCE):
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        log.write_text(render(run))
        records, stats = parse_log(log, nonce)
    result = measure(records, seed_recipe(), parse_stats=stats, gpu_samples=samples)
    return result, judge(result, seed_recipe())


def busy_findings(result):
    return [d for d in result.evidence.disagreements if d.check == "gpus busy"]


@st.composite
def loads(draw: st.DrawFn) -> tuple[Run, Load]:
    """A run at its claimed pace (check 6 passes) whose GPUs idle over any part of the window:
    none, one GPU or several, a span anywhere from its start to past its end, near half the
    window too (the median's edge), at 0% or some low or middling utilization."""
    run = Run(clock=True)
    start, end = window_span(run)
    length = end - start
    idle = []
    for gpu in draw(st.sets(st.integers(0, 7), max_size=8)):
        at = draw(st.floats(-0.2, 1.0)) * length + start
        share = draw(st.floats(0.0, 1.2) | st.sampled_from([0.45, 0.5, 0.55]))
        util = draw(st.sampled_from([0, 3, 20, 49, 50, 51, 80]))
        idle.append((gpu, at, at + share * length, util))
    return run, Load(idle=idle)


@SETTINGS
@given(loads())
def test_the_check_fails_exactly_when_some_gpus_median_over_the_window_is_under_the_threshold(
    drawn,
):
    run, load = drawn
    result, verdict = judged(run, parse_samples(render_samples(run, load)))
    model = medians(run, load)
    low = {g for g, m in model.items() if m < BUSY_UTIL_PERCENT}
    found = busy_findings(result)
    assert {int(d.what.split()[1]) for d in found} == low, (load, model)
    assert any(c.startswith(CHECKED) for c in result.evidence.checked)
    assert result.evidence.cross["gpu_busy_median_percent"] == {str(g): m for g, m in model.items()}
    if low:
        assert verdict.status == "mismatch" and verdict.difference_percent is None
        for d in found:
            gpu = int(d.what.split()[1])
            assert d.recipe == BUSY_UTIL_PERCENT and d.evidence == model[gpu]
            assert f"GPU {gpu}'s median utilization.gpu" in d.detail
            assert f"is {model[gpu]:g}%, under the {BUSY_UTIL_PERCENT:g}%" in d.detail
            assert any(r.startswith(f"gpus busy: GPU {gpu}'s") for r in verdict.reasons)
    else:
        assert verdict.status in PASSING, verdict.reasons


def test_the_drawn_loads_fall_on_both_sides():
    seen: set[bool] = set()

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(loads())
    def probe(drawn):
        run, load = drawn
        seen.add(any(m < BUSY_UTIL_PERCENT for m in medians(run, load).values()))

    probe()
    assert seen == {True, False}


def test_a_container_whose_gpus_idle_through_the_window_is_a_mismatch_naming_the_check():
    """It trained earlier (or never) and prints its lines at the claimed pace: check 6 passes,
    the host saw the GPUs at 0%."""
    run = Run(clock=True)
    result, verdict = judged(run, parse_samples(render_samples(run, Load(busy=0))))
    assert not [d for d in result.evidence.disagreements if d.check == "host clock"]
    assert verdict.status == "mismatch"
    assert len(busy_findings(result)) == 8
    assert "gpus busy: GPU 0's median utilization.gpu over steps 5 to 19" in verdict.reasons[0]


def test_busy_gpus_pass_the_check_and_say_what_it_saw():
    run = Run(clock=True)
    result, verdict = judged(run, parse_samples(render_samples(run, Load())))
    assert verdict.status == "reproduced", verdict.reasons
    (line,) = [c for c in result.evidence.checked if c.startswith(CHECKED)]
    assert "GPU 0 97%" in line and "GPU 7 97%" in line and "at least 50% each" in line


@pytest.mark.parametrize("idle", [(8, 9), (0, 1), (0, 9)])
def test_gpus_the_run_did_not_have_are_not_judged_whatever_their_index(idle):
    """The seed uses 8 GPUs a node; on a node of 10, the two it did not get idle. Which two is
    the profile's business (`docker.gpus: device=2,3,...`), so no index is assumed: the 8
    busiest GPUs the host watched are the ones judged."""
    run = Run(clock=True)
    load = Load(gpus=10, idle=[(g, 0.0, 1e12, 0) for g in idle])
    result, verdict = judged(run, parse_samples(render_samples(run, load)))
    assert verdict.status == "reproduced" and not busy_findings(result), verdict.reasons
    judged_gpus = {int(g) for g in result.evidence.cross["gpu_busy_median_percent"]}
    assert judged_gpus == set(range(10)) - set(idle)


def test_a_node_whose_gpus_all_idle_fails_however_many_it_has():
    """The busiest GPUs judged: a node of 10, all idle, fails on 8 of them (the recipe's)."""
    run = Run(clock=True)
    result, verdict = judged(run, parse_samples(render_samples(run, Load(gpus=10, busy=0))))
    assert verdict.status == "mismatch" and len(busy_findings(result)) == 8


def test_without_a_file_a_sample_or_a_host_clock_the_check_is_not_checked_and_said():
    run = Run(clock=True)
    result, verdict = judged(run, None)
    assert NO_GPU_SAMPLES in result.evidence.not_checked
    assert f"not checked: {NO_GPU_SAMPLES}" in verdict.reasons
    text = "# gpu_sampler start t=1 interval_ms=1000\n# no samples: nvidia-smi cannot be run\n"
    result, verdict = judged(run, parse_samples(text))
    (said,) = [n for n in result.evidence.not_checked if n.startswith("the GPUs at work")]
    assert "gives no samples (nvidia-smi cannot be run" in said
    assert verdict.status == "reproduced"
    # the samples, but no host clock to place the window on them (a log measured apart)
    result, verdict = judged(run, parse_samples(render_samples(run, Load(busy=0))), nonce=None)
    assert NO_CLOCK_FOR_SAMPLES in result.evidence.not_checked and not busy_findings(result)


def test_a_gap_in_the_samples_is_not_checked_naming_the_gpu_and_the_gap():
    """nvidia-smi stalled on the host: the host did not watch that GPU work, and says so; the
    GPUs it did watch are still judged."""
    run = Run(clock=True)
    start, end = window_span(run)
    text = render_samples(run, Load(busy=0))
    kept = [
        line
        for line in text.splitlines()
        if not (line[:1].isdigit() and line.split(",")[1] == "3")
        or not start + 30 < float(line.split(",")[0]) < start + 60
    ]
    result, verdict = judged(run, parse_samples("\n".join(kept) + "\n"))
    (said,) = [n for n in result.evidence.not_checked if n.startswith("the GPUs at work")]
    assert "GPU 3 (" in said and f"at most {MAX_SAMPLE_GAP_S:g} s" in said
    assert {d.what for d in busy_findings(result)} == {
        f"GPU {g} utilization.gpu" for g in range(8) if g != 3
    }


HOSTILE = {
    "garbage": "hello\n\x00\x01\xff binary\n,,,\n",
    "nan": "1792576803.250000000,0,nan,100.00\n",
    "negative": "1792576803.250000000,0,-5,100.00\n",
    "huge": "1792576803.250000000,0,101,100.00\n1792576803.250000000,0,99999999999,1\n",
    "huge index": "1792576803.250000000,99999,97,100.00\n",
    "float util": "1792576803.250000000,0,97.5,100.00\n",
    "exponent time": "1e9,0,97,100.00\n",
    "no fraction": "1792576803,0,97,100.00\n",
    "long line": "1792576803.250000000,0,97," + "9" * 100_000 + "\n",
    "comments only": "# 1792576803.250000000,0,97,100.00\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_sample_files_never_crash_and_never_pass(name):
    samples = parse_samples(HOSTILE[name])
    assert samples.samples == 0 and not samples.by_gpu
    run = Run(clock=True)
    result, _ = judged(run, samples)
    assert not any(c.startswith("the GPUs at work") for c in result.evidence.checked)
    assert any(n.startswith("the GPUs at work") for n in result.evidence.not_checked)


def test_out_of_order_samples_are_refused_never_used():
    """Busy samples placed back in time among idle ones (the sampler's clock never goes back)."""
    run = Run(clock=True)
    idle = render_samples(run, Load(busy=0)).splitlines()
    start, end = window_span(run)
    forged = [f"{stamp(start + 1.5 + k)},{g},100,700.00" for k in range(14) for g in range(8)]
    samples = parse_samples("\n".join(idle + forged) + "\n")
    assert samples.refused == len(forged)
    result, verdict = judged(run, samples)
    assert verdict.status == "mismatch" and len(busy_findings(result)) == 8


def test_every_hostile_line_mixed_with_busy_samples_changes_nothing():
    run = Run(clock=True)
    good = render_samples(run, Load()).splitlines()
    bad = [line for text in HOSTILE.values() for line in text.splitlines()]
    mixed = [x for pair in zip(good, bad * (len(good) // len(bad) + 1), strict=False) for x in pair]
    samples = parse_samples("\n".join(mixed) + "\n")
    clean = parse_samples("\n".join(good) + "\n")
    assert samples.by_gpu == clean.by_gpu and samples.refused > 0


def test_a_file_of_gigabytes_a_fifo_or_a_link_is_read_bounded_and_gives_no_samples(tmp_path):
    path = tmp_path / Files.GPU_SAMPLES
    with path.open("wb") as f:  # a sparse file of 2 GiB: the reader must not read it
        f.truncate(2 << 30)
    samples = read_gpu_samples(tmp_path)
    assert samples is not None and samples.samples == 0 and "more than" in (samples.problem or "")
    path.unlink()
    os.mkfifo(path)  # no writer: a read that is not bounded and non-blocking hangs here
    samples = read_gpu_samples(tmp_path)
    assert samples is not None and samples.problem and samples.samples == 0
    path.unlink()
    target = tmp_path / "elsewhere.csv"
    target.write_text(render_samples(Run(clock=True), Load()))
    path.symlink_to(target)  # never followed
    samples = read_gpu_samples(tmp_path)
    assert samples is not None and samples.problem and samples.samples == 0
    path.unlink()
    assert read_gpu_samples(tmp_path) is None  # no file at all
    result, _ = judged(Run(clock=True), GpuSamples(problem="gpu-samples.csv: not a regular file"))
    (said,) = [n for n in result.evidence.not_checked if n.startswith("the GPUs at work")]
    assert "not a regular file" in said
