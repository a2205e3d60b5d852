"""`reproduce runs` (and `--live`) and `reproduce status RUN`: the user's runs as a table, and one
run in detail. One module: both show the run index's summaries (launcher/records/runs.py) with
the same rows, prices and what is still billing.

launcher/records/runs.py reads run directories and launcher/clusters/aws/live.py asks AWS; this is
where their values meet the console. With `--json` exactly one JSON object goes to stdout, also
when the input is bad (`output.fail` writes the error object).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from launcher.commands import options as o
from launcher.commands.output import fail, say
from launcher.errors import BadInput, ReproduceError

if TYPE_CHECKING:
    from launcher.records.rundir import RunDir
    from launcher.records.runs import RunSummary


def runs_cmd(
    runs_dir: o.RunsDir = None,
    import_dir: o.Import = None,
    json_out: o.Json = False,
    live: bool = typer.Option(
        False,
        "--live",
        help="Instead: the instances this tool launched that still exist (by tag, in the "
        "aws profile's region).",
    ),
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    refresh: o.Refresh = False,
    cost: bool = typer.Option(
        False, "--cost", help="What the runs cost: per run, in total, by recipe and by cluster."
    ),
) -> None:
    """Every run this user made, from any directory (with --runs-dir: those under it): id, recipe, target, state, verdict, started, GPU-hours, cost so far; --live searches the --cluster profile's region."""  # noqa: E501 - typer shows its line breaks

    try:
        code = runs_command(
            runs_dir,
            json_out=json_out,
            live=live,
            cluster=cluster,
            region=region,
            import_dir=import_dir,
            refresh=refresh,
            cost=cost,
        )
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


def status_cmd(
    run: o.RunArg,
    runs_dir: o.RunsDir = None,
    json_out: o.Json = False,
    refresh: o.Refresh = False,
) -> None:
    """Where a run is: its stage, step N of M (a run nobody follows: as its node has it), elapsed, cost so far, a node still billing, where its logs are."""  # noqa: E501 - typer shows its line breaks

    try:
        code = status_command(run, runs_dir, json_out=json_out, refresh=refresh)
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


_HEADER = ["run id", "recipe", "target", "state", "verdict", "started", "GPU-h", "cost"]
_LIVE_HEADER = ["instance", "type", "state", "run id", "recipe", "up", "cost", "expires", "owner"]


# A line of these commands' output (a run's recipe, state, detail and what its node reported,
# read back from files anyone could have written) goes through the commands' one door.
_say = say


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts is not None else "-"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def vouched(found: list[RunSummary]) -> list[RunSummary]:
    """Each summary with its trust line (launcher/clusters/trust.py decides it, from the run's
    own record, in every state): every surface of these commands shows it."""
    from launcher.clusters import trust

    for s in found:
        s.unverified = trust.run_line(Path(s.run_dir))
    return found


def _target(s: RunSummary, target: str | None) -> str:
    from launcher.clusters import trust

    return (target or "-") + (f" ({trust.MARK})" if s.unverified else "")


def _row(s: RunSummary) -> list[str]:
    from launcher.pages.report import fmt

    state = s.state + (" *" if s.state not in ("done", "failed", "cancelled") else "")
    cost = _usd(s.cost_usd)
    if s.holds_node:
        state += ", node billing" + ("" if s.billing and s.billing.source == "cloud" else "?")
        cost += " so far"
    return [
        s.run_id,
        s.recipe,
        _target(s, s.target),
        state,
        s.verdict or "-",
        _when(s.started_at),
        fmt(s.gpu_hours, ",.2f", missing="-"),
        cost,
    ]


def billing_lines(found: list[RunSummary]) -> list[str]:
    """What still bills, under the table: each run holding a node, and the rate together."""
    holding = [s for s in found if s.holds_node and s.billing is not None]
    if not holding:
        return []
    rate = sum(s.billing.per_hour or 0.0 for s in holding if s.billing is not None)
    lines = [f"\nstill billing: {len(holding)} run(s) hold a node, ${rate:,.2f}/h together"]
    for s in holding:
        assert s.billing is not None
        lines.append(
            f"  {s.run_id} ({s.state}): {s.billing.words()}, {_usd(s.cost_usd)} so far; "
            f"end it: reproduce down {s.run_id}"
        )
    if any(s.billing.source != "cloud" for s in holding if s.billing is not None):
        lines.append("  ? = last known state; `reproduce runs --refresh` asks AWS")
    return lines


def _refresh(found: list[RunSummary]) -> None:
    """--refresh: the cloud's word on every aws run's instances replaces the last known one."""
    from launcher.clusters.aws.billing import refresh
    from launcher.records.runs import summarize

    answers = refresh([Path(s.run_dir) for s in found if s.kind == "aws"])
    for s in found:
        if s.run_dir in answers:
            s.billing = None
            # priced again: the answer holds the instances' own launch and end (their cost)
            s.cost_usd = summarize(Path(s.run_dir)).cost_usd
            s.with_billing(answers[s.run_dir])


def runs_command(
    runs_dir: Path | None,
    *,
    json_out: bool = False,
    live: bool = False,
    cluster: str = "aws",
    region: str | None = None,
    import_dir: Path | None = None,
    refresh: bool = False,
    cost: bool = False,
) -> int:
    """`reproduce runs`: every run this user made (the index and ./runs), or those under
    --runs-dir; `--import DIR` first enters DIR's run directories in the index; `--live`: the
    launcher's instances."""
    from launcher.clusters import trust
    from launcher.pages.report import text_table
    from launcher.records import state
    from launcher.records.rundir import default_runs_root
    from launcher.records.runs import indexed_runs, list_runs

    root = Path(runs_dir) if runs_dir is not None else default_runs_root()
    if live:
        if refresh or cost:
            raise BadInput(
                "--live lists instances (always asked of AWS): not with --refresh/--cost."
            )
        return _live(root, cluster, region, json_out)
    imported: list[str] = []
    if import_dir is not None:
        if not Path(import_dir).is_dir():
            raise BadInput(f"--import {import_dir}: no such directory (expected a runs root).")
        added, bad = state.import_runs(Path(import_dir))
        imported = [str(p) for p in added]
        if not json_out:
            _say(f"imported {len(added)} run(s) from {import_dir}/ into {state.index_dir()}/")
            for line in bad:
                _say(f"not imported: {line}")
    if runs_dir is not None:
        found, skipped = list_runs(root)
        where = f"under {root}/"
    else:
        found, skipped = indexed_runs(root)
        where = f"in {state.index_dir()}/ and under {root}/"
    vouched(found)
    if refresh:
        _refresh(found)
    if cost:
        return _cost(found, where, json_out)
    if json_out:
        body: dict[str, Any] = {
            "runs_root": str(root),
            "index": str(state.index_dir()),
            "runs": [s.to_dict() for s in found],
            "skipped": skipped,
        }
        if import_dir is not None:
            body["imported"] = imported
        print(json.dumps(body, indent=2))
        return 0
    if not found:
        _say(f"no runs {where}")
    else:
        _say(text_table(_HEADER, [_row(s) for s in found]))
        unfinished = sum(s.state not in ("done", "failed", "cancelled") for s in found)
        _say(
            f"\n{len(found)} run(s) {where}"
            + (f"; * = not finished ({unfinished}): `reproduce status RUN`" if unfinished else "")
        )
        if any(s.unverified for s in found):
            _say(trust.LEGEND)
        for line in billing_lines(found):
            _say(line)
    for line in skipped:
        _say(f"skipped {line}")
    return 0


def _cost(found: list[RunSummary], where: str, json_out: bool) -> int:
    """`runs --cost`: what every run cost, in total, by recipe and by cluster."""
    from launcher.clusters import trust
    from launcher.pages.report import fmt, text_table
    from launcher.records.billing import cost_report

    report = cost_report(found)
    if json_out:
        print(json.dumps(report, indent=2))
        return 0
    if not found:
        _say(f"no runs {where}")
        return 0
    marked = {s.run_id: s for s in found if s.unverified}
    rows = [
        [
            r["run_id"],
            r["recipe"],
            _target(marked[r["run_id"]], r["cluster"])
            if r["run_id"] in marked
            else r["cluster"] or "-",
            r["state"] + (", node billing" if r["billing"] else ""),
            fmt(r["gpu_hours"], ",.2f", missing="-"),
            _usd(r["cost_usd"]) + (" so far" if r["billing"] else ""),
        ]
        for r in report["runs"]
    ]
    _say(text_table(["run id", "recipe", "cluster", "state", "GPU-h", "cost"], rows))
    if marked:
        _say(trust.LEGEND)
    for title, group in (("recipe", report["by_recipe"]), ("cluster", report["by_cluster"])):
        _say(f"\nby {title}:")
        _say(text_table([title, "runs", "GPU-h", "cost", "note"], [_sum_row(g) for g in group]))
    _say()
    _say(text_table(["", "runs", "GPU-h", "cost", "note"], [_sum_row(report["total"])]))
    return 0


def _sum_row(line: dict[str, Any]) -> list[str]:
    notes = []
    if line["unpriced"]:
        notes.append(f"{line['unpriced']} run(s) without a price: not counted")
    if line["billing"]:
        notes.append(f"{line['billing']} still billing: growing")
    return [
        line["key"],
        str(line["runs"]),
        f"{line['gpu_hours']:,.2f}",
        _usd(line["usd"]),
        "; ".join(notes) or "-",
    ]


def _live(root: Path, cluster: str, region: str | None, json_out: bool) -> int:
    from launcher.clusters.aws.live import live_instances
    from launcher.pages.report import text_table
    from launcher.records.runs import duration

    if region is None:
        from launcher.inputs.profile import load_profile

        profile = load_profile(cluster)
        if profile.kind != "aws":
            raise BadInput(
                f"--cluster {cluster} is of kind {profile.kind}; --live lists the AWS instances "
                "this tool launched: give an aws profile or --region."
            )
        region = profile.region
    if not region:
        raise BadInput("no region: give --region or an aws profile with a region.")
    found = live_instances(region, runs_root=root)
    if json_out:
        print(json.dumps({"region": region, "instances": [i.to_dict() for i in found]}, indent=2))
        return 0
    if not found:
        _say(f"no instance launched by reproduce is running in {region}")
        return 0
    rows = [
        [
            i.instance_id,
            i.instance_type,
            i.state,
            i.run_id or "-",
            i.recipe or "-",
            duration(i.uptime_s),
            _usd(i.cost_usd),
            i.expires_at or "-",
            i.owner or "-",
        ]
        for i in found
    ]
    _say(text_table(_LIVE_HEADER, rows))
    per_hour = sum(i.price_per_hour or 0.0 for i in found if i.state in ("pending", "running"))
    _say(
        f"\n{len(found)} instance(s) in {region}, ${per_hour:,.2f}/h together while running. "
        "End one with `reproduce down RUN` (or `reproduce reap` once expired)."
    )
    return 0


def status_command(
    run: str, runs_dir: Path | None, *, json_out: bool = False, refresh: bool = False
) -> int:
    """`reproduce status RUN`: where one run is and what it has cost; a run nobody follows is
    read on its node too (the progress it has there, without taking it over)."""
    from launcher.records.rundir import RunDir
    from launcher.records.runs import summarize

    rd = RunDir.find(run, runs_dir)
    summary = vouched([summarize(rd.path)])[0]
    if refresh:
        _refresh([summary])
    note = _from_node(rd, summary)
    if json_out:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    _say("\n".join(status_lines(summary)))
    if note:
        _say(note)
    return 0


def _from_node(rd: RunDir, summary: RunSummary) -> str | None:
    """A run not over that no reproduce process follows (detached, or its launcher died): its
    step and stage as the node's log has them now. A line saying why not, when the node cannot
    be read; None when there was nothing to read."""
    from launcher.errors import ReproduceError
    from launcher.runner import runlogs

    if summary.followed or not runlogs.is_live(rd):
        return None
    try:
        update = runlogs.node_progress(rd)
    except ReproduceError as err:
        return f"node      not read ({err}); step and stage above are the run directory's copy"
    if update.step is not None:
        summary.step = update.step
    if update.stage is not None:
        summary.stage = update.stage
    summary.progress_from = "node"
    if update.skipped:  # the node's log grew past what status reads (runlogs.node_progress)
        return (
            f"node      its log grew by {update.new_bytes:,} bytes; status read "
            f"their first {runlogs.SCAN_BYTES >> 20} MiB and last {runlogs.TAIL_BYTES >> 20} MiB "
            f"({update.skipped:,} bytes between not read: a stage begun there is not seen)"
        )
    return None


def status_lines(s: RunSummary) -> list[str]:
    from launcher.pages.report import fmt
    from launcher.records.rundir import Files
    from launcher.records.runs import duration

    finished = s.state in ("done", "failed", "cancelled")
    step = "-"
    if s.step is not None:
        step = f"{s.step}" + (f" of {s.steps_total}" if s.steps_total else "")
    elif s.steps_total:
        step = f"0 of {s.steps_total}"
    follower: dict[bool, str] = {
        True: "a reproduce process follows it now",
        False: f"no reproduce process follows it: `reproduce attach {s.run_dir}`",
    }
    read = " (read from the node now)" if s.progress_from == "node" else ""
    lines = [
        f"run       {s.run_id}  ({s.recipe})",
        f"target    {s.target or '-'} (kind {s.kind or '-'})",
        *([f"trust     {s.unverified}"] if s.unverified else []),
        f"state     {s.state}" + (f": {s.detail}" if s.detail else ""),
        f"stage     {s.stage or '-'}{read}",
        f"step      {step}{read}",
        f"elapsed   {duration(s.elapsed_s)}" + ("" if finished else " (so far)"),
        f"GPU-hours {fmt(s.gpu_hours, ',.2f', missing='-')}",
        f"cost      {_usd(s.cost_usd)}"
        + (" so far" if (not finished or s.holds_node) and s.cost_usd is not None else "")
        + (" (no price recorded)" if s.cost_usd is None else ""),
        f"price     ${s.price_per_hour:,.3f}/h per node ({s.price_source or 'source not recorded'})"
        if s.price_per_hour is not None
        else "price     none recorded",
        f"verdict   {s.verdict or '-'}",
        f"run dir   {s.run_dir}",
        f"logs      {s.logs}/node.log"
        + (f", {s.logs}/{s.stage}.log" if s.stage and s.stage != "node" else ""),
    ]
    if not finished and s.state != "created":
        lines.append(f"follower  {follower[s.followed]}")
    if s.billing is not None:
        rate = s.billing.per_hour
        up = "" if s.billing.since is None else f", up {duration(time.time() - s.billing.since)}"
        lines.append(
            f"node      {s.billing.words()}{up}"
            + (f", ${rate:,.2f}/h" if rate is not None else ", no price recorded")
            + (f": still billing, end it with `reproduce down {s.run_id}`" if s.holds_node else "")
        )
    if (Path(s.run_dir) / Files.REPORT_HTML).is_file():
        lines.append(f"report    {Path(s.run_dir) / 'report.html'}")
    return lines
