"""More of the `reproduce` command line: following runs (attach, cancel, runs, status, logs, ssh),
their history (history, nightly), attestations and the reaper. Declarations only, as in
launcher/commands/cli.py, whose command table (COMMANDS) registers them in their groups; shared
options come from launcher/commands/options.py.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Annotated

import typer

from launcher.commands import options as o
from launcher.commands.options import finite as finite
from launcher.errors import ReproduceError
from launcher.excerpt import printable


def output_file(value: Path | None) -> Path | None:
    """The callback of every option or argument naming a file a command writes (--script-out,
    --html, --record, keygen's PATH): the file is replaced through a rename, so whatever stood at
    the path was gone, a FIFO or a device included (as root, `--script-out /dev/full` replaced
    the device node), and a link rather than what it points to. So the path must name a regular
    file or nothing, in a directory that exists; an empty path is none."""
    if value is None:
        return None
    if value.name in ("", ".", ".."):
        raise typer.BadParameter(f"got {str(value)!r}; expected the path of a file to write")
    try:
        info = os.lstat(value)
    except FileNotFoundError:
        if not value.parent.is_dir():
            raise typer.BadParameter(f"{value.parent} is not a directory") from None
        return value
    except OSError as err:
        raise typer.BadParameter(f"{value}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise typer.BadParameter(
            f"{value} is {kind}; expected a regular file to replace, or a new path"
        )
    return value


def fail(err: ReproduceError, json_out: bool = False) -> typer.Exit:
    """The error on stderr; with --json also one JSON object on stdout (its `error` field), so a
    script reading stdout always gets an object."""
    try:
        if json_out:
            from launcher.commands.runs import error_object

            print(error_object(err, err.exit_code), flush=True)
        # the message may quote the node, a log or a stranger's bundle: shown printable
        text = printable(f"error: {err}" if err.exit_code else str(err), keep="\n")
        print(text, file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP, EIO): the exit code still tells
        pass
    return typer.Exit(err.exit_code)


def show_version(value: bool) -> None:
    if value:
        from launcher import __version__

        print(f"reproduce {__version__}")
        raise typer.Exit(0)


# --- attach / cancel (launcher/commands/run.py) ---


def attach(
    run: o.RunArg,
    runs_dir: o.RunsDir = None,
    on_interrupt: o.Interrupt = o.OnInterrupt.ask,
) -> None:
    """Reattach to a run in progress: continue collecting its log where it stopped, then measure."""
    from launcher.commands.run import attach_command

    try:
        code = attach_command(run, runs_dir, on_interrupt.value)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def cancel(
    run: o.RunArg,
    runs_dir: o.RunsDir = None,
) -> None:
    """Stop a run on its node: its processes and its container (with Ray inside); nothing else."""
    from launcher.commands.run import cancel_command

    try:
        code = cancel_command(run, runs_dir)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


# --- history and nightly (launcher/commands/history.py) ---


def history_cmd(
    recipe: str | None = typer.Argument(
        None,
        help="Recipe file, its name under recipes/ (qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k) "
        "or its slug (as `reproduce runs` shows it).",
    ),
    import_dir: o.Import = None,
    json_out: o.Json = False,
    limit: int = typer.Option(
        20, "--limit", help="Show the last N runs (the trend uses all of them)."
    ),
    cluster: o.ClusterOrNone = None,
    history: o.History = None,
    runs_dir: o.RunsDir = None,
    html: Path | None = typer.Option(
        None,
        "--html",
        help="Also write the history as one self-contained HTML page to PATH.",
        callback=output_file,
    ),
) -> None:
    """Past runs of a recipe (with --cluster: those on that profile), the trend and whether the latest run is a regression (exit 1 when it is)."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.history import run_history

    try:
        code = run_history(
            recipe,
            import_dir=import_dir,
            json_out=json_out,
            limit=limit,
            db=history,
            runs_dir=runs_dir,
            cluster=cluster,
            html_out=html,
        )
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


def nightly_cmd(
    recipes: Annotated[
        list[Path],
        typer.Argument(help="Recipe files, or directories (every *.yaml under them, sorted)."),
    ],
    cluster: o.Cluster,
    runs_dir: o.RunsDir = None,
    history: o.History = None,
    max_usd: o.MaxUsd = None,
    max_hours: o.MaxHours = None,
    yes: o.Yes = False,
    key: o.Key = None,
) -> None:
    """Reproduce each recipe in turn (on aws, recipes of one node shape share one launched node), record it in the history, flag regressions; exit 0 all good, 1 any regression or failed check, 3 infra.

    --max-usd and --max-hours hold for each recipe; on a paid cluster a nightly, unattended, needs --max-usd or --yes. --key attests every measured run (as `reproduce attest`)."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.history import run_nightly

    try:
        code = run_nightly(
            recipes,
            cluster,
            runs_dir=runs_dir,
            history=history,
            max_usd=max_usd,
            max_hours=max_hours,
            yes=yes,
            attest_key=key,
        )
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


# --- what was run and what runs now: `runs`, `status` (launcher/commands/runs.py) ---


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
    from launcher.commands.runs import runs_command

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
    from launcher.commands.runs import status_command

    try:
        code = status_command(run, runs_dir, json_out=json_out, refresh=refresh)
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


# --- looking without taking over: `logs`, `ssh` (launcher/commands/logs.py) ---


def logs_cmd(
    run: o.RunArg,
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Go on printing until the run ends on its node."
    ),
    stage: str | None = typer.Option(
        None, "--stage", help="Only this stage's lines (image, assets, train, ...)."
    ),
    node: o.Node = 0,
    runs_dir: o.RunsDir = None,
) -> None:
    """A run's log: the run directory's copy and, while it runs, the rest from the node; never takes the run over (no attach, nothing written)."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.logs import logs_command

    try:
        code = logs_command(run, runs_dir, follow=follow, stage=stage, node=node)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


# --- signed evidence: attest, verify, bundle, keygen (launcher/commands/attest.py) ---


def attest_cmd(
    run: str = typer.Argument(
        ..., help="A run directory, a run id, or a `measure --out` directory."
    ),
    key: o.Key = None,
    runs_dir: o.RunsDir = None,
    json_out: o.Json = False,
) -> None:
    """Sign what a run holds and showed (in-toto statement, DSSE envelope, ed25519): writes attestation.intoto.json into it; exit 1 when its figures are not what its logs give."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.attest import run_attest

    try:
        code = run_attest(run, key, runs_dir, json_out)
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


def verify_cmd(
    target: Path = typer.Argument(
        ..., help="An attested directory, a run id, or a bundle (.tar.gz)."
    ),
    key: o.Key = None,
    json_out: o.Json = False,
) -> None:
    """Check an attestation offline: the signature, every file's sha256, then the figures and verdict measured again from the raw log; exit 0 all hold, 1 the first difference, 2 bad input."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.attest import run_verify

    raise typer.Exit(run_verify(target, key, json_out))


def bundle_cmd(
    run: str = typer.Argument(..., help="An attested directory or run id."),
    out: o.Out = None,
    runs_dir: o.RunsDir = None,
) -> None:
    """Pack an attested run (after verifying it) and its files into one .tar.gz to share (--out, default: beside the directory, .attested.tar.gz); `verify` takes it as it is."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.attest import run_bundle

    try:
        code = run_bundle(run, out, runs_dir)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def ssh_cmd(
    run: o.RunArg,
    command: list[str] | None = typer.Argument(
        None, help="A command to run there instead of a shell (after --)."
    ),
    node: o.Node = 0,
    runs_dir: o.RunsDir = None,
) -> None:
    """A shell (or `-- COMMAND`) on a node the run holds, trusting only the host key the run pinned."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.logs import ssh_command

    try:
        code = ssh_command(run, runs_dir, node=node, remote=command)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def keygen_cmd(
    path: Path = typer.Argument(
        ..., help="Where to write the private key (PATH.pub beside).", callback=output_file
    ),
) -> None:
    """Make an ed25519 key pair for attestations (OpenSSH format; never overwrites)."""
    from launcher.commands.attest import run_keygen

    try:
        code = run_keygen(path)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def reap(
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    dry_run: o.DryRun = False,
    all_owners: o.AllOwners = False,
    yes: o.Yes = False,
) -> None:
    """End your launches (instances, Elastic IPs, groups, key pairs) whose expires-at has passed, after listing them."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.aws import reap_command

    try:
        reap_command(cluster, region, dry_run=dry_run, all_owners=all_owners, yes=yes)
    except ReproduceError as err:
        raise fail(err) from None


OPS_COMMANDS = (
    ("attach", attach),
    ("cancel", cancel),
    ("history", history_cmd),
    ("logs", logs_cmd),
    ("nightly", nightly_cmd),
    ("runs", runs_cmd),
    ("ssh", ssh_cmd),
    ("status", status_cmd),
    ("attest", attest_cmd),
    ("verify", verify_cmd),
    ("bundle", bundle_cmd),
    ("keygen", keygen_cmd),
    ("reap", reap),
)
