"""The runner against a hostile or broken world, on this host with real processes: a node that
plants files for collection, a pid that names someone else's process group, another process that
follows the run, a terminal that closes (SIGHUP, then EIO on every print), a launcher disk that
fills up (a real tmpfs), a staging or launch that fails with the secrets already on the node, a
run id used twice, directories someone else could write to."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
import tracemalloc
from pathlib import Path

import pytest
from support.helpers import REPO, cli, group_alive, wait_for
from support.nodescript import job, plan_running

from launcher import clusters
from launcher.clusters.base import CommandResult, Node
from launcher.clusters.local import LocalCluster, LocalTransport
from launcher.errors import BadInput, InfraError
from launcher.plan import protocol
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner


def _run(tmp_path: Path, body: str, **kw):
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    outcome = Runner(poll_s=0.05, measure=False, **kw).execute(plan, rd, LocalCluster())
    return rd, plan, outcome


def _driver_spec(rd: RunDir, plan, **extra) -> dict:
    return {
        "cluster": {"kind": "local"},
        "node_script": plan.node_script,
        "run_id": rd.run_id,
        "node_run_dir": plan.node_run_dir,
        "container": plan.container,
        "run_dir": str(rd.path),
        **extra,
    }


def _cancel_here(plan) -> None:
    LocalTransport().run(protocol.cancel_command(plan.node_run_dir, plan.container), check=False)


# --- collection ---------------------------------------------------------------------------------


def test_collection_takes_the_result_files_only_and_never_through_a_symlink(tmp_path: Path):
    private = tmp_path / "credentials"
    private.write_text("aws_secret_access_key = SECRET-CANARY\n")
    private.chmod(0o600)
    body = f"""_mark train start; _mark train end ok
ln -s {private} stack.json                      # a result name, planted as a symlink
ln -s {private} extra.json                      # any *.json
echo '{{"kind": "forged"}}' > run.json           # the launcher's own record
echo '{{"instances": ["i-0forged"]}}' > aws.json  # the AWS state teardown trusts
echo '{{"state": "done"}}' > status.json
head -c 5000000 /dev/zero | tr '\\0' ' ' > preflight-gpu.json   # larger than a result may be
echo '{{"image": "ok"}}' > image.json
"""
    rd, _, outcome = _run(tmp_path, body)
    assert outcome.state == "done"
    assert rd.record()["collected"] == ["image.json"]
    assert (rd.path / "image.json").read_text() == '{"image": "ok"}\n'
    assert (rd.path / "image.json").stat().st_mode & 0o777 == 0o666 & ~_umask()
    for name in ("stack.json", "extra.json", "aws.json", "preflight-gpu.json", "node"):
        assert not (rd.path / name).exists(), name
    assert rd.record()["slug"] == "test/local" and rd.status()["state"] == "done"
    for path in rd.path.rglob("*"):
        if path.is_file():
            assert b"SECRET-CANARY" not in path.read_bytes(), path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_never_signals_a_process_group_that_is_not_the_runs(tmp_path: Path, runs_root):
    body = "_mark train start\nsleep 300\n"
    rd, plan = job(runs_root, tmp_path / "node", body)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # its own group
    proc = None
    try:
        from support.helpers import start_driver

        proc = start_driver(_driver_spec(rd, plan), tmp_path)
        wait_for(lambda: rd.status().get("state") == "running", what="the run to start")
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies; the run goes on
        proc.wait()
        wrapper = rd.record()["pid"]
        # the pid file now names someone else's process group (stale, reused or forged)
        Path(plan.node_run_dir, "pid").write_text(f"{bystander.pid}\n")
        result = cli("cancel", str(rd.path))
        assert result.returncode == 0, result.stderr
        assert bystander.poll() is None, "cancel killed a process group that was not the run's"
        # the run's own processes carry its mark and were stopped all the same
        wait_for(lambda: not group_alive(wrapper), 10, "the run's processes to end")
        assert rd.status()["state"] == "cancelled"
    finally:
        bystander.kill()
        bystander.wait()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _cancel_here(plan)


def test_the_container_name_is_data_in_the_cancel_command(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    for container in (f"x$(touch {canary})", f"x`touch {canary}`", f"x'; touch {canary}; '"):
        script = protocol.cancel_command(str(node_dir), container)
        subprocess.run(["bash", "-c", script], capture_output=True, timeout=60)
        assert not canary.exists(), container


# --- attach -------------------------------------------------------------------------------------


def test_a_refused_attach_releases_nothing(tmp_path: Path, runs_root, monkeypatch) -> None:
    rd, plan = job(runs_root, tmp_path / "node", "_mark train start\nsleep 300\n")
    released: list[int] = []

    class Counting(LocalCluster):
        def release(self) -> None:
            released.append(1)

    from support.helpers import start_driver

    proc = start_driver(_driver_spec(rd, plan), tmp_path)
    try:
        wait_for(lambda: rd.status().get("state") == "running", what="the run to start")
        monkeypatch.setattr(clusters, "from_record", lambda record, run_dir=None: Counting())
        # the launcher that started the run still follows it: attach is refused
        with pytest.raises(BadInput, match="being followed by another"):
            Runner(measure=False).attach(str(rd.path))
        assert released == []
        assert rd.timeline().released_at is None and rd.status()["state"] == "running"
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _cancel_here(plan)


def test_a_damaged_run_record_is_a_clear_error(tmp_path: Path, runs_root) -> None:
    rd, _ = job(runs_root, tmp_path / "node", "echo hi\n")
    (rd.path / "run.json").write_text('{"run_id": "x", "cluster": ')
    for command in ("attach", "cancel"):
        result = cli(command, str(rd.path))
        assert result.returncode == 2, result.stderr
        assert "run.json is not valid JSON" in result.stderr and "Traceback" not in result.stderr


# --- the terminal closes -------------------------------------------------------------------------


def test_a_closed_terminal_still_cancels_the_run_and_releases(tmp_path: Path, runs_root) -> None:
    """SIGHUP from a terminal that went away, and from then on EIO on every print."""
    rd, plan = job(runs_root, tmp_path / "node", "_mark train start\nsleep 300\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_driver_spec(rd, plan, on_interrupt="detach")))
    master, slave = os.openpty()

    def own_terminal() -> None:  # the driver's controlling terminal is the pty, as in a shell
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "drive.py"), str(spec)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        # Python's own buffering (as a user's shell has it): text left for the closed terminal
        env={**buffered_env(), "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
        preexec_fn=own_terminal,
    )
    os.close(slave)
    try:
        wait_for(lambda: rd.status().get("state") == "running", what="the run to start")
        pid = rd.record()["pid"]
        time.sleep(0.3)
        os.close(master)  # the terminal window closes
        master = -1
        proc.wait(60)
        assert not group_alive(pid), "the run was left going on the node"
        assert rd.status()["state"] == "cancelled"
        assert rd.timeline().released_at is not None  # the release ran to its end
        assert proc.returncode == 130
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _cancel_here(plan)


# --- the launcher's disk fills up ----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs (root only): a real ENOSPC for the run directory."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


FLOOD = (
    "_mark train start\nfor i in $(seq 40); do head -c 100000 /dev/zero | tr '\\0' x; echo; "
    "sleep 0.05; done\nsleep 30\n"
)


@pytest.mark.parametrize("unattended", [False, True])
def test_a_full_launcher_disk_is_reported_as_such(tmp_path: Path, small_disk, unattended):
    rd, plan = job(small_disk, tmp_path / "node", FLOOD)
    policy = {"unattended": True} if unattended else {}  # the default: interactive
    runner = Runner(poll_s=0.05, measure=False, reconnect_s=30, **policy)
    t0 = time.monotonic()
    try:
        with pytest.raises(InfraError) as err:
            runner.execute(plan, rd, LocalCluster())
        message = str(err.value)
        assert "disk is full" in message and "lost the connection" not in message, message
        assert time.monotonic() - t0 < 20  # not the 30 s reconnect window
        pid = rd.record()["pid"]
        if unattended:  # nobody will free the disk and reattach: the run is stopped
            assert "Unattended run: it was cancelled on the node" in message
            assert not group_alive(pid)
        else:
            assert "reproduce attach" in message and group_alive(pid)
    finally:
        _cancel_here(plan)


# --- secrets ------------------------------------------------------------------------------------


def test_the_secrets_file_is_0600_and_read_before_anything_else(tmp_path: Path) -> None:
    body = (
        '_mark train start; stat -c "mode %a" .secrets.env 2>&1 || true\n'
        "[ -e .secrets.env ] && grep -c HF_TOKEN .secrets.env\n"
    )
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    Runner(poll_s=0.05, measure=False).execute(
        plan, rd, LocalCluster(), secrets={"HF_TOKEN": "hf_x"}
    )
    assert (rd.logs / "train.log").read_text().startswith("mode 600\n")
    assert not Path(plan.node_run_dir, ".secrets.env").exists()  # the wrapper removed it


@pytest.fixture
def small_node_disk(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "node"
    root.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4k,mode=700", "tmpfs", str(root)], check=True
    )
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_no_secrets_stay_on_a_node_whose_staging_failed(tmp_path: Path, small_node_disk) -> None:
    """The node's disk is full: node.sh does not fit (a real ENOSPC)."""
    rd, plan = job(tmp_path / "runs", small_node_disk / "work", "echo hi\n")
    plan = plan_running(rd.run_id, plan.node_run_dir, plan.node_script + "#" * 8192 + "\n")
    with pytest.raises(Exception) as err:
        Runner(measure=False).execute(plan, rd, LocalCluster(), secrets={"HF_TOKEN": "hf_x"})
    assert not list(small_node_disk.rglob(".secrets.env"))
    assert isinstance(err.value, InfraError) and "No space left" in str(err.value)


def test_no_secrets_stay_on_a_node_where_the_launch_failed(tmp_path: Path) -> None:
    rd, plan = job(tmp_path / "runs", tmp_path / "node", "echo hi\n")
    launch = protocol.launch_command(plan.node_run_dir)

    class NoSetsid(LocalTransport):
        def run(self, command: str, **kw) -> CommandResult:
            if command == launch:  # as a node without setsid would answer
                raise InfraError("a command on node local failed with exit 127: setsid: not found")
            return super().run(command, **kw)

    class Cluster(LocalCluster):
        def transport(self, node: Node) -> LocalTransport:
            return NoSetsid(node.name)

    with pytest.raises(InfraError, match="setsid"):
        Runner(measure=False).execute(plan, rd, Cluster(), secrets={"HF_TOKEN": "hf_x"})
    assert Path(plan.node_run_dir, "node.sh").exists()  # it was staged
    assert not Path(plan.node_run_dir, ".secrets.env").exists()


# --- run ids and directories ---------------------------------------------------------------------


def test_a_used_run_id_is_refused_and_nothing_is_created(tmp_path: Path, runs_root) -> None:
    from support.cli import SEED

    for run_id in ("my-run", "20260101T000000Z-abcdef"):
        RunDir.create(runs_root, "earlier/run", run_id)
        before = sorted(p for p in runs_root.rglob("*"))
        result = cli(
            str(SEED), "--run-id", run_id, "--runs-dir", str(runs_root), "--on-interrupt", "cancel"
        )
        assert result.returncode == 2, result.stderr
        assert f"--run-id {run_id} was used before" in result.stderr
        assert sorted(p for p in runs_root.rglob("*")) == before  # nothing created


def test_a_node_run_dir_that_exists_is_never_reused(tmp_path: Path) -> None:
    rd, plan = job(tmp_path / "runs", tmp_path / "node", "echo hi\n")
    earlier = Path(plan.node_run_dir)
    earlier.mkdir(parents=True)
    (earlier / "node.sh").write_text("# the earlier run's\n")
    with pytest.raises(InfraError, match="already exists on the node"):
        Runner(measure=False).execute(plan, rd, LocalCluster())
    assert (earlier / "node.sh").read_text() == "# the earlier run's\n"


def test_a_work_dir_others_can_write_to_is_refused(tmp_path: Path) -> None:
    rd, plan = job(tmp_path / "runs", tmp_path / "shared", "echo hi\n")
    shared = tmp_path / "shared"  # the work dir's runs/ (plan: <node root>/<run id>)
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InfraError, match=f"refusing {shared}.*mode 777"):
        Runner(measure=False).execute(plan, rd, LocalCluster())
    assert list(shared.iterdir()) == []  # nothing was written into it


# --- small things that bite --------------------------------------------------------------------


def test_concurrent_writers_never_collide_and_each_write_reaches_the_disk(tmp_path, monkeypatch):
    import threading

    rd = RunDir.create(tmp_path / "runs", "test/atomic")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(200):
                rd.set_status("running", f"writer {n} write {i}")
        except BaseException as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert rd.status()["state"] == "running"
    assert not [p for p in rd.path.iterdir() if p.name.endswith(".tmp")]
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    rd.write_json("timeline.json", {"stages": []})
    assert synced, "the bytes were not flushed to disk before the rename"


def test_a_long_unterminated_line_is_written_on_as_it_grows_never_held_whole(
    tmp_path: Path,
) -> None:
    """Linear work, checked without a clock: a line too long to be a marker is written on to its
    stage as its bytes arrive, and the splitter never holds more of it than one chunk and a marker's
    worth. Holding (and re-copying) the growing line was the quadratic case: 96 MiB held, ~7 s."""
    from launcher.records.rundir import Timeline
    from launcher.runner.stream import LogSplitter

    splitter = LogSplitter(tmp_path, Timeline())
    splitter.append(b"##reproduce stage=train event=start t=1\n")
    chunk = b"x" * (1 << 20)
    train_log = tmp_path / "train.log"
    tracemalloc.start()
    try:
        for n in range(1, 97):  # a 96 MiB line arriving 1 MiB at a time
            splitter.append(chunk)
            splitter.flush()
            assert train_log.stat().st_size >= (n - 1) * len(chunk), n  # a tail -f sees it grow
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(chunk), f"{peak / 2**20:.0f} MiB held for a 96 MiB line"
    splitter.append(b"\nafter\n##reproduce stage=train event=end status=ok t=2\n")
    splitter.close()
    assert train_log.stat().st_size == 96 * (1 << 20) + len(b"\nafter\n")


@pytest.mark.parametrize("field", ["max_usd", "max_hours", "price_per_hour"])
def test_a_nan_budget_or_price_is_refused(field: str) -> None:
    from launcher.cost.budget import Budget

    values = {"max_usd": 100.0, "max_hours": None, "price_per_hour": 63.296}
    values[field] = float("nan")
    with pytest.raises(BadInput):
        Budget(**values)


def test_sighup_and_sigterm_never_abandon_a_release() -> None:
    """A closed terminal can send SIGHUP more than once; only Ctrl-C presses may abandon."""
    from launcher.runner.signals import release_hard

    ended: list[str] = []

    class Cluster:
        name = "stand-in"

        def release(self) -> None:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGHUP, signal.SIGHUP):
                os.kill(os.getpid(), sig)
                time.sleep(0.01)
            ended.append("released")

    assert release_hard(Cluster()) is None and ended == ["released"]


def test_the_node_cannot_write_into_the_launchers_own_logs(tmp_path: Path) -> None:
    """A stage named "node" would append to logs/node.log, whose size is the streaming offset; the
    tail of a failed stage reaches the terminal without the node's control sequences."""
    body = (
        "_mark node start\nfor i in $(seq 50); do echo junk $i; done\n_mark node end ok\n"
        "_mark image start\nprintf 'pulling \\033]0;pwned\\007 \\033[2J done\\n'\nexit 3\n"
    )
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    with pytest.raises(InfraError) as err:
        Runner(poll_s=0.05, measure=False).execute(plan, rd, LocalCluster())
    assert (rd.logs / "node.log").read_bytes() == Path(plan.node_run_dir, "node.log").read_bytes()
    assert "\x1b" not in str(err.value) and "\x07" not in str(err.value)
    # shown as their escapes (launcher/excerpt.py printable): seen, and what they were
    assert "pulling \\x1b]0;pwned\\x07 \\x1b[2J done" in str(err.value)


def buffered_env() -> dict[str, str]:
    """This environment without PYTHONUNBUFFERED (set on some machines): Python's own buffering,
    as a user's shell has it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_a_reader_gone_does_not_turn_the_exit_code_into_pythons_120(tmp_path: Path) -> None:
    """Text still buffered for a pipe whose reader went away (`reproduce runs | head -1`), or for
    a terminal that closed, fails Python's flush at exit, and Python then exits 120 instead of
    the code the CLI chose; settle_streams (the CLI's last step) keeps the code."""
    child = (
        "import os, sys, time\n"
        "from launcher.runner.signals import settle_streams\n"
        "sys.stdout.write('still buffered\\n' * 10)  # a pipe: held in the buffer until exit\n"
        "open(sys.argv[1] + '.written', 'w').close()\n"
        "while os.path.exists(sys.argv[1]): time.sleep(0.05)  # until the reader is gone\n"
        "if sys.argv[2] == 'settle': settle_streams()\n"
        "sys.exit(130)\n"
    )
    codes = {}
    for mode in ("settle", "plain"):
        flag = tmp_path / f"open-{mode}"
        flag.touch()
        proc = subprocess.Popen(
            [sys.executable, "-c", child, str(flag), mode],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**buffered_env(), "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        wait_for(lambda f=flag: Path(f"{f}.written").exists(), 30, "the child's write")
        assert proc.stdout is not None
        proc.stdout.close()  # the reader goes away
        flag.unlink()
        codes[mode] = proc.wait(30)
    assert codes == {"settle": 130, "plain": 120}
