"""Where the GPU-hours went when stages ran at once (launcher/judge/split.py): overlapping stages
are one part charged their wall time once, each stage's own time is kept beside it, and the
parts still add up to the run's time, for any timeline (generated ones included)."""

from __future__ import annotations

import random

import pytest

from launcher.judge.split import PARALLEL_PART, stage_split, stage_work
from launcher.judge.timeline import RunTimeline


def _stage(name: str, start: float, end: float) -> dict:
    return {"name": name, "start": start, "end": end, "status": "ok"}


def test_stages_that_ran_at_once_are_one_part_charged_once():
    timeline = {
        "acquired_at": 0.0,
        "release_started_at": 400.0,
        "released_at": 410.0,
        "stages": [  # in the order they reached node.log: as they ended
            _stage("preflight", 10.0, 12.0),
            _stage("resolve", 10.0, 15.0),
            _stage("assets", 15.2, 145.0),  # beside the pull, and the stack probe after it
            _stage("image", 10.0, 140.0),
            _stage("stack", 140.3, 150.0),
            _stage("convert", 150.5, 160.0),
            _stage("train", 161.0, 390.0),
        ],
    }
    split = stage_split(RunTimeline.of(timeline), window_s=200.0)
    part = PARALLEL_PART + "preflight+resolve+image+assets+stack"  # in the order they started
    assert list(split) == [
        "acquire", part, "convert", "train", "window", "between", "collect", "release"
    ]  # fmt: skip
    assert split[part] == pytest.approx(140.0)  # 10 .. 150: the node's wall time, once
    assert split["between"] == pytest.approx(1.5)
    assert sum(split.values()) == pytest.approx(410.0)
    work = stage_work(RunTimeline.of(timeline))
    assert list(work) == [part]
    assert work[part]["image"] == pytest.approx(130.0) and work[part]["stack"] == pytest.approx(9.7)
    assert sum(work[part].values()) > split[part]  # the work per stage is more than the wall time


def test_stages_one_after_another_keep_their_own_parts():
    timeline = {
        "acquired_at": 0.0,
        "released_at": 30.0,
        "stages": [_stage("a", 1.0, 2.0), _stage("b", 2.0, 3.0), _stage("c", 3.5, 4.0)],
    }
    assert stage_split(RunTimeline.of(timeline)) == {
        "acquire": 1.0, "a": 1.0, "b": 1.0, "c": 0.5, "between": 0.5, "collect": 26.0
    }  # fmt: skip
    assert stage_work(RunTimeline.of(timeline)) == {}


@pytest.mark.parametrize("seed", range(40))
def test_any_timeline_is_split_into_parts_that_add_up(seed: int):
    rng = random.Random(seed)
    t, stages = 5.0, []
    for i in range(rng.randint(1, 12)):
        start = t + rng.choice([-3.0, -0.5, 0.0, 0.0, 0.2, 2.0]) * rng.random()
        start = max(5.0, start)
        end = start + rng.choice([0.0, 0.1, 1.0, 10.0]) * rng.random()
        stages.append(_stage(f"s{i}", start, end))
        t = max(t, end) if rng.random() < 0.7 else start
    rng.shuffle(stages)  # node.log's order says nothing
    released = max(s["end"] for s in stages) + 7.0
    timeline = {"acquired_at": 0.0, "released_at": released, "stages": stages}
    split = stage_split(RunTimeline.of(timeline))
    assert sum(split.values()) == pytest.approx(released)
    assert all(v >= 0 for v in split.values())
    # every stage is in exactly one part
    parts = [k.removeprefix(PARALLEL_PART).split("+") for k in split]
    named = [n for names in parts for n in names if n.startswith("s")]
    assert sorted(named) == sorted(s["name"] for s in stages)
    # a part of several stages is their union: no instant inside it without one of them
    by = {s["name"]: s for s in stages}
    for key, work in stage_work(RunTimeline.of(timeline)).items():
        members = [by[n] for n in work]
        lo, hi = min(s["start"] for s in members), max(s["end"] for s in members)
        assert split[key] == pytest.approx(hi - lo)
        covered = lo
        for s in sorted(members, key=lambda s: s["start"]):
            assert s["start"] <= covered + 1e-9
            covered = max(covered, s["end"])
        assert sum(work.values()) >= split[key] - 1e-9
