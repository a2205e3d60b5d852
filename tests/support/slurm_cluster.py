"""A real 2-node Slurm cluster on loopback for the tests (Debian 12's slurmctld, slurmd, munge).

The same cluster as ../shared/tools/slurm_loopback_cluster.sh: slurmctld on 127.0.0.1, slurmd "n1"
on 127.0.0.2 and "n2" on 127.0.0.3 with 8 gres GPUs each (regular files stand in for the device
nodes), munge with its own key and socket, no accounting (sacct answers nothing, as on many real
clusters). Its ports are chosen free, and SlurmdTimeout is short, so a node whose slurmd dies is
DOWN within seconds (a real cluster waits minutes). Started once per session (conftest.py's
`slurm` fixture); every command the launcher runs finds it through SLURM_CONF.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.ports import free_port

NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}
SLURMD_TIMEOUT_S = 6
NODE_MARK = "REPRODUCE_TEST_SLURM_NODE"
# A partition of one node with 4 GPUs and no slurmd (it never runs anything): what sinfo says of
# it is enough for the refusal of a recipe that needs 8 GPUs per node.
SMALL_PARTITION, SMALL_NODE = "small", "n3"


def have_slurm() -> bool:
    return all(
        shutil.which(p) or Path(f"/usr/sbin/{p}").exists()
        for p in ("slurmctld", "slurmd", "munged", "sbatch")
    )


@dataclass
class SlurmLoop:
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    munge_dir: Path = Path("/nonexistent")
    # SPANK plugins (pyxis: tests/manual/pyxis_loopback.py), and the environment slurmd and its
    # steps get besides SLURM_CONF (the PATH where they find enroot)
    plugstack: Path | None = None
    node_env: dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def start(self) -> SlurmLoop:
        d = self.root
        for sub in ("state", "spooln1", "spooln2", "log", "dev"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        # munged runs as user munge, who cannot pass through pytest's private temporary root
        self.munge_dir = Path(tempfile.mkdtemp(prefix="reproduce-test-munge-"))
        for i in range(8):
            (d / "dev" / f"gpu{i}").touch()
        munge = self.munge_dir
        (munge / "munge.key").write_bytes(os.urandom(1024))
        shutil.chown(munge, "munge", "munge")
        shutil.chown(munge / "munge.key", "munge", "munge")
        munge.chmod(0o700)
        (munge / "munge.key").chmod(0o400)
        subprocess.run(
            [
                "runuser", "-u", "munge", "--", "/usr/sbin/munged",
                f"--key-file={munge}/munge.key", f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/seed", "--force",
            ],
            check=True,
        )  # fmt: skip
        ctld, n1, n2 = free_port(), free_port(), free_port()
        ports = {"n1": n1, "n2": n2}
        node_lines = "\n".join(
            f"NodeName={n} NodeAddr={a} NodeHostname={n} Port={ports[n]} CPUs=2 RealMemory=2000 "
            "Gres=gpu:8 State=UNKNOWN"
            for n, a in NODES.items()
        )
        self.conf.write_text(
            f"""ClusterName=loop
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={n1}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool%n
SlurmctldPidFile={d}/ctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/ctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AuthType=auth/munge
AuthInfo=socket={munge}/munge.socket
MpiDefault=none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
KillWait=5
MinJobAge=300
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{f"PlugStackConfig={self.plugstack}" if self.plugstack else ""}
{node_lines}
PartitionName=gpu Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
NodeName={SMALL_NODE} NodeAddr=127.0.0.4 NodeHostname={SMALL_NODE} Port={free_port()} CPUs=2 \
RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName={SMALL_PARTITION} Nodes={SMALL_NODE} MaxTime=INFINITE State=UP
"""
        )
        (d / "gres.conf").write_text(
            f"NodeName=n[1-2] Name=gpu File={d}/dev/gpu[0-7]\n"
            f"NodeName={SMALL_NODE} Name=gpu File={d}/dev/gpu[0-3]\n"
        )
        self.env = {"SLURM_CONF": str(self.conf)}
        env = {**os.environ, **self.env}
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(self.conf)], env=env, check=True)
        self.wait(lambda: (d / "ctld.pid").is_file(), "slurmctld")
        for name in NODES:
            self.start_node(name)
        self.wait(self.all_idle, "both nodes idle")
        return self

    def start_node(self, name: str) -> None:
        # the mark every process of this node's slurmd carries (its slurmstepd's too)
        env = {**os.environ, **self.env, **self.node_env, NODE_MARK: self.mark(name)}
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf), "-N", name], env=env, check=True)
        self.wait(lambda: (self.root / f"slurmd-{name}.pid").is_file(), f"slurmd {name}")

    def mark(self, name: str) -> str:
        return f"{self.root}/{name}"

    def run(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
            check=check, timeout=60,
        )  # fmt: skip

    def all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def squeue(self) -> str:
        return self.run("squeue", "-h", "-o", "%i %j %T %N").stdout.strip()

    def restart_controller(self, down_s: float = 3.0) -> None:
        """slurmctld stops (its state saved), stays away `down_s`, and starts again: every Slurm
        command fails meanwhile, while the jobs' steps on the nodes go on."""
        pid = int((self.root / "ctld.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        self.wait(lambda: not Path(f"/proc/{pid}").exists(), "slurmctld to stop")
        time.sleep(down_s)
        env = {**os.environ, **self.env}
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(self.conf)], env=env, check=True)
        self.wait(lambda: self.run("squeue", "-h").returncode == 0, "slurmctld to answer again")

    def node_processes(self, name: str) -> list[int]:
        """Every process of node `name`: its slurmd and slurmstepd (they carry NODE_MARK) and the
        job tasks they started there (SLURMD_NODENAME of this cluster's SLURM_CONF)."""
        mark = f"{NODE_MARK}={self.mark(name)}".encode()
        task = (f"SLURMD_NODENAME={name}".encode(), f"SLURM_CONF={self.conf}".encode())
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in environ or all(t in environ for t in task):
                found.append(int(proc.name))
        return found

    def freeze_node(self, name: str) -> list[int]:
        """The machine stops answering, as a dead one does: every process of the node stopped
        (SIGSTOP; no connection is closed, nothing says goodbye). Returns them."""
        frozen = self.node_processes(name)
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        return frozen

    def revive(self, name: str) -> None:
        """After freeze_node: its processes killed, its slurmd started again, the node resumed."""
        for pid in self.node_processes(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        (self.root / f"slurmd-{name}.pid").unlink(missing_ok=True)
        self.start_node(name)
        self.run("scontrol", "update", f"nodename={name}", "state=resume")
        self.wait(self.all_idle, "both nodes idle again", timeout_s=60)

    def stop(self) -> None:
        for name in NODES:  # a frozen node's processes first
            for pid in self.node_processes(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for path in [self.root / f for f in ("slurmd-n1.pid", "slurmd-n2.pid", "ctld.pid")] + [
            self.munge_dir / "munged.pid"
        ]:
            try:
                pid = int(path.read_text())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + 10  # munged writes its seed file as it exits
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(self.munge_dir, ignore_errors=True)

    @staticmethod
    def wait(check, what: str, timeout_s: float = 30) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the loopback Slurm cluster: {what} not within {timeout_s} s")
