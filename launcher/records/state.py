"""The user's state directory: one index of every run this user made, wherever its run directory is.

Why: a run directory lives under whatever runs root the launch used (`./runs` of the directory
it was started in, `--runs-dir`, `$REPRODUCE_RUNS_DIR`), so a run that is billing right now could
not be found from another directory. Every run directory is entered here the moment it is created
(launcher/records/rundir.py, `RunDir.create`), and `runs`, `status`, `attach`, `logs`, `ssh`,
`cancel` and `down` look a run id up here as well as under the runs root (`RunDir.find`).

    $REPRODUCE_HOME/                 default $XDG_STATE_HOME/reproduce or ~/.local/state/reproduce
      runs/<run id>.json             {"run_id", "run_dir" (absolute), "slug", "created_at"}
      aws/ keys/                     AWS launch records and keys (launcher/clusters/aws/state.py)

Why one small JSON file per run and not SQLite: each run writes only its own file, by a unique
temporary file and a rename, so two launches at the same instant can never corrupt each other's
entry or a shared file (no lock, no journal, nothing on an NFS home that SQLite's locking would
need); a damaged or hand-deleted entry loses one run, never the index; and a person can read,
copy or delete one with the usual tools. Reading all entries is one directory listing: a user's
runs number in the thousands at most. The index holds only where a run directory is; everything
else is read from the run directory itself (the record), so the two can never disagree.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import InfraError
from launcher.records import jsonread
from launcher.records.atomic import write_atomic

# A run directory's record (launcher.records.rundir.Files.RUN), named here rather than imported:
# rundir imports this module (RunDir.create indexes every new run), so this one cannot import it.
RUN_FILE = "run.json"

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def home() -> Path:
    """The user's state directory: $REPRODUCE_HOME, else the XDG state home's `reproduce`."""
    explicit = os.environ.get("REPRODUCE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "reproduce"


def index_dir() -> Path:
    return home() / "runs"


class IndexUnwritable(InfraError):  # noqa: N818 - named for what happened, as InfraError is
    """The state directory refused the run's entry: the run would be unfindable, so it stops."""


@dataclass(frozen=True)
class Entry:
    """One run in the index: its id and where its run directory is."""

    run_id: str
    run_dir: Path
    slug: str
    created_at: float | None
    source: Path  # the entry's own file

    @property
    def present(self) -> bool:
        return (self.run_dir / RUN_FILE).is_file()


def _entry_path(run_id: str) -> Path:
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} cannot name an index entry")
    return index_dir() / f"{run_id}.json"


def enter_run(run_id: str, run_dir: Path, slug: str, created_at: float | None = None) -> Path:
    """Enter a run directory in the index (atomically: a reader sees the old entry or the new).

    IndexUnwritable when the state directory cannot be written."""
    target = _entry_path(run_id)
    data = {
        "run_id": run_id,
        "run_dir": str(Path(run_dir).resolve()),
        "slug": slug,
        "created_at": time.time() if created_at is None else created_at,
    }
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(target, json.dumps(data, indent=2) + "\n", mode=0o600)
    except OSError as err:
        raise IndexUnwritable(
            f"cannot write the run index entry {target}: {err.strerror or err}",
            hint="Set REPRODUCE_HOME to a writable directory (the state of every run goes there).",
        ) from err
    return target


def forget(run_id: str, run_dir: Path) -> None:
    """Remove the entry of `run_id` if it still points at `run_dir` (a run directory removed
    again because its creation did not finish)."""
    try:
        entry = lookup(run_id)
    except ValueError:
        return
    if entry is not None and entry.run_dir == Path(run_dir).resolve():
        entry.source.unlink(missing_ok=True)


def _read(path: Path) -> Entry | None:
    """An entry file read back; None when it is not one (damaged, half-copied, foreign)."""
    try:
        data = jsonread.load_file(path)  # bounded: an index copied in is anyone's
        run_id, run_dir = data["run_id"], data["run_dir"]
    except (jsonread.NodeJSONError, KeyError, TypeError):
        return None
    if not isinstance(run_id, str) or not isinstance(run_dir, str) or not run_dir:
        return None
    created = data.get("created_at")
    return Entry(
        run_id=run_id,
        run_dir=Path(run_dir),
        slug=str(data.get("slug") or ""),
        created_at=float(created) if isinstance(created, (int, float)) else None,
        source=path,
    )


def lookup(run_id: str) -> Entry | None:
    """The index entry of `run_id`, or None."""
    path = _entry_path(run_id)
    return _read(path) if path.is_file() else None


def entries() -> tuple[list[Entry], list[str]]:
    """Every readable entry (oldest first), and a line for each file that is not one."""
    folder = index_dir()
    found: list[Entry] = []
    bad: list[str] = []
    try:
        names = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    except OSError:
        return [], []
    for path in names:
        entry = _read(path)
        if entry is None:
            bad.append(f"{path}: not a run index entry (damaged?); delete it if it is not needed")
        else:
            found.append(entry)
    found.sort(key=lambda e: (e.created_at or 0.0, e.run_id))
    return found, bad


def import_runs(root: Path) -> tuple[list[Path], list[str]]:
    """Enter every run directory under `root` (`<root>/**/run.json`) in the index: what a runs
    root written before the index existed (or copied from another machine) needs once."""
    root = Path(root)
    added: list[Path] = []
    bad: list[str] = []
    for run_json in sorted(root.glob(f"**/{RUN_FILE}")):
        try:
            data = jsonread.load_file(run_json)  # a runs root from another machine: anyone's
            run_id = data["run_id"]
        except (jsonread.NodeJSONError, KeyError, TypeError):
            bad.append(f"{run_json.parent}: run.json has no readable run_id; not imported")
            continue
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            bad.append(f"{run_json.parent}: run id {run_id!r} cannot be indexed; not imported")
            continue
        known = lookup(run_id)
        if known is not None and known.present and known.run_dir != run_json.parent.resolve():
            bad.append(
                f"{run_json.parent}: run id {run_id} is indexed already as {known.run_dir}; "
                "not imported"
            )
            continue
        created = data.get("created_at")
        enter_run(
            run_id,
            run_json.parent,
            str(data.get("slug") or ""),
            float(created) if isinstance(created, (int, float)) else None,
        )
        added.append(run_json.parent)
    return added, bad
