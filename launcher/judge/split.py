"""Where a run's GPU-hours went: its timeline split into parts that add up to the whole.

Stages that ran at once (launcher/plan/stage_graph.py) are one part, their wall time counted once;
each one's own time is kept beside it (`stage_work`). docs/measurement.md, "Where the GPU-hours
go", defines every part. A pure function of timeline.json, like the rest of the measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.judge.timeline import RunTimeline, StageTimes

# The stage whose log is the training (records/rundir.py re-exports it as TRAIN_STAGE).
TRAIN_STAGE = "train"


def failed_stages(timeline: RunTimeline) -> tuple[list[str], list[str]]:
    """(the failed stages that decide the verdict, the failed stages that began after training).

    Why one function: a run judged alone and a mean of K measured runs must read one timeline
    the same way. A stage that failed before training, or training itself, means the figures were
    not made as the recipe says: failed. A stage that began after every train stage had ended ok
    (the store's push, a collection) failed once the figures were made: they stand, the verdict
    says so in a note, and the run's own exit code still says it failed."""
    stages = timeline.stages
    trains = [s for s in stages if s.name == TRAIN_STAGE]
    ends = [s.end for s in trains if s.status == "ok" and s.end is not None]
    trained_by = max(ends) if trains and len(ends) == len(trains) else None
    deciding: list[str] = []
    after: list[str] = []
    for stage in stages:
        if stage.status != "failed":
            continue
        start = stage.start
        late = trained_by is not None and start is not None and start >= trained_by
        (after if late and stage.name != TRAIN_STAGE else deciding).append(str(stage.name))
    return deciding, after


def failed_after_note(names: Sequence[str]) -> str:
    """The note a verdict carries for failed_stages' second list."""
    return (
        f"stage(s) {', '.join(names)} failed after training had ended: the figures were measured "
        "before and stand; the run's exit code says it failed"
    )


# A part of the split made of stages that ran at once: "parallel: image+assets+..." (their names in
# the order they started), charged the wall time from the first one's start to the last one's end
# once (docs/measurement.md, "Where the GPU-hours go").
PARALLEL_PART = "parallel: "


@dataclass(frozen=True)
class _Ended:
    """A stage with a start and an end."""

    name: str
    start: float
    end: float


def _ended_stages(timeline: RunTimeline) -> list[_Ended]:
    """The stages with a start and an end, in the order they started."""
    stages = [_ended(s) for s in timeline.stages]
    return sorted((s for s in stages if s is not None), key=lambda s: s.start)


def _ended(stage: StageTimes) -> _Ended | None:
    span = stage.span
    return None if span is None else _Ended(str(stage.name), *span)


def _overlap_groups(stages: list[_Ended]) -> list[list[_Ended]]:
    """Stages (in start order) grouped where they overlap in time: a stage that starts before
    every earlier one of its group has ended joins the group."""
    groups: list[list[_Ended]] = []
    end = float("-inf")
    for stage in stages:
        if groups and stage.start < end:
            groups[-1].append(stage)
        else:
            groups.append([stage])
        end = max(end, stage.end) if len(groups[-1]) > 1 else stage.end
    return groups


def _part_name(group: list[_Ended]) -> str:
    names = dict.fromkeys(s.name for s in group)
    return next(iter(names)) if len(names) == 1 else PARALLEL_PART + "+".join(names)


def stage_work(timeline: RunTimeline) -> dict[str, dict[str, float]]:
    """Each part of the split made of stages that ran at once -> each stage's own seconds in it
    (the work per stage, beside the part's wall time; these do not add up to the part)."""
    work: dict[str, dict[str, float]] = {}
    for group in _overlap_groups(_ended_stages(timeline)):
        if len(group) > 1:
            mine = work.setdefault(_part_name(group), {})
            for stage in group:
                mine[stage.name] = mine.get(stage.name, 0.0) + stage.end - stage.start
    return work


def stage_split(
    timeline: RunTimeline, window_s: float | Sequence[float] | None = None
) -> dict[str, float]:
    """Seconds from acquisition to release, by stage, in order (docs/measurement.md, "Where the
    GPU-hours go"): `acquire` (provisioning, boot, staging: until the node's first stage), each
    stage of the node script (stages that ran at once as one part, `parallel: a+b`, their wall
    time counted once), `train` split into the measured `window` (the sum of its step times) and
    the rest of training (start-up, steps outside the window), `between` (the node script's
    moments between its stages), `collect` (after the last stage until the release began) and
    `release`. The parts add up to released_at - acquired_at (clocks permitting: the node's marks
    and the launcher's times come from two clocks, and a negative part is 0). A sequence of
    window seconds is one per `train` stage, in order (K measured runs)."""
    acquired = timeline.acquired_at
    released = timeline.released_at
    releasing = timeline.release_started_at
    stages = _ended_stages(timeline)
    split: dict[str, float] = {}
    if acquired is None:
        return split
    if stages:
        split["acquire"] = max(0.0, stages[0].start - acquired)
    between = 0.0
    end: float | None = None
    windows = [window_s] if isinstance(window_s, (int, float)) else list(window_s or [])
    trains = 0
    for group in _overlap_groups(stages):
        name = _part_name(group)
        start, group_end = group[0].start, max(s.end for s in group)
        if end is not None:
            between += max(0.0, start - end)
        end = group_end
        seconds = group_end - start
        trains += name == TRAIN_STAGE and len(group) == 1
        window = windows[trains - 1] if name == TRAIN_STAGE and 0 < trains <= len(windows) else None
        if name == TRAIN_STAGE and len(group) == 1 and window is not None and window > 0:
            split["train"] = split.get("train", 0.0) + max(0.0, seconds - window)
            split["window"] = split.get("window", 0.0) + min(window, seconds)
            continue
        split[name] = split.get(name, 0.0) + seconds
    if between > 0:
        split["between"] = between
    if end is None:
        end = acquired
    if releasing is not None:
        split["collect"] = max(0.0, releasing - end)
        if released is not None:
            split["release"] = max(0.0, released - releasing)
    elif released is not None:
        split["collect"] = max(0.0, released - end)  # release start not recorded: both here
    return split
