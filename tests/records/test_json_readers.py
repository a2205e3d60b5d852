"""Every JSON file the launcher reads back is read by one bounded reader, and every reader of one
ends in a ReproduceError (its exit code, one paragraph) or a value, never another exception.

Why: the run directory holds what collection brought back from the node and may be copied in from
anyone; a bundle handed to `reproduce verify` is a stranger's, signed with the key found beside
it; the index under $REPRODUCE_HOME can be copied from another machine. json.loads over them
raised RecursionError on a 100,000-deep nesting, ValueError on a 5,000-digit integer and
AttributeError on a list where a mapping was read (found 2026-12-04), so `verify`, `status`,
`runs`, the history and the pages ended in a traceback. launcher/records/jsonread.py is the one
reader (docs/architecture.md, "The trust boundary").

The adversary is generic, not a list of examples: the source is walked for any json.loads outside
that module (one added later fails here); each reader of the table below, for the file it reads
out of a real run directory (the runner's own, attested), is handed a fixed set of hostile
documents (deep nesting, a huge integer, NaN, a list, a scalar, nothing, a cut document, invalid
UTF-8, 5 MiB, a FIFO, a symlink, a directory) and every key of the real file holding each wrong
type. `reproduce verify` is handed the same, each file re-signed by the stranger's key beside it.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.attest import cli, keypair, real_run
from support.json_docs import key_paths, with_value
from support.paths import REPO

from launcher.clusters.aws import down as aws_down
from launcher.clusters.aws.state import AwsState
from launcher.errors import ReproduceError
from launcher.pages.attestation import read_attestation
from launcher.pages.run_sections import Context
from launcher.pages.rundata import read_run_dir
from launcher.plan.claimruns import accepted_in
from launcher.records import billing, jsonread, state
from launcher.records.history_rows import row_from_run_dir
from launcher.records.plan_record import RecordedPlan
from launcher.records.result_record import RecordedResult
from launcher.records.rundir import Files, RunDir
from launcher.records.runs import summarize
from launcher.records.verdict_record import RecordedVerdict
from launcher.results.attest import ENVELOPE_FILE, read_envelope, sign
from launcher.results.attest_keys import load_signing_key
from launcher.results.attest_predicate import build_predicate
from launcher.results.attest_verify import verify_dir
from launcher.results.readback import read_steps, read_timeline, recorded_price
from launcher.results.side_by_side import side_of
from launcher.runner.nightly_groups import _timeline as nightly_timeline

# The only json.loads outside jsonread.py: a value the launcher holds, dumped and read back in the
# same breath (attest_predicate.plain: JSON's view of it), not a read of anyone's bytes.
NOT_READS = {("launcher/results/attest_predicate.py", "plain")}

Reader = Callable[[Path], Any]


def _aws_state(d: Path) -> Any:
    return AwsState.load(d / Files.AWS)


def _state_entry(d: Path) -> Any:
    return state._read(d / Files.RUN)


# reader -> the files of the run directory it reads (its argument is the run directory)
READERS: dict[str, tuple[Reader, tuple[str, ...]]] = {
    "RunDir.record": (lambda d: RunDir(d).record(), (Files.RUN,)),
    "RunDir.status": (lambda d: RunDir(d).status(), (Files.STATUS,)),
    "RunDir.timeline": (lambda d: RunDir(d).timeline(), (Files.TIMELINE,)),
    "runs.summarize": (summarize, (Files.RUN, Files.STATUS, Files.TIMELINE, Files.PLAN)),
    "history row": (
        row_from_run_dir,
        (Files.RUN, Files.STATUS, Files.TIMELINE, Files.PLAN, Files.VERDICT),
    ),
    "billing.aws_facts": (lambda d: billing.aws_facts(RunDir(d)), (Files.AWS,)),
    "state index entry": (_state_entry, (Files.RUN,)),
    "state.import_runs": (lambda d: state.import_runs(d), (Files.RUN,)),
    "claimruns.accepted_in": (accepted_in, (Files.PLAN,)),
    "nightly timeline": (nightly_timeline, (Files.TIMELINE,)),
    "aws down run.json": (lambda d: aws_down._run_json(d), (Files.RUN,)),
    "aws.json state": (_aws_state, (Files.AWS,)),
    "evaluate.recorded_price": (recorded_price, (Files.RUN,)),
    "evaluate.read_timeline": (lambda d: read_timeline(d / Files.TIMELINE), (Files.TIMELINE,)),
    "evaluate.read_steps": (lambda d: read_steps(d / Files.STEPS), (Files.STEPS,)),
    "attest predicate": (
        build_predicate,
        (Files.MEASURE, Files.STATUS, Files.VERDICT, Files.TIMELINE, Files.PLAN, Files.RUN),
    ),
    "attest.read_envelope": (lambda d: read_envelope(d / ENVELOPE_FILE), (ENVELOPE_FILE,)),
    "page attestation line": (read_attestation, (ENVELOPE_FILE,)),
    "page run files": (
        read_run_dir,
        (Files.VERDICT, Files.STEPS, Files.TIMELINE, Files.PLAN, Files.RUN, Files.STATUS),
    ),
    "page context": (
        lambda d: Context.of(read_run_dir(d)),
        (Files.VERDICT, Files.TIMELINE, Files.PLAN, Files.RUN),
    ),
    "plan record": (lambda d: RecordedPlan.of(jsonread.read(d / Files.PLAN).value), (Files.PLAN,)),
    "verdict record": (lambda d: RecordedVerdict.read(d / Files.VERDICT), (Files.VERDICT,)),
    "compare side": (lambda d: side_of(d, d), (Files.VERDICT,)),
}

HOSTILE: dict[str, bytes | str] = {
    "deep list": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "5,000-digit integer": b'{"run_id": ' + b"9" * 5_000 + b"}",
    "NaN and Infinity": b'{"run_id": NaN, "state": Infinity, "stages": [-Infinity], "x": 1e999}',
    "a list": b"[1, 2, 3]",
    "a scalar": b'"done"',
    "null": b"null",
    "empty": b"",
    "cut": b'{"run_id": "r',
    "invalid UTF-8": b'{"run_id": "\xff\xfe\xc0", "state": "\xed\xa0\x80"}',
    "5 MiB": b'{"run_id": "' + b"x" * (5 * 1024 * 1024) + b'"}',
    "a FIFO": "fifo",
    "a symlink": "symlink",
    "a directory": "directory",
}
WRONG: list[Any] = [5, "x", [1], {"a": 1}, None, True, -1e308, "\x1b[2J\u202e"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run directory the real runner made, with an aws.json beside (the shape aws writes),
    attested; its files are each reader's real sample."""
    root = tmp_path_factory.mktemp("readers")
    key, pub = keypair(root)
    (root / "runs").mkdir()
    run = real_run(root / "runs", root / "node")
    (run / Files.AWS).write_text(
        json.dumps(
            {
                "schema": 1,
                "region": "us-east-2",
                "run_id": RunDir(run).record()["run_id"],
                "instances": ["i-0abc"],
                "targeted": [],
                "terminated": [],
            }
        )
    )
    proc = cli("attest", run, "--key", key)
    assert proc.returncode == 0, proc.stderr
    return {"run": run, "key": key, "pub": pub, "originals": _snapshot(run)}


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def _place(path: Path, doc: bytes | str) -> None:
    """Put the hostile document (or thing) where the file was."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if doc == "fifo":
        os.mkfifo(path)
    elif doc == "symlink":
        os.symlink("/etc/hostname" if Path("/etc/hostname").exists() else "/dev/null", path)
    elif doc == "directory":
        path.mkdir()
    else:
        assert isinstance(doc, bytes)
        path.write_bytes(doc)


def _restore(run: Path, originals: dict[str, bytes], name: str) -> None:
    path = run / name
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    path.write_bytes(originals[name])


def hang_guard(seconds: float) -> pytest.MarkDecorator:
    """pytest-timeout's marker, by signal: the test is interrupted where it hangs."""
    return pytest.mark.timeout(seconds, method="signal")


# The hang guard of every test that hands a reader a hostile file (pytest-timeout, a dependency
# of the tests: pyproject's [test] extra, tests/constraints.txt). Why a marker and not a clock
# read around the call: a reader that blocks on a FIFO never returns to let a clock be read, and
# a timed assertion on one that does return fails a slow machine, not a slow reader. The plugin
# interrupts the test itself (SIGALRM) and fails it with the stack of the call that hung: held by
# test_a_reader_that_blocks_on_a_fifo_fails_its_test below. The bound is a hang's, far above
# what the slowest of these tests needs on a loaded 2-core machine (about 6 s), and under the
# suite's own 300 s.
HANG_GUARD = hang_guard(120)


def _outcome(reader: Reader, run: Path) -> str:
    """'value' or 'ReproduceError (exit N)'; anything else fails the test, naming it. A reader
    that hangs (blocks on a FIFO, walks a document without end) fails by HANG_GUARD, which
    every caller's test carries."""
    try:
        reader(run)
    except ReproduceError as err:
        assert "Traceback" not in str(err)
        return f"ReproduceError (exit {err.exit_code})"
    return "value"


def test_a_reader_that_blocks_on_a_fifo_fails_its_test(tmp_path):
    """The guard fails a hung reader: a test of the same shape (hang_guard, _outcome) whose
    reader opens a FIFO without O_NONBLOCK, run by pytest in a child process, fails with the
    plugin's timeout instead of waiting for ever. The child's bound is 1 s (the mechanism, not the
    bound, is what is held); nothing here reads a clock."""
    os.mkfifo(tmp_path / "node.json")
    (tmp_path / "test_hung.py").write_text(
        "from pathlib import Path\n"
        "from test_json_readers import _outcome, hang_guard\n\n"
        "@hang_guard(1)\n"
        "def test_hung():\n"
        f"    _outcome(lambda run: (run / 'node.json').read_bytes(), Path({str(tmp_path)!r}))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "tests"), str(REPO)]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_hung.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Timeout" in out and "1 failed" in out, out


def test_no_json_is_parsed_outside_the_one_reader():
    """Any json.loads / json.load / JSONDecoder outside launcher/records/jsonread.py fails here,
    naming the file, the function and the line."""
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "launcher/records/jsonread.py":
            continue
        tree = ast.parse(path.read_text(), rel)
        allowed = [
            range(f.lineno, (f.end_lineno or f.lineno) + 1)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and (rel, f.name) in NOT_READS
        ]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "json"
                and node.attr in ("loads", "load", "JSONDecoder", "raw_decode")
                and not any(node.lineno in lines for lines in allowed)
            ):
                found.append(f"{rel}:{node.lineno}: json.{node.attr}")
    assert not sorted(set(found)), "JSON read outside jsonread.py:\n" + "\n".join(sorted(found))


def _cases(readers: dict[str, tuple[Reader, tuple[str, ...]]], docs: dict) -> list[tuple]:
    """(reader, file, document) for every file each reader reads and every hostile document."""
    return [(r, name, doc) for r, (_, names) in readers.items() for name in names for doc in docs]


def _given(sample: dict[str, Any], reader: Reader, name: str, doc: bytes | str) -> None:
    """READER on the sample run directory whose file NAME is DOC, the file restored after."""
    run, originals = sample["run"], sample["originals"]
    try:
        _place(run / name, doc)
        _outcome(reader, run)
    finally:
        _restore(run, originals, name)


@HANG_GUARD
@pytest.mark.parametrize(("reader", "name", "doc"), _cases(READERS, HOSTILE))
def test_every_reader_given_every_hostile_document(sample, reader, name, doc):
    _given(sample, READERS[reader][0], name, HOSTILE[doc])


@HANG_GUARD
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_key_of_a_real_file_holding_every_wrong_type(sample, reader):
    run, originals = sample["run"], sample["originals"]
    func, names = READERS[reader]
    for name in names:
        if name == Files.STEPS or name == ENVELOPE_FILE:
            continue  # lines of steps / the envelope: the statement's own test is verify's below
        real = json.loads(originals[name])
        try:
            for path in key_paths(real):
                for wrong in WRONG:
                    (run / name).write_text(json.dumps(with_value(real, path, wrong)))
                    _outcome(func, run)
        finally:
            _restore(run, originals, name)


def _resign(d: Path, key: Path) -> None:
    """The stranger's move: sign the directory as it now is with the key found beside it."""
    envelope = json.loads((d / ENVELOPE_FILE).read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    for subject in stmt["subject"]:
        path = d / subject["name"]
        if path.is_file() and not path.is_symlink():
            subject["digest"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            subject.setdefault("annotations", {})["size"] = path.stat().st_size
    (d / ENVELOPE_FILE).write_text(json.dumps(sign(stmt, load_signing_key(key))))


# what verify reads as JSON from a bundle: the measurement's record and the verdict
VERIFIED = (Files.MEASURE, Files.VERDICT)


@pytest.mark.parametrize("name", VERIFIED)
@pytest.mark.parametrize("doc", sorted(HOSTILE))
def test_verify_of_a_stranger_s_bundle_given_every_hostile_document(sample, tmp_path, name, doc):
    d = tmp_path / "bundle"
    shutil.copytree(sample["run"], d, symlinks=True)
    _place(d / name, HOSTILE[doc])
    _resign(d, sample["key"])
    assert _outcome(lambda root: verify_dir(root), d) in (
        "ReproduceError (exit 1)",
        "ReproduceError (exit 2)",
    )


@pytest.mark.parametrize("name", (Files.MEASURE, Files.VERDICT))
def test_verify_given_every_key_of_the_record_holding_every_wrong_type(sample, tmp_path, name):
    d = tmp_path / "bundle"
    shutil.copytree(sample["run"], d, symlinks=True)
    real = json.loads(sample["originals"][name])
    for path in key_paths(real):
        for wrong in WRONG[:4]:
            (d / name).write_text(json.dumps(with_value(real, path, wrong)))
            _resign(d, sample["key"])
            _outcome(lambda root: verify_dir(root), d)


def test_verify_through_the_cli_is_one_paragraph_and_exit_1(sample, tmp_path):
    d = tmp_path / "bundle"
    shutil.copytree(sample["run"], d, symlinks=True)
    (d / Files.MEASURE).write_bytes(HOSTILE["deep list"])
    _resign(d, sample["key"])
    proc = cli("verify", d)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "measure.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_limits_are_the_reader_s(tmp_path):
    """One place holds them: a file over MAX_BYTES is refused by load_file, and a caller that
    allows more (steps.jsonl, a page) says so itself."""
    path = tmp_path / "big.json"
    path.write_bytes(b'"' + b"x" * jsonread.MAX_BYTES + b'"')
    with pytest.raises(jsonread.NodeJSONError, match="more than"):
        jsonread.load_file(path)
    assert len(jsonread.load_file(path, max_bytes=2 * jsonread.MAX_BYTES)) == jsonread.MAX_BYTES


# --- the run directory's YAML: the same promise, one reader (records/rundir.read_yaml) ---

# reader -> the YAML files of the run directory it reads
YAML_READERS: dict[str, tuple[Reader, tuple[str, ...]]] = {
    "history row": (row_from_run_dir, (Files.RESULT,)),
    "runs.summarize": (summarize, (Files.RESULT,)),
    "attest predicate": (build_predicate, (Files.RESULT, Files.RECIPE)),
    "page run files": (read_run_dir, (Files.RESULT,)),
    "page context": (lambda d: Context.of(read_run_dir(d)), (Files.RESULT, Files.RECIPE)),
    "result record": (lambda d: RecordedResult.read(d / Files.RESULT), (Files.RESULT,)),
    "compare side": (lambda d: side_of(d, d), (Files.RESULT,)),
}
_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)
)
HOSTILE_YAML: dict[str, bytes | str] = {
    "alias bomb": _LAUGHS.encode(),  # 9**10 nodes for whatever walks it (a dump, a comparison)
    "deep flow list": b"[" * 100_000 + b"]" * 100_000,
    "not YAML": b"figures: [unclosed\n  - : :\n",
    "a python tag": b"!!python/object/apply:os.system ['true']\n",
    "a list": b"- 1\n- 2\n",
    "empty": b"",
    "invalid UTF-8": b"run_id: \xff\xfe\xc0\n",
    "5 MiB": b"x: '" + b"y" * (5 * 1024 * 1024) + b"'\n",
    "a FIFO": "fifo",
    "a symlink": "symlink",
    "a directory": "directory",
}


@HANG_GUARD
@pytest.mark.parametrize(("reader", "name", "doc"), _cases(YAML_READERS, HOSTILE_YAML))
def test_every_yaml_reader_given_every_hostile_document(sample, reader, name, doc):
    _given(sample, YAML_READERS[reader][0], name, HOSTILE_YAML[doc])


def test_no_yaml_is_parsed_outside_the_readers():
    """The run directory's YAML is read by records/rundir.py alone; a recipe's and a profile's
    by inputs/ (schema checked). Any other yaml.load / safe_load fails here, naming it."""
    allowed = {
        "launcher/records/rundir.py",
        "launcher/inputs/recipe.py",
        "launcher/inputs/profile.py",
        "launcher/inputs/yamlschema.py",
    }
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "yaml"
                and node.attr in ("load", "safe_load", "full_load", "unsafe_load", "load_all")
            ):
                found.append(f"{rel}:{node.lineno}: yaml.{node.attr}")
    assert not found, "YAML read outside the readers:\n" + "\n".join(found)


def test_the_launchers_own_yaml_has_no_alias_to_refuse(sample):
    """What the launcher writes reads back: a value written twice is written out twice."""
    from launcher.records.rundir import dump_yaml, load_yaml

    shared = {"tokens_per_s_per_gpu": 6913.2}
    text = dump_yaml({"claimed": shared, "measured": shared})
    assert "&" not in text and "*" not in text
    assert load_yaml(text, Path("result.yaml")) == {"claimed": shared, "measured": shared}
    assert "&" not in (sample["run"] / Files.RESULT).read_text()


# --- the streams: logs, status, bundles. Bounded in bytes, memory and time, whatever they hold.
#
# A reader of a log (the run directory's copy, the node's, one stage's) or of a bundle gets every
# hostile stream below: a line of 24 MiB, 24 MiB of NULs, a flood of stage markers, invalid
# UTF-8 with controls, a FIFO, a symlink, a directory. It must end (HANG_GUARD), with a value or
# a ReproduceError, having allocated at most STREAM_PEAK (tracemalloc: what Python allocated,
# not the clock, so a loaded machine does not change it). A reader added later joins the table.

STREAM_PEAK = 16 << 20  # the largest stream is 24 MiB: a reader that holds it whole fails
NODE_LOG = "node:node.log"  # the node's own node.log (NODE_RUN_DIR), read from the copy's end


def _sink() -> Any:
    import io

    class Sink(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            return len(data)

        def isatty(self) -> bool:
            return False

    return Sink()


def _logs(stage: str | None) -> Reader:
    def read(d: Path) -> Any:
        from launcher.commands.logs import logs_command

        return logs_command(str(d), None, stage=stage, out=_sink())

    return read


def _live_stage_filter(d: Path) -> Any:
    """`logs --stage train` of a run still going: the node's log through the filter."""
    from launcher.runner.runlogs import StageFilter, read_local

    filt = StageFilter("train")
    for chunk in read_local(d / "logs" / "node.log"):
        filt.feed(chunk)
    return filt.finish()


def _node_status(d: Path) -> Any:
    from launcher.runner.runlogs import node_progress

    return node_progress(RunDir(d))


def _failure_tail(d: Path) -> Any:
    from launcher.runner.outcome import tail_of

    return tail_of(d / "logs" / "train.log")


def _train_progress(d: Path) -> Any:
    from launcher.records.runs import train_progress

    return train_progress(RunDir(d))


# reader -> the streams it reads (relative to the run directory; NODE_LOG: the node's log)
STREAM_READERS: dict[str, tuple[Reader, tuple[str, ...]]] = {
    "logs": (_logs(None), ("logs/node.log",)),
    "logs --stage": (_logs("train"), ("logs/train.log",)),
    "logs --stage (live)": (_live_stage_filter, ("logs/node.log",)),
    "status: the node's log": (_node_status, ("logs/node.log", NODE_LOG)),
    "status: the train tail": (_train_progress, ("logs/train.log",)),
    "status: runs.summarize": (summarize, ("logs/train.log", "logs/node.log")),
    "failure message tail": (_failure_tail, ("logs/train.log",)),
    "history row": (row_from_run_dir, ("logs/train.log",)),
}

_MARKERS = b"##reproduce stage=a event=start t=1\n" * 30_000 + (
    b"##reproduce stage=a event=end status=ok t=2\n" * 30_000
)
HOSTILE_STREAMS: dict[str, Callable[[], Iterator[bytes]] | str] = {
    "a 24 MiB line": lambda: iter([b"x" * (1 << 20)] * 24),
    "24 MiB of NULs": lambda: iter([b"\0" * (1 << 20)] * 24 + [b"\n"]),
    "a flood of markers": lambda: iter([_MARKERS]),
    "invalid UTF-8 and controls": lambda: iter([b"\xff\xfe\x1b[2J\xed\xa0\x80\r\x00\n" * 10_000]),
    "a FIFO": "fifo",
    "a symlink": "symlink",
    "a directory": "directory",
}


def _stream_path(run: Path, name: str) -> Path:
    if name == NODE_LOG:
        return Path(RunDir(run).record()["node_run_dir"]) / "node.log"
    return run / name


def _place_stream(path: Path, doc: Callable[[], Iterator[bytes]] | str) -> None:
    if isinstance(doc, str):
        _place(path, doc)
        return
    if path.is_symlink() or path.is_file():
        path.unlink()
    with open(path, "wb") as fh:
        for chunk in doc():
            fh.write(chunk)


def _peak_of(reader: Reader, run: Path) -> int:
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        _outcome(reader, run)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@HANG_GUARD
@pytest.mark.parametrize(("reader", "name", "doc"), _cases(STREAM_READERS, HOSTILE_STREAMS))
def test_every_stream_reader_given_every_hostile_stream(sample, reader, name, doc):
    run = sample["run"]
    path = _stream_path(run, name)
    original = path.read_bytes()
    try:
        _place_stream(path, HOSTILE_STREAMS[doc])
        peak = _peak_of(STREAM_READERS[reader][0], run)
        assert peak < STREAM_PEAK, f"{reader} on {doc} in {name}: {peak >> 20} MiB at its peak"
    finally:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()
        path.write_bytes(original)


def _bomb(path: Path, top: str, first: str, size: int) -> None:
    import io
    import tarfile

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buf: Any) -> int:
            n = min(len(buf), self.left)
            buf[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo(f"{top}/{first}")
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros()))


def _many_entries(path: Path, top: str) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        env = tarfile.TarInfo(f"{top}/{ENVELOPE_FILE}")
        env.size = 2
        tar.addfile(env, io.BytesIO(b"{}"))
        for k in range(20_000):
            info = tarfile.TarInfo(f"{top}/f{k}")
            tar.addfile(info, io.BytesIO(b""))


HOSTILE_BUNDLES: dict[str, Callable[[Path], None] | str] = {
    "an entry of 64 MiB of zeros first": lambda p: _bomb(p, "run", "zeros", 64 << 20),
    "an envelope of 64 MiB": lambda p: _bomb(p, "run", ENVELOPE_FILE, 64 << 20),
    "20,000 entries after an envelope": lambda p: _many_entries(p, "run"),
    "not gzip": lambda p: p.write_bytes(b"\x1f\x8b" + b"\0" * 100),
    "a cut gzip": lambda p: (
        _bomb(p, "run", "zeros", 1 << 20),
        p.write_bytes(p.read_bytes()[:300]),
    ),
    "a FIFO": "fifo",
    "a symlink": "symlink",
    "a directory": "directory",
}


@HANG_GUARD
@pytest.mark.parametrize("doc", sorted(HOSTILE_BUNDLES))
def test_verify_of_every_hostile_bundle_writes_and_holds_little(tmp_path, doc):
    """`reproduce verify BUNDLE` reads the bundle as a stream and writes only what its signed
    statement names (launcher/results/attest.py, `_Unpack`): each of these ends in a
    ReproduceError, having written at most an envelope's bound and allocated at most STREAM_PEAK."""
    from launcher.commands.attest import verify_target
    from launcher.results.attest import ENVELOPE_MAX_BYTES, extract_bundle

    bundle = tmp_path / "hostile.tar.gz"
    made = HOSTILE_BUNDLES[doc]
    if isinstance(made, str):
        _place(bundle, made)
    else:
        made(bundle)
    into = tmp_path / "into"
    into.mkdir()
    assert _outcome(lambda _: extract_bundle(bundle, into), tmp_path).startswith("ReproduceError")
    written = sum(p.stat().st_size for p in into.rglob("*") if p.is_file())
    assert written <= ENVELOPE_MAX_BYTES, written
    peak = _peak_of(lambda _: verify_target(bundle, None), tmp_path)
    assert peak < STREAM_PEAK, f"verify of {doc}: {peak >> 20} MiB at its peak"


# Every read of a whole file or stream in launcher/ (read_bytes, read_text, read() with no size,
# readlines): each one here is bounded by what it reads, said why; a read added later fails
# until it is bounded or placed here. jsonread and yamlschema are the bounded readers themselves.
WHOLE_READS = {
    ("launcher/inputs/profile.py", "profile_schema"): "the shipped schema",
    ("launcher/inputs/recipe.py", "recipe_schema"): "the shipped schema",
    ("launcher/plan/bash_template.py", "template"): "the shipped node.sh template",
    ("launcher/prepare/image.py", "build_and_push"): "docker's image id file, written by us",
    ("launcher/runner/runner.py", "run"): "the user's profile, loaded and checked already",
    ("launcher/results/attest_verify.py", "remeasure_check"): "a subject, at its attested size",
    ("launcher/results/attest_verify.py", "_same_runs"): "subjects, at their attested sizes",
    ("launcher/results/evaluate.py", "_write_log_page"): "--timeline, read bounded before",
}


def test_no_whole_read_of_a_stream_is_unbounded():
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text(), rel)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                attr, receiver = node.func.attr, node.func.value
                if isinstance(receiver, ast.Name) and receiver.id in ("jsonread", "yamlschema"):
                    continue
                whole = attr in ("read_bytes", "read_text", "readlines") or (
                    attr == "read" and not node.args and not node.keywords
                )
                if whole and (rel, func.name) not in WHOLE_READS:
                    found.append(f"{rel}:{node.lineno}: {attr} in {func.name}")
    assert not found, "whole reads not bounded nor placed:\n" + "\n".join(sorted(set(found)))
