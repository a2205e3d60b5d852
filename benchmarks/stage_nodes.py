"""Wall time to stage a run on N nodes over SSH (node.sh, the wrapper, the node programs of
scripts/): one node after another, and all at once (launcher/runner/nodes.py `on_each`, what the
runner does). Each "node" is a real sshd on 127.0.0.1 (tests/support/sshd.py) with its own run dir.

Usage: .venv/bin/python benchmarks/stage_nodes.py [--nodes 4] [--repeat 3]
Run as root or a user sshd accepts (the test fixture's rules); loopback only.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.sshd import SshServer  # noqa: E402

from launcher.clusters import staging  # noqa: E402
from launcher.clusters.base import Node  # noqa: E402
from launcher.clusters.ssh import SSHSettings, SSHTransport  # noqa: E402
from launcher.runner.nodes import on_each  # noqa: E402


def transports(servers: list[SshServer]) -> list[SSHTransport]:
    out = []
    for k, s in enumerate(servers):
        node = Node(f"node{k}", "127.0.0.1", port=s.port, user=s.user,
                    identity_file=str(s.identity_file))  # fmt: skip
        settings = SSHSettings(host="127.0.0.1", port=s.port, user=s.user,
                               identity_file=str(s.identity_file), known_hosts=str(s.known_hosts))  # fmt: skip
        out.append(SSHTransport(node, settings))
    return out


def stage_all(ts: list[SSHTransport], root: Path, tag: str, parallel: bool) -> float:
    script = (REPO / "tests" / "golden" / "seed-node-ssh.sh").read_text()
    dirs = {id(t): str(root / "work" / f"{tag}-{k}") for k, t in enumerate(ts)}

    def one(t: SSHTransport) -> None:
        staging.stage(t, dirs[id(t)], script, REPO / "scripts", None)

    started = time.perf_counter()
    if parallel:
        on_each(ts, one)  # type: ignore[arg-type]
    else:
        for t in ts:
            one(t)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # a work dir must be writable by its owner only (staging checks)
        servers = [SshServer(root / f"sshd-{k}").start() for k in range(args.nodes)]
        try:
            ts = transports(servers)
            for t in ts:  # connected once, as the runner is before staging
                t.run("true")
            files = sum(1 for p in (REPO / "scripts").rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts) + 2  # fmt: skip
            results: dict[str, list[float]] = {"one after another": [], "all at once": []}
            for i in range(args.repeat):
                results["one after another"].append(stage_all(ts, root, f"seq{i}", False))
                results["all at once"].append(stage_all(ts, root, f"par{i}", True))
            print(f"{args.nodes} nodes, {files} files each; {platform.machine()}, "
                  f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
                  f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
            for name, runs in results.items():
                print(f"{name:>18}: median {statistics.median(runs):.2f} s "
                      f"(runs: {', '.join(f'{r:.2f}' for r in runs)})")  # fmt: skip
        finally:
            for s in servers:
                s.stop()


if __name__ == "__main__":
    main()
