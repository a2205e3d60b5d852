"""The history of runs (a SQLite file) and the regression test of docs/measurement.md.

Why SQLite: one file, stdlib, safe against two writers (a nightly and a person importing runs),
and queryable by hand (`sqlite3 runs/history.sqlite 'select * from runs'`). The run directory
stays the record (docs/architecture.md); a row here is an index of it: `record` reads the files
the run path and launcher/results/evaluate.py wrote, and re-recording the same run id replaces its
row,
so importing a runs tree twice changes nothing (launcher/records/history_rows.py reads a row). Rows
are
keyed on the recipe's content-derived slug, so two recipes never share a series and one recipe
keeps its series wherever its file lies; a writer that finds the database locked waits
BUSY_TIMEOUT_S, then raises HistoryUnavailable (a clear error, never a traceback).

The regression rules (docs/measurement.md, regressions over time) are pure functions of rows,
so they are tested on hand-built histories:

- claim test: the run's tokens/s per GPU is below the recipe's claim by more than the verdict's
  slower tolerance (3% by default): the verdict already says "slower" (or "unstable" and slow).
- trend test: against the trailing baseline, the last K (default 7) *good* runs before it on the
  same cluster profile, good meaning verdict "reproduced" or "faster". With m the baseline's
  median, MAD the median of |x - m|, spread% = 100 x 1.4826 x MAD / m (1.4826 x MAD estimates a
  standard deviation for normal noise, and is not moved by one outlier), the run is a regression
  when 100 x (x - m) / m < -max(tolerance%, 3 x spread%). With fewer than 3 good runs the trend
  test is skipped and says "not enough history".
- a run that failed or is incomplete has no comparable throughput: it is "not judged" (its
  failure is reported as such, by its verdict), never a regression and never part of a baseline.
"""

from __future__ import annotations

import math
import os
import sqlite3
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.errors import BadInput, InfraError
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT
from launcher.records.history_rows import (
    RunRow,
    db_value,
    file_sha256,
    is_content_slug,
    num,
    read_json,
    recipe_file_slug,
    row_from_run_dir,
    slug_of,
)
from launcher.records.rundir import Files

__all__ = [
    "History",
    "HistoryDamaged",
    "HistoryUnavailable",
    "RunRow",
    "Assessment",
    "Trend",
    "assess_history",
    "check_regression",
    "default_history_path",
    "file_sha256",
    "import_runs",
    "index_run",
    "row_from_run_dir",
    "runs",
    "runs_of_recipe",
    "slug_of",
    "spread",
    "trend_of",
]

# 2: rows are keyed on the recipe's content-derived slug; `legacy_slug` keeps the path-derived
# name version 1 used (migrated on open: old rows still read, under both names).
# 3: `measured_runs`, K: the row's figures are the mean of K measured runs (null: one run).
SCHEMA_VERSION = 4
# How long a writer waits for another one (a nightly and a person importing runs) before giving
# up with a clear error instead of a traceback.
BUSY_TIMEOUT_S = 30.0
HISTORY_ENV = "REPRODUCE_HISTORY"
DEFAULT_K = 7  # baseline: the last K good runs
MIN_GOOD = 3  # the trend test needs at least this many good runs
MAD_SCALE = 1.4826  # MAD x 1.4826 estimates the standard deviation of normal noise
SPREAD_FACTOR = 3.0  # a drop must exceed 3 x spread% (and the tolerance) to be a regression
GOOD_VERDICTS = ("reproduced", "faster")
# Verdicts whose tokens/s covers the whole window (comparable); failed/incomplete ones are not.
JUDGED_VERDICTS = ("reproduced", "faster", "slower", "unstable")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    slug TEXT NOT NULL,
    recipe_sha256 TEXT,
    run_dir TEXT,
    cluster_name TEXT,
    cluster_kind TEXT,
    started_at REAL,
    ended_at REAL,
    state TEXT,
    verdict TEXT,
    difference_percent REAL,
    claimed_tokens_per_s_per_gpu REAL,
    tolerance_percent REAL,
    tokens_per_s_per_gpu REAL,
    step_time_cv_percent REAL,
    mfu REAL,
    usd_per_million_tokens REAL,
    gpu_hours REAL,
    image TEXT,
    detail TEXT,
    recorded_at REAL NOT NULL,
    legacy_slug TEXT,
    measured_runs INTEGER,
    assurance TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_slug ON runs (slug, started_at, run_id);
"""


class HistoryUnavailable(InfraError):
    """The history database could not be used now (locked by another writer past the busy
    timeout, or a read/write failure): the run itself is unaffected."""


class HistoryDamaged(BadInput):
    """The file is a SQLite database whose content is damaged (a page of its table overwritten,
    a truncated copy): bad input, exit 2, found when it is opened (PRAGMA quick_check), so a
    nightly refuses before its first paid recipe rather than after it."""


_COLUMNS = [f.name for f in fields(RunRow)]
# The column names are RunRow's own fields, never input: only the values are parameters.
_INSERT = (
    f"INSERT OR REPLACE INTO runs ({', '.join(_COLUMNS)}) "  # noqa: S608 - fixed column names
    f"VALUES ({', '.join('?' * len(_COLUMNS))})"
)


def default_history_path() -> Path:
    """$REPRODUCE_HISTORY, else history.sqlite in the user's state directory
    (launcher/records/state.py): the same file from any directory, whichever runs root a run
    used, as the run index is."""
    env = os.environ.get(HISTORY_ENV)
    if env:
        return Path(env).expanduser().absolute()
    from launcher.records import state

    return state.home().absolute() / "history.sqlite"


class History:
    """The history database; the schema is created on first use."""

    def __init__(self, path: Path | None = None, *, create: bool = True) -> None:
        """`create=False` (a query): a database that does not exist yet is not made; the query
        works on an empty one in memory, and no file is left behind."""
        self.path = Path(path) if path is not None else default_history_path()
        try:
            if create or self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S)
            else:
                self.conn = sqlite3.connect(":memory:")
        except (OSError, sqlite3.Error) as err:
            raise BadInput(f"history database {self.path}: cannot open: {err}") from None
        self.conn.row_factory = sqlite3.Row
        try:
            self._ensure_schema()
            self._check_intact()
        except HistoryDamaged:
            self.conn.close()
            raise
        except sqlite3.OperationalError as err:
            self.conn.close()
            raise self._unavailable(err) from None
        except sqlite3.DatabaseError as err:
            self.conn.close()
            raise BadInput(
                f"history database {self.path}: not a usable SQLite history ({err})."
            ) from None
        except BaseException:
            self.conn.close()
            raise

    def _check_intact(self) -> None:
        """PRAGMA quick_check: every page of every table and index is read. A schema can read
        while the table behind it is garbage; that must be said now, not after a paid run."""
        try:
            found = [r[0] for r in self.conn.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.OperationalError:
            raise  # locked or busy: the caller says "unavailable"
        except sqlite3.DatabaseError as err:
            raise self._damaged(err) from None
        if found != ["ok"]:
            raise self._damaged("; ".join(str(f) for f in found[:3]))

    def _damaged(self, why: object) -> HistoryDamaged:
        return HistoryDamaged(
            f"history database {self.path} is damaged ({why}): its runs cannot be read or "
            "recorded. Move it aside and rebuild it from the run directories (they are the "
            "record) with `reproduce history --import RUNS_DIR --history "
            f"{self.path}`."
        )

    def _failed(self, err: sqlite3.Error) -> HistoryUnavailable | HistoryDamaged:
        """A read or write that failed: locked (unavailable) or the file damaged."""
        if isinstance(err, sqlite3.OperationalError):
            return self._unavailable(err)
        return self._damaged(err)

    def _unavailable(self, err: sqlite3.Error) -> HistoryUnavailable:
        if "locked" in str(err) or "busy" in str(err):
            return HistoryUnavailable(
                f"history database {self.path} is locked by another process (waited "
                f"{BUSY_TIMEOUT_S:g} s); the run is not recorded now.",
                hint="Record it later with `reproduce history --import RUNS_DIR`.",
            )
        return HistoryUnavailable(f"history database {self.path}: {err}.")

    def _ensure_schema(self) -> None:
        with self.conn:
            self.conn.executescript(_SCHEMA)
            row = self.conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = row[0]
            if version is None:
                self.conn.execute(
                    "INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,)
                )
            elif version > SCHEMA_VERSION:
                raise BadInput(
                    f"history database {self.path} has schema version {version}; this launcher "
                    f"knows version {SCHEMA_VERSION}: upgrade reproduce."
                )
            elif version < SCHEMA_VERSION:
                self._migrate_from(version)

    def _migrate_from(self, version: int) -> None:
        """An older schema brought up to this one, inside the caller's transaction."""
        if version < 2:
            self._migrate_from_1()
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        if "measured_runs" not in columns:  # 3: K measured runs (older rows: one run, null)
            self.conn.execute("ALTER TABLE runs ADD COLUMN measured_runs INTEGER")
        if "assurance" not in columns:  # 4: the verdict's assurance level (older rows: null)
            self.conn.execute("ALTER TABLE runs ADD COLUMN assurance TEXT")
        self.conn.execute("DELETE FROM schema_version")
        self.conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))

    def _migrate_from_1(self) -> None:
        """Version 1 keyed rows on the recipe file's path; key them on the content slug of the
        recipe.yaml their run directory kept (when it still exists), the old name kept as
        legacy_slug so that both names find them. Runs inside the caller's transaction."""
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        if "legacy_slug" not in columns:
            self.conn.execute("ALTER TABLE runs ADD COLUMN legacy_slug TEXT")
        rows = self.conn.execute("SELECT run_id, slug, run_dir FROM runs").fetchall()
        for run_id, slug, run_dir in rows:
            content = None
            if run_dir and not is_content_slug(slug):
                content = recipe_file_slug(Path(run_dir) / Files.RECIPE)
            self.conn.execute(
                "UPDATE runs SET slug = ?, legacy_slug = ? WHERE run_id = ?",
                (content or slug, slug if content and content != slug else None, run_id),
            )
        self.conn.execute("DELETE FROM schema_version")
        self.conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ---

    def insert(self, row: RunRow) -> RunRow:
        """Insert or replace (by run id) one row."""
        if not row.recorded_at:
            row.recorded_at = time.time()
        values = [db_value(getattr(row, c)) for c in _COLUMNS]
        try:
            with self.conn:
                self.conn.execute(_INSERT, values)
        except sqlite3.DatabaseError as err:
            raise self._failed(err) from None
        return row

    def record(self, run_dir: Path) -> RunRow:
        """Index one run directory (idempotent on its run id)."""
        return self.insert(row_from_run_dir(run_dir))

    def import_runs(self, root: Path) -> tuple[list[RunRow], list[str]]:
        """Record every finished run under `root`: (rows recorded, one line per run skipped)."""
        from launcher.records.rundir import FINAL_STATES

        root = Path(root)
        if not root.is_dir():
            raise BadInput(f"runs directory {root} does not exist.")
        recorded: list[RunRow] = []
        skipped: list[str] = []
        for run_json in sorted(root.rglob(Files.RUN)):
            run_dir = run_json.parent
            if run_dir.parent.name == "node":  # a node's own run.json collected into a run dir
                continue
            try:
                state = (read_json(run_dir / Files.STATUS) or {}).get("state")
            except BadInput as err:
                skipped.append(f"{run_dir}: {err}")
                continue
            if state not in FINAL_STATES:
                skipped.append(f"{run_dir}: state {state or 'unknown'}, not finished")
                continue
            try:
                recorded.append(self.record(run_dir))
            except BadInput as err:
                skipped.append(f"{run_dir}: {err}")
        return recorded, skipped

    # --- reading ---

    def runs(self, slug: str, limit: int | None = None, cluster: str | None = None) -> list[RunRow]:
        """The runs of a recipe slug, oldest first (the last `limit` of them when given)."""
        sql = "SELECT * FROM runs WHERE (slug = ? OR legacy_slug = ?)"
        args: list[Any] = [slug, slug]
        if cluster is not None:
            sql += " AND cluster_name = ?"
            args.append(cluster)
        sql += " ORDER BY COALESCE(started_at, recorded_at) DESC, run_id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            found = self.conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as err:
            raise self._failed(err) from None
        rows = [RunRow(**{c: r[c] for c in _COLUMNS}) for r in found]
        return rows[::-1]

    def slugs(self) -> list[str]:
        try:
            found = self.conn.execute("SELECT DISTINCT slug FROM runs ORDER BY slug").fetchall()
        except sqlite3.DatabaseError as err:
            raise self._failed(err) from None
        return [r[0] for r in found]


def index_run(run_dir: Path, db: Path | None = None) -> RunRow:
    """Index one finished run directory into the history at `db` (default_history_path())."""
    with History(db) as hist:
        return hist.record(run_dir)


def runs(slug: str, limit: int | None = None, db: Path | None = None) -> list[RunRow]:
    """The runs of `slug`, oldest first."""
    with History(db) as hist:
        return hist.runs(slug, limit)


def import_runs(root: Path, db: Path | None = None) -> tuple[list[RunRow], list[str]]:
    """Index every finished run directory under `root`."""
    with History(db) as hist:
        return hist.import_runs(root)


# ---------------------------------------------------------------------------------------------
# Regression detection (pure)


@dataclass
class Trend:
    """The trailing baseline a run is compared with."""

    points: list[tuple[str, float]]  # (run id, tokens/s per GPU) of the baseline, oldest first
    median: float | None = None
    mad: float | None = None
    spread_percent: float | None = None  # 100 x 1.4826 x MAD / median
    threshold_percent: float | None = None  # max(tolerance, 3 x spread)
    difference_percent: float | None = None  # the run vs the median, signed
    skipped: str | None = None  # why the trend test did not run

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [{"run_id": r, "tokens_per_s_per_gpu": v} for r, v in self.points],
            "median": self.median,
            "mad": self.mad,
            "spread_percent": self.spread_percent,
            "threshold_percent": self.threshold_percent,
            "difference_percent": self.difference_percent,
            "skipped": self.skipped,
        }


@dataclass
class Assessment:
    """Whether one run is a regression, and why."""

    run_id: str
    regression: bool
    judged: bool  # False when the run has no comparable throughput (failed, incomplete, never ran)
    claim_regression: bool
    trend_regression: bool
    trend: Trend
    reasons: list[str] = field(default_factory=list)
    suspect: bool = False  # one miss (claim or trend): a regression needs two in a row

    @property
    def miss(self) -> bool:
        return self.claim_regression or self.trend_regression

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "regression": self.regression,
            "suspect": self.suspect,
            "judged": self.judged,
            "claim_regression": self.claim_regression,
            "trend_regression": self.trend_regression,
            "trend": self.trend.to_dict(),
            "reasons": list(self.reasons),
        }


def is_good(row: RunRow) -> bool:
    """A run that may join a baseline: judged reproduced or faster, with a throughput."""
    return row.verdict in GOOD_VERDICTS and num(row.tokens_per_s_per_gpu) is not None


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, MAD, spread%) with spread% = 100 x 1.4826 x MAD / median."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med, mad, (100.0 * MAD_SCALE * mad / med) if med else math.inf


def trend_of(
    value: float | None,
    earlier: Sequence[RunRow],
    *,
    k: int = DEFAULT_K,
    tolerance_percent: float = DEFAULT_TOLERANCE_PERCENT,
    min_good: int = MIN_GOOD,
) -> Trend:
    """The baseline (last k good runs of `earlier`, oldest first) and `value` against it."""
    good = [r for r in earlier if is_good(r)][-k:]
    points = [(r.run_id, float(r.tokens_per_s_per_gpu or 0.0)) for r in good]  # good: not None
    if len(points) < min_good:
        return Trend(
            points,
            skipped=(
                f"not enough history: {len(points)} good run(s) before this one; "
                f"the trend test needs {min_good}"
            ),
        )
    med, mad, spread_pct = spread([v for _, v in points])
    threshold = max(tolerance_percent, SPREAD_FACTOR * spread_pct)
    diff = 100.0 * (value - med) / med if value is not None and med else None
    return Trend(points, med, mad, spread_pct, threshold, diff)


def check_regression(
    latest: RunRow,
    earlier: Sequence[RunRow],
    *,
    k: int = DEFAULT_K,
    tolerance_percent: float | None = None,
    min_good: int = MIN_GOOD,
) -> Assessment:
    """Is `latest` a regression? `earlier`: the runs before it (oldest first), same recipe and
    cluster.

    A miss (below the claim, or below the trend) is a regression only when the judged run before
    it missed too (as the PyTorch benchmark bot confirms a regression on a second run); a first
    miss is `suspect`. Runs without a figure in between are passed over: they judge no speed.
    """
    opts: dict[str, Any] = {"k": k, "tolerance_percent": tolerance_percent, "min_good": min_good}
    now = _assess_once(latest, earlier, **opts)
    if not now.miss:
        return now
    before = [i for i, r in enumerate(earlier) if _judged(r)]
    prev = _assess_once(earlier[before[-1]], earlier[: before[-1]], **opts) if before else None
    if prev is not None and prev.miss:
        now.regression = True
        now.reasons.append(
            f"the judged run before it ({prev.run_id}) missed too: two misses in a row, a "
            "regression"
        )
    else:
        now.regression, now.suspect = False, True
        now.reasons.append(
            "suspect: a first miss; a regression is raised when the next judged run misses too"
        )
    return now


def _judged(row: RunRow) -> bool:
    return row.verdict in JUDGED_VERDICTS and num(row.tokens_per_s_per_gpu) is not None


def _assess_once(
    latest: RunRow,
    earlier: Sequence[RunRow],
    *,
    k: int = DEFAULT_K,
    tolerance_percent: float | None = None,
    min_good: int = MIN_GOOD,
) -> Assessment:
    """One run's misses, claim and trend (assess adds the two-in-a-row rule). The tolerance is
    the verdict's own slower tolerance when recorded, else 3%."""
    tol = (
        tolerance_percent
        if tolerance_percent is not None
        else (
            latest.tolerance_percent
            if latest.tolerance_percent is not None
            else DEFAULT_TOLERANCE_PERCENT
        )
    )
    value = num(latest.tokens_per_s_per_gpu)
    trend = trend_of(value, earlier, k=k, tolerance_percent=tol, min_good=min_good)
    if latest.verdict not in JUDGED_VERDICTS or value is None:
        why = (
            f"verdict {latest.verdict}"
            if latest.verdict
            else f"state {latest.state or 'unknown'}, no verdict"
        )
        reason = f"not judged: {why}; a run without a whole window's throughput is no trend point"
        return Assessment(latest.run_id, False, False, False, False, trend, [reason])

    reasons: list[str] = []
    diff = latest.difference_percent
    claim_reg = diff is not None and diff < -tol
    if claim_reg:
        reasons.append(f"below the recipe's claim: {diff:+.2f}% (tolerance -{tol:g}%)")
    trend_reg = False
    if trend.skipped:
        reasons.append(f"trend test skipped: {trend.skipped}")
    elif trend.difference_percent is not None and trend.threshold_percent is not None:
        trend_reg = trend.difference_percent < -trend.threshold_percent
        words = "below" if trend_reg else "within"
        reasons.append(
            f"{words} the trend: {value:.2f} vs median {trend.median:.2f} of the last "
            f"{len(trend.points)} good runs = {trend.difference_percent:+.2f}% (threshold "
            f"-{trend.threshold_percent:.2f}% = max(tolerance {tol:g}%, 3 x spread "
            f"{trend.spread_percent:.2f}%))"
        )
    return Assessment(
        latest.run_id, claim_reg or trend_reg, True, claim_reg, trend_reg, trend, reasons
    )


def assess_history(
    rows: Sequence[RunRow],
    *,
    k: int = DEFAULT_K,
    tolerance_percent: float | None = None,
    min_good: int = MIN_GOOD,
) -> Assessment | None:
    """Assess the last of `rows` (oldest first) against the earlier ones of its cluster profile
    (check_regression's rules and parameters)."""
    if not rows:
        return None
    latest = rows[-1]
    earlier = [r for r in rows[:-1] if r.cluster_name == latest.cluster_name]
    return check_regression(
        latest, earlier, k=k, tolerance_percent=tolerance_percent, min_good=min_good
    )


# ---------------------------------------------------------------------------------------------
# Recipes by slug


def runs_of_recipe(
    hist: History, slug: str, *, runs_dir: Path | None = None, cluster: str | None = None
) -> list[RunRow]:
    """The runs of `slug`, oldest first; BadInput naming the recorded recipes when there is none.

    Runs made by `reproduce RECIPE` join the history here: the recipe's runs the user's run index
    knows (launcher/records/state.py, from any directory) are indexed first, and those under
    `runs_dir`/<slug> when a runs root is given.
    """
    from launcher.records import state

    found, _bad = state.entries()
    for entry in found:
        if entry.slug == slug and entry.present:
            hist.import_runs(entry.run_dir)
    own = Path(runs_dir) / slug if runs_dir is not None else None
    if own is not None and own.is_dir():
        hist.import_runs(own)
    rows = hist.runs(slug, cluster=cluster)
    if not rows:
        known = ", ".join(hist.slugs()) or "none"
        raise BadInput(
            f"no runs of {slug!r} in {hist.path} (recipes recorded: {known}). "
            f"Index run directories with `reproduce history --import RUNS_DIR`."
        )
    return rows
