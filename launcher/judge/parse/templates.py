"""Payload templates: the file reader's fast way to read a flat metric dict whose keys it has seen.

Why: on a log where every line is a metric line, reading each dict with the general reader
(launcher/judge/parse/lines.py, `parse_payload`: a regular expression per pair, a dict, a float
per value) costs more than reading the line itself. A run prints the same keys in the same order
at every step, so a dict is read once by the general rule and becomes a template: one compiled
expression with its keys and numpy wrappers as literals and the reference number grammar in each
value slot. A later payload that the template matches whole is, by construction, a dict the
general reader reads by its flat-dict rule to exactly these keys and values; only the values the
record needs are converted.

What makes a payload a template (`template_of`): ASCII, Python's repr of a dict of str keys
(no quote, backslash, bracket, brace, double quote or ESC in a key) to numbers, each optionally in
`np.float64(...)`-style wrappers, pairs separated by `, `. Anything else is read by the general
reader (tests/judge/test_parse_equivalence.py holds the two readers equal over generated logs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from launcher.judge.parse.shapes import (
    PARTS_TOLERANCE,
    STEP_TIME_KEYS,
    TRAIN_KEY,
    TRAIN_PERF_KEYS,
    WAIT_KEY,
)

# The reference number grammar (lines.py `_NUM`) on ASCII bytes; its digits before a point are
# one run, so a long run of digits that fails is not split every way (linear, not quadratic).
NUM = rb"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|nan|inf)"
_WRAP = rb"np\.(?:float(?:64|32|16)|int(?:64|32))\("
_KEY = rb"[^'\\\n\[\]{}\"\x1b]*"
_VALUE = rb"(?:" + _WRAP + NUM + rb"\)|" + NUM + rb")"
_FLAT_PAIR = rb"'" + _KEY + rb"': " + _VALUE
_FLAT_RE = re.compile(rb"\{" + _FLAT_PAIR + rb"(?:, " + _FLAT_PAIR + rb")*\}")
_PAIR_RE = re.compile(rb"'(" + _KEY + rb")': (" + _WRAP + rb")?" + NUM)
_MAX_TEMPLATES = 8  # per kind of line: a run prints a few layouts; more is a log to read slowly
# Compiling a layout costs far more than reading one payload (about 0.3 ms a pair): it pays only
# for a layout read again and again. A payload of more pairs than a run prints, and every layout
# past the first _MAX_LEARNT of a kind, is left to the general reader, so a hostile log of ever
# new, long layouts costs linear time at the general reader's speed, never a compile per line.
_MAX_PAIRS = 64
_MAX_LEARNT = 64


@dataclass(frozen=True)
class Template:
    """One layout of a metric dict. Each index is the group (1-based) of the key's value in
    `regex`, or 0 when the layout has no such key; a repeated key is read from its last pair,
    as a dict keeps it."""

    regex: re.Pattern[bytes]
    train_perf: bool  # a train perf dict (shapes.TRAIN_PERF_KEYS): the actor's
    loss: int = 0
    grad_norm: int = 0
    lr: int = 0  # train/lr-pg_0, else the first train/lr* key (shapes.apply_step)
    named: int = 0  # the first of shapes.STEP_TIME_KEYS the dict has
    wait: int = 0
    train: int = 0
    actor_train_time: int = 0
    tflops: int = 0
    tok_per_s: int = 0
    peak: int = 0
    mfu: int = 0


def template_of(payload: bytes) -> Template | None:
    """The template of a payload (`{...}`, bytes as in the log), or None when it is not one."""
    if payload.count(b"': ") > _MAX_PAIRS or not payload.isascii():
        return None
    if _FLAT_RE.fullmatch(payload) is None:
        return None
    pairs = [(m.group(1).decode(), m.group(2) or b"") for m in _PAIR_RE.finditer(payload)]
    parts = []
    for i, (key, wrap) in enumerate(pairs):
        value = rb"(" + NUM + rb")"
        if wrap:
            value = re.escape(wrap) + value + rb"\)"
        parts.append(re.escape((b"{'" if i == 0 else b", '") + key.encode() + b"': ") + value)
    regex = re.compile(b"".join(parts) + rb"\}")
    last = {key: i + 1 for i, (key, _) in enumerate(pairs)}  # dict order, last value
    lr = last.get("train/lr-pg_0") or next(
        (group for key, group in last.items() if key.startswith("train/lr")), 0
    )
    named = next((last[k] for k in STEP_TIME_KEYS if k in last), 0)
    return Template(
        regex=regex,
        train_perf=any(k in key for key in last for k in TRAIN_PERF_KEYS),
        loss=last.get("train/loss", 0),
        grad_norm=last.get("train/grad_norm", 0),
        lr=lr,
        named=named,
        wait=last.get(WAIT_KEY, 0),
        train=last.get(TRAIN_KEY, 0),
        actor_train_time=last.get("perf/actor_train_time", 0),
        tflops=last.get("perf/actor_train_tflops", 0),
        tok_per_s=last.get("perf/actor_train_tok_per_s", 0),
        peak=last.get("perf/mfu_peak_tflops", 0),
        mfu=last.get("perf/actor_train_mfu", 0),
    )


class Templates:
    """The layouts seen so far for one kind of line, the last one used first."""

    def __init__(self) -> None:
        self.known: list[Template] = []
        self.learnt = 0  # layouts compiled so far (at most _MAX_LEARNT)

    def match(self, payload: bytes) -> tuple[Template, re.Match[bytes]] | None:
        """(template, match) of a payload, learning its layout when it is new; None when the
        payload is not one the templates read (the general reader then reads it)."""
        known = self.known
        if known:  # the common case first: the layout of the last line of this kind
            m = known[0].regex.fullmatch(payload)
            if m is not None:
                return known[0], m
        for i, tmpl in enumerate(known):
            m = tmpl.regex.fullmatch(payload)
            if m is not None:
                if i:
                    known.insert(0, known.pop(i))
                return tmpl, m
        if self.learnt >= _MAX_LEARNT:
            return None
        learnt = template_of(payload)
        if learnt is None:
            return None
        self.learnt += 1
        m = learnt.regex.fullmatch(payload)
        if m is None:  # a template matches the payload it was made from
            return None
        known.insert(0, learnt)
        del known[_MAX_TEMPLATES:]
        return learnt, m


# (step_time, actor_train_time, tflops, mfu, peak, tokens): tokens False when the dict does not say.
PerfValues = tuple[float, float | None, float | None, float | None, float | None, int | None | bool]


def perf_values(tmpl: Template, m: re.Match[bytes]) -> PerfValues | None:
    """(step_time, actor_train_time, tflops, mfu, peak, tokens) of a train perf dict read
    by a template, by shapes.apply_perf's rules; None when the slow path must judge it (no step
    time, or a step time that disagrees with its parts: it is counted and shown there)."""
    named = float(m.group(tmpl.named)) if tmpl.named else None
    wait = float(m.group(tmpl.wait)) if tmpl.wait else None
    train = float(m.group(tmpl.train)) if tmpl.train else None
    parts = wait + train if wait is not None and train is not None else None
    if named is not None and parts is not None and math.isfinite(named) and math.isfinite(parts):
        if abs(named - parts) > PARTS_TOLERANCE * max(1.0, abs(parts)):
            return None
    step_time = named if named is not None else parts
    if step_time is None:
        return None
    actor = float(m.group(tmpl.actor_train_time)) if tmpl.actor_train_time else None
    tokens: int | None | bool = False  # False: the dict does not say (the record keeps its own)
    if tmpl.tok_per_s and actor is not None:
        product = float(m.group(tmpl.tok_per_s)) * actor
        tokens = round(product) if math.isfinite(product) else None
    return (
        step_time,
        actor,
        float(m.group(tmpl.tflops)) if tmpl.tflops else None,
        float(m.group(tmpl.mfu)) if tmpl.mfu else None,
        float(m.group(tmpl.peak)) if tmpl.peak else None,
        tokens,
    )
