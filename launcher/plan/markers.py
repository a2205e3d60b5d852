"""The stage markers node.sh prints and every reader of node.log parses: their words
(`parse_marker`) and which of them count (`MarkerGate`). Rendered by launcher/plan/protocol.py
(STAGE_FUNCTIONS, NONCE_LINE), read by the follower's splitter, `reproduce logs`, `status` and
the measured runs' cut; docs/architecture.md, "The node protocol"."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.excerpt import open_regular
from launcher.judge.timeline import StageTimes

MARKER = "##reproduce"

# A marker line is short; a longer line is never one, so it is written on as it arrives instead of
# being held (a long unterminated line costs linear time and bounded memory).
MAX_MARKER_LINE = 4096
# A stage's log is logs/<name>.log: a name the node prints may not be a path, and never "node"
# (logs/node.log is the stream itself, whose size is the offset streaming continues from).
SAFE_STAGE = re.compile(r"^(?!node$)(?!\.)[A-Za-z0-9_.-]{1,64}$")
_MARKER_LINE = re.compile(rb"^" + re.escape(MARKER.encode()) + rb" (.*?)\r?$")


# What a stage marker may say, and nothing else: its words are shown on the operator's screen, in
# the timeline, the report and the attestation, and a line a container printed can look like one
# (`status='ok<ESC>]52;...'` would set the operator's clipboard through the console).
MARKER_STATUSES = frozenset({"ok", "failed", "stopped", "cancelled"})
_MARKER_KEYS = frozenset({"stage", "event", "status", "rc", "t", "n"})
_N = re.compile(r"^[0-9a-f]{0,64}$")
_RC = re.compile(r"^-?[0-9]{1,4}$")
# printable ASCII but quotes and backslashes: words split at spaces, as shlex splits them
_PLAIN = re.compile(r"[ !#-&(-\[\]-~]*")
_T = re.compile(r"^[!-~]{1,40}$")  # printable: a time the timeline reads, or None if it cannot


def parse_marker(line: bytes) -> dict[str, str] | None:
    """`##reproduce stage=train event=start t=1.5` -> {"stage": "train", ...}; else None.

    Only what STAGE_FUNCTIONS and the background stages print passes: the keys stage, event,
    status, rc and t, each once; a stage name SAFE_STAGE allows, event start or end, a status of
    MARKER_STATUSES (on an end only), rc a small integer, t a short printable word (a time that
    is not a finite number is no time: records/rundir.py). Anything else is not a marker: the line
    stays a line of its stage's log."""
    match = _MARKER_LINE.match(line)
    if not match:
        return None
    text = match.group(1).decode(errors="replace")
    if _PLAIN.fullmatch(text):  # no quote, escape or control: shlex would split it the same
        words = text.split()
    else:
        try:
            words = shlex.split(text)
        except ValueError:
            return None
    pairs = [w.split("=", 1) for w in words]
    fields = dict(p for p in pairs if len(p) == 2)
    if len(fields) != len(words) or not set(fields) <= _MARKER_KEYS:
        return None
    event, status = fields.get("event"), fields.get("status")
    if (
        event not in ("start", "end")
        or not SAFE_STAGE.match(fields.get("stage", ""))
        or (status is not None and (event != "end" or status not in MARKER_STATUSES))
        or ("rc" in fields and not _RC.match(fields["rc"]))
        or ("t" in fields and not _T.match(fields["t"]))
        or ("n" in fields and not _N.match(fields["n"]))
    ):
        return None
    return fields


# The stages that run inside the training container, whose markers the container prints itself
# (without node.sh's nonce), in the order it runs them: the only ones a marker without it may
# open or close, and only as MarkerGate says.
CONTAINER_STAGES = ("ray", "train")  # in the order the container runs them
_NONCE_LINE = re.compile(rb"^" + re.escape(MARKER.encode()) + rb" nonce=([0-9a-f]{32})\r?$")


class MarkerGate:
    """Which `##reproduce stage=` lines of one node's stream are markers: the one place every
    reader of node.log asks (the follower's splitter, `reproduce logs`, the measured runs' cut).

    Why: the recipe's code prints into the same stream, and a well-formed marker it prints looked
    like node.sh's own: a container could close the preflight as failed and so have its own
    failure blamed on the node (exit 3 instead of 1), or end a stage node.sh was running.
    node.sh's first line gives its nonce (NONCE_LINE); from then on a marker without
    it speaks only for the training container, and only as that container's own script prints
    them (`_container_marker`): it opens a stage of CONTAINER_STAGES when none of them is open,
    never one that comes before the last it opened; it closes only the one open (or, when none
    is, ends the last it opened once more: the container's own end after an early one the
    recipe's code printed); its time is a finite number, never before the latest marker already
    taken. So the recipe's code, which runs in the last of them, can neither end `ray` as failed
    nor date a marker back before the container started (its failure blamed on Ray, exit 3
    instead of 1). A stream with no nonce line (a run of an older launcher, a hand-made log) is
    read as before: every well-formed marker counts."""

    def __init__(self) -> None:
        self.nonce: str | None = None
        self._settled = False  # the nonce is known, or a marker came first: none is taken now
        self._open: str | None = None  # the container stage open now, by its own markers
        self._rank = -1  # the place in CONTAINER_STAGES of the last container stage opened
        self._floor: float | None = None  # the latest time of a marker taken

    @classmethod
    def of_log(cls, path: Path) -> MarkerGate:
        """A gate that knows the nonce from the first line of a node.log already on disk."""
        gate = cls()
        try:
            with open_regular(path) as fh:  # never blocked by a FIFO, never through a link
                for _ in range(64):  # node.sh's first line; a login shell may print before it
                    gate.marker(fh.readline(MAX_MARKER_LINE).rstrip(b"\n"))
                    if gate._settled:
                        break
        except OSError:
            pass
        return gate

    def resume(self, stages: Sequence[StageTimes]) -> None:
        """Go on where a reader of the same stream left off, from the timeline it built
        (timeline.json read back, judge/timeline.py): the container stage open, the last one
        opened, the latest time. For a reader that starts in the middle of node.log (`status`)."""
        for stage in stages:
            for value in (stage.start, stage.end):
                if value is not None:
                    self._raise_floor(value)
            if stage.name in CONTAINER_STAGES:
                self._rank = max(self._rank, CONTAINER_STAGES.index(stage.name))
                self._open = stage.name if stage.status == "running" else None

    def marker(self, line: bytes) -> dict[str, str] | None:
        """The marker on this line (without its newline), or None: a line of its stage's log."""
        if not self._settled:
            found = _NONCE_LINE.match(line)
            if found:
                self.nonce, self._settled = found.group(1).decode(), True
                return None
        fields = parse_marker(line)
        self._settled = self._settled or fields is not None
        if fields is None or self.nonce is None:
            return fields
        if fields.get("n") == self.nonce:
            self._raise_floor(_time_of(fields))
            return fields
        return self._container_marker(fields)

    def _container_marker(self, fields: dict[str, str]) -> dict[str, str] | None:
        """A marker without the nonce: taken only as the training container's script prints
        its own (the class's docstring says which)."""
        name, t = fields["stage"], _time_of(fields)
        if name not in CONTAINER_STAGES or t is None:
            return None
        if self._floor is not None and t < self._floor:
            return None  # dated before a marker already taken: before the container started
        if fields["event"] == "start":
            rank = CONTAINER_STAGES.index(name)
            if self._open is not None or rank < self._rank:
                return None
            self._open, self._rank = name, rank
        elif name == self._open:
            self._open = None
        elif self._open is not None or self._rank < 0 or name != CONTAINER_STAGES[self._rank]:
            return None  # an end may also follow an end of the same stage (a forged early one)
        self._raise_floor(t)
        return fields

    def _raise_floor(self, t: float | None) -> None:
        if t is not None and math.isfinite(t) and (self._floor is None or t > self._floor):
            self._floor = t


def _time_of(fields: Mapping[str, str]) -> float | None:
    """A marker's `t` as a finite number, or None (records/rundir.py reads it the same way)."""
    try:
        t = float(fields.get("t", "nan"))
    except ValueError:
        return None
    return t if math.isfinite(t) else None
