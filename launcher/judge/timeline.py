"""A run's timeline as the measurement reads it: timeline.json parsed once into types.

The file may come from anyone (a run directory copied in, a `--timeline` file, a bundle handed to
`verify`), so the reading is total: a time that is not a finite number is no time (None,
docs/architecture.md, "Numbers are finite"), a stage that is not a mapping is not a stage, a
name or status that is not text is kept as the text it prints. Every reader (the GPU-hours, their
split, the failed stages, the run page) then meets the types it expects. `written` keeps the
mapping as read, for the one record that copies it (measure.json: what the measurement saw).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _word(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class StageTimes:
    """One stage of timeline.json: its name, start and end (epoch seconds) and how it ended."""

    name: str | None
    start: float | None
    end: float | None
    status: str | None  # ok | failed | stopped | cancelled | running | ...

    @classmethod
    def of(cls, stage: Mapping[str, Any]) -> StageTimes:
        return cls(
            name=_word(stage.get("name")),
            start=_time(stage.get("start")),
            end=_time(stage.get("end")),
            status=_word(stage.get("status")),
        )

    @property
    def span(self) -> tuple[float, float] | None:
        """(start, end) when both are known and the end is not before the start."""
        if self.start is None or self.end is None or self.end < self.start:
            return None
        return self.start, self.end


@dataclass(frozen=True)
class RunTimeline:
    """timeline.json: when the node was acquired, when its release began and ended, the stages."""

    acquired_at: float | None = None
    released_at: float | None = None
    release_started_at: float | None = None
    stages: tuple[StageTimes, ...] = ()
    written: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RunTimeline:
        stages = data.get("stages")
        return cls(
            acquired_at=_time(data.get("acquired_at")),
            released_at=_time(data.get("released_at")),
            release_started_at=_time(data.get("release_started_at")),
            stages=tuple(
                StageTimes.of(s)
                for s in (stages if isinstance(stages, list) else [])
                if isinstance(s, dict)
            ),
            written=data,
        )

    @property
    def recorded(self) -> bool:
        """Whether the file recorded anything at all (an empty object records nothing)."""
        return bool(self.written)
