"""The host side of the GPU preflight: build its command line, read its report, stop on failure.

The checks themselves run on the node (scripts/preflight.py, standard library + PyTorch). This
module only turns a recipe's facts and a profile's settings into that script's arguments, and its
JSON report into a verdict the launcher can show and act on: a node that fails stops the run
before the first training minute (unless --skip-preflight). Light imports: rich only to render.

The thresholds live in ONE table, scripts/preflight_thresholds.json, read here only to check the
names of a profile's overrides, and on the node to judge.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from launcher import catalog
from launcher.errors import BadInput, InfraError
from launcher.excerpt import MAX_LINES, clip, excerpt
from launcher.records.jsonread import Fields, NodeJSONError, decode_at, load_file
from launcher.resources import data_dir

if TYPE_CHECKING:
    from rich.console import Console

THRESHOLDS_FILE = "preflight_thresholds.json"

# Lowest Linux driver for each CUDA toolkit release (NVIDIA's CUDA release notes, table 3).
DRIVER_FOR_CUDA = {
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


def expected_efa_devices(instance_type: str | None) -> int | None:
    """EFA devices a node of this type shows (the catalog's maximum EFA interfaces); None where
    the type is not in the catalog (then the preflight expects none)."""
    entry = catalog.instance(instance_type)
    return entry.max_efa if entry else None


def driver_min_for_cuda(cuda: str | None) -> str | None:
    """The lowest driver that runs the stack's CUDA (major.minor); None where not in the table."""
    if not cuda:
        return None
    m = re.match(r"(\d+)\.(\d+)", cuda.strip())
    return DRIVER_FOR_CUDA.get(f"{m.group(1)}.{m.group(2)}") if m else None


@cache
def thresholds_table() -> dict[str, Any]:
    """The thresholds table the node script reads too (scripts/preflight_thresholds.json)."""
    table = load_file(data_dir("scripts") / THRESHOLDS_FILE)  # shipped, read as any JSON file
    if not isinstance(table, dict):
        raise NodeJSONError(f"{THRESHOLDS_FILE} holds no thresholds table")
    return table


def threshold_names() -> set[str]:
    return set(thresholds_table()["names"])


def preflight_argv(
    *,
    gpu_type: str,
    gpus_per_node: int,
    gpu_memory_gb: float | None,
    driver_min: str | None,
    cuda: str | None,
    efa_expected: int | None,
    disk_path: str,
    disk_min_gb: float,
    thresholds: dict[str, float],
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[str]:
    """The arguments after `python3 <scripts>/preflight.py` (always with --json).

    Unknown threshold names are a BadInput naming the known ones: a typo in a profile must not
    silently leave the default in force. The caller quotes each element (shlex.join).
    """
    known = threshold_names()
    unknown = sorted(set(thresholds) - known)
    if unknown:
        raise BadInput(
            f"profile preflight.thresholds: unknown name(s) {', '.join(unknown)}",
            hint=f"Known: {', '.join(sorted(known))}.",
        )
    if nnodes > 1 and (not master_addr or not master_port):
        raise BadInput(
            "a multi-node preflight needs master_addr and master_port (node 0 and a free port)"
        )
    argv = ["--json", "--gpu-type", gpu_type, "--gpus", str(gpus_per_node)]
    if gpu_memory_gb is not None:
        argv += ["--gpu-memory-gb", f"{gpu_memory_gb:g}"]
    if driver_min:
        argv += ["--driver-min", driver_min]
    if cuda:
        argv += ["--cuda", cuda]
    if efa_expected is not None:
        argv += ["--efa-expected", str(efa_expected)]
    argv += ["--disk-path", disk_path, "--disk-min-gb", f"{disk_min_gb:g}"]
    for name in sorted(thresholds):
        argv += ["--threshold", f"{name}={float(thresholds[name]):g}"]
    if nnodes > 1:
        argv += [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            str(master_addr),
            "--master-port",
            str(master_port),
        ]
    return argv


def preflight_command(scripts_dir: str, argv: list[str], *, python: str = "python3") -> str:
    """The shell line that runs the preflight on the node, every part quoted (for node.sh)."""
    return shlex.join([python, f"{scripts_dir.rstrip('/')}/preflight.py", *argv])


@dataclass(frozen=True)
class PreflightCheck:
    name: str
    value: Any
    expected: str
    ok: bool
    unit: str | None = None
    warning: str | None = None
    detail: Any = None

    @property
    def shown_value(self) -> str:
        if self.value is None:
            return "-"
        v = self.value
        text = (f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}") if isinstance(v, float) else str(v)
        return f"{text} {self.unit}" if self.unit else text


@dataclass(frozen=True)
class PreflightReport:
    """What scripts/preflight.py printed, as the launcher uses it (and keeps as preflight.json)."""

    ok: bool
    checks: list[PreflightCheck]
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def failures(self) -> list[PreflightCheck]:
        return [c for c in self.checks if not c.ok]

    def warnings(self) -> list[PreflightCheck]:
        return [c for c in self.checks if c.ok and c.warning]

    def summary(self) -> str:
        """One paragraph naming each failed check with its measured and expected values."""
        if self.ok:
            return f"preflight passed ({len(self.checks)} checks)"
        failed = self.failures()
        # each part bounded and without control characters: the words are the node's
        parts = [
            clip(
                f"{c.name}: {c.shown_value} (expected {c.expected})"
                + (f" - {c.warning}" if c.warning else "")
            )
            for c in failed[:MAX_LINES]
        ]
        if len(failed) > len(parts):
            parts.append(f"{len(failed) - len(parts)} more failed checks")
        return (
            "the node failed the GPU preflight: "
            + "; ".join(parts)
            + ". Fix or replace the node, or rerun with --skip-preflight to train anyway."
        )

    def table(self) -> Any:
        """A rich Table: check, value, expected, result."""
        from rich.table import Table

        t = Table(title="GPU preflight", show_lines=False)
        for col in ("check", "value", "expected", "result"):
            t.add_column(col)
        for c in self.checks:
            result = "[green]pass[/]" if c.ok else "[bold red]FAIL[/]"
            if c.ok and c.warning:
                result = "[yellow]pass (warning)[/]"
            t.add_row(c.name, c.shown_value, c.expected, result)
        return t

    def render(self, console: Console) -> None:
        """Print the table, then each warning and failure reason, on a rich Console."""
        console.print(self.table())
        for c in self.checks:
            if c.warning:
                style = "red" if not c.ok else "yellow"
                console.print(f"[{style}]{c.name}[/]: {c.warning}", markup=True, highlight=False)


# A report is looked for at this many line starts `{` from the end, no more: each try may read
# to the end of the text, and a container printing many such lines must not make it quadratic.
MAX_REPORT_STARTS = 16


def parse_report(text: str) -> PreflightReport:
    """The preflight's JSON object from its stdout, even among other lines (NCCL, warnings).

    Takes the last JSON object that starts a line and has `checks` (a list), among the last
    MAX_REPORT_STARTS lines that start with `{`. No such object is an InfraError: the script did
    not get to report (killed, wrong Python, not uploaded). The text is what the node (the
    GPU preflight: the recipe's image) printed, so it is read as hostile (launcher/records/
    jsonread.py): nothing but an InfraError comes out, whatever it holds.
    """
    found: Fields | None = None
    starts = [m.start() for m in re.finditer(r"^\{", text, flags=re.M)]
    for start in reversed(starts[-MAX_REPORT_STARTS:]):
        try:
            obj, _ = decode_at(text, start)
        except NodeJSONError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("checks"), list):
            found = Fields(obj)
            break
    if found is None:
        tail = excerpt(text, 5)
        raise InfraError(
            "the GPU preflight printed no report",
            hint=f"Its last output: {tail!r}" if tail else None,
        )
    checks = [
        PreflightCheck(
            name=c.word("name", "?"),
            value=c.raw("value"),
            expected=c.word("expected"),
            ok=c.flag("ok") is True,
            unit=c.text("unit"),
            warning=c.text("warning"),
            detail=c.raw("detail"),
        )
        for c in found.records("checks")
    ]
    ok = found.flag("ok") is True and all(c.ok for c in checks) and bool(checks)
    return PreflightReport(ok=ok, checks=checks, raw=found.mapping())
