"""How fast the runner copies a node log into the run dir (byte offsets, stage split), locally and
over SSH to a real sshd on 127.0.0.1. A training log grows by a few KB/s; this shows the margin.

    .venv/bin/python benchmarks/stream_log.py [MiB]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.sshd import SshServer  # noqa: E402

from launcher.clusters.local import LocalTransport  # noqa: E402
from launcher.clusters.ssh import SSHCluster  # noqa: E402
from launcher.records.rundir import Timeline  # noqa: E402
from launcher.runner.stream import LogSplitter  # noqa: E402

READ = 1 << 20


def make_log(path: Path, mib: int) -> None:
    line = b"(MegatronTrainRayActor pid=5123) [2026-10-21 10:00:00.123 actor_cell0_rank0] log_utils.py:542 - step 7: {'train/loss': 0.91}\n"
    with open(path, "wb") as fh:
        fh.write(b"##reproduce stage=train event=start t=1.0\n")
        for _ in range(mib * (1 << 20) // len(line)):
            fh.write(line)
        fh.write(b"##reproduce stage=train event=end status=ok t=2.0\n")


def stream(transport, remote: str, logs: Path) -> tuple[float, int]:
    logs.mkdir(parents=True)
    splitter = LogSplitter(logs, Timeline())
    t0 = time.perf_counter()
    while True:
        data = transport.read_from(remote, splitter.offset(), READ)
        if not data:
            break
        splitter.append(data)
    splitter.flush_partial()
    splitter.close()
    return time.perf_counter() - t0, splitter.offset()


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "node.log"
        make_log(log, mib)
        size = log.stat().st_size
        secs, n = stream(LocalTransport(), str(log), root / "local")
        assert n == size
        print(f"local: {size / 2**20:.1f} MiB in {secs:.2f} s = {size / 2**20 / secs:.0f} MiB/s")
        server = SshServer(root / "sshd").start()
        try:
            cluster = SSHCluster.from_profile(server.profile())
            transport = cluster.transport(cluster.acquire()[0])
            secs, n = stream(transport, str(log), root / "ssh")
            assert n == size
            print(
                f"ssh (127.0.0.1, paramiko sftp, 1 MiB reads): {size / 2**20:.1f} MiB in {secs:.2f} s = "
                f"{size / 2**20 / secs:.1f} MiB/s"
            )
            t0 = time.perf_counter()
            for _ in range(20):
                transport.run("true")
            print(
                f"ssh command round trip (poll cost): {(time.perf_counter() - t0) / 20 * 1000:.1f} ms"
            )
            cluster.release()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
