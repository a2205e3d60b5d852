"""The records of a run directory that a measurement reads back: steps.jsonl, a timeline, the
recorded price, the host's GPU samples, the run's nonce. Each read through
launcher/records/jsonread.py (bounded, never a traceback): the directory measured, or a timeline
named with --timeline, may have come from anyone, and a file of
it nested 100,000 deep, holding a 5,000-digit number or a list is BadInput naming it (exit 2)."""

from __future__ import annotations

from pathlib import Path

from launcher.catalog import Price
from launcher.errors import BadInput
from launcher.inputs.yamlschema import read_text_capped
from launcher.judge.evidence import HostWatch
from launcher.judge.parse.gpu import GpuSamples, parse_samples
from launcher.judge.parse.records import StepRecord
from launcher.judge.timeline import RunTimeline
from launcher.records import jsonread
from launcher.records.rundir import Files

# steps.jsonl read back (a run directory without its log): bounded like every JSON read, at a
# size a very long run's steps reach (~300 bytes a step), not at a node report's 4 MiB
STEPS_MAX_BYTES = 256 * 1024 * 1024


def read_steps(path: Path) -> list[StepRecord]:
    """steps.jsonl read back: each line a JSON object of a step (launcher/records/jsonread.py:
    bounded; the directory measured is anyone's); BadInput naming the line that is not one."""
    try:
        text = jsonread.read_text(path, max_bytes=STEPS_MAX_BYTES) or ""
    except jsonread.NodeJSONError as err:
        raise BadInput(f"{path}: {err.message}") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = jsonread.loads(line)
            if not isinstance(data, dict):
                raise BadInput(f"{path}, line {number}: not a step object")
            records.append(StepRecord.from_dict(data))
        except (jsonread.NodeJSONError, ValueError, TypeError) as err:
            raise BadInput(f"{path}, line {number}: not a step ({str(err)[:200]})") from None
    return records


def read_timeline(path: Path) -> RunTimeline:
    """A timeline.json (the run's stage times, for GPU-hours); BadInput when unreadable.

    Read as any file a user names: a regular file, capped (a FIFO or /dev/zero had hung
    `measure --timeline`), JSON without NaN or Infinity (a time that is not a number)."""
    text = read_text_capped(Path(path), "timeline")

    try:  # strict: a NaN time is a wrong file, said, not a null time
        data = jsonread.loads(text, strict=True)
    except jsonread.NodeJSONError as err:
        raise BadInput(f"{path} is not valid JSON: {err.message}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a timeline object.")
    return RunTimeline.of(data)


def load_timeline(run_dir: Path) -> RunTimeline | None:
    """run_dir/timeline.json, or None when the run directory has none."""
    path = Path(run_dir) / Files.TIMELINE
    return read_timeline(path) if path.is_file() else None


def recorded_price(run_dir: Path) -> Price | None:
    """The price a run recorded in run.json (`price`), or None (none recorded, or unreadable:
    then the catalog prices it, as before prices were recorded)."""
    try:
        record = jsonread.load_file(Path(run_dir) / Files.RUN)
    except jsonread.NodeJSONError:
        return None
    return Price.from_dict(record.get("price")) if isinstance(record, dict) else None


def read_gpu_samples(run_dir: Path) -> GpuSamples | None:
    """The host's GPU samples of a run directory (gpu-samples.csv, collected from the node run
    directory: scripts/gpu_sampler.py), read through the one bounded reader; None when there is
    no such file. Never raises: a file that cannot be read (a FIFO, a link, over the collection's
    4 MiB) gives no samples and says why, so the evidence gate states check 7 not checked."""
    path = Path(run_dir) / Files.GPU_SAMPLES
    try:
        text = jsonread.read_text(path)
    except jsonread.NodeJSONError as err:
        return GpuSamples(problem=f"{Files.GPU_SAMPLES}: {err.message}")
    return None if text is None else parse_samples(text)


def run_nonce(run_dir: Path) -> str | None:
    """The nonce node.sh printed first in a run directory's logs/node.log (None: no node.log, or
    one of an older launcher): the one that makes its host clock lines count. Read from the log,
    never from anything the container could write (launcher/plan/protocol.py, MarkerGate)."""
    from launcher.plan.markers import MarkerGate

    node_log = Path(run_dir) / Files.LOGS / Files.NODE_LOG
    return MarkerGate.of_log(node_log).nonce if node_log.is_file() else None


# What node.sh runs when the host watches the training (launcher/plan/host_clock.py): the words
# that start the host's clock and its GPU sampler.
_CLOCK_WORDS, _SAMPLER_WORDS = "scripts/host_clock.py", "scripts/gpu_sampler.py"


def host_watch(run_dir: Path) -> HostWatch | None:
    """Whether the run was launched with the host's clock and GPU sampler on: read from the node
    script the run directory keeps (node.sh, what was run, byte for byte), else from the record
    of an earlier measurement of it (measure.json's `host_watch`: an attested bundle). None
    where neither says (a log, a run of an older launcher): then the checks that cannot apply
    are named, not owed (launcher/judge/evidence.py, HostWatch)."""
    script = Path(run_dir) / Files.NODE_SCRIPT
    try:
        text = jsonread.read_text(script)
    except jsonread.NodeJSONError:
        text = None
    if text is not None:
        return HostWatch(clock=_CLOCK_WORDS in text, sampler=_SAMPLER_WORDS in text)
    try:
        record = jsonread.load_file(Path(run_dir) / Files.MEASURE)
    except jsonread.NodeJSONError:
        return None
    watch = record.get("host_watch") if isinstance(record, dict) else None
    if isinstance(watch, dict) and all(
        isinstance(watch.get(k), bool) for k in ("clock", "sampler")
    ):
        return HostWatch(clock=watch["clock"], sampler=watch["sampler"])
    return None
