"""The host's GPU samples of a modelled run (tests/support/log_shapes.py's `Run`), written as
scripts/gpu_sampler.py writes them: once a second, one line per GPU, on the host's clock.

Why a model: check 7 (launcher/judge/evidence.py) reads what the GPUs did over the host span in
which the window's step lines arrived; the tests draw runs whose GPUs are idle or busy over any
part of that span and compute, here, apart from the launcher, what the check must conclude.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from support.log_shapes import HOST_START, Run, host_times

BUSY = 97
INTERVAL_S = 1.0
WINDOW = (5, 19)


@dataclass
class Load:
    """What the node's GPUs did: `busy` everywhere but the spans of `idle` (gpu, host seconds
    from, to, utilization there); `gpus` GPUs sampled (8: the seed's node)."""

    gpus: int = 8
    busy: int = BUSY
    idle: list[tuple[int, float, float, int]] = field(default_factory=list)

    def util(self, gpu: int, t: float) -> int:
        for g, start, end, value in self.idle:
            if g == gpu and start <= t < end:
                return value
        return self.busy


def sample_times(run: Run) -> list[float]:
    """When the sampler sampled: once a second from before the run's first line to after its
    last (the life of the docker run)."""
    end = host_times(run)[-1] + 3.0
    t, out = HOST_START - 2.0, []
    while t <= end:
        out.append(t)
        t += INTERVAL_S
    return out


def stamp(t: float) -> str:
    ns = round(t * 1e9)
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def render_samples(run: Run, load: Load) -> str:
    """The sampler file of `run` under `load`, exactly in gpu_sampler.py's form."""
    lines = [f"# gpu_sampler start t={stamp(HOST_START - 2.5)} interval_ms=1000"]
    for t in sample_times(run):
        for gpu in range(load.gpus):
            util = load.util(gpu, t)
            lines.append(f"{stamp(t)},{gpu},{util},{120.0 + 5.8 * util:.2f}")
    lines.append("# stopped")
    return "\n".join(lines) + "\n"


def window_span(run: Run) -> tuple[float, float]:
    """The host span check 6 and 7 read: the arrival bounds of the window's first and last step
    lines (each step's clock line: the model's steps are all further apart than the gap)."""
    host = host_times(run)
    return host[WINDOW[0]], host[WINDOW[1]]


def medians(run: Run, load: Load, gpus: int = 8) -> dict[int, float]:
    """The model's own answer: each GPU's median utilization over the window's host span."""
    start, end = window_span(run)
    seen = [t for t in sample_times(run) if start <= t <= end]
    return {g: statistics.median(load.util(g, t) for t in seen) for g in range(gpus)}
