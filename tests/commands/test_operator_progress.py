"""Progress a person can follow: the node's progress lines (format, parser, the docker pull that
prints them), the runner passing them on with the step's speed, and the console: a live line
with a bar and an ETA on a terminal, throttled plain lines elsewhere.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.docker import docker
from support.nodescript import job
from support.operator_cli import REPO

from launcher.clusters.local import LocalCluster
from launcher.commands.console import ConsoleReporter, Transfer, human_bytes
from launcher.plan.protocol import Progress, parse_progress, progress_in
from launcher.runner.runner import Runner

PULL = REPO / "scripts" / "pull_progress.py"
TTY_PULL = REPO / "tests" / "operator_data" / "docker_pull_tty.bin"  # docker 28 on a pty
LAYERS = {"4ddc566b57ff": 40_021_504, "d22aa1279b1e": 40_021_504}


def _pull_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pull_progress", PULL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the line ------------------------------------------------------------------------------------


def test_the_progress_line_round_trips_and_bad_lines_are_not_progress():
    p = Progress("assets", 5, 9, "files", "model-00001-of-00004.safetensors")
    assert parse_progress(p.line()) == p
    assert parse_progress("##reproduce progress stage=image done=3 unit=bytes").total is None
    for bad in (
        "##reproduce progress done=3 total=9",  # no stage
        "##reproduce progress stage=image done=-1",
        "##reproduce progress stage=image done=10 total=9",  # total below done
        "##reproduce progress stage=image done=x",
        "##reproduce progress stage=image done=1 unit=parsecs",
        "##reproduce stage=image event=start",  # a stage marker is not progress
        "  ##reproduce progress stage=image done=1",  # not at the start of the line
    ):
        assert parse_progress(bad) is None, bad


def test_a_chunk_gives_the_last_line_of_each_stage_and_never_a_cut_one():
    chunk = (
        b"docker says hi\n"
        b"##reproduce progress stage=image done=1 total=9\n"
        b"##reproduce progress stage=assets done=4 unit=files\n"
        b"##reproduce progress stage=image done=7 total=9\n"
        b"##reproduce progress stage=image done=8"  # cut: the rest comes with the next chunk
    )
    found = progress_in(chunk)
    assert [(p.stage, p.done) for p in found] == [("assets", 4), ("image", 7)]
    assert progress_in(b"no progress here\n") == []


# --- the docker pull ----------------------------------------------------------------------------


def test_docker_pull_screen_becomes_bytes_and_plain_status_lines():
    pull = _pull_module()
    state = pull.Pull("image", LAYERS)
    lines = state.feed(TTY_PULL.read_bytes().decode())
    assert "4ddc566b57ff: Pull complete" in lines and "d22aa1279b1e: Pull complete" in lines
    assert sum(line.endswith(": Downloading") for line in lines) == 2  # once per layer, no bars
    assert not any("[=" in line or "\x1b" in line for line in lines)
    final = parse_progress(state.line(final=True))
    assert final.done == final.total == sum(LAYERS.values()) and final.item == "2/2 layers"


def test_a_partial_screen_counts_the_bytes_each_layer_has():
    pull = _pull_module()
    state = pull.Pull("image", {})
    state.feed(
        "\x1b[2K\r4ddc566b57ff: Downloading [=====>    ]  10.53MB/40.01MB\r\n"
        "\x1b[2K\rd22aa1279b1e: Downloading [======>   ]  13.49MB/40.01MB\r\n"
    )
    now = parse_progress(state.line())
    assert now.done == 10_530_000 + 13_490_000 and now.total == 80_020_000  # docker's totals
    state.feed("4ddc566b57ff: Download complete\r\n")
    assert parse_progress(state.line()).done == 40_010_000 + 13_490_000


def test_manifest_sizes_for_one_manifest_and_for_a_list():
    pull = _pull_module()
    layer = {"size": 7, "digest": "sha256:" + "ab" * 32}
    single = {"Descriptor": {}, "SchemaV2Manifest": {"layers": [layer]}}
    assert pull.manifest_sizes(single) == {"ab" * 6: 7}
    listed = [
        {
            "Descriptor": {"platform": {"os": "linux", "architecture": "arm64"}},
            "OCIManifest": {"layers": [{"size": 1, "digest": "sha256:" + "cd" * 32}]},
        },
        {**single, "Descriptor": {"platform": {"os": "linux", "architecture": "amd64"}}},
    ]
    assert pull.manifest_sizes(listed, "amd64") == {"ab" * 6: 7}
    assert pull.manifest_sizes("garbage", "amd64") == {}


def _standin_docker(where: Path, *, pull_exit: int = 0, cut: int = 0) -> dict[str, str]:
    """A `docker` that answers `manifest inspect` with LAYERS and `pull` with the recorded screen."""
    manifest = {
        "Descriptor": {},
        "SchemaV2Manifest": {
            "layers": [{"size": n, "digest": f"sha256:{k}{'0' * 52}"} for k, n in LAYERS.items()]
        },
    }
    where.mkdir(parents=True, exist_ok=True)
    (where / "manifest.json").write_text(json.dumps(manifest))
    fake = where / "docker"
    fake.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import sys, time
            if sys.argv[1:3] == ["manifest", "inspect"]:
                print(open({str(where / "manifest.json")!r}).read()); sys.exit(0)
            assert sys.argv[1] == "pull" and sys.stdout.isatty(), "pull on a terminal"
            data = open({str(TTY_PULL)!r}, "rb").read()
            data = data[:{cut}] if {cut} else data
            for i in range(0, len(data), 200):
                sys.stdout.buffer.write(data[i:i + 200]); sys.stdout.flush(); time.sleep(0.12)
            sys.exit({pull_exit})
            """
        )
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{where}:{os.environ['PATH']}"}


def test_the_pull_program_prints_progress_lines_the_launcher_reads(tmp_path):
    env = _standin_docker(tmp_path / "bin")
    out = subprocess.run(
        [sys.executable, str(PULL), "example/image@sha256:" + "0" * 64],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    found = [p for p in map(parse_progress, out.stdout.splitlines()) if p is not None]
    assert len(found) >= 2  # while it pulls (about once a second) and at the end
    assert all(p.stage == "image" and p.total == sum(LAYERS.values()) for p in found)
    assert [p.done for p in found] == sorted(p.done for p in found)  # never backwards
    assert found[-1].done == found[-1].total
    assert "Status: Downloaded newer image" in out.stdout


def test_a_failed_pull_keeps_dockers_exit_status_and_claims_no_completion(tmp_path):
    env = _standin_docker(tmp_path / "bin", pull_exit=1, cut=900)  # stops while downloading
    out = subprocess.run(
        [sys.executable, str(PULL), "example/image:v1"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 1
    found = [p for p in map(parse_progress, out.stdout.splitlines()) if p is not None]
    assert found and all(p.done < p.total for p in found)  # never a completion it did not see


@pytest.mark.docker
def test_a_real_docker_pull_from_the_registry(registry, tmp_path):
    build = tmp_path / "image"
    build.mkdir()
    for i in (1, 2):
        (build / f"blob{i}").write_bytes(os.urandom(6_000_000))
    (build / "Dockerfile").write_text("FROM scratch\nCOPY blob1 /blob1\nCOPY blob2 /blob2\n")
    ref = f"{registry.address}/operator/pull:{os.getpid()}"
    docker("build", "-q", "-t", ref, str(build))
    docker("push", ref)
    docker("rmi", "-f", ref)
    try:
        out = subprocess.run(
            [sys.executable, str(PULL), ref], capture_output=True, text=True, timeout=300
        )
    finally:
        docker("rmi", "-f", ref, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    found = [p for p in map(parse_progress, out.stdout.splitlines()) if p is not None]
    assert found and found[-1].done == found[-1].total >= 12_000_000
    assert out.stdout.count(": Pull complete") == 2


# --- the console ---------------------------------------------------------------------------------


def _console(terminal: bool):
    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=terminal, width=160, highlight=False)


class _Gate:
    usd_per_hour = 63.296
    tokens_per_step = 1_048_576
    nodes, gpus_per_node, launches = 1, 8, True
    header = ("recipe    x", "worst     $379.78 until the TTL")


def test_plain_lines_are_throttled_and_the_last_one_always_comes():
    console = _console(False)
    reporter = ConsoleReporter(console)
    assert not reporter.live_wanted
    reporter.cost(_Gate())
    reporter.stage("image", "start", "")
    for done in range(0, 101, 10):
        reporter.progress(Progress("image", done * 1_000_000, 100_000_000, item="1/2 layers"))
    reporter.stage("image", "end", "ok")
    text = console.file.getvalue()
    lines = [line for line in text.splitlines() if "image: " in line]
    assert len(lines) == 2  # the first, then nothing for PLAIN_EVERY_S, then the last
    assert "of 100.0 MB (0%)" in lines[0] and "100.0 MB of 100.0 MB (100%)" in lines[1]
    assert "stage image ok after" in text and "so far at $63.30/h" in text
    reporter.stage("train", "start", "")
    reporter.step_time(3, 18.96)
    reporter.step(4, 20)
    assert "train step 4 of 20 (6,913 tokens/s/GPU, 18.96 s/step)" in console.file.getvalue()


def test_the_live_line_has_the_stage_cost_bar_and_eta():
    console = _console(True)
    reporter = ConsoleReporter(console, live=False)  # rendered by hand below, not on a thread
    reporter.cost(_Gate())
    reporter.stage("image", "start", "")
    transfer = reporter.transfers.setdefault("image", Transfer("image"))
    transfer.update(Progress("image", 2_000_000_000, 15_200_000_000), 100.0)
    transfer.update(Progress("image", 3_000_000_000, 15_200_000_000, item="3/12 layers"), 110.0)
    assert transfer.rate == pytest.approx(100_000_000) and transfer.eta_s == pytest.approx(122)
    console.print(reporter)
    shown = console.file.getvalue()
    words = " ".join(shown.split())  # a narrower console wraps the line: its words are the same
    assert "image" in shown and "so far at $63.30/h" in words
    assert "3.0 GB of 15.2 GB (20%), 100.0 MB/s, ETA 2m02s, 3/12 layers" in words
    assert "━" in shown  # the bar
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 kB"


class _Recorder:
    def __init__(self) -> None:
        self.progress_seen: list[Progress] = []
        self.times: list[tuple[int, float]] = []
        self.steps: list[tuple[int, int | None]] = []

    def progress(self, p: Progress) -> None:
        self.progress_seen.append(p)

    def step_time(self, step: int, seconds: float) -> None:
        self.times.append((step, seconds))

    def step(self, done: int, total: int | None) -> None:
        self.steps.append((done, total))


BODY = textwrap.dedent(
    """\
    _mark image start
    for n in 1 2 3; do
      echo "##reproduce progress stage=image done=$((n * 100)) total=300 unit=bytes item='layer $n'"
      sleep 0.3
    done
    _mark image end ok
    _mark train start
    for s in 0 1 2; do
      echo "(actor) - step $s: {'train/loss': 1.0}"
      echo "(actor) - perf $s: {'perf/actor_train_time': 17.5, 'perf/step_time': 18.$s}"
      sleep 0.3
    done
    _mark train end ok
    """
)


def test_the_runner_passes_progress_and_the_steps_speed_on(tmp_path, runs_root):
    rd, plan = job(runs_root, tmp_path / "node", BODY)
    reporter = _Recorder()
    Runner(reporter, poll_s=0.1, measure=False).execute(plan, rd, LocalCluster())
    assert reporter.progress_seen[-1] == Progress("image", 300, 300, "bytes", "layer 3")
    assert reporter.times[-1] == (2, 18.2) and reporter.steps[-1][0] == 3


DRIVER = textwrap.dedent(
    """\
    import sys
    from pathlib import Path
    from support.nodescript import job
    from launcher.clusters.local import LocalCluster
    from launcher.commands.console import ConsoleReporter
    from launcher.runner.runner import Runner

    rd, plan = job(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    reporter = ConsoleReporter()
    try:
        Runner(reporter, poll_s=0.1, measure=False).execute(plan, rd, LocalCluster())
    finally:
        reporter.close()
    """
)


def test_on_a_terminal_the_run_shows_a_live_bar_and_in_a_pipe_plain_lines(tmp_path):
    body = BODY.replace("sleep 0.3", "sleep 0.6")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    args = [str(driver), str(tmp_path / "runs"), str(tmp_path / "node"), body]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import runpy,sys; sys.argv=sys.argv[1:]; "
         "runpy.run_path(sys.argv[0], run_name='__main__')", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=REPO,
    )  # fmt: skip
    _, plain = proc.communicate(timeout=120)
    assert proc.returncode == 0, plain
    assert "image: 100 B of 300 B (33%)" in plain and "image: 300 B of 300 B (100%)" in plain
    assert "\x1b[" not in plain  # no redrawn line in a log
    started = time.monotonic()
    code, screen = _terminal_python(args, env)
    assert code == 0, screen
    assert "ETA" in screen and "━" in screen and "layer 2" in screen  # the live line's frames
    assert "stage train ok" in screen and time.monotonic() - started < 120


def _terminal_python(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The driver on a pseudo-terminal (run_in_terminal runs `-m launcher`: this runs a file)."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import runpy,sys; sys.argv=sys.argv[1:]; "
         "runpy.run_path(sys.argv[0], run_name='__main__')", *args],
        stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm", "COLUMNS": "160"},
        cwd=REPO, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), out.decode(errors="replace")
