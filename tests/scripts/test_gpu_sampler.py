"""scripts/gpu_sampler.py for real: a real process, real pipes and signals, its file read back by
the launcher's own parser. nvidia-smi is the stand-in (tests/standin_gpu/nvidia-smi: no GPU
here), first on PATH; the last test runs the real nvidia-smi where there is one (marked `gpu`,
skipped without it, as tests/scripts/test_preflight_gpu.py).

No timed assertions: each test waits for what it needs to see in the file, with a generous bound
that only keeps a broken sampler from hanging the suite.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO, STANDIN_GPU

from launcher.judge.parse.gpu import parse_samples

SAMPLER = REPO / "scripts" / "gpu_sampler.py"
STANDIN = STANDIN_GPU


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}", **extra}


def _start(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SAMPLER), "--out", str(out), "--interval-ms", "100", *args],
        env=env or _env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _until(predicate, bound_s: float = 60.0) -> None:
    end = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < end, "the sampler never got there"
        time.sleep(0.05)


def _samples(out: Path) -> int:
    return parse_samples(out.read_text()).samples if out.exists() else 0


def test_it_samples_every_gpu_on_the_hosts_clock_in_the_form_the_launcher_reads(tmp_path):
    out = tmp_path / "gpu-samples.csv"
    before = time.time()
    proc = _start(out, env=_env(STANDIN_GPU_UTIL="97,0,55"))
    _until(lambda: _samples(out) >= 8 * 3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    after = time.time()
    text = out.read_text()
    samples = parse_samples(text)
    assert samples.refused == 0 and sorted(samples.by_gpu) == list(range(8))
    assert {u for _, u in samples.by_gpu[0]} == {97} and {u for _, u in samples.by_gpu[1]} == {0}
    assert {u for _, u in samples.by_gpu[2]} == {55} and {u for _, u in samples.by_gpu[7]} == {55}
    times = [t for t, _ in samples.by_gpu[0]]
    assert times == sorted(times) and before - 1 <= times[0] and times[-1] <= after + 1
    assert text.startswith("# gpu_sampler start t=") and text.endswith("# stopped\n")


def test_it_stops_when_the_process_it_watches_is_gone_and_ends_nvidia_smi(tmp_path):
    out = tmp_path / "gpu-samples.csv"
    tag = f"REPRODUCE_TEST_SAMPLER={os.getpid()}-{tmp_path.name}"
    watched = subprocess.Popen(["sleep", "600"])
    proc = _start(out, "--while-pid", str(watched.pid), env=_env(**dict([tag.split("=")])))
    _until(lambda: _samples(out) >= 8)
    watched.kill()
    watched.wait()
    assert proc.wait(60) == 0
    assert out.read_text().endswith("# stopped\n")
    _until(lambda: not _marked(tag))  # nvidia-smi (its child, carrying the tag) ended with it


def _marked(tag: str) -> list[int]:
    """The live processes whose environment holds `tag`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("how", ["absent", "failing"])
def test_without_a_working_nvidia_smi_the_file_says_so_and_it_ends_0(tmp_path, how):
    out = tmp_path / "gpu-samples.csv"
    if how == "absent":
        env = {**os.environ, "PATH": str(tmp_path / "nothing-here")}
    else:
        env = _env(STANDIN_GPU_FAIL="1")
    proc = subprocess.run(
        [sys.executable, str(SAMPLER), "--out", str(out)], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    samples = parse_samples(out.read_text())
    assert samples.samples == 0 and samples.why_none
    assert ("cannot be run" if how == "absent" else "before its first sample") in samples.why_none


def test_the_file_stays_under_its_bound(tmp_path):
    out = tmp_path / "gpu-samples.csv"
    proc = _start(out, "--max-bytes", "2048")
    assert proc.wait(120) == 0
    text = out.read_text()
    assert len(text.encode()) <= 2048 and text.endswith("# truncated at the file's limit\n")
    assert parse_samples(text).samples > 0


def test_it_never_writes_through_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("")
    (tmp_path / "gpu-samples.csv").symlink_to(target)
    proc = _start(tmp_path / "gpu-samples.csv")
    assert proc.wait(60) == 2 and target.read_text() == ""


def _has_nvidia_smi() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=60)
    return probe.returncode == 0 and b"GPU " in probe.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not _has_nvidia_smi(), reason="needs NVIDIA GPUs (nvidia-smi)")
def test_the_real_nvidia_smi_is_sampled_in_the_form_the_launcher_reads(tmp_path):
    out = tmp_path / "gpu-samples.csv"
    env = {**os.environ}  # the real nvidia-smi: no stand-in on PATH
    gpus = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True).stdout.splitlines())
    proc = _start(out, env=env)
    _until(lambda: _samples(out) >= 3 * gpus)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    samples = parse_samples(out.read_text())
    assert samples.refused == 0 and sorted(samples.by_gpu) == list(range(gpus))
    assert all(0 <= u <= 100 for series in samples.by_gpu.values() for _, u in series)


@pytest.mark.parametrize("how", ["TERM", "gone", "KILL"])
def test_its_last_line_says_whether_it_ended_in_order(tmp_path, how):
    # The end line is the sampler's record of its own exit (docs/measurement.md, "The host's
    # evidence fails closed"): stopped by node.sh (TERM) or because node.sh is gone, it writes
    # one; killed (or its writes failing: a full disk), it cannot, and the file reads cut off.
    out = tmp_path / "gpu-samples.csv"
    watched = subprocess.Popen(["sleep", "600"])
    proc = _start(out, "--while-pid", str(watched.pid))
    _until(lambda: _samples(out) >= 8 * 2)
    if how == "TERM":
        proc.send_signal(signal.SIGTERM)
    elif how == "gone":
        watched.kill()
        watched.wait()  # reaped: a zombie still answers kill(pid, 0)
    else:
        proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    watched.kill()
    watched.wait()
    assert parse_samples(out.read_text()).ended == (how != "KILL"), out.read_text()[-200:]
