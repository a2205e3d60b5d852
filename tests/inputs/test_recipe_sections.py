"""The recipe's typed sections (inputs/recipe.py: Sections, Claim, Hardware, Workload, Layout) and
the timeline's (judge/timeline.py: RunTimeline), built from whatever a file held.

A run directory's recipe.yaml and timeline.json are read back from directories anyone may have
written, so the typed records are built from every shape: the adversary walks every leaf of the
seed recipe (and of a real timeline) and puts every wrong type in its place. Building never
raises, and every field is its declared type or None: a reader of the sections never meets a
list where it reads a number.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import math
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support.paths import SEED

from launcher.inputs.recipe import Claim, Hardware, Layout, RowsBuild, Sections, Workload
from launcher.inputs.recipe import Dataset as DatasetSection
from launcher.judge.timeline import RunTimeline, StageTimes

WRONG: tuple[object, ...] = (
    None,
    True,
    -3,
    math.nan,
    math.inf,
    "text",
    [1, 2],
    {},
    {"a": 1},
    datetime.date(2026, 1, 1),
)
SEED_RAW: dict[str, Any] = yaml.safe_load(SEED.read_text())


def _leaves(node: object, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))


def _put(raw: Any, path: tuple[Any, ...], value: object) -> Any:
    if not path:
        return value
    out = copy.deepcopy(raw)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _check_types(record: object) -> None:
    """Every field of a typed record (recursively) is of its declared type."""
    hints = typing.get_type_hints(type(record))
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(value):
            _check_types(value)
            continue
        assert _is(value, hint), (type(record).__name__, f.name, value, hint)


def _is(value: object, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:  # a float field holds an int as written, never a bool, never NaN or inf
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, tuple)
    if origin in (frozenset, dict) or hint is typing.Any:
        return isinstance(value, origin or object)
    if typing.get_origin(hint) is not None:  # Mapping[...] and the like
        return isinstance(value, typing.get_origin(hint))
    return isinstance(value, hint)


CASES = [
    (path, wrong)
    for path in _leaves(SEED_RAW)
    if path and path[0] in ("model", "author", "status", "gpu", "workload", "layout", "result")
    for wrong in WRONG
]


@pytest.mark.parametrize(("path", "wrong"), CASES, ids=lambda v: repr(v)[:40])
def test_sections_of_any_value_at_any_field_are_typed(path, wrong):
    sections = Sections.of(_put(SEED_RAW, path, wrong))
    _check_types(sections)
    for f in ("tokens_per_s_per_gpu", "mfu", "gpu_hours"):
        value = sections.claim.figure(f)
        assert value is None or isinstance(value, int | float)


def test_the_seeds_sections_are_its_fields():
    s = Sections.of(SEED_RAW)
    r, g, w, lay = SEED_RAW["result"], SEED_RAW["gpu"], SEED_RAW["workload"], SEED_RAW["layout"]
    assert s.claim.tokens_per_s_per_gpu == r["tokens_per_s_per_gpu"]
    assert s.claim.window == tuple(r["window"]) and s.claim.steps_per_run == r["steps_per_run"]
    assert s.claim.active_params == r["active_params"]["count"]
    assert (s.hardware.count, s.hardware.per_node, s.hardware.type) == (
        g["count"],
        g["per_node"],
        g["type"],
    )
    assert (s.workload.global_batch, s.workload.row_tokens) == (
        w["global_batch"],
        w["row_tokens"],
    )
    assert s.workload.dataset.build.parquet_sha256 == w["dataset"]["build"].get("parquet_sha256")
    assert (s.layout.tp, s.layout.pp, s.layout.dp) == (lay["tp"], lay["pp"], lay["dp"])


@pytest.mark.parametrize("wrong", WRONG, ids=repr)
def test_sections_of_a_block_of_the_wrong_type(wrong):
    for block in ("gpu", "workload", "layout", "result", "author"):
        _check_types(Sections.of({**SEED_RAW, block: wrong}))
    for cls in (Hardware, Workload, Layout, Claim):
        _check_types(cls.of({}))
    _check_types(DatasetSection.of({}))
    _check_types(RowsBuild.of({}))


TIMELINE = {
    "acquired_at": 100.0,
    "released_at": 400.0,
    "release_started_at": 390.0,
    "stages": [
        {"name": "preflight", "start": 110.0, "end": 120.0, "status": "ok"},
        {"name": "train", "start": 130.0, "end": 380.0, "status": "ok"},
    ],
}


@pytest.mark.parametrize(
    ("path", "wrong"),
    [(p, w) for p in _leaves(TIMELINE) if p for w in WRONG],
    ids=lambda v: repr(v)[:40],
)
def test_a_timeline_of_any_value_at_any_field_is_typed(path, wrong):
    timeline = RunTimeline.of(_put(TIMELINE, path, wrong))
    for value in (timeline.acquired_at, timeline.released_at, timeline.release_started_at):
        assert value is None or (isinstance(value, float) and math.isfinite(value))
    for stage in timeline.stages:
        assert isinstance(stage, StageTimes)
        for value in (stage.start, stage.end):
            assert value is None or (isinstance(value, float) and math.isfinite(value))
        assert stage.name is None or isinstance(stage.name, str)
        assert stage.status is None or isinstance(stage.status, str)
    assert timeline.written == _put(TIMELINE, path, wrong)  # kept as read, for measure.json
