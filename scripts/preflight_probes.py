#!/usr/bin/env python3
"""The GPU preflight's probes: ask the machine, return what it said (a module of preflight.py).

Its one job is the impure part: run nvidia-smi and the kernel log readers, count the EFA devices
(retrying while they come up), find a free port for the benchmarks' rendezvous. A probe never
raises for a missing tool or an unreadable file: it returns what it could read, and the verdicts
in preflight_checks.py turn that into a failed or warned check. Runs on the node under python 3.8
or later with the standard library alone, never the `launcher` package.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from preflight_checks import is_na, parse_csv_rows

HEALTH_FIELDS = (
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
)


def run_cmd(argv: Sequence[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv)}: timed out after {timeout:g} s"
    except OSError as err:
        return 126, "", f"{argv[0]}: {err}"


def smi_query(fields: Sequence[str]) -> list[dict[str, str]] | None:
    rc, out, _ = run_cmd(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    )
    if rc != 0:
        return None
    try:
        return parse_csv_rows(out, fields)
    except ValueError:
        return None


def smi_serials() -> dict[str, str | None]:
    """Each GPU's board serial by index (an attestation names the GPUs it ran on), asked on its
    own so that a driver without the field changes nothing else; None where it gives none."""
    got = smi_query(("index", "serial")) or []
    return {r["index"]: (None if is_na(r["serial"]) else r["serial"]) for r in got}


def smi_health(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """ECC and remapping fields; queried together, else one by one (older drivers lack some)."""
    got = smi_query(("index",) + HEALTH_FIELDS)
    if got is None:
        by_index: dict[str, dict[str, str]] = {r["index"]: {"index": r["index"]} for r in rows}
        for f in HEALTH_FIELDS:
            part = smi_query(("index", f)) or []
            for r in part:
                by_index.setdefault(r["index"], {"index": r["index"]})[f] = r[f]
        got = list(by_index.values())
    keep = {r["index"] for r in rows}
    return [r for r in got if r["index"] in keep]


def read_kernel_log() -> tuple[str | None, str]:
    """Kernel messages: journalctl -k for the last day when readable, else dmesg (since boot)."""
    rc, out, _ = run_cmd(["journalctl", "-k", "--since", "-24h", "--no-pager", "-q"])
    if rc == 0 and out.strip():
        return out, "journalctl -k, last 24 h"
    rc, out, err = run_cmd(["dmesg"])
    if rc == 0 and out.strip():
        return out, "dmesg, since boot"
    return None, "dmesg/journalctl: " + (
        err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
    )


def count_efa(sysfs: Path = Path("/sys/class/infiniband")) -> int:
    """EFA devices: /sys/class/infiniband entries driven by `efa` (all entries if the driver is
    unknown)."""
    if not sysfs.is_dir():
        return 0
    n = 0
    for dev in sysfs.iterdir():
        driver = dev / "device" / "driver"
        try:
            name = os.path.basename(os.readlink(driver)) if driver.is_symlink() else ""
        except OSError:
            name = ""
        if name in ("", "efa") or dev.name.startswith(("efa", "rdmap")):
            n += 1
    return n


def probe_efa(
    expected: int | None,
    retries: int,
    wait_s: float,
    counter: Callable[[], int] = count_efa,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, int]:
    """Count EFA devices, retrying while fewer than expected (p5en's EFA comes up late)."""
    attempts = 1
    count = counter()
    while expected is not None and count < expected and attempts < max(1, retries):
        sleep(wait_s)
        attempts += 1
        count = counter()
    return count, attempts


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
