"""Every file the launcher writes is written atomically through one helper (launcher/records/atomic.py).

Issue 19: the pages were written through one fixed temporary name (`.history.html.tmp`), so two
writers at once failed (one renamed the other's file away) and a symlink planted under that name
was written through. The class check: no module writes a file any other way (an AST scan, with
the few appends and exclusive creations named and justified), and the writers themselves are
raced and handed planted symlinks.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
from support.pages import SLUG, make_run
from support.paths import REPO

from launcher.pages import write_history_page, write_run_page
from launcher.records.atomic import write_atomic
from launcher.records.history import History

# (module, call) -> why it may write without launcher/records/atomic.py
ALLOWED = {
    ("launcher/runner/stream.py", "open"): "node.log is appended to by byte offset",
    ("launcher/runner/stream.py", "open#2"): "a stage's log is appended to, as node.log is",
    ("launcher/runner/stream.py", "open#3"): "the follow lock file holds no content",
    ("launcher/results/measured_runs.py", "open"): "a measured run's log, cut from node.log as "
    "the stage logs are, into a measured/ made afresh each time (a partial one is remade)",
    ("launcher/clusters/aws/session.py", "self.path.open"): "aws-calls.jsonl is append-only",
    ("launcher/clusters/ssh.py", "open"): "known_hosts is appended to, as ssh itself does",
    ("launcher/clusters/ssh.py", "sftp.open"): "the node's side, into a fresh 0700 run dir",
    ("launcher/clusters/aws/provision.py", "os.open"): "the private key: O_EXCL, mode 0600",
    ("launcher/clusters/ray/jobs.py", "write_text"): "a fresh temporary directory of its own",
    ("launcher/results/attest.py", "tarfile.open"): "a bundle: a temporary file, then renamed",
    ("launcher/results/attest.py", "open"): "a bundle unpacked into a fresh directory, O_EXCL",
    ("launcher/results/attest_keys.py", "os.open"): "the private key: O_EXCL|O_NOFOLLOW, 0600",
    ("launcher/results/attest_keys.py", "write_text"): "beside a key just made with O_EXCL",
}


def _writes(path: Path) -> list[str]:
    """Calls in PATH that create or change a file without launcher/records/atomic.py."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        name = func.rsplit(".", 1)[-1]
        if name in ("write_text", "write_bytes"):
            receiver = func.rsplit(".", 1)[0] if "." in func else ""
            if receiver in ("rd", "self.rd", "self", "run", "rundir"):  # RunDir: atomic itself
                continue
            found.append("write_text" if name == "write_text" else "write_bytes")
        elif name == "open" and func != "os.fdopen":
            args = [ast.unparse(a) for a in node.args[1:]] + [
                ast.unparse(k.value) for k in node.keywords if k.arg == "mode"
            ]
            flags = " ".join(args)
            if func == "os.open" and "O_CREAT" not in flags:
                continue
            if func != "os.open" and not any(c in flags for c in ("'w", "'a", '"w', '"a', "'x")):
                continue
            found.append(func if func != "open" else "open")
    seen: dict[str, int] = {}
    out = []
    for call in found:
        seen[call] = seen.get(call, 0) + 1
        out.append(call if seen[call] == 1 else f"{call}#{seen[call]}")
    return out


def test_no_module_writes_a_file_around_the_atomic_helper():
    offenders = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "launcher/records/atomic.py":
            continue
        offenders += [f"{rel}: {c}" for c in _writes(path) if (rel, c) not in ALLOWED]
    assert offenders == []


def test_concurrent_page_writers_never_fail_and_leave_a_whole_page(tmp_path):
    rd = make_run(tmp_path, "20261021T094500Z-aaaaaa")
    with History(tmp_path / "history.sqlite") as hist:
        hist.record(rd)
        rows = hist.runs(SLUG)
    target = tmp_path / "pages" / "history.html"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer() -> None:
        try:
            start.wait()
            for _ in range(15):
                write_history_page(target, SLUG, rows)
                write_run_page(rd)
        except BaseException as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_text().rstrip().endswith("</html>")
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("planted", [".history.html.tmp", ".report.html.tmp"])
def test_a_symlink_planted_under_a_temporary_name_is_never_written_through(tmp_path, planted):
    rd = make_run(tmp_path, "20261021T094500Z-bbbbbb")
    canary = tmp_path / "canary"
    canary.write_text("untouched")
    with History(tmp_path / "history.sqlite") as hist:
        hist.record(rd)
        rows = hist.runs(SLUG)
    (rd.parent / planted).symlink_to(canary)
    (rd / planted).symlink_to(canary)
    write_history_page(rd.parent / "history.html", SLUG, rows)
    write_run_page(rd)
    assert canary.read_text() == "untouched"
    assert (rd / "report.html").read_text().rstrip().endswith("</html>")


def test_write_atomic_sets_an_exact_mode_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "node.sh"
    write_atomic(target, "echo hi\n", chmod=0o755)
    assert target.stat().st_mode & 0o777 == 0o755
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "x", b"data")
    assert [p.name for p in tmp_path.iterdir()] == ["node.sh"]
