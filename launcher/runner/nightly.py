"""`reproduce nightly`: re-measure a set of recipes, keep the history, flag regressions.

Each recipe runs exactly as `reproduce RECIPE --cluster NAME` runs it
(launcher.runner.prelaunch.prepare, then launcher.runner.runner.Runner.run: no second run path),
one after the other, each with its own run directory, timeline and verdict. On a backend that
launches nodes (aws) or holds them in a scheduler's allocation (slurm: each run a job step of
it), recipes of the same node shape (launcher/runner/nightly_groups.py) share one node and run
one after another (groups in the order of their first recipe): the group's
first run acquires it through its cluster as any run does, the next runs are lent it
(launcher/runner/held.py: one provisioning, the image's layers and the asset cache already on
the node), and the nightly releases it once, after the group's last run, on every way out
(Ctrl-C, SIGTERM, a failure, a budget stop). Whatever happens to one recipe (invalid file,
budget refusal, a failed check) is recorded in the history as that recipe's run and the nightly
goes on with the next: one bad recipe must not hide the others' numbers. A node a run breaks
(lost, unreachable, never acquired) ends its group: the group's remaining recipes are recorded
as not run (infra), and the other groups go on. Ctrl-C stops the nightly (the run in progress is
cancelled by the run path, then the node is released). A run that `reproduce cancel` ends from
another terminal is that recipe's outcome ("interrupted", exit 130 in the end): the nightly goes
on with the next recipe, on the same node.

Budget (--max-usd/--max-hours): a limit of each run, on the run's own clock as for a single run
(from its acquire to its end); the group's first run's clock includes the provisioning, which it
waits for. A group of N recipes is so held at most N times the limit, plus the moments between
runs and the one release.

Exit code, by precedence (the most actionable news wins):
  130  interrupted;
  1    any recipe regressed (below its claim, or below its trend), failed a check (verdict not
       "reproduced", failed preflight/stack check) or could not be loaded (invalid recipe);
  3    otherwise, any recipe hit an infrastructure failure (provisioning, connection, node, or
       not run: its group's node was lost) or an unexpected error: the recipe could not be
       measured; or a group's node could not be released whole; or the history database
       could not be used (locked by another writer past its busy timeout): the runs were
       judged, but not recorded or compared with their trend, and the summary says so;
  2    bad input for the whole nightly, found before the first recipe runs: no recipe, a bad
       --cluster, a refused cost, or a history database that is damaged (PRAGMA quick_check at
       open: it could not record the runs it would pay for);
  0    every recipe reproduced without regression; a first miss of speed (below the claim or
       the trend) is "suspect", flagged in the summary but not raised: a regression is two
       misses in a row (docs/measurement.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import BadInput, Cancelled, ReproduceError
from launcher.judge.assurance import shown
from launcher.pages.report import fmt, markdown_table, text_table, trend_lines
from launcher.records.atomic import write_atomic
from launcher.records.history import (
    Assessment,
    History,
    HistoryDamaged,
    HistoryUnavailable,
    RunRow,
    default_history_path,
    file_sha256,
    row_from_run_dir,
    slug_of,
)
from launcher.records.night import NightlyEntry as NightlyEntry
from launcher.records.night import RecipeRun as RecipeRun
from launcher.records.rundir import Files
from launcher.runner.held import HeldNode
from launcher.runner.nightly_groups import Group, Ran, group_by_shape, group_lines, view
from launcher.runner.prelaunch import RunOptions

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from launcher.inputs.profile import Profile
    from launcher.runner.reporter import Reporter


@dataclass
class NightlyResult:
    entries: list[NightlyEntry] = field(default_factory=list)
    summary_path: Path | None = None
    page_path: Path | None = None  # nightly-<date>.html (launcher/pages/)
    exit_code: int = 0
    history_error: str | None = None  # why the history could not be used (the runs went on)
    groups: list[Group] = field(default_factory=list)  # by node shape, each with its node


class RecipeRunner(Protocol):
    """How one recipe is reproduced (run_recipe; tests pass their own)."""

    def __call__(
        self, recipe: Path, options: RunOptions, *, held: HeldNode | None = None
    ) -> RecipeRun: ...


def run_recipe(
    recipe: Path,
    options: RunOptions,
    reporter: Reporter | None = None,
    *,
    held: HeldNode | None = None,
) -> RecipeRun:
    """One reproduction through the real run path (prepare -> Runner.run), errors caught and kept.

    `reporter` (launcher.runner.reporter.Reporter) shows the run's progress; None shows nothing.
    `held`: the node of the recipe's group, lent to the run (launcher/runner/held.py).
    """
    from launcher.records.rundir import RunDir, default_runs_root
    from launcher.runner.prelaunch import prepare

    try:
        prepared = prepare(recipe, options)
    except ReproduceError as err:
        return RecipeRun(recipe, err.exit_code, None, str(err))
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    cancelled = False
    try:
        runner = Runner(reporter, on_interrupt=options.on_interrupt, unattended=True)
        outcome = runner.run(prepared, options, held=held)
        code, error = exit_code_of(outcome), None
    except ReproduceError as err:
        code, error, cancelled = err.exit_code, str(err), isinstance(err, Cancelled)
    run_dir = None
    try:
        run_dir = RunDir.find(prepared.plan.run_id, options.runs_dir or default_runs_root()).path
    except BadInput:
        pass  # refused before a run directory was made (budget, unsupported recipe)
    return RecipeRun(recipe, code, run_dir, error, cancelled=cancelled)


def expand_targets(targets: Sequence[Path]) -> list[Path]:
    """Files as given; a directory means every *.yaml under it (recursively), sorted."""
    out: list[Path] = []
    for target in targets:
        target = Path(target)
        if target.is_dir():
            found = sorted(p for p in target.rglob("*.yaml") if p.is_file())
            if not found:
                raise BadInput(f"{target}: no *.yaml recipe under this directory.")
            out += found
        elif target.is_file():
            out.append(target)
        else:
            raise BadInput(
                f"{target} does not exist (give recipe files or directories of recipes)."
            )
    return out


def failure_row(recipe: Path, cluster_name: str, cluster_kind: str | None, message: str) -> RunRow:
    """The history row of a recipe that made no run directory (invalid, refused before launch)."""
    from launcher.records.rundir import new_run_id

    now = time.time()
    return RunRow(
        run_id=new_run_id(),
        slug=slug_of(str(recipe)),
        recipe_sha256=file_sha256(recipe),
        cluster_name=cluster_name,
        cluster_kind=cluster_kind,
        started_at=now,
        ended_at=now,
        state="failed",
        detail=_first_line(message),
    )


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _indented(text: str, prefix: str = "    ") -> str:
    """A multi-line reason kept whole (an invalid recipe lists every problem), indented."""
    return "\n".join(prefix + line for line in text.strip().splitlines())


def outcome_of(run: RecipeRun, assessment: Assessment) -> str:
    if run.code == 130:
        return "interrupted"
    if assessment.regression:
        return "regression"
    if assessment.suspect and run.code in (0, 1):
        return "suspect"  # one miss of speed: flagged, not raised (two in a row raise it)
    if run.crashed:
        return "error"
    return {0: "reproduced", 1: "check failed", 2: "invalid", 3: "infra"}.get(run.code, "error")


def exit_code_of(entries: Sequence[NightlyEntry]) -> int:
    """Precedence: 130 interrupted > 1 regression/check/invalid > 3 infra/error > 0.

    A suspect run (one miss, not yet a regression) whose own verdict is not "reproduced" (its
    run exited 1: slower, faster, mismatch...) is a 1 too: for cron the exit code is the one
    signal, and the README promises 1 for any verdict other than reproduced."""
    outcomes = {e.outcome for e in entries}
    if "interrupted" in outcomes:
        return 130
    if outcomes & {"regression", "check failed", "invalid"}:
        return 1
    if any(e.outcome == "suspect" and e.run.code == 1 for e in entries):
        return 1
    if outcomes & {"infra", "error"}:
        return 3
    return 0


def nightly(
    targets: Sequence[Path],
    cluster: str,
    *,
    runs_dir: Path | None = None,
    history: Path | None = None,
    runner: RecipeRunner = run_recipe,
    max_usd: float | None = None,
    max_hours: float | None = None,
    yes: bool = False,
    echo: Callable[[str], Any] = lambda _line: None,
    now: float | None = None,
    attest_key: Path | None = None,
    clock: Callable[[], float] = time.time,
) -> NightlyResult:
    """Run every recipe, record each into the history, judge regressions, write the summary.

    `echo` receives the progress and summary lines (the command layer passes print). A nightly
    is unattended: on a cluster that launches paid nodes it needs `max_usd` (each run stops
    there) or `yes` (the cost accepted without a budget), else it is refused before the first
    recipe (launcher/cost/costgate.py); each run's cost header is still printed.

    `attest_key` (an ed25519 private key): every run that was measured is attested with it
    (launcher/results/attest_run.py); the key is read before the first recipe, so a bad key is bad
    input for the whole nightly, and a run that cannot be attested is said so, line by line.

    `clock`: the time a held node's TTL is checked against before each lend (a test's to set).
    """
    from launcher.cost.costgate import refuse_unattended
    from launcher.inputs.profile import load_profile
    from launcher.records.rundir import default_runs_root

    recipes = expand_targets(targets)
    profile = load_profile(cluster)  # a bad --cluster is bad input for the whole nightly: exit 2
    refuse_unattended(profile, yes=yes, max_usd=max_usd, who="a nightly")
    signing_key = None
    if attest_key is not None:
        from launcher.results.attest_keys import load_signing_key

        signing_key = load_signing_key(attest_key)  # BadInput now, before anything is paid for
    root = Path(runs_dir) if runs_dir is not None else default_runs_root()
    db_path = Path(history) if history is not None else default_history_path()
    result = NightlyResult()
    started = time.time()  # the night's start (its page shows start and end)
    db: History | None = None
    try:  # opened (and checked whole) before the first recipe: a damaged one refuses (exit 2)
        db = History(db_path)
    except HistoryUnavailable as err:
        result.history_error = str(err)
        echo(f"warning: {err} The recipes run anyway; none is recorded.")
    base = RunOptions(
        cluster=cluster,
        runs_dir=root,
        on_interrupt="cancel",
        max_usd=max_usd,
        max_hours=max_hours,
        yes=yes,
    )
    result.groups = group_by_shape(recipes, profile)
    count = [0, len(recipes)]  # recipes begun, recipes in all
    try:
        for group in result.groups:
            if not _run_group(
                group, runner, base, db, profile, result, signing_key, echo, count, clock
            ):
                break  # interrupted
    finally:
        if db is not None:
            db.close()
    result.exit_code = exit_code_of(result.entries)
    if result.exit_code == 0 and any(g.node and g.node.release_error for g in result.groups):
        result.exit_code = 3  # every run reproduced, but something the nightly made is left
    if result.history_error and result.exit_code == 0:
        result.exit_code = 3  # nothing regressed that could be seen, but the trend was not checked
    stamp = now if now is not None else time.time()
    result.summary_path = write_summary(
        root, result, profile.name, db_path, stamp, started=min(started, stamp)
    )
    echo(summary_text(result.entries))
    if result.history_error:
        echo(f"history not used: {result.history_error}")
    from launcher.pages import write_nightly_page

    try:
        result.page_path = write_nightly_page(
            root,
            result.entries,
            cluster=profile.name,
            stamp=stamp,
            exit_code=result.exit_code,
            history_path=None if result.history_error else db_path,
            started=min(started, stamp),
            groups=[v for v in map(view, result.groups) if v is not None],
        )
    except Exception as err:  # noqa: BLE001 - the page is a view; the summary above is the record
        echo(f"warning: the nightly page was not written: {err}")
    echo(
        f"summary: {result.summary_path}; page: {result.page_path}; history: {db_path}; "
        f"exit {result.exit_code}"
    )
    return result


def _run_group(
    group: Group,
    runner: RecipeRunner,
    base: RunOptions,
    db: History | None,
    profile: Profile,
    result: NightlyResult,
    signing_key: Ed25519PrivateKey | None,
    echo: Callable[[str], object],
    count: list[int],
    clock: Callable[[], float] = time.time,
) -> bool:
    """The group's recipes one after another on its node, then the node released (on every way
    out: a KeyboardInterrupt or SIGTERM anywhere in here ends in the `finally`). False when the
    nightly was interrupted. A recipe its node's TTL has no time left for starts the group's rest
    on a node of their own (a new group right after this one, in result.groups)."""
    from launcher.records.history import check_regression
    from launcher.records.rundir import new_run_id
    from launcher.runner.signals import signals_cancel

    node = group.node
    try:
        with signals_cancel():  # SIGTERM between two runs, too, ends in the release below
            if node is not None and len(group.recipes) > 1:
                echo(f"[nightly] node group {group.label}: {len(group.recipes)} recipes, one node")
            for i, recipe in enumerate(group.recipes):
                short = _ttl_left_short(node, profile, recipe, clock) if i else None
                if short is not None:
                    rest = Group(f"{group.label} (continued)", group.recipes[i:], gpus=group.gpus)
                    rest.node = HeldNode(rest.label, len(rest.recipes), rest.recipes)
                    group.recipes = group.recipes[:i]
                    if node is not None:
                        node.recipes = i
                    result.groups.insert(result.groups.index(group) + 1, rest)
                    echo(
                        f"[nightly] node group {group.label}: {short}; its next "
                        f"{len(rest.recipes)} recipe(s) go to a new node"
                    )
                    return True
                count[0] += 1
                tag = f"[nightly {count[0]}/{count[1]}]"
                echo(f"{tag} {recipe}")
                broken = node.check() if node is not None and node.lent else None
                if broken is not None:
                    run = RecipeRun(
                        recipe,
                        3,
                        None,
                        f"not run: the node of its group ({group.label}) cannot be used: {broken}",
                    )
                else:
                    run = _one(runner, recipe, replace(base, run_id=new_run_id()), node)
                if signing_key is not None:
                    echo(f"{tag} {_attest(run, signing_key)}")
                row, earlier = _record(db, recipe, run, profile, result)
                assessment = check_regression(row, earlier)
                entry = NightlyEntry(recipe, run, row, assessment, outcome_of(run, assessment))
                result.entries.append(entry)
                group.runs.append(Ran(row.run_id, row.slug, run.run_dir))
                echo(f"{tag} {row.slug}: {entry.outcome}")
                if run.error and entry.outcome != "regression":  # the whole reason, every line
                    echo(_indented(run.error))
                if run.code == 130 and not run.cancelled:  # this process was interrupted
                    return False
        return True
    finally:
        if node is not None and node.cluster is not None:
            left = node.release(echo)
            if left:
                echo(f"[nightly] node group {group.label}: the release did not finish: {left}")
            else:
                echo(f"[nightly] node group {group.label}: node released")
        for line in group_lines(group):
            echo(line)


def _ttl_left_short(
    node: HeldNode | None, profile: Profile, recipe: Path, clock: Callable[[], float]
) -> str | None:
    """Why the held node's TTL has no room left for RECIPE (launcher/cost/ttl.py), or None."""
    from launcher.cost.costgate import launches
    from launcher.cost.ttl import fits_what_is_left
    from launcher.inputs.profile import AwsProfile
    from launcher.inputs.recipe import load_recipe

    if node is None or node.acquire_started is None or node.broken is not None:
        return None
    if not isinstance(profile, AwsProfile) or not launches(profile):
        return None
    try:
        loaded = load_recipe(recipe)
    except ReproduceError:  # its own run says why
        return None
    return fits_what_is_left(loaded, profile.ttl_hours, clock() - node.acquire_started)


def _one(
    runner: RecipeRunner, recipe: Path, options: RunOptions, node: HeldNode | None
) -> RecipeRun:
    """One recipe's run; whatever it raises is its outcome (an interrupt too: 130)."""
    try:
        return runner(recipe, options, held=node)
    except KeyboardInterrupt:
        return RecipeRun(recipe, 130, None, "interrupted by the user")
    except Exception as err:  # noqa: BLE001 - one recipe's crash must not end the nightly
        return RecipeRun(
            recipe,
            3,
            None,
            f"unexpected error (a bug in reproduce?): {type(err).__name__}: {err}",
            crashed=True,
        )


def _attest(run: RecipeRun, key: Ed25519PrivateKey) -> str:
    """Attest one run's directory; the line that says how it went (never raises: one run's
    attestation must not end the nightly)."""
    if run.run_dir is None or not (run.run_dir / Files.VERDICT).is_file():
        return "not attested: the run was not measured"
    from launcher.results.attest_run import attest_directory

    try:
        done = attest_directory(run.run_dir, key)
    except ReproduceError as err:
        return f"not attested: {err}"
    return f"attested: {done['subjects']} files, signed by {done['signed_by']}, verify passes"


def _record(
    db: History | None, recipe: Path, run: RecipeRun, profile: Profile, result: NightlyResult
) -> tuple[RunRow, list[RunRow]]:
    """The run's row (its run directory's, else a failure row), recorded in the history when it
    can be, and the earlier runs it is judged against. A history that cannot be used (locked)
    is noted in the result and the row judged on its own: the nightly goes on."""
    row = None
    if run.run_dir is not None:
        try:
            row = row_from_run_dir(run.run_dir)
        except BadInput as err:
            run.error = run.error or str(err)
    if row is None:
        row = failure_row(recipe, profile.name, profile.kind, run.error or f"exit {run.code}")
    elif run.error and not row.detail:
        row.detail = _first_line(run.error)
    if db is None:
        return row, []
    try:
        db.insert(row)
        rows = db.runs(row.slug, cluster=row.cluster_name)
    except (HistoryUnavailable, HistoryDamaged) as err:  # found mid-nightly: the runs go on
        result.history_error = result.history_error or str(err)
        return row, []
    idx = next((n for n, r in enumerate(rows) if r.run_id == row.run_id), len(rows))
    return row, rows[:idx]


_HEADER = ["recipe", "outcome", "verdict", "tokens/s/GPU", "vs claim", "vs trend", "regression"]


def _cells(e: NightlyEntry) -> list[str]:
    r, a = e.row, e.assessment
    tps = fmt(r.tokens_per_s_per_gpu, missing="-")
    claim = fmt(r.difference_percent, "+.2f", missing="-", suffix="%")
    if a.trend.difference_percent is not None and a.judged:
        trend = fmt(a.trend.difference_percent, "+.2f", suffix="%")
    else:
        trend = "n/a" if a.judged else "-"
    reg = "yes" if a.regression else ("suspect" if a.suspect else ("no" if a.judged else "n/a"))
    verdict = shown(r.verdict, r.assurance) if r.verdict else "-"  # with its assurance level
    return [r.slug, e.outcome, verdict, tps, claim, trend, reg]


def summary_text(entries: Sequence[NightlyEntry]) -> str:
    return text_table(_HEADER, [_cells(e) for e in entries])


def write_summary(
    root: Path,
    result: NightlyResult,
    cluster: str,
    db_path: Path,
    stamp: float,
    *,
    started: float | None = None,
) -> Path:
    """runs/nightly-<UTC date>.md (a second nightly on the same date replaces it). `stamp`: when
    the night ended (it dates the file); `started`: when it began (its "Started" line)."""
    began = stamp if started is None else started
    date = time.strftime("%Y-%m-%d", time.gmtime(stamp))
    lines = [
        f"# Nightly {date} (cluster {cluster})",
        "",
        f"Started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(began))} UTC, ended "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(stamp))} UTC; history {db_path}; "
        f"exit code {result.exit_code}.",
        "",
        *([f"**History not used**: {result.history_error}", ""] if result.history_error else []),
        markdown_table(_HEADER, [_cells(e) for e in result.entries]),
        "",
    ]
    shared = [g for g in result.groups if g.node is not None and g.node.cluster is not None]
    if shared:  # one node per shape: what each was held for, once
        lines += ["## Node groups", ""]
        for group in shared:
            lines += ["```text", *group_lines(group), "```", ""]
    for e in result.entries:
        lines += [
            f"## {e.row.slug}",
            "",
            f"- recipe: `{e.recipe}`",
            f"- run: `{e.row.run_id}`"
            + (f" in `{e.row.run_dir}`" if e.row.run_dir else " (no run directory)"),
            f"- outcome: {e.outcome} (exit {e.run.code})",
        ]
        if e.run.error:  # whole: an invalid recipe's reason is the list of its problems
            lines += ["- error:", "", "  ```text", _indented(e.run.error, "  "), "  ```", ""]
        lines += [f"- {line.strip()}" for line in trend_lines(e.assessment)]
        lines.append("")
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"nightly-{date}.md"
    write_atomic(path, "\n".join(lines))
    return path
