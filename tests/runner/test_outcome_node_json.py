"""Every reader of the node's JSON reports against hostile documents: the run still ends with its
exit code, and no exception but a ReproduceError comes out (launcher/records/jsonread.py).

Why: preflight.json, preflight-gpu.json, image.json, stack.json and assets-plan.json are what
programs on the node printed, some inside the recipe's image, collected into the run directory.
A top-level list, `"checks": [1]`, `"gpus": 5`, a 100,000-deep nesting or a 5,000-digit integer
made the launcher raise AttributeError, TypeError, RecursionError or ValueError instead of giving
the run its exit code: the run's status stayed "collecting", and a nightly ended at that run.

The adversary, for each of those files and each reader of them (the failure message of
runner/outcome.py, node 0's and node K's; the attestation's predicate; the history row a
nightly records; the run page): a fixed set of hostile documents (a list or a scalar at the top,
empty, cut, nested 100,000 deep, a 5,000-digit integer, NaN and Infinity everywhere, invalid
UTF-8, 10 MB, terminal escapes in every text, many lines that start with `{`) and, for every key
of a real sample of the file (tests/data), that key holding each wrong type or missing. Then real
runs whose node writes such files: each ends "failed" with its exit code, or "done" and judged.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.attest import real_run
from support.json_docs import GONE, key_paths, with_value
from support.nodescript import job
from support.paths import TESTS

from launcher.clusters.local import LocalCluster
from launcher.errors import ReproduceError
from launcher.pages import write_run_page
from launcher.records.history import History
from launcher.records.history_rows import row_from_run_dir
from launcher.records.rundir import NODE_RESULT_FILES, Files, RunDir, Stage, Timeline
from launcher.results.attest_predicate import build_predicate
from launcher.runner.outcome import failure
from launcher.runner.runner import Runner

DATA = TESTS / "data"
SAMPLES = {
    Files.PREFLIGHT: DATA / "node" / "preflight.json",
    Files.PREFLIGHT_GPU: DATA / "preflight" / "h200x2_report.json",
    Files.IMAGE: DATA / "node" / "image.json",
    Files.STACK: DATA / "node" / "stack.json",
    Files.ASSET_PLAN: DATA / "node" / "assets-plan.json",
}
# The stage whose failure reads the file (runner/outcome.py, check_detail).
STAGE = {
    Files.PREFLIGHT: "preflight",
    Files.PREFLIGHT_GPU: "preflight-gpu",
    Files.IMAGE: "image",
    Files.STACK: "stack",
    Files.ASSET_PLAN: "resolve",
}
WRONG: list[Any] = [5, "x", [1], {"a": 1}, None, True]
ESCAPE = "\x1b]52;c;b3duZWQ=\x07\x1b[2J"
BOUND = 20_000  # characters of a failure message: our words and bounded excerpts


def test_every_node_result_file_has_a_sample():
    assert set(SAMPLES) == set(NODE_RESULT_FILES)


def _map(value: Any, leaf: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map(v, leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [_map(v, leaf) for v in value]
    return leaf(value)


def _fixed(name: str) -> list[tuple[str, bytes]]:
    raw = SAMPLES[name].read_bytes()
    sample = json.loads(raw)
    nan = _map(sample, lambda v: math.nan if isinstance(v, (int, float)) else v)
    inf = _map(sample, lambda v: math.inf if isinstance(v, (int, float)) else v)
    escaped = _map(sample, lambda v: ESCAPE + "y" * 100_000 if isinstance(v, str) else v)
    key = next(iter(sample))
    first = {key: 0, **{k: v for k, v in sample.items() if k != key}}
    huge = json.dumps(first).encode().replace(b'": 0', b'": ' + b"9" * 5000, 1)
    return [
        ("a list at the top", b"[1, 2]"),
        ("a number at the top", b"5"),
        ("a text at the top", b'"preflight"'),
        ("null", b"null"),
        ("empty", b""),
        ("cut", raw[: len(raw) // 2]),
        ("nested 100k deep", b"[" * 100_000 + b"]" * 100_000),
        ("objects nested 100k deep", b'{"checks": ' * 100_000 + b"1" + b"}" * 100_000),
        ("a 5,000-digit integer", huge),
        ("checks of a 5,000-digit integer", b'{"checks": [' + b"9" * 5000 + b'], "ok": false}'),
        ("NaN", json.dumps(nan).encode()),
        ("Infinity", json.dumps(inf).encode()),
        ("invalid UTF-8", raw.replace(b'"', b'"\xff\xfe\xc0', 3)),
        ("a lone surrogate", raw.replace(b'"', b'"\\udc80', 3)),
        ("10 MB", b" " * (10 * 1024 * 1024) + raw),
        ("escapes and long texts", json.dumps(escaped).encode()),
        ("many lines that start with {", b'{"checks": [\n' * 150_000),
        ("noise around a report", b"NCCL INFO init\n" + raw + b"\n{\nnot json\n"),
    ]


def hostile(name: str) -> list[tuple[str, bytes]]:
    """(what, bytes) of every hostile document for the file `name`."""
    sample = json.loads(SAMPLES[name].read_bytes())
    docs = _fixed(name)
    for path in key_paths(sample):
        for value in [*WRONG, GONE]:
            what = f"{'.'.join(map(str, path))} = {'(removed)' if value is GONE else repr(value)}"
            docs.append((what, json.dumps(with_value(sample, path, value)).encode()))
    return docs


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run directory, measured and attestable (support/attest.py): its files are the
    runner's own."""
    root = tmp_path_factory.mktemp("hostile-node-json")
    return real_run(root / "runs", root / "node")


def _every_reader(run_dir: Path, name: str, db: History) -> None:
    """Each reader of the node's reports, on `run_dir` as it is now; raises what they raise."""
    rd = RunDir(run_dir)
    stage = STAGE[name]
    timeline = Timeline(stages=[Stage(stage, start=1.0, end=2.0, status="failed")])
    node_k = rd.logs / "node-1"
    for logs, on in ((None, None), (node_k, "node 1 (10.0.0.2)")):
        said, error = failure(rd, timeline, 1, logs=logs, node=on)
        assert said == stage and isinstance(error, ReproduceError)
        assert error.exit_code in (1, 3)
        message = str(error)
        assert len(message) < BOUND, len(message)
        assert "\x1b" not in message and "\x07" not in message
    predicate = build_predicate(run_dir, now=0.0)
    json.dumps(predicate, allow_nan=False).encode("utf-8")  # what attest signs and writes
    row = row_from_run_dir(run_dir)
    db.insert(row)
    assert row.image is None or isinstance(row.image, str)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_no_reader_fails_on_a_hostile_report(made: Path, tmp_path: Path, name: str):
    run_dir = tmp_path / "run"
    shutil.copytree(made, run_dir)
    (run_dir / "logs" / "node-1").mkdir()
    db = History(tmp_path / "history.sqlite")
    fixed = {what for what, _ in _fixed(name)}
    for what, data in hostile(name):
        for where in (run_dir / name, run_dir / "logs" / "node-1" / name):
            where.write_bytes(data)
        try:
            _every_reader(run_dir, name, db)
            if what in fixed:  # the page: its sections guard themselves; the whole page, here
                assert write_run_page(run_dir).is_file()
        except ReproduceError:
            pass  # documented: a message and an exit code
        except Exception as err:  # noqa: BLE001 - the failure names the document
            raise AssertionError(f"{name} holding {what}: {type(err).__name__}: {err}") from err


def _run(tmp_path: Path, body: str):
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body, slug="test/hostile-json")
    scripts = tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    return rd, lambda: Runner(scripts_dir=scripts, poll_s=0.05).execute(plan, rd, LocalCluster())


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("what", ["a list at the top", "objects nested 100k deep"])
def test_a_run_whose_node_writes_a_hostile_report_still_gets_its_exit_code(tmp_path, name, what):
    doc = tmp_path / "doc.json"
    doc.write_bytes(dict(_fixed(name))[what])
    stage = STAGE[name]
    body = (
        f'_mark {stage} start\ncp {doc} "$NODE_RUN_DIR/{name}"\n_mark {stage} end failed\nexit 1\n'
    )
    rd, run = _run(tmp_path, body)
    with pytest.raises(ReproduceError) as info:
        run()
    assert info.value.exit_code in (1, 3) and f"stage {stage}" in str(info.value)
    assert rd.status()["state"] == "failed"  # never left "collecting"
    assert (rd.path / name).read_bytes() == doc.read_bytes()  # collected as it was


def test_a_run_with_every_report_hostile_is_judged(tmp_path):
    standin = TESTS / "standin_miles" / "train.py"
    lines = []
    for i, name in enumerate(sorted(SAMPLES)):
        doc = tmp_path / f"doc{i}.json"
        doc.write_bytes(dict(_fixed(name))["a 5,000-digit integer"])
        lines.append(f'cp {doc} "$NODE_RUN_DIR/{name}"')
    body = (
        "\n".join(lines)
        + f"\n_mark train start\npython3 {standin} --num-rollout 20 --global-batch-size 128\n"
        + "_mark train end ok\n"
    )
    rd, run = _run(tmp_path, body)
    outcome = run()
    assert outcome.state == "done" and outcome.exit_code == 0
    assert rd.status()["state"] == "done"
    assert json.loads((rd.path / "verdict.json").read_text())["status"]
    assert write_run_page(rd.path).is_file()  # the page the run path writes next
