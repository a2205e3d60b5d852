"""Every option that more than one command takes, declared once (pip's cmdoptions, SkyPilot's
flags.py): one name, one meaning, one help text, wherever it appears. A command declares its own
options only when no other command has them. The help panels `reproduce --help` groups the
commands by are here too. tests/commands/test_cli_face.py walks the command table and holds it.
"""

from __future__ import annotations

import math
import os
import stat
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from launcher.catalog import DEFAULT_REGION


def finite(value: float | None) -> float | None:
    """The callback of every number option (--max-usd, --tolerance-slower, ...): click reads
    "nan" and "inf" as floats, and a NaN limit or bound is never crossed, so such a value is a
    usage error (exit 2) naming the option, before any command body sees it (docs/architecture.md,
    "Numbers are finite"; tests/commands/test_cli_numbers.py walks every option)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"got {value}; expected a finite number")
    return value


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


# --- the groups of `reproduce --help`, by what a command is for ---

RUN = "Run"
WATCH = "Watch a run"
JUDGE = "Judge"
ATTEST = "Attest"
AWS = "AWS housekeeping"
ASSETS = "Assets and images"
PANELS = (RUN, WATCH, JUDGE, ATTEST, AWS, ASSETS)


# --- choices ---


class OnInterrupt(StrEnum):
    """What Ctrl-C does to a followed run (runner/reporter.py INTERRUPT_CHOICES, the same words)."""

    ask = "ask"
    cancel = "cancel"
    detach = "detach"


class RowsBuilder(StrEnum):
    """Who builds a recipe's rows in `prepare` (prepare/assets.py ROWS_BUILDERS)."""

    auto = "auto"
    host = "host"
    docker = "docker"
    skip = "skip"


class BuildNetwork(StrEnum):
    """`docker build --network` for an image's RUN steps (prepare/image.py NETWORKS)."""

    none = "none"
    default = "default"
    host = "host"


# --- shared options: the annotation is the declaration; a command gives only its default ---

_CLUSTER = typer.Option(
    "--cluster",
    "-c",
    help="Cluster profile: a name from env/ (local, ssh, aws, ray, slurm) or a path to a profile "
    "file.",
)
Cluster = Annotated[str, _CLUSTER]
ClusterOrNone = Annotated[str | None, _CLUSTER]  # the same option, where it may be left out

RunsDir = Annotated[
    Path | None,
    typer.Option(
        "--runs-dir",
        help="Runs root: where run directories go and run ids are looked up "
        "(default: $REPRODUCE_RUNS_DIR or ./runs).",
    ),
]
RunArg = Annotated[
    str,
    typer.Argument(
        help="Run directory, or a run id (from any directory: the user's index, or the runs root)."
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Show what would be done (the plan, the requests, what would end); change nothing.",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")]
Yes = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Go ahead without asking: accept the cost or price shown (without a terminal, a paid "
        "launch needs this or --max-usd), or end what reap lists.",
    ),
]
AllOwners = Annotated[
    bool,
    typer.Option(
        "--all-owners", help="Also end other owners' expired launches (their reproduce:owner)."
    ),
]
Key = Annotated[
    Path | None,
    typer.Option(
        "--key",
        help="The attestation key. To sign (attest, nightly): an OpenSSH or PEM ed25519 private "
        "key (default: $REPRODUCE_ATTEST_KEY, else ~/.ssh/id_ed25519; an encrypted key's "
        "passphrase from $REPRODUCE_KEY_PASSPHRASE). To verify: the signer's public key "
        "(OpenSSH .pub line; default: the attestation.pub beside it, which checks the files but "
        "not who signed).",
    ),
]
Region = Annotated[
    str | None,
    typer.Option(
        "--region",
        help=f"AWS region (default: the profile's, or the run's; for prices {DEFAULT_REGION}).",
    ),
]
MaxUsd = Annotated[
    float | None,
    typer.Option(
        "--max-usd",
        help="Spend at most this many US$: a run stops before its cost passes it, an offering "
        "that costs more is not bought; without a terminal it is the consent to cost below it.",
        callback=finite,
    ),
]
MaxHours = Annotated[
    float | None,
    typer.Option(
        "--max-hours", help="Stop a run after this many wall-clock hours.", callback=finite
    ),
]
PricePerHour = Annotated[
    float | None,
    typer.Option(
        "--price-per-hour",
        help="US$ per node-hour for cost figures (overrides the profile and the price table).",
        callback=finite,
    ),
]
Runs = Annotated[
    int | None,
    typer.Option(
        "--runs",
        help="Measured runs (default: the claim's result.runs N, the verdict on their mean; a run "
        "directory's: what it was started with). Fewer than N is judged as such, and says so.",
    ),
]
Interrupt = Annotated[
    OnInterrupt,
    typer.Option(
        "--on-interrupt",
        help="On Ctrl-C: ask (when interactive; cancel otherwise), cancel, or detach.",
    ),
]
History = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="History database (default: $REPRODUCE_HISTORY or <runs dir>/history.sqlite).",
    ),
]
Import = Annotated[
    Path | None,
    typer.Option(
        "--import",
        help="First enter every finished run directory under this runs tree in the index.",
    ),
]
Refresh = Annotated[
    bool,
    typer.Option(
        "--refresh",
        "-r",
        help="Ask AWS whether each run's instances still exist (else: last known).",
    ),
]
Node = Annotated[
    int, typer.Option("--node", help="Node K of a multi-node run (default 0, the head).")
]
Out = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Where the output goes (measure: a directory for its files; bundle: the .tar.gz).",
    ),
]
