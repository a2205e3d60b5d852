"""What captures put before each line of a log (docker's and kubectl's timestamps, kubectl's pod,
journald's forms, the CRI log file, `srun -l`, Ray's actor, colour codes), to wrap test logs in: the line framing
tests (tests/judge/test_line_framing.py) and the adversary (tests/judge/test_adversary.py). Each
form as the capture writes it (launcher/judge/parse/frame.py names the sources)."""

from __future__ import annotations

from collections.abc import Callable

from launcher.judge.parse.clock import CLOCK

# One prefix per capture, as each writes it (the i-th line of the log as argument).
FRAMES: dict[str, Callable[[int], str]] = {
    "docker": lambda i: f"2026-10-21T10:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 10**9:09d}Z ",
    "docker+tz": lambda i: f"2026-10-21T12:00:{i % 60:02d}.000000001+02:00 ",
    "cri": lambda i: f"2026-10-21T10:00:{i % 60:02d}.{i:09d}Z {('stdout', 'stderr')[i % 2]} F ",
    "kubectl": lambda i: "[pod/miles-train-0/trainer] ",
    "journald": lambda i: f"Oct {1 + i % 28:2d} 10:00:{i % 60:02d} gpu-node-1 dockerd[4242]: ",
    "journald-precise": lambda i: f"Oct 21 10:00:00.{i % 10**6:06d} gpu-node-1 train: ",
    "journald-iso": lambda i: f"2026-10-21T10:00:{i % 60:02d}+0000 gpu-node-1 3f2a9c1b[77]: ",
    "journald-unix": lambda i: f"{1792576800 + i}.123456 gpu-node-1 trainer[9]: ",
    "srun": lambda i: "0: ",
    "srun-wide": lambda i: f"{i % 16:2d}: ",
    "ray": lambda i: "(MegatronTrainRayActor pid=5123, ip=10.0.0.2) ",
    "ansi": lambda i: "\x1b[36m(pid=77)\x1b[0m ",
}
NESTINGS: tuple[tuple[str, ...], ...] = (
    *((name,) for name in FRAMES),
    ("journald", "docker", "srun"),
    ("kubectl", "docker"),
    ("cri", "srun", "ray"),
    ("docker", "kubectl"),
    ("docker", "srun", "ray"),
    ("journald-iso", "srun-wide", "ansi"),
    ("srun", "docker", "journald", "kubectl"),
)


def wrap(text: str, frames: tuple[str, ...]) -> str:
    """Every line of a log behind the frames, outermost first (the host's clock lines, which
    node.sh writes itself and nothing frames, are left as they are)."""
    out = []
    for i, line in enumerate(text.split("\n")):
        if line.startswith(CLOCK) or (not line and i == text.count("\n")):
            out.append(line)
            continue
        out.append("".join(FRAMES[f](i) for f in frames) + line)
    return "\n".join(out)
