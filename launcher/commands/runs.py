"""The bodies of `reproduce runs` (and `--live`) and `reproduce status RUN`: tables and JSON.

launcher/records/runs.py reads run directories and launcher/clusters/aws/live.py asks AWS; this is
where their
values meet the console. With `--json` exactly one JSON object goes to stdout, also when the
input is bad (launcher/commands/cli.py writes the error object).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.pages.report import fmt, text_table
from launcher.records.rundir import Files
from launcher.records.runs import RunSummary, duration, list_runs, summarize

_HEADER = ["run id", "recipe", "target", "state", "verdict", "started", "GPU-h", "cost"]
_LIVE_HEADER = ["instance", "type", "state", "run id", "recipe", "up", "cost", "expires", "owner"]


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts is not None else "-"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _row(s: RunSummary) -> list[str]:
    state = s.state + (" *" if s.state not in ("done", "failed", "cancelled") else "")
    return [
        s.run_id,
        s.recipe,
        s.target or "-",
        state,
        s.verdict or "-",
        _when(s.started_at),
        fmt(s.gpu_hours, ",.2f", missing="-"),
        _usd(s.cost_usd),
    ]


def runs_command(
    runs_dir: Path | None,
    *,
    json_out: bool = False,
    live: bool = False,
    cluster: str = "aws",
    region: str | None = None,
) -> int:
    """`reproduce runs`: every run under the runs root; `--live`: the launcher's instances."""
    from launcher.records.rundir import default_runs_root

    root = Path(runs_dir) if runs_dir is not None else default_runs_root()
    if live:
        return _live(root, cluster, region, json_out)
    found, skipped = list_runs(root)
    if json_out:
        print(
            json.dumps(
                {"runs_root": str(root), "runs": [s.to_dict() for s in found], "skipped": skipped},
                indent=2,
            )
        )
        return 0
    if not found:
        print(f"no runs under {root}/")
    else:
        print(text_table(_HEADER, [_row(s) for s in found]))
        unfinished = sum(s.state not in ("done", "failed", "cancelled") for s in found)
        print(
            f"\n{len(found)} run(s) under {root}/"
            + (f"; * = not finished ({unfinished}): `reproduce status RUN`" if unfinished else "")
        )
    for line in skipped:
        print(f"skipped {line}")
    return 0


def _live(root: Path, cluster: str, region: str | None, json_out: bool) -> int:
    from launcher.clusters.aws.live import live_instances

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
        print(f"no instance launched by reproduce is running in {region}")
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
    print(text_table(_LIVE_HEADER, rows))
    per_hour = sum(i.price_per_hour or 0.0 for i in found if i.state in ("pending", "running"))
    print(
        f"\n{len(found)} instance(s) in {region}, ${per_hour:,.2f}/h together while running. "
        "End one with `reproduce down RUN` (or `reproduce reap` once expired)."
    )
    return 0


def status_command(run: str, runs_dir: Path | None, *, json_out: bool = False) -> int:
    """`reproduce status RUN`: where one run is and what it has cost."""
    from launcher.records.rundir import RunDir

    summary = summarize(RunDir.find(run, runs_dir).path)
    if json_out:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    print("\n".join(status_lines(summary)))
    return 0


def status_lines(s: RunSummary) -> list[str]:
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
    lines = [
        f"run       {s.run_id}  ({s.recipe})",
        f"target    {s.target or '-'} (kind {s.kind or '-'})",
        f"state     {s.state}" + (f": {s.detail}" if s.detail else ""),
        f"stage     {s.stage or '-'}",
        f"step      {step}",
        f"elapsed   {duration(s.elapsed_s)}" + ("" if finished else " (so far)"),
        f"GPU-hours {fmt(s.gpu_hours, ',.2f', missing='-')}",
        f"cost      {_usd(s.cost_usd)}"
        + ("" if finished or s.cost_usd is None else " so far")
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
    if (Path(s.run_dir) / Files.REPORT_HTML).is_file():
        lines.append(f"report    {Path(s.run_dir) / 'report.html'}")
    return lines


def error_object(err: Any, exit_code: int) -> str:
    """The one JSON object a `--json` command prints when it fails."""
    return json.dumps({"error": str(err), "exit_code": exit_code})
