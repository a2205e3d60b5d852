"""The `reproduce` command line: the app, its command table, and the console entry point.

Each command is one module of launcher/commands/ named after it, holding its typer declaration
(`<name>_cmd`) and its body: run.py, validate.py, nightly.py, runs.py (`runs` and `status`),
logs.py, attach.py, cancel.py, ssh.py, measure.py, compare.py, history.py, attest.py (`attest`,
`verify`, `bundle`, `keygen`), down.py, reap.py, capacity.py, prepare.py and image.py (the
`image` group). Every option two commands take is declared once, in options.py. A command
module imports only typer, options.py and output.py at its top; what its body needs (boto3,
paramiko, ray, matplotlib, and the launcher's own heavier layers) is imported inside the body,
so `reproduce ... --dry-run` and `--help` start fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from launcher.commands import (
    attach,
    attest,
    cancel,
    capacity,
    compare,
    down,
    history,
    image,
    logs,
    measure,
    nightly,
    prepare,
    reap,
    run,
    runs,
    ssh,
    validate,
)
from launcher.commands import options as o
from launcher.commands.output import fail
from launcher.errors import ReproduceError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Reproduce a published GPU training recipe and judge whether its numbers hold.",
    pretty_exceptions_enable=False,
)


def show_version(value: bool) -> None:
    if value:
        from launcher import __version__

        print(f"reproduce {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=show_version,
        help="Print the version and exit.",
    ),
) -> None:
    """Reproduce a published GPU training recipe and judge whether its numbers hold."""


# --- the command table: `reproduce --help` shows the commands in these groups, in this order ---

COMMANDS: tuple[tuple[str, Callable[..., None] | typer.Typer, str], ...] = (
    ("run", run.run_cmd, o.RUN),
    ("validate", validate.validate_cmd, o.RUN),
    ("nightly", nightly.nightly_cmd, o.RUN),
    ("runs", runs.runs_cmd, o.WATCH),
    ("status", runs.status_cmd, o.WATCH),
    ("logs", logs.logs_cmd, o.WATCH),
    ("attach", attach.attach_cmd, o.WATCH),
    ("cancel", cancel.cancel_cmd, o.WATCH),
    ("ssh", ssh.ssh_cmd, o.WATCH),
    ("measure", measure.measure_cmd, o.JUDGE),
    ("compare", compare.compare_cmd, o.JUDGE),
    ("history", history.history_cmd, o.JUDGE),
    ("attest", attest.attest_cmd, o.ATTEST),
    ("verify", attest.verify_cmd, o.ATTEST),
    ("bundle", attest.bundle_cmd, o.ATTEST),
    ("keygen", attest.keygen_cmd, o.ATTEST),
    ("down", down.down_cmd, o.AWS),
    ("reap", reap.reap_cmd, o.AWS),
    ("capacity", capacity.capacity_cmd, o.AWS),
    ("prepare", prepare.prepare_cmd, o.ASSETS),
    ("image", image.image_app, o.ASSETS),
)
for _name, _command, _panel in COMMANDS:
    if isinstance(_command, typer.Typer):
        app.add_typer(_command, name=_name, rich_help_panel=_panel)
    else:
        app.command(_name, rich_help_panel=_panel)(_command)


def _default_to_run(argv: list[str]) -> list[str]:
    """`reproduce RECIPE ...` means `reproduce run RECIPE ...`: the first word is a file."""
    if not argv:
        return argv
    first = argv[0]
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups if g.name}
    if first.startswith("-") or first in names:
        return argv
    unknown_command(first, sorted(names))
    return ["run", *argv]


def unknown_command(word: str, names: list[str]) -> None:
    """A first word that is neither a command nor a recipe file: BadInput with "did you mean".

    A word is taken for a recipe when it could be a path: a file that exists, a name with a
    slash, or one ending in .yaml/.yml (a missing recipe file is then the run's own error)."""
    import difflib

    from launcher.errors import BadInput

    if Path(word).exists() or "/" in word or word.endswith((".yaml", ".yml")):
        return
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    if close:
        raise BadInput(
            f"unknown command {word!r}; did you mean {' or '.join(repr(c) for c in close)}?"
        )
    raise BadInput(
        f"unknown command {word!r}, and no recipe file of that name. Commands: "
        f"{', '.join(names)}; `reproduce RECIPE.yaml` runs a recipe."
    )


def main() -> None:
    """Console entry point: one clear paragraph and the documented exit code on any failure."""
    from launcher.runner.signals import report_thread_failures

    report_thread_failures()
    try:
        args = _default_to_run(sys.argv[1:])
        if "--json" in args:
            sys.exit(_main_json(args))
        app(args=args, prog_name="reproduce")
    except ReproduceError as err:  # raised outside a command body (an unknown command)
        raise SystemExit(fail(err, "--json" in sys.argv[1:]).exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        from launcher.runner.signals import settle_streams

        settle_streams()  # a reader gone (closed terminal, `| head`) must not make it 120


def _main_json(args: list[str]) -> int:
    """A `--json` command line: a usage error (an unknown option, a missing argument) is one
    JSON object on stdout too, besides the usual message on stderr."""
    # typer may vendor click: its usage errors derive from the ClickException behind BadParameter
    usage_error: type[Exception] = next(
        c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
    )
    try:
        code = app(args=args, prog_name="reproduce", standalone_mode=False)
    except usage_error as err:
        exit_code = int(getattr(err, "exit_code", 2))
        print(json.dumps({"error": _usage_text(err), "exit_code": exit_code}), flush=True)
        show = getattr(err, "show", None)
        if callable(show):
            show()
        return exit_code
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


def _usage_text(err: Exception) -> str:
    message = getattr(err, "format_message", None)
    return str(message() if callable(message) else err)
