"""The host's GPU samples (scripts/gpu_sampler.py's file, gpu-samples.csv), read back.

Why: the host's clock proves the step lines arrived at the pace they claim, not that the GPUs
did the work. node.sh runs the sampler on the host, outside every container, for the life of the
training `docker run`; it writes one line per GPU per sample,

    <host epoch s.ns>,<index>,<utilization.gpu %>,<power.draw>

on the host clock's own clock, so the evidence gate can look at what the GPUs did over the span in
which the host saw the window's step lines arrive (launcher/judge/evidence.py, check 7).

The file is the host's, not the container's (the node run directory is never mounted), but it is
still read as hostile: a line counts only in exactly that form, with a utilization that is a
whole number from 0 to 100 and a time that does not go back (the sampler's clock never does);
anything else (garbage, NaN, a negative or huge value, a line out of order) is counted in
`refused` and never used. `#` lines are the sampler's comments; a `# no samples: ...` one says
why there are none. Pure: no I/O (the bounded read is launcher/results/readback.py's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from launcher.excerpt import printable

_SAMPLE = re.compile(r"([0-9]{1,12})\.([0-9]{9}),([0-9]{1,3}),([0-9]{1,3}),[^,\n]{0,32}")
NO_SAMPLES = "# no samples: "
# The lines scripts/gpu_sampler.py writes last, whichever way it ends (stopped by node.sh or
# because node.sh is gone, nvidia-smi ended, no samples at all, the file at its limit).
END_LINES = ("# stopped", "# nvidia-smi ended (exit ", NO_SAMPLES, "# truncated at ")
MAX_INDEX = 255  # a node holds at most a few dozen GPUs; a larger index is no GPU's


@dataclass
class GpuSamples:
    """The samples of one sampler file: per GPU index, (host time, utilization %) in time order."""

    by_gpu: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    samples: int = 0
    refused: int = 0  # lines neither a comment nor a sample in the sampler's form
    why_none: str | None = None  # the sampler's `# no samples: ...`, shown
    problem: str | None = None  # the file could not be read (the reader's why)
    # The file's last line is one the sampler writes as it ends (END_LINES): a file without one
    # was cut off (the sampler killed, or its writes failing: a full disk), so its samples may
    # stop anywhere before the run did.
    ended: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": sorted(self.by_gpu),
            "samples": self.samples,
            "refused": self.refused,
            "why_none": self.why_none,
            "problem": self.problem,
            "ended": self.ended,
        }


def parse_samples(text: str) -> GpuSamples:
    """Every line of a sampler file; never raises, whatever the text. A file whose text does not
    end with a line break was cut mid-line: not ended, whatever its last line holds."""
    out = GpuSamples()
    last = float("-inf")
    for line in text.splitlines():
        if line.strip():
            out.ended = line.startswith(END_LINES)
        if line.startswith("#"):
            if line.startswith(NO_SAMPLES) and out.why_none is None:
                out.why_none = printable(line[len(NO_SAMPLES) :][:200])
            continue
        if not line.strip():
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            out.refused += 1
            continue
        t = int(m.group(1)) + int(m.group(2)) / 1e9
        index, util = int(m.group(3)), int(m.group(4))
        if util > 100 or index > MAX_INDEX or t < last:
            out.refused += 1
            continue
        last = t
        out.by_gpu.setdefault(index, []).append((t, util))
        out.samples += 1
    if text and not text.endswith("\n"):
        out.ended = False
    return out
