"""`reproduce down RUN`: end what an aws run launched, by its directory, its aws.json or its id.

The AWS work itself (launcher/clusters/aws/) returns values and reports through a log callback;
this is where those lines reach the terminal.
"""

from __future__ import annotations

from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.output import Say, fail
from launcher.errors import ReproduceError


def down_cmd(
    run: str = typer.Argument(
        ...,
        help="Run directory (or its aws.json), or a run id (the user's index, or the runs root).",
    ),
    runs_dir: o.RunsDir = None,
    region: o.Region = None,
) -> None:
    """End what an aws run launched (a --keep node, or what a crash left): instances, Elastic IPs, groups, key pair; --region: where to search when its aws.json cannot be read."""  # noqa: E501 - typer shows its line breaks

    try:
        down_run(run, runs_root=runs_dir, region=region)
    except ReproduceError as err:
        raise fail(err) from None


def down_run(
    ref: str, *, runs_root: Path | None = None, region: str | None = None, say: Say = print
) -> list[str]:
    """`reproduce down RUN`: RUN is a run directory, its aws.json, or a run id in the runs root.

    `region` is used when aws.json cannot be read and no other record names the region.
    """
    from launcher.clusters.aws.down import down
    from launcher.records.rundir import Files

    path = Path(ref)
    if not (path.is_file() or (path / Files.AWS).is_file()):
        from launcher.records.rundir import RunDir

        path = RunDir.find(ref, runs_root).path
    ended = down(path, log=say, region=region)
    say(
        f"aws: ended {', '.join(ended)}"
        if ended
        else "aws: nothing of this run was still allocated"
    )
    return ended
