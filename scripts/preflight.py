#!/usr/bin/env python3
"""GPU preflight: is this node fit to run the recipe? Checked before the first training minute.

Runs ON the node (inside the training container, or on the host): standard library plus PyTorch,
never the `launcher` package. Every check reports a measured value, the expected value and
pass/fail; `--json` prints one JSON object, otherwise a terminal table. Exit 0 only when every
check passed, 1 when one failed, 2 on bad arguments. Without nvidia-smi or PyTorch it fails with a
clear check, never a traceback.

Checks: GPU count, model and memory against the recipe's `gpu`; driver and CUDA versions against
the stack; ECC errors and Xid events; NVLink between every GPU pair; EFA devices against the
instance type (retried: p5en's EFA comes up late); free disk; and, one process per GPU, the bf16
matrix-product rate, the device memory copy bandwidth, and the NCCL all-reduce bus bandwidth across
the node's GPUs (and across nodes, given torch.distributed rendezvous settings).

Thresholds come from preflight_thresholds.json beside this file (the one table the launcher reads
too), overridable with `--threshold NAME=VALUE`.
"""

from __future__ import annotations

import os

# NVLink multicast can put a host's GPUs out of service: force it off before torch or NCCL is
# imported or initialised, whatever the caller's environment says (setdefault could leave it on).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def force_multicast_off(environ: os._Environ[str] | dict[str, str]) -> None:
    """Set the NVLink-multicast switches to their off values in `environ`, overriding any value."""
    for key, value in MULTICAST_OFF.items():
        environ[key] = value


force_multicast_off(os.environ)

import argparse  # noqa: E402  (after the environment is fixed, on purpose)
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

THRESHOLDS_FILE = Path(__file__).with_name("preflight_thresholds.json")
SCHEMA_VERSION = 1
GIB = 1 << 30
MIB = 1 << 20

# Sizes: chosen so that the whole preflight takes well under 60 s on 8 GPUs.
MATMUL_N = 8192
MATMUL_WARMUP, MATMUL_ITERS = 5, 20
COPY_BYTES = 4 * GIB
COPY_WARMUP, COPY_ITERS = 3, 20
ALLREDUCE_SIZES = (64 * MIB, 256 * MIB, 1 * GIB, 4 * GIB)
ALLREDUCE_WARMUP, ALLREDUCE_ITERS = 3, 10

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "pci.bus_id")
HEALTH_FIELDS = (
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
NA_VALUES = {
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "[insufficient permissions]",
}


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class Check:
    """One line of the report. `ok` False fails the node; a `warning` alone does not."""

    name: str
    value: Any
    expected: str
    ok: bool
    unit: str | None = None
    warning: str | None = None
    detail: Any = None


def report_dict(checks: Sequence[Check], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON object `--json` prints (and the launcher keeps as preflight.json)."""
    return {
        "schema": SCHEMA_VERSION,
        "ok": all(c.ok for c in checks),
        **meta,
        "checks": [asdict(c) for c in checks],
    }


def format_value(value: Any, unit: str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    else:
        text = str(value)
    return f"{text} {unit}" if unit else text


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table for a terminal on the node (no rich there)."""
    rows = [("check", "value", "expected", "result")]
    for c in report["checks"]:
        result = "pass" if c["ok"] else "FAIL"
        if c["ok"] and c.get("warning"):
            result = "pass (warning)"
        rows.append((c["name"], format_value(c["value"], c.get("unit")), c["expected"], result))
    widths = [min(max(len(r[i]) for r in rows), 60) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for c in report["checks"]:
        if c.get("warning"):
            lines.append(f"{'FAIL' if not c['ok'] else 'warning'}: {c['name']}: {c['warning']}")
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    took = report.get("duration_s")
    lines.append(
        f"preflight {'PASSED' if not failed else 'FAILED: ' + ', '.join(failed)}"
        + (f" ({took:.1f} s)" if isinstance(took, (int, float)) else "")
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Thresholds


def load_thresholds(path: Path = THRESHOLDS_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def threshold_names(table: dict[str, Any]) -> set[str]:
    return set(table["names"])


@dataclass(frozen=True)
class Threshold:
    min: float | None
    source: str
    provisional: bool = False


def resolve_threshold(
    table: dict[str, Any],
    name: str,
    gpu_type: str,
    overrides: dict[str, float],
    gpu_count: int | None = None,
) -> Threshold:
    """The pass threshold for `name` on `gpu_type` (and, for the all-reduce, this many GPUs).

    An override wins; then the GPU type's entry; then the defaults; else no threshold (min None).
    """
    if name in overrides:
        return Threshold(float(overrides[name]), "override (--threshold)")
    per_type = _lookup_type(table.get("gpu_types", {}), gpu_type)
    entry = per_type.get(name) if per_type else None
    if entry is None:
        entry = table.get("defaults", {}).get(name)
    if entry is not None and "min" not in entry:  # keyed by GPU count
        entry = entry.get(str(gpu_count)) if gpu_count is not None else None
    if entry is None:
        return Threshold(
            None, f"no threshold for {gpu_type}" + (f" on {gpu_count} GPUs" if gpu_count else "")
        )
    return Threshold(
        float(entry["min"]), entry.get("source", ""), bool(entry.get("provisional", False))
    )


def _lookup_type(types: dict[str, Any], gpu_type: str) -> dict[str, Any] | None:
    for key, value in types.items():
        if key.lower() == gpu_type.lower():
            return value
    return None


def parse_threshold_overrides(items: Sequence[str], known: set[str]) -> dict[str, float]:
    """`NAME=VALUE` strings to a mapping; unknown names and non-numbers are errors (ValueError)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(
                f"--threshold {item!r}: expected NAME=VALUE with NAME one of "
                f"{', '.join(sorted(known))}"
            )
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--threshold {item!r}: {value!r} is not a number") from None
    return out


# --------------------------------------------------------------------------------------------
# nvidia-smi and system parsing (pure functions: tested on CPU with captured outputs)


def parse_csv_rows(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` as dicts."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields):  # a GPU name with a comma: join the overflow into `name`
            extra = len(cells) - len(fields)
            i = list(fields).index("name") if "name" in fields else 0
            cells[i : i + extra + 1] = [", ".join(cells[i : i + extra + 1])]
        if len(cells) != len(fields):
            raise ValueError(
                f"nvidia-smi row has {len(cells)} fields, expected {len(fields)}: {line!r}"
            )
        rows.append(dict(zip(fields, cells)))
    return rows


def is_na(value: str | None) -> bool:
    return value is None or value.strip().lower() in NA_VALUES


def parse_cuda_version(smi_text: str) -> str | None:
    """The CUDA version the driver supports, from the header of plain `nvidia-smi`."""
    m = re.search(r"CUDA Version:\s*([0-9]+(?:\.[0-9]+)*)", smi_text)
    return m.group(1) if m else None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def version_at_least(have: str, want: str) -> bool:
    h, w = version_tuple(have), version_tuple(want)
    n = max(len(h), len(w))
    return h + (0,) * (n - len(h)) >= w + (0,) * (n - len(w))


ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """GPU-to-GPU cells of `nvidia-smi topo -m`: {(i, j): 'NV18' | 'SYS' | ...} for i != j."""
    text = ANSI_RE.sub("", text)  # nvidia-smi underlines the header on a terminal and in captures
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"^\s*GPU0\b", ln)), None)
    if header is None:
        return {}
    columns = header.split()
    gpu_cols = [i for i, c in enumerate(columns) if re.fullmatch(r"GPU\d+", c)]
    cells: dict[tuple[int, int], str] = {}
    for ln in lines[lines.index(header) + 1 :]:
        parts = ln.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        row = int(parts[0][3:])
        values = parts[1:]
        for col_pos in gpu_cols:
            if col_pos < len(values):
                col = int(columns[col_pos][3:])
                if col != row:
                    cells[(row, col)] = values[col_pos]
    return cells


XID_RE = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d+)")


def parse_xids(text: str) -> list[dict[str, Any]]:
    """Xid events in kernel log text (dmesg or journalctl -k): code, device and the line."""
    out = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if m:
            out.append(
                {
                    "code": int(m.group("code")),
                    "device": m.group("where"),
                    "line": line.strip()[:300],
                }
            )
    return out


def visible_filter(rows: list[dict[str, str]], cuda_visible: str | None) -> list[dict[str, str]]:
    """Only the GPUs CUDA_VISIBLE_DEVICES names (indices or UUID prefixes), as torch will see
    them."""
    if cuda_visible is None or not cuda_visible.strip():
        return rows
    wanted = [w.strip() for w in cuda_visible.split(",") if w.strip()]
    out = []
    for w in wanted:
        for row in rows:
            if (w.isdigit() and row.get("index") == w) or (
                not w.isdigit() and row.get("uuid", "").startswith(w)
            ):
                out.append(row)
                break
        else:
            break  # CUDA stops at the first invalid entry
    return out


# --------------------------------------------------------------------------------------------
# Verdicts (pure): facts in, Check out


def check_gpu_count(rows: list[dict[str, str]], expected: int | None) -> Check:
    n = len(rows)
    if expected is None:
        return Check("gpu_count", n, ">= 1", n >= 1)
    return Check("gpu_count", n, f"== {expected}", n == expected)


def check_gpu_model(rows: list[dict[str, str]], gpu_type: str | None) -> Check:
    names = sorted({r["name"] for r in rows})
    value = ", ".join(names) or None
    if not gpu_type:
        return Check("gpu_model", value, "any", bool(rows))
    pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(gpu_type)}(?![A-Za-z0-9])", re.I)
    bad = [r["index"] for r in rows if not pat.search(r["name"])]
    return Check(
        "gpu_model",
        value,
        f"{gpu_type} on every GPU",
        bool(rows) and not bad,
        detail={"not_matching": bad} if bad else None,
    )


def check_gpu_memory(rows: list[dict[str, str]], memory_gb: float | None, fraction: float) -> Check:
    gib = [int(r["memory.total"]) / 1024 for r in rows if not is_na(r.get("memory.total"))]
    low = round(min(gib), 1) if gib else None
    if memory_gb is None:
        return Check("gpu_memory", low, "any", bool(gib), unit="GiB")
    want = memory_gb * fraction
    return Check(
        "gpu_memory",
        low,
        f">= {want:.1f} GiB ({fraction:.0%} of {memory_gb:g} GB)",
        bool(gib) and len(gib) == len(rows) and min(gib) >= want,
        unit="GiB",
        detail={"per_gpu_gib": [round(g, 1) for g in gib]},
    )


def check_driver(rows: list[dict[str, str]], driver_min: str | None) -> Check:
    versions = sorted({r["driver_version"] for r in rows})
    value = ", ".join(versions) or None
    if not driver_min:
        return Check("driver_version", value, "any", bool(versions))
    ok = bool(versions) and all(version_at_least(v, driver_min) for v in versions)
    return Check("driver_version", value, f">= {driver_min}", ok)


def check_cuda(driver_cuda: str | None, cuda: str | None, torch_cuda: str | None = None) -> Check:
    detail = {"torch_cuda": torch_cuda} if torch_cuda else None
    if not cuda:
        return Check("cuda_version", driver_cuda, "any", driver_cuda is not None, detail=detail)
    if driver_cuda is None:
        return Check(
            "cuda_version",
            None,
            f">= {cuda}",
            False,
            warning="nvidia-smi printed no 'CUDA Version'",
            detail=detail,
        )
    ok = version_at_least(driver_cuda, cuda)
    return Check(
        "cuda_version",
        driver_cuda,
        f">= {cuda} (driver supports the stack's CUDA)",
        ok,
        detail=detail,
    )


def check_ecc(rows: list[dict[str, str]]) -> Check:
    """Uncorrected volatile ECC errors, pending page retirement or row remapping, remap failures."""
    problems, unreadable = [], []
    for r in rows:
        i = r.get("index", "?")
        unc = r.get("ecc.errors.uncorrected.volatile.total")
        if is_na(unc):
            unreadable.append(f"GPU{i} uncorrected")
        elif int(unc) > 0:
            problems.append(f"GPU{i}: {unc} uncorrected ECC errors")
        for key, label in (
            ("retired_pages.pending", "page retirement pending"),
            ("remapped_rows.pending", "row remapping pending"),
            ("remapped_rows.failure", "row remapping failed"),
        ):
            v = r.get(key)
            if not is_na(v) and v.strip().lower() in ("yes", "1", "true"):
                problems.append(f"GPU{i}: {label}")
    value = "; ".join(problems) if problems else ("none" if rows else None)
    warning = f"not readable: {', '.join(unreadable)}" if unreadable else None
    return Check(
        "ecc",
        value,
        "no uncorrected errors, no pending retirement/remap",
        bool(rows) and not problems,
        warning=warning,
    )


def check_xid(xids: list[dict[str, Any]] | None, source: str, critical: set[int]) -> Check:
    if xids is None:
        return Check(
            "xid",
            "not readable",
            "no critical Xid events",
            True,
            warning=f"kernel log not readable ({source}): Xid events not checked",
        )
    crit = [x for x in xids if x["code"] in critical]
    other = [x for x in xids if x["code"] not in critical]
    codes = sorted({x["code"] for x in xids})
    value = f"{len(xids)} event(s), codes {codes}" if xids else "none"
    warning = None
    if other:
        warning = f"non-critical Xid codes {sorted({x['code'] for x in other})} in {source}"
    return Check(
        "xid",
        value,
        f"no critical Xid events ({source})",
        not crit,
        warning=warning,
        detail={"critical": crit[:20]} if crit else None,
    )


def check_nvlink(
    cells: dict[tuple[int, int], str], gpu_indices: list[int], links_min: float | None
) -> Check:
    if len(gpu_indices) < 2:
        return Check("nvlink", "single GPU", "NV<k> between every GPU pair", True)
    want = f"NV{int(links_min)}+" if links_min else "NV<k>"
    bad, seen = [], []
    for a in gpu_indices:
        for b in gpu_indices:
            if a >= b:
                continue
            cell = cells.get((a, b)) or cells.get((b, a))
            m = re.fullmatch(r"NV(\d+)", cell or "")
            if not m or (links_min and int(m.group(1)) < links_min):
                bad.append(f"GPU{a}-GPU{b}: {cell or 'missing'}")
            else:
                seen.append(cell)
    pairs = len(gpu_indices) * (len(gpu_indices) - 1) // 2
    value = f"{pairs} pair(s) " + (
        "/".join(sorted(set(seen))) if not bad else f"{len(bad)} bad: " + "; ".join(bad[:6])
    )
    return Check("nvlink", value, f"{want} between every GPU pair", not bad)


def check_efa(count: int | None, expected: int | None, attempts: int) -> Check:
    if expected is None:
        return Check("efa", count, "none expected (instance type not known)", True)
    return Check(
        "efa",
        count,
        f">= {expected}",
        count is not None and count >= expected,
        detail={"attempts": attempts},
    )


def check_disk(path: str, min_gb: float) -> Check:
    p = Path(path)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    note = None if probe == p else f"{path} does not exist yet: measured at {probe}"
    return Check(
        "disk",
        round(free_gb, 1),
        f">= {min_gb:g} GB free at {path}",
        free_gb >= min_gb,
        unit="GB",
        warning=note,
    )


def check_min(
    name: str,
    value: float | None,
    unit: str,
    thr: Threshold,
    detail: Any = None,
    error: str | None = None,
) -> Check:
    """A measured figure against a minimum. No threshold: passes with a warning, figure kept."""
    if value is None:
        return Check(
            name,
            None,
            _expected_min(thr, unit),
            False,
            unit=unit,
            warning=error or "not measured",
            detail=detail,
        )
    if thr.min is None:
        return Check(
            name,
            round(value, 3),
            "no threshold",
            True,
            unit=unit,
            warning=thr.source,
            detail=detail,
        )
    warning = f"threshold provisional: {thr.source}" if thr.provisional else None
    return Check(
        name,
        round(value, 3),
        _expected_min(thr, unit),
        value >= thr.min,
        unit=unit,
        warning=warning,
        detail=detail,
    )


def _expected_min(thr: Threshold, unit: str) -> str:
    return f">= {thr.min:g} {unit}" if thr.min is not None else "no threshold"


def busbw_factor(world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor: busbw = algbw * 2(n-1)/n."""
    return 2 * (world - 1) / world


# --------------------------------------------------------------------------------------------
# Probes of the machine (impure)


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


# --------------------------------------------------------------------------------------------
# GPU benchmarks: one process per GPU (torch only imported here)


def _time_cuda(torch: Any, fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Mean seconds per call of `fn`, by CUDA events around `iters` calls after `warmup`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def bench_worker(local_rank: int, cfg: dict[str, Any], queue: Any) -> None:
    """One GPU: matmul and copy on its own, then the all-reduce with the others. Puts one dict."""
    force_multicast_off(os.environ)
    out: dict[str, Any] = {"local_rank": local_rank}
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        out["device_name"] = torch.cuda.get_device_name(dev)
        n = cfg["matmul_n"]
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        # F821: ruff checks the lambda at the end of the scope, after `del`; it runs before.
        t = _time_cuda(
            torch,
            lambda: torch.matmul(a, b, out=c),  # noqa: F821 - called before `del a, b, c`
            MATMUL_WARMUP,
            MATMUL_ITERS,
        )
        out["matmul_bf16_tflops"] = 2 * n**3 / t / 1e12
        del a, b, c
        nbytes = cfg["copy_bytes"]
        src = torch.empty(nbytes, device=dev, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        t = _time_cuda(
            torch,
            lambda: dst.copy_(src),  # noqa: F821 - called before `del src, dst`
            COPY_WARMUP,
            COPY_ITERS,
        )
        out["copy_tbps"] = 2 * nbytes / t / 1e12
        del src, dst
        torch.cuda.empty_cache()

        nlocal, nnodes = cfg["nlocal"], cfg["nnodes"]
        world = nlocal * nnodes
        rank = cfg["node_rank"] * nlocal + local_rank
        if world > 1:
            dist.init_process_group(
                "nccl",
                init_method=f"tcp://{cfg['master_addr']}:{cfg['master_port']}",
                rank=rank,
                world_size=world,
                device_id=dev,
            )
            groups = {}
            if nnodes > 1:
                groups["multinode"] = None  # the default group: every GPU of every node
                if nlocal > 1:
                    groups["node"], _ = dist.new_subgroups(group_size=nlocal)
            else:
                groups["node"] = None
            for key, group in groups.items():
                out[f"allreduce_{key}"] = _allreduce(
                    torch, dist, dev, group, cfg["allreduce_sizes"]
                )
            dist.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - reported as a failed check, not a traceback
        out["error"] = f"{type(err).__name__}: {err}".strip()[:500]
    queue.put(out)


def _allreduce(torch: Any, dist: Any, dev: Any, group: Any, sizes: Sequence[int]) -> dict[str, Any]:
    """Sum-all-reduce of float32 at each size; the slowest rank's time gives algbw and busbw."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    probe = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(probe, group=group)
    correct = bool(torch.all(probe == world * (world + 1) / 2).item())
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device=dev, dtype=torch.float32)
        dist.barrier(group=group, device_ids=[dev.index])
        # B023/F821: the lambda only runs inside _time_cuda, in this iteration, before `del x`.
        t = _time_cuda(
            torch,
            lambda: dist.all_reduce(x, group=group),  # noqa: B023, F821
            ALLREDUCE_WARMUP,
            ALLREDUCE_ITERS,
        )
        tt = torch.tensor([t], device=dev, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
        t = float(tt.item())
        algbw = nbytes / t / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_ms": round(t * 1e3, 3),
                "algbw_gbps": round(algbw, 1),
                "busbw_gbps": round(algbw * busbw_factor(world), 1),
            }
        )
        del x
        torch.cuda.empty_cache()
    return {"world": world, "correct": correct, "sizes": rows}


def run_benchmarks(args: argparse.Namespace, nlocal: int, timeout_s: float) -> list[dict[str, Any]]:
    """Spawn one worker per local GPU and collect their dicts (errors included, never raised)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    cfg = {
        "matmul_n": args.matmul_n,
        "copy_bytes": int(args.copy_gib * GIB),
        "allreduce_sizes": [int(m * MIB) for m in args.allreduce_mib],
        "nlocal": nlocal,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "master_addr": args.master_addr or "127.0.0.1",
        "master_port": args.master_port or free_port(),
    }
    procs = [
        ctx.Process(target=bench_worker, args=(i, cfg, queue), daemon=True) for i in range(nlocal)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < nlocal:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = queue.get(timeout=min(left, 1.0))
            # queue.Empty, or a pipe broken by a dying worker: see whether a worker died
            except Exception:  # noqa: BLE001 - a timeout must never crash the preflight
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and len(results) + len(dead) >= nlocal:
                    break
                continue
            results.append(item)
            if "error" in item:
                break  # the others may wait forever in NCCL for the failed one
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == nlocal else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    got = {r["local_rank"] for r in results}
    failed_first = any("error" in r for r in results)
    for i in range(nlocal):
        if i not in got:
            why = (
                "stopped after another GPU's worker failed"
                if failed_first
                else (f"gave no result within {timeout_s:g} s (exit code {procs[i].exitcode})")
            )
            results.append({"local_rank": i, "error": f"worker for GPU {i} {why}"})
    return sorted(results, key=lambda r: r["local_rank"])


def bench_checks(
    results: list[dict[str, Any]],
    table: dict[str, Any],
    gpu_type: str,
    overrides: dict[str, float],
    nnodes: int,
) -> list[Check]:
    """Matmul, copy and all-reduce checks from the workers' results (pure)."""
    errors = [f"GPU{r['local_rank']}: {r['error']}" for r in results if "error" in r]
    err_text = "; ".join(errors) or None
    checks = []
    for name, key, unit in (
        ("matmul_bf16", "matmul_bf16_tflops", "TFLOP/s"),
        ("copy_bandwidth", "copy_tbps", "TB/s"),
    ):
        per = [r.get(key) for r in results]
        measured = [v for v in per if v is not None]
        value = min(measured) if measured and len(measured) == len(per) else None
        checks.append(
            check_min(
                name,
                value,
                unit,
                resolve_threshold(table, key, gpu_type, overrides),
                detail={"per_gpu": [None if v is None else round(v, 3) for v in per]},
                error=err_text,
            )
        )
    nlocal = len(results)
    wanted = []
    if nlocal > 1:
        wanted.append(("allreduce_busbw", "allreduce_node", "allreduce_busbw_gbps", nlocal))
    if nnodes > 1:
        wanted.append(
            (
                "allreduce_multinode_busbw",
                "allreduce_multinode",
                "allreduce_multinode_busbw_gbps",
                None,
            )
        )
    for name, key, thr_name, count in wanted:
        ar = next((r[key] for r in results if key in r), None)
        thr = resolve_threshold(table, thr_name, gpu_type, overrides, count)
        if ar is None:
            checks.append(check_min(name, None, "GB/s", thr, error=err_text))
            continue
        largest = max(ar["sizes"], key=lambda s: s["bytes"])
        check = check_min(name, largest["busbw_gbps"], "GB/s", thr, detail=ar)
        check.expected += f" at {largest['bytes'] / GIB:g} GiB, {ar['world']} GPUs"
        if not ar["correct"]:
            check.ok = False
            check.warning = "all-reduce gave a wrong sum"
        checks.append(check)
    return checks


# --------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--gpu-type", default=None, help="the recipe's gpu.type, e.g. H200")
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs this node must have (the recipe's gpu.per_node)",
    )
    p.add_argument("--gpu-memory-gb", type=float, default=None, help="the recipe's gpu.memory_gb")
    p.add_argument(
        "--driver-min", default=None, help="lowest NVIDIA driver version the stack runs on"
    )
    p.add_argument(
        "--cuda", default=None, help="the stack's CUDA version; the driver must support it"
    )
    p.add_argument(
        "--efa-expected",
        type=int,
        default=None,
        help="EFA devices the instance type has (none: not checked)",
    )
    p.add_argument("--efa-retries", type=int, default=3, help="EFA counts to try before failing")
    p.add_argument("--efa-retry-wait", type=float, default=5.0, help="seconds between EFA counts")
    p.add_argument("--disk-path", default="/", help="where the image and assets go")
    p.add_argument("--disk-min-gb", type=float, default=0.0, help="free GB needed at --disk-path")
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a threshold of preflight_thresholds.json (repeatable)",
    )
    p.add_argument(
        "--nnodes", type=int, default=1, help="nodes in the run (all-reduce across them when > 1)"
    )
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument(
        "--master-addr", default=None, help="rendezvous address (node 0); needed when --nnodes > 1"
    )
    p.add_argument(
        "--master-port", type=int, default=None, help="rendezvous port; needed when --nnodes > 1"
    )
    p.add_argument(
        "--no-bench", action="store_true", help="skip the GPU benchmarks (matmul, copy, all-reduce)"
    )
    p.add_argument(
        "--bench-timeout", type=float, default=300.0, help="seconds the GPU benchmarks may take"
    )
    # sizes (defaults keep 8 GPUs under 60 s); smaller ones are for tests only
    p.add_argument("--matmul-n", type=int, default=MATMUL_N, help=argparse.SUPPRESS)
    p.add_argument("--copy-gib", type=float, default=COPY_BYTES / GIB, help=argparse.SUPPRESS)
    p.add_argument(
        "--allreduce-mib",
        type=float,
        nargs="+",
        default=[s / MIB for s in ALLREDUCE_SIZES],
        help=argparse.SUPPRESS,
    )
    return p


def torch_probe() -> tuple[Check, dict[str, Any], int]:
    """Import PyTorch (in this process: no CUDA context) and count the GPUs it sees."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - ImportError, or a broken install: a failed check
        return (
            Check(
                "torch",
                None,
                "PyTorch importable, CUDA available",
                False,
                warning=f"PyTorch is not importable here ({type(err).__name__}: {err}); "
                "run the preflight inside the training container",
            ),
            {},
            0,
        )
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a CPU-only build has no NCCL
        info["nccl"] = None
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:  # noqa: BLE001 - a broken CUDA setup is a failed check
        return Check("torch", torch.__version__, "CUDA available", False, warning=str(err)), info, 0
    value = f"{torch.__version__} (CUDA {torch.version.cuda}), {n} GPU(s)"
    ok = n > 0 and torch.version.cuda is not None
    return (
        Check(
            "torch",
            value,
            "PyTorch with CUDA sees the GPUs",
            ok,
            warning=None if ok else "PyTorch sees no CUDA device",
        ),
        info,
        n,
    )


def run_preflight(
    args: argparse.Namespace, overrides: dict[str, float], table: dict[str, Any]
) -> dict[str, Any]:
    started = time.time()
    t0 = time.monotonic()
    gpu_type = args.gpu_type or ""
    checks: list[Check] = []
    meta: dict[str, Any] = {
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "node_rank": args.node_rank,
        "nnodes": args.nnodes,
        "environment": {k: os.environ.get(k) for k in MULTICAST_OFF},
    }

    # --no-bench is the host-side pass before the image is pulled: the host (a DLAMI, say) need not
    # have PyTorch, so it is neither imported nor checked there; the in-image pass checks it.
    if args.no_bench:
        torch_check, torch_info, ngpu = None, {}, 0
    else:
        torch_check, torch_info, ngpu = torch_probe()
    meta["environment"].update(torch_info)
    rows = smi_query(GPU_FIELDS) if shutil.which("nvidia-smi") else None
    if rows is None:
        why = "not found on PATH" if not shutil.which("nvidia-smi") else "failed"
        checks.append(
            Check(
                "nvidia_smi",
                why,
                "nvidia-smi lists the GPUs",
                False,
                warning=f"nvidia-smi {why}: no NVIDIA GPU or driver here "
                "(a container needs --gpus all)",
            )
        )
    else:
        rows = visible_filter(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
        _, smi_text, _ = run_cmd(["nvidia-smi"])
        _, topo_text, _ = run_cmd(["nvidia-smi", "topo", "-m"])
        frac = resolve_threshold(table, "memory_fraction_min", gpu_type, overrides).min or 0.95
        links = resolve_threshold(table, "nvlink_links_min", gpu_type, overrides).min
        checks += [
            check_gpu_count(rows, args.gpus),
            check_gpu_model(rows, args.gpu_type),
            check_gpu_memory(rows, args.gpu_memory_gb, frac),
            check_driver(rows, args.driver_min),
            check_cuda(parse_cuda_version(smi_text), args.cuda, torch_info.get("torch_cuda")),
            check_ecc(smi_health(rows)),
            check_nvlink(parse_topo(topo_text), [int(r["index"]) for r in rows], links),
        ]
        serials = smi_serials()
        keys = ("index", "name", "uuid", "pci.bus_id")
        meta["gpus"] = [dict({k: r[k] for k in keys}, serial=serials.get(r["index"])) for r in rows]
    log, source = read_kernel_log()
    critical = set(table.get("xid_critical", {}).get("codes", []))
    checks.append(check_xid(None if log is None else parse_xids(log), source, critical))
    efa_count, attempts = probe_efa(args.efa_expected, args.efa_retries, args.efa_retry_wait)
    checks.append(check_efa(efa_count, args.efa_expected, attempts))
    checks.append(check_disk(args.disk_path, args.disk_min_gb))
    if torch_check is not None:
        checks.append(torch_check)
    if torch_check is not None and torch_check.ok:
        results = run_benchmarks(args, ngpu, args.bench_timeout)
        checks += bench_checks(results, table, gpu_type, overrides, args.nnodes)
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    return report_dict(checks, meta)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    table = load_thresholds()
    try:
        overrides = parse_threshold_overrides(args.threshold, threshold_names(table))
    except ValueError as err:
        parser.error(str(err))
    if args.nnodes > 1 and (not args.master_addr or not args.master_port):
        parser.error(
            "--nnodes > 1 needs --master-addr and --master-port (node 0's address and a free port)"
        )
    if not 0 <= args.node_rank < args.nnodes:
        parser.error("--node-rank must be in [0, --nnodes)")
    try:
        report = run_preflight(args, overrides, table)
    except KeyboardInterrupt:
        print("preflight: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_table(report))
    sys.stdout.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
