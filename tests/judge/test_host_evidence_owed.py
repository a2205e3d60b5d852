"""For a run launched with the host's clock and GPU sampler on, their evidence is owed: a dead
sampler (killed, or its writes failing on a full disk), a file cut off, missing, unreadable or
without samples, samples that stop before the window ends, or a log whose step lines carry no
host clock, fails closed and says which (launcher/judge/evidence.py, HostWatch; docs/
measurement.md, "The host's evidence fails closed"). The same evidence of a run that could not
have it (a bare log, a Ray cluster, docker.host_clock off: HostWatch off or unknown) is named as
not checked, as before.

The adversary: the sampler killed at every moment of a run (its file cut after each of its
lines, with and without the partial line it was writing), each judged with the sampler owed and
not: owed, the verdict is never a speed verdict unless the cut came after the sampler's own end
line; not owed, a cut that leaves the window covered changes nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from support.gpu_samples import Load, render_samples
from support.log_shapes import NONCE, Run, render
from support.measure import seed_recipe

from launcher.judge.evidence import HostWatch
from launcher.judge.measure import measure
from launcher.judge.parse.gpu import GpuSamples, parse_samples
from launcher.judge.verdict import JUDGED, judge
from launcher.records.rundir import Files
from launcher.results.readback import host_watch

ON = HostWatch(clock=True, sampler=True)
OFF = HostWatch(clock=False, sampler=False)
RUN = Run(clock=True)
FILE = render_samples(RUN, Load())


def judged(samples: GpuSamples | None, watch: HostWatch | None, run: Run = RUN):
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        log.write_text(render(run))
        from launcher.results.evaluate import parse_log

        records, stats = parse_log(log, NONCE)
    result = measure(records, seed_recipe(), parse_stats=stats, gpu_samples=samples, host=watch)
    return result, judge(result, seed_recipe())


def test_a_whole_sampler_file_passes_owed_or_not():
    for watch in (ON, OFF, None):
        _, verdict = judged(parse_samples(FILE), watch)
        assert verdict.status == "reproduced", (watch, verdict.reasons)


@pytest.mark.parametrize(
    ("samples", "word"),
    [
        (None, "holds no gpu-samples.csv"),
        (GpuSamples(problem="gpu-samples.csv: not a regular file"), "not a regular file"),
        (parse_samples("# no samples: nvidia-smi cannot be run: ENOENT\n"), "no samples"),
        (parse_samples(""), "no samples"),
    ],
    ids=["no file", "unreadable", "no nvidia-smi", "empty"],
)
def test_missing_sampler_evidence_fails_closed_when_owed_and_is_named_when_not(samples, word):
    result, verdict = judged(samples, ON)
    assert verdict.status == "mismatch" and verdict.difference_percent is None
    assert any(d.check == "gpus busy" and word in d.detail for d in result.evidence.disagreements)
    for watch in (OFF, None):
        result, verdict = judged(samples, watch)
        assert verdict.status == "reproduced", verdict.reasons
        assert any(n.startswith("the GPUs at work") for n in result.evidence.not_checked)


def _cuts() -> list[int]:
    """Where the sampler dies: after each of a spread of its lines (its file's byte offsets)."""
    ends = [i + 1 for i, c in enumerate(FILE) if c == "\n"]
    step = max(1, len(ends) // 40)
    return sorted({*ends[::step], ends[-2], ends[-1]})


@pytest.mark.parametrize("cut", _cuts())
def test_a_sampler_killed_at_any_moment_never_passes_when_owed(cut):
    for partial in ("", "17929"):  # its last write cut too
        text = FILE[:cut] + partial
        whole = text == FILE
        result, verdict = judged(parse_samples(text), ON)
        if whole:
            assert verdict.status == "reproduced", verdict.reasons
            continue
        assert verdict.status not in JUDGED, (cut, partial, verdict.reasons)
        assert any(d.check == "gpus busy" for d in result.evidence.disagreements)


def test_a_sampler_that_died_after_the_window_still_fails_when_owed_and_says_cut_off():
    text = FILE[: FILE.rindex("# stopped")]  # every sample there, the end line missing
    result, verdict = judged(parse_samples(text), ON)
    assert verdict.status == "mismatch"
    assert any("cut off" in d.detail for d in result.evidence.disagreements)
    assert judged(parse_samples(text), OFF)[1].status == "reproduced"  # covered: fine unowed


def test_a_log_without_the_host_clock_fails_closed_when_the_clock_was_on():
    bare = Run(clock=False)
    result, verdict = judged(parse_samples(FILE), ON, bare)
    assert verdict.status == "mismatch"
    assert any(d.check == "host clock" for d in result.evidence.disagreements)
    result, verdict = judged(None, OFF, bare)
    assert verdict.status == "reproduced"
    assert any(n.startswith("the host's clock") for n in result.evidence.not_checked)


def test_what_was_launched_is_read_from_the_node_script_else_from_the_measure_record(tmp_path):
    assert host_watch(tmp_path) is None
    (tmp_path / Files.MEASURE).write_text('{"host_watch": {"clock": true, "sampler": false}}')
    assert host_watch(tmp_path) == HostWatch(clock=True, sampler=False)
    (tmp_path / Files.NODE_SCRIPT).write_text(
        'python3 "$NODE_RUN_DIR/scripts/gpu_sampler.py" --out x &\n'
        '  | ( exec python3 "$NODE_RUN_DIR/scripts/host_clock.py" --gap 0.5 )\n'
    )
    assert host_watch(tmp_path) == ON
    (tmp_path / Files.NODE_SCRIPT).write_text("docker run ... # docker.host_clock: false\n")
    assert host_watch(tmp_path) == OFF


@pytest.mark.parametrize(("clock", "want"), [(True, ON), (False, OFF)])
def test_the_rendered_node_script_owes_both_or_neither(tmp_path, clock, want):
    from support.plan_env import plan_for, write_profile, write_recipe

    recipe = write_recipe(tmp_path)
    profile = write_profile(tmp_path, {"kind": "local"}, [], docker={"host_clock": clock})
    (tmp_path / Files.NODE_SCRIPT).write_text(plan_for(recipe, profile).node_script)
    assert host_watch(tmp_path) == want
