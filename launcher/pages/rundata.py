"""Reading a run directory's files for a page, tolerantly: nothing missing or broken stops a page.

Why not launcher/results/evaluate.py's readers: those refuse bad input (a measurement must not go on
from
a broken file), while a page must show whatever is there and say, per file, what is not: "not
recorded" for a file the run never wrote (a run that failed before training has no result.yaml),
"unreadable" with the reason for one that is damaged. Only regular files under a size cap are
read (a FIFO or a runaway log cannot hang or swamp the page). docs/architecture.md lists the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.records import jsonread
from launcher.records.rundir import NODE_RESULT_FILES, Files, load_yaml

# The files a run page is made from, in the order the page's footer lists them.
RUN_FILES = (
    Files.RESULT,
    Files.VERDICT,
    Files.STEPS,
    Files.TIMELINE,
    Files.STACK,
    Files.PREFLIGHT,
    Files.PREFLIGHT_GPU,
    Files.PLAN,
    Files.CONVERGENCE,
    Files.RECIPE,
    Files.RUN,
    Files.STATUS,
    Files.IMAGE,
)
MAX_BYTES = 32 * 1024 * 1024
MAX_STEPS = 200_000


@dataclass
class RunFiles:
    """What a run directory holds: parsed data by file name, and why any other file is absent."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # name -> "missing" | "unreadable: .."

    def get(self, name: str) -> Any:
        return self.data.get(name)

    def mapping(self, name: str) -> dict[str, Any]:
        """The file's top-level mapping; {} when absent or not a mapping."""
        value = self.data.get(name)
        return value if isinstance(value, dict) else {}

    def has(self, name: str) -> bool:
        return name in self.data

    def why_not(self, name: str) -> str:
        """'not recorded' or 'unreadable (...)': the words a section shows for an absent file."""
        problem = self.problems.get(name, "missing")
        if problem == "missing":
            return f"not recorded (no {name} in the run directory)"
        return f"{name} is unreadable: {problem.removeprefix('unreadable: ')}"

    @property
    def steps(self) -> list[dict[str, Any]]:
        value = self.data.get(Files.STEPS)
        return value if isinstance(value, list) else []


def _read_text(path: Path) -> str:
    """A regular file of at most MAX_BYTES (never through a link, never from a FIFO)."""
    text = jsonread.read_text(path, max_bytes=MAX_BYTES)
    if text is None:
        raise FileNotFoundError(f"no {path.name}")
    return text


def _strict_json(text: str) -> Any:
    """JSON within launcher/records/jsonread.py's limits (the run directory is anyone's: a
    page made from one must not crash on it); NaN and Infinity read as null (none is written)."""
    return jsonread.loads(text)


def _parse(name: str, text: str) -> Any:
    if name.endswith(".jsonl"):
        out: list[dict[str, Any]] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                item = _strict_json(line)
            except jsonread.NodeJSONError:
                continue  # a cut last line (the run was killed) leaves the others readable
            if isinstance(item, dict):
                out.append(item)
            if len(out) >= MAX_STEPS:
                break
        return out
    if name.endswith(".yaml"):
        return load_yaml(text, Path(name))
    return _strict_json(text)


def read_run_dir(path: Path, names: tuple[str, ...] = RUN_FILES) -> RunFiles:
    """Every file of `names` in the run directory at `path` that can be read; never raises for
    a missing or damaged file (an unreadable directory reads as one with nothing recorded)."""
    files = RunFiles(Path(path))
    for name in names:
        p = files.path / name
        if name in NODE_RESULT_FILES:  # the node's output: one reader, bounded and typed
            doc = jsonread.read(p)
            if doc.problem is None:
                files.data[name] = doc.value
            else:
                files.problems[name] = "missing" if doc.missing else f"unreadable: {doc.problem}"
            continue
        try:
            if not p.exists():
                files.problems[name] = "missing"
                continue
            files.data[name] = _parse(name, _read_text(p))
        except Exception as err:  # noqa: BLE001 - any damage to one file only costs its section
            files.problems[name] = f"unreadable: {type(err).__name__}: {_first_line(err)}"
    return files


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no detail"
