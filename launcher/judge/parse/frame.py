"""Line framing: what a capture puts before a line of the training's output, told apart from the
line itself (its payload), by one rule for every kind of line the parser reads.

Why one rule: a miles log reaches `measure` through whatever captured it, and each capture puts
its own words before every line: docker's `logs --timestamps` an RFC 3339 stamp, kubectl's
`logs --prefix` the pod and container, journald its date, host and unit, `srun -l` the task
number, Ray the actor's `(Name pid=N, ip=A)`, and any of them colour codes; several nest (a
journald capture of a docker container running `srun -l`). A line read at its start (an
argument of Megatron's listing, the next line of a dict printed over several, bash's `Killed`)
is read at its payload's start, found here, so a prefix can never hide a line from one check
while another check still sees it. Metric markers (`step N: {`) are searched anywhere in a line,
which is a superset of this rule. The host's own clock lines are the exception: node.sh writes
them into node.log itself, where nothing frames them, and a clock line counts only whole
(launcher/judge/parse/clock.py). docs/miles-log.md, "Line framing", lists each prefix and its
source; tests/judge/test_line_framing.py wraps every line of every fixture log in each prefix
and their nestings and holds the verdict and figures unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Colour codes (SGR and the other CSI sequences a terminal capture keeps).
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ANSI_AT = re.compile(r"(?:\x1b\[[0-9;?]*[A-Za-z])+")


@dataclass(frozen=True)
class Prefix:
    """One capture's prefix: its pattern (anchored at the position it is tried at) and where its
    form is documented."""

    name: str
    pattern: re.Pattern[str]
    source: str


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_D = "[0-9]"  # ASCII digits only (`\\d` of a str pattern takes every script's)
_DATE = rf"{_D}{{4}}-{_D}{{2}}-{_D}{{2}}T{_D}{{2}}:{_D}{{2}}:{_D}{{2}}"
# journald's short-iso form is tried before docker's stamp, which is its first word. Every
# quantifier below runs over a class its neighbour cannot take (or is bounded), so each pattern
# matches in linear time on any line (tests/judge/test_parse_regex_linear.py finds them here).
_JOURNALD_RE = re.compile(
    rf"(?:{_MONTH} [ 0-9]{_D} {_D}{{2}}:{_D}{{2}}:{_D}{{2}}(?:\.{_D}{{1,6}})?"
    rf"|{_DATE}(?:\.{_D}{{1,6}})?[+-]{_D}{{2}}:?{_D}{{2}}"
    rf"|{_D}{{9,11}}\.{_D}{{6}})"
    rf" [^\s\[\]:]{{1,255}} [^\s\[\]:]{{1,255}}(?:\[{_D}{{1,10}}\])?: "
)
_DOCKER_RE = re.compile(rf"{_DATE}(?:\.{_D}{{1,9}})?(?:Z|[+-]{_D}{{2}}:?{_D}{{2}}) ")
# The CRI log file (what the kubelet keeps under /var/log/pods and log shippers read): RFC 3339
# with nanoseconds, the stream, F (a full line) or P (a part of a longer one, not joined here)
_CRI_RE = re.compile(
    rf"{_DATE}(?:\.{_D}{{1,9}})?(?:Z|[+-]{_D}{{2}}:?{_D}{{2}}) std(?:out|err) [FP] "
)
_KUBECTL_RE = re.compile(r"\[pod/[^\]\s/]{1,253}/[^\]\s/]{1,253}\] ")
_SRUN_RE = re.compile(rf" {{0,9}}{_D}{{1,10}}: ")
# The parenthesis is matched whole, then searched for `pid=N` (`[^()]*pid=\d+[^()]*` in one
# expression tries every split of a long parenthesis: quadratic).
_RAY_RE = re.compile(r"\(([^()]*)\)(?:\x1b\[[0-9;?]*[A-Za-z])* ?")
_PID_RE = re.compile(r"pid=[0-9]")
PREFIXES: tuple[Prefix, ...] = (
    Prefix(
        "journald",
        _JOURNALD_RE,
        "journalctl -o short, short-precise, short-iso, short-iso-precise, short-unix: "
        "DATE HOST IDENTIFIER[PID]: ",
    ),
    Prefix(
        "cri",
        _CRI_RE,
        "the CRI log file (containerd, CRI-O; kubelet's /var/log/pods): RFC 3339 with "
        "nanoseconds, stdout or stderr, F or P, each followed by one space",
    ),
    Prefix(
        "docker",
        _DOCKER_RE,
        "docker logs --timestamps / kubectl logs --timestamps: RFC 3339 with nanoseconds "
        "(docker's jsonmessage.RFC3339NanoFixed), then one space",
    ),
    Prefix("kubectl", _KUBECTL_RE, "kubectl logs --prefix: [pod/NAME/CONTAINER], then one space"),
    Prefix(
        "srun",
        _SRUN_RE,
        "srun -l / --label: the task number right-aligned to the widest one, then `: `",
    ),
    Prefix(
        "ray",
        _RAY_RE,
        "Ray's actor and task prefix: (NAME pid=N) or (NAME pid=N, ip=A), colour codes, a space",
    ),
)
# More nested prefixes than this are not looked for: a line is read at most this far in.
MAX_NESTING = 8


def payload_start(line: str) -> int:
    """Where the payload starts: after every known prefix (PREFIXES, in any order and nesting,
    colour codes before and after each)."""
    pos = 0
    for _ in range(MAX_NESTING):
        colour = _ANSI_AT.match(line, pos)
        at = colour.end() if colour is not None else pos
        for prefix in PREFIXES:
            found = prefix.pattern.match(line, at)
            if found is not None and (prefix.pattern is not _RAY_RE or _PID_RE.search(found[1])):
                pos = found.end()
                break
        else:
            return at
    colour = _ANSI_AT.match(line, pos)
    return colour.end() if colour is not None else pos


def payload(line: str) -> str:
    """The line without its frame (PREFIXES), colour codes and line end."""
    text = line[payload_start(line) :]
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    return text.rstrip("\r\n")
