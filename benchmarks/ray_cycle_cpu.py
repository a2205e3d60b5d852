"""CPU of one Ray cycle as the suite's end-to-end runs make it, process by process.

Usage: .venv/bin/python benchmarks/ray_cycle_cpu.py [--port 6390]

Why: the test suite is CPU-bound on CI's two cores and most of an end-to-end test's CPU is Ray
starting (docs/testing.md); this says which Ray process costs what, so a change meant to make a
cycle cheaper can be measured. The cycle: `ray start --head` with the seed's flags (as
launcher/plan/node_script.py renders them), one driver that places one actor and calls it, then
`ray stop --force`. The CLI commands and the driver are measured by wait4 (their own CPU and their
waited children's); the daemons `ray start` leaves running (GCS, raylet, agents, monitors) by
their utime+stime in /proc just before `ray stop`. Ray runs on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")
DRIVER = """
import ray
ray.init(address="127.0.0.1:{port}")
@ray.remote
class A:
    def f(self):
        return 1
actor = A.remote()
assert ray.get(actor.f.remote()) == 1
print("placed", flush=True)
import sys
sys.stdin.read()  # the actor stays alive until the daemons are read
"""


def waited(argv: list[str]) -> float:
    """CPU-seconds of a command and the children it waited for."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{argv[:3]} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def driver_and_daemons(port: int) -> tuple[list[tuple[float, str]], float]:
    """Run the driver; read Ray's processes while its actor lives; then the driver's own CPU."""
    argv = [sys.executable, "-c", DRIVER.format(port=port)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdin and proc.stdout
    if proc.stdout.readline().strip() != "placed":
        sys.exit("the driver did not place its actor")
    daemons = [row for row in ray_daemons() if f"-c {argv[2][:20]}" not in row[1]]
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return daemons, usage.ru_utime + usage.ru_stime


def ray_daemons() -> list[tuple[float, str]]:
    """(CPU-seconds, command) of every live process that belongs to Ray."""
    rows = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "ray" not in cmd or "ray_cycle_cpu" in cmd:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        rows.append(((int(fields[11]) + int(fields[12])) / TICK, cmd[:90]))
    return sorted(rows, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=6390)
    ap.add_argument("--extra", default="", help="more `ray start` flags, space-separated")
    args = ap.parse_args()
    port = args.port
    ray = str(BIN / "ray")
    start = [ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)]
    start += ["--num-gpus", "1", "--disable-usage-stats", "--log-color", "false"]
    start += ["--include-dashboard=false", *args.extra.split()]
    rows = [(waited(start), "ray start (the CLI)")]
    try:
        daemons, driver = driver_and_daemons(port)
        rows.append((driver, "the driver"))
    finally:
        rows.append((waited([ray, "stop", "--force"]), "ray stop (the CLI)"))
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores")
    for cpu, what in rows[:2] + daemons + rows[2:]:
        print(f"{cpu:6.2f}  {what}")
    print(f"{sum(c for c, _ in rows + daemons):6.2f}  in all")


if __name__ == "__main__":
    main()
