#!/usr/bin/env python3
"""The GPU preflight's verdicts: facts in, pass/fail out (a module of preflight.py).

Its one job is judging: the Check type and the report (JSON object and terminal table), the
thresholds (preflight_thresholds.json beside this file, `--threshold` overrides), the parsers of
what nvidia-smi and the kernel log print, and every `check_*` verdict. Pure functions, tested on
CPU with captured outputs; asking the machine is preflight_probes.py's job. Runs on the node
under python 3.8 or later with the standard library alone, never the `launcher` package.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

THRESHOLDS_FILE = Path(__file__).with_name("preflight_thresholds.json")
SCHEMA_VERSION = 1

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
        elif unc is not None and int(unc) > 0:
            problems.append(f"GPU{i}: {unc} uncorrected ECC errors")
        for key, label in (
            ("retired_pages.pending", "page retirement pending"),
            ("remapped_rows.pending", "row remapping pending"),
            ("remapped_rows.failure", "row remapping failed"),
        ):
            v = r.get(key)
            if v is not None and not is_na(v) and v.strip().lower() in ("yes", "1", "true"):
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
    bad: list[str] = []
    seen: list[str] = []
    for a in gpu_indices:
        for b in gpu_indices:
            if a >= b:
                continue
            cell = cells.get((a, b)) or cells.get((b, a))
            m = re.fullmatch(r"NV(\d+)", cell or "")
            if not m or (links_min and int(m.group(1)) < links_min):
                bad.append(f"GPU{a}-GPU{b}: {cell or 'missing'}")
            else:
                seen.append(m.group(0))  # the whole cell: fullmatch
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
