"""A real Ray cluster on this machine for the `kind: ray` tests, on loopback only.

Layout (every process started here, and ended here by its own pid):

    holder      `unshare --net --mount`: a network namespace with only `lo` up, so nothing of
                the cluster binds or reaches an address outside 127.0.0.0/8 and its ports never
                meet another test's; and a mount namespace where /root is an overlay with
                tests/standin_miles at /root/miles: the cluster "is the image" the recipe runs
                (`cd /root/miles && python3 train.py`), and the host's /root is untouched.
    nodes       one `ray start --block` per Ray node, each inside the holder's namespaces and in
                its own PID namespace (`unshare --pid --kill-child`): killing that one process
                ends the whole node (raylet, agents, workers) at once, like a machine lost.
                Head 127.0.0.1 (GCS 6379, job server 127.0.0.1:8265), workers 127.0.0.2, .3, ...
                Each node declares GPUs as a resource (`--num-gpus 8` on a CPU machine) and gets
                REPRODUCE_IMAGE_DIGEST in its environment: the digest it says it runs.
    launcher    the CLI runs inside the holder's network namespace (`nsenter --net`) and talks
                to the job server at http://127.0.0.1:8265; the host's own files stay visible.

The job server is the dashboard (ray[default]); on loopback it needs only
`--dashboard-host 127.0.0.1` (the default) and a fixed port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from support.paths import REPO

VENV_BIN = Path(sys.executable).parent
STANDIN = REPO / "tests" / "standin_miles"
SEED_DIGEST = "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"
ADDRESS = "http://127.0.0.1:8265"


def available() -> str | None:
    """Why this machine cannot host the loopback cluster, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network, mount and PID namespaces)"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    try:
        import aiohttp  # noqa: F401 - the job server is the dashboard: ray[default]
        import ray.dashboard  # noqa: F401
    except ImportError as err:
        return f"needs ray[default] ({err})"
    return None


class LoopbackRay:
    """The cluster; `start()` brings up the head, `add_node()` workers, `stop()` ends it all."""

    def __init__(self) -> None:
        self.holder: subprocess.Popen | None = None
        self.nodes: dict[str, subprocess.Popen] = {}
        # short: Ray's unix socket paths live under each node's temp dir (at most 107 bytes)
        self.root = Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))
        self.api_error: list[str] = []  # the last failed job-server request, for a failure

    # --- namespaces ------------------------------------------------------------------------------

    def _start_holder(self) -> None:
        ovl = self.root / "ovl"
        ovl.mkdir()
        setup = (
            "set -e; ip link set lo up; "
            f"mount -t tmpfs tmpfs {ovl}; mkdir {ovl}/up {ovl}/wk; "
            f"mount -t overlay overlay -o lowerdir=/root,upperdir={ovl}/up,workdir={ovl}/wk /root; "
            f"mkdir /root/miles; mount --bind {STANDIN} /root/miles; "
            f"touch {self.root}/ready; exec sleep infinity"
        )
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--", "bash", "-c", setup],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not (self.root / "ready").exists():
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the loopback namespace holder did not start")
            time.sleep(0.05)

    def ns(self, *, mount: bool = False) -> list[str]:
        """The command prefix that enters the cluster's network (and mount) namespace. Entering
        a mount namespace moves the root to the namespace's own; `-r` and `-w` keep the holder's
        root and working directory, which differ inside a chroot (tests/fresh-debian/run.sh runs
        the suite in one; Ray's dashboard asks for its working directory)."""
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-n", *(["-m", "-r", "-w"] if mount else [])]

    # --- nodes -----------------------------------------------------------------------------------

    def add_node(
        self, ip: str, *, gpus: int = 8, digest: str | None = SEED_DIGEST, head: bool = False
    ) -> None:
        env = {
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            "HOME": "/root",
        }
        if digest is not None:
            env["REPRODUCE_IMAGE_DIGEST"] = digest
        if head:  # a lost node is declared dead in about 10 s (Ray's default: about 15 s)
            env.update(RAY_health_check_period_ms="2000")
        role = (
            ["--head", "--port", "6379", "--include-dashboard=true"]
            + ["--dashboard-host", "127.0.0.1", "--dashboard-port", "8265"]
            if head
            else ["--address", "127.0.0.1:6379"]
        )
        argv = [
            *self.ns(mount=True),
            *["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"],
            *["env", "-i", *(f"{k}={v}" for k, v in env.items())],
            str(VENV_BIN / "ray"),
            *["start", "--block", "--node-ip-address", ip, "--temp-dir", str(self.root / ip)],
            *["--num-gpus", str(gpus), "--num-cpus", "1", "--object-store-memory", "80000000"],
            "--disable-usage-stats",
            *role,
        ]
        log = open(self.root / f"{ip}.log", "ab")  # kept open by the node, closed by the OS
        self.nodes[ip] = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def start(
        self, workers: int = 0, *, digest: str | None = SEED_DIGEST, timeout_s: float = 120
    ) -> LoopbackRay:
        """The head and `workers` workers, each saying it runs `digest`; all alive on return.

        Nodes join one after another. Ray gives a node 30 s to register with its GCS (not
        configurable); on a loaded 2-core machine one can miss that and exit, so a node that
        exits before it is alive is started again (three tries)."""
        self._start_holder()
        self._bring_up("127.0.0.1", digest, timeout_s, head=True)
        for k in range(workers):
            self._bring_up(f"127.0.0.{k + 2}", digest, timeout_s)
        return self

    def _bring_up(self, ip: str, digest: str | None, timeout_s: float, head: bool = False) -> None:
        for _ in range(3):
            self.add_node(ip, head=head, digest=digest)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.nodes[ip].poll() is None:
                if ip in self.alive_nodes():
                    return
                time.sleep(0.5)
            self.kill_node(ip)
        raise AssertionError(
            f"Ray node {ip} did not come up in three tries; the job server said "
            f"{self.api_error or 'nothing wrong'}; {self.logs()}"
        )

    def logs(self) -> dict[str, str]:
        """The nodes' own output and the dashboard's log (the job server that answers `api`)."""
        found = list(self.root.glob("*.log")) + list(self.root.glob("*/session_*/logs/dashboard.*"))
        return {str(p.relative_to(self.root)): p.read_text(errors="replace")[-2000:] for p in found}

    def kill_node(self, ip: str) -> None:
        """The node is lost at once: its PID namespace ends with its first process."""
        proc = self.nodes.pop(ip)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)

    def stop(self) -> None:
        for ip in list(self.nodes):
            self.kill_node(ip)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait(timeout=30)
            self.holder = None
        shutil.rmtree(self.root, ignore_errors=True)

    # --- asking the cluster ----------------------------------------------------------------------

    def api(self, path: str) -> Any:
        """GET on the job server from inside the namespace (this process is outside it)."""
        # no proxy: a machine whose environment names one (a CI runner's http_proxy) would send
        # this loopback request to it, and the namespace reaches nothing else
        code = (
            "import sys, urllib.request\n"
            "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
            f"sys.stdout.write(opener.open({ADDRESS + path!r}, timeout=10).read().decode())\n"
        )
        proc = subprocess.run(
            [*self.ns(), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        if proc.returncode != 0:
            self.api_error = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            return None
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return proc.stdout

    def alive_nodes(self) -> list[str]:
        answer = self.api("/api/v0/nodes?limit=100&detail=1") or {}
        rows = answer.get("data", {}).get("result", {}).get("result", [])
        return sorted(r["node_ip"] for r in rows if r.get("state") == "ALIVE")

    def wait_alive(self, count: int, timeout_s: float = 90) -> None:
        self.wait(lambda: len(self.alive_nodes()) == count, timeout_s, f"{count} alive Ray nodes")

    def jobs(self) -> list[dict[str, Any]]:
        return self.api("/api/jobs/") or []

    def job(self, submission_id: str) -> dict[str, Any] | None:
        return next((j for j in self.jobs() if j.get("submission_id") == submission_id), None)

    def wait(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {what}: {self.logs()}"
                )
            time.sleep(0.3)

    # --- the launcher inside the namespace -------------------------------------------------------

    def cli_argv(self, *args: str) -> list[str]:
        return [*self.ns(), sys.executable, "-m", "launcher", *args]

    def cli(
        self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """`reproduce ARGS` as a user on a machine that reaches the job server runs it."""
        return subprocess.run(
            self.cli_argv(*args),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            timeout=timeout,
            cwd=REPO,
        )

    def start_cli(self, *args: str) -> subprocess.Popen:
        """The CLI in the background, in its own process group, SIGINT as a terminal gives it."""
        return subprocess.Popen(
            self.cli_argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def ray_profile(tmp_path: Path, **overrides: Any) -> Path:
    """A `kind: ray` profile for the loopback cluster: the assets already in place (as the
    execution tests' profiles have them), no GPU preflight, no stack probe."""
    from support.plan_env import write_profile

    base = yaml.safe_load(write_profile(tmp_path, {"kind": "local"}, []).read_text())
    data = {
        "kind": "ray",
        "description": "the tests' loopback Ray cluster",
        "address": ADDRESS,
        "runtime": "host",
        "work_dir": base["work_dir"],
        "cache_dir": base["cache_dir"],
        "price_per_hour": base["price_per_hour"],
        "preflight": {"enabled": False},
        "stack_check": "skip",
        "assets": base["assets"],
        "env": base.get("env", {}),
        "nodes_wait_s": 3,
    }
    data.update(overrides)
    path = tmp_path / "ray-profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
