"""The `reproduce` command line. Thin: parse arguments, call one function, map errors to exit codes.

Heavy libraries (boto3, paramiko, ray, matplotlib) are imported inside the commands that use
them, so `reproduce ... --dry-run` starts fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.cli_ops import OPS_COMMANDS, output_file, show_version
from launcher.commands.cli_ops import fail as _fail
from launcher.commands.options import finite
from launcher.errors import ReproduceError
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Reproduce a published GPU training recipe and judge whether its numbers hold.",
    pretty_exceptions_enable=False,
)


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


# --- commands are declared below and registered at the end, by group (COMMANDS); shared options
# come from launcher/commands/options.py; keep each body a call into a module, imports lazy ---


# --- run (the default command): launcher/commands/run.py; validate: launcher/inputs/recipe.py ---


def run_cmd(
    recipe: Path = typer.Argument(..., help="Recipe file (OpenRecipes YAML, schema_version 1)."),
    cluster: o.Cluster = "local",
    dry_run: o.DryRun = False,
    check: bool = typer.Option(
        False,
        "--check",
        help="aws: send the launch's calls with DryRun=True (needs credentials); "
        "nothing is created.",
    ),
    script_out: Path | None = typer.Option(
        None,
        "--script-out",
        help="Also write the node script alone to this file.",
        callback=output_file,
    ),
    run_id: str | None = typer.Option(
        None, "--run-id", help="Run id (default: UTC timestamp + random suffix)."
    ),
    skip_preflight: bool = typer.Option(
        False, "--skip-preflight", help="Do not run the GPU preflight before training."
    ),
    instance_id: str | None = typer.Option(
        None, "--instance-id", help="aws: target this existing instance (never terminated)."
    ),
    price_per_hour: o.PricePerHour = None,
    keep: bool = typer.Option(
        False,
        "--keep",
        help="aws: keep the instance after the run (prints its cost per hour and how to end it).",
    ),
    max_usd: o.MaxUsd = None,
    max_hours: o.MaxHours = None,
    on_interrupt: o.Interrupt = o.OnInterrupt.ask,
    runs_dir: o.RunsDir = None,
    yes: o.Yes = False,
    runs: o.Runs = None,
) -> None:
    """Reproduce RECIPE on a cluster (also: `reproduce RECIPE ...`): provision, check, train,
    measure, judge, release."""
    from launcher.commands.run import run_command
    from launcher.runner.prelaunch import RunOptions

    options = RunOptions(
        cluster=cluster,
        run_id=run_id,
        skip_preflight=skip_preflight,
        instance_id=instance_id,
        price_per_hour=price_per_hour,
        keep=keep,
        max_usd=max_usd,
        max_hours=max_hours,
        on_interrupt=on_interrupt.value,
        runs_dir=runs_dir,
        yes=yes,
        runs=runs,
    )
    try:
        code = run_command(recipe, options, dry_run=dry_run, check=check, script_out=script_out)
    except ReproduceError as err:
        raise _fail(err) from None
    raise typer.Exit(code)


def validate(
    recipes: list[Path] = typer.Argument(..., help="Recipe files to check."),
) -> None:
    """Check recipes against the schema and against themselves; exit 2 when any is invalid."""
    from launcher.errors import BadInput
    from launcher.inputs.recipe import load_recipe

    bad = 0
    for path in recipes:
        try:
            recipe = load_recipe(path)
        except BadInput as err:
            bad += 1
            print(f"error: {err}", file=sys.stderr)
            continue
        print(
            f"ok: {path} ({recipe.model}, {recipe.nodes} x {recipe.gpus_per_node} "
            f"{recipe.gpu_type}, image {recipe.image.ref})"
        )
    if bad:
        raise typer.Exit(2)


# --- measurement, verdict and report: `measure`, `compare` (launcher/commands/measure.py) ---


def measure_cmd(
    log: Path = typer.Argument(
        ...,
        help="one miles log file, a run directory (one with run.json; its artifacts are "
        "written there), or a run id",
    ),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        help="the recipe whose claim is judged (default: a run directory's recipe.yaml)",
    ),
    json_out: o.Json = False,
    price_per_hour: o.PricePerHour = None,
    region: o.Region = None,
    timeline: Path | None = typer.Option(
        None, "--timeline", help="timeline.json for GPU-hours (log file only)"
    ),
    slower: float = typer.Option(
        DEFAULT_TOLERANCE_PERCENT,
        "--tolerance-slower",
        help="percent below the claim still 'reproduced'",
        callback=finite,
    ),
    faster: float = typer.Option(
        DEFAULT_TOLERANCE_PERCENT,
        "--tolerance-faster",
        help="percent above the claim still 'reproduced'",
        callback=finite,
    ),
    out: o.Out = None,
    runs: o.Runs = None,
) -> None:
    """Measure a miles log against the recipe's claim (files written to --out, or a run directory; a log file's nowhere without it). Exit 0 reproduced, 1 otherwise (mismatch included), 2 bad input or an unreadable log."""  # noqa: E501 - typer shows its line breaks
    try:
        from launcher.commands.measure import run_measure

        code = run_measure(
            log,
            recipe,
            json_out=json_out,
            price_per_hour=price_per_hour,
            region=region,
            timeline=timeline,
            slower=slower,
            faster=faster,
            out=out,
            runs=runs,
        )
    except ReproduceError as err:
        raise _fail(err, json_out) from None
    raise typer.Exit(code)


def compare_cmd(
    candidate: Path = typer.Argument(..., help="candidate run directory, run id or log"),
    reference: Path = typer.Argument(..., help="reference run directory, run id or log"),
    json_out: o.Json = False,
    allow_different: bool = typer.Option(
        False,
        "--allow-different-recipes",
        help="compare runs of two different recipes (refused otherwise)",
    ),
) -> None:
    """Both runs' figures side by side (with each verdict's assurance), then the loss-curve convergence check of CANDIDATE against REFERENCE. Exit 0 pass, 1 fail, 2 bad input or two different recipes."""  # noqa: E501 - typer shows its line breaks
    try:
        from launcher.commands.measure import run_compare

        code = run_compare(
            candidate, reference, json_out=json_out, allow_different_recipes=allow_different
        )
    except ReproduceError as err:
        raise _fail(err, json_out) from None
    raise typer.Exit(code)


# --- aws: `down`, `reap`, `capacity` (launcher/commands/aws.py) ---


def down(
    run: str = typer.Argument(
        ...,
        help="Run directory (or its aws.json), or a run id (the user's index, or the runs root).",
    ),
    runs_dir: o.RunsDir = None,
    region: o.Region = None,
) -> None:
    """End what an aws run launched (a --keep node, or what a crash left): instances, Elastic IPs, groups, key pair; --region: where to search when its aws.json cannot be read."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.aws import down_run

    try:
        down_run(run, runs_root=runs_dir, region=region)
    except ReproduceError as err:
        raise _fail(err) from None


def capacity(
    recipe: Path = typer.Argument(
        ..., help="Recipe whose instance type and node count are wanted."
    ),
    cluster: o.Cluster = "aws",
    hours: int = typer.Option(24, "--hours", help="Block length: whole days (24, 48, ...)."),
    nodes: int | None = typer.Option(
        None, "--nodes", help="Instances in the block (default: the recipe's nodes)."
    ),
    start_after: str | None = typer.Option(
        None, "--start-after", help="Earliest start (ISO, UTC)."
    ),
    end_before: str | None = typer.Option(None, "--end-before", help="Latest end (ISO, UTC)."),
    buy: str | None = typer.Option(
        None,
        "--buy",
        help="Buy this offering id. It CANNOT be cancelled; its price is printed first.",
    ),
    max_usd: o.MaxUsd = None,
    yes: o.Yes = False,
) -> None:
    """List Capacity Block offerings for RECIPE (price, start time); buy one only with --buy OFFERING_ID."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.aws import capacity_command

    try:
        capacity_command(
            str(recipe),
            cluster,
            hours=hours,
            nodes=nodes,
            start_after=start_after,
            end_before=end_before,
            buy_id=buy,
            max_usd=max_usd,
            yes=yes,
        )
    except ReproduceError as err:
        raise _fail(err) from None


# --- prepare: a recipe's assets into a store (launcher/commands/assets.py) ---


def prepare_cmd(
    recipe: Path = typer.Argument(..., help="Recipe whose assets go into the store."),
    store: str | None = typer.Option(
        None, "--store", help="s3://BUCKET/PREFIX or a directory (local or shared)."
    ),
    cluster: o.ClusterOrNone = None,
    work_dir: Path | None = typer.Option(
        None, "--work-dir", help="Local copy of the assets (default ~/.cache/reproduce/assets)."
    ),
    rows: Path | None = typer.Option(
        None, "--rows", help="Rows built elsewhere: uploaded if their sha256 is the recipe's."
    ),
    rows_builder: o.RowsBuilder = typer.Option(
        o.RowsBuilder.auto,
        "--rows-builder",
        help="auto (miles here, else the image: asked first, it is ~20 GB), host (miles here), "
        "docker (pull and run the recipe's image), or skip.",
    ),
    threads: int = typer.Option(8, "--threads", help="Files transferred in parallel."),
    test_encoder: str | None = typer.Option(
        None,
        "--test-encoder",
        help="Testing with small assets only: build the rows with a stand-in tokenizer "
        "(builtin:whitespace-test) instead of miles'; docs/assets.md.",
    ),
    yes: o.Yes = False,
) -> None:
    """Fetch RECIPE's checkpoint and dataset at their pinned revisions, build its rows, verify every hash, upload with a manifest (to --store, or the --cluster profile's assets.store); no GPU; resumable."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.assets import prepare_command

    try:
        code = prepare_command(
            recipe,
            store=store,
            cluster=cluster,
            work_dir=work_dir,
            rows_file=rows,
            rows_builder=rows_builder.value,
            threads=threads,
            encoder=test_encoder,
            yes=yes,
        )
    except ReproduceError as err:
        raise _fail(err) from None
    raise typer.Exit(code)


# --- image: the recipe's image built for multi-node (launcher/commands/image.py) ---

image_app = typer.Typer(
    no_args_is_help=True,
    help="The recipe's image: built with EFA (docs/image.md), baked into an AMI (docs/aws.md).",
)


@image_app.command("build")
def image_build_cmd(
    recipe: Path = typer.Argument(..., help="Recipe whose image (pinned by digest) is the base."),
    push: str = typer.Option(
        ..., "--push", help="REGISTRY or REGISTRY/NAMESPACE: ECR (login via boto3) or any other."
    ),
    efa_installer: Path = typer.Option(
        ..., "--efa-installer", help="The EFA installer tarball, downloaded and verified."
    ),
    efa_sha256: str = typer.Option(
        ..., "--efa-sha256", help="The installer's pinned SHA256; a file that differs is refused."
    ),
    tag: str | None = typer.Option(
        None, "--tag", help="Tag to push (default: <base tag>-efa<version>)."
    ),
    efa_version: str | None = typer.Option(
        None, "--efa-version", help="Installer version when its file name does not say it."
    ),
    record: Path | None = typer.Option(
        None,
        "--record",
        help="Record file (default: images/<recipe slug>.json beside runs/).",
        callback=output_file,
    ),
    network: o.BuildNetwork = typer.Option(
        o.BuildNetwork.default, "--network", help="docker build --network for RUN steps."
    ),
    dockerfile: Path | None = typer.Option(
        None, "--dockerfile", help="Another Dockerfile (default: the repository's)."
    ),
) -> None:
    """Build the Dockerfile FROM RECIPE's image by digest, push it, record the pushed digest and the base digest."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.image import build_command
    from launcher.prepare.image import BuildRequest

    try:
        code = build_command(
            BuildRequest(
                recipe=recipe,
                push=push,
                efa_installer=efa_installer,
                efa_sha256=efa_sha256,
                tag=tag,
                efa_version=efa_version,
                record=record,
                network=network.value,
                dockerfile=dockerfile,
            )
        )
    except ReproduceError as err:
        raise _fail(err) from None
    raise typer.Exit(code)


@image_app.command("bake")
def image_bake_cmd(
    recipe: Path = typer.Argument(..., help="Recipe whose image (pinned by digest) the AMI holds."),
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    dry_run: o.DryRun = False,
) -> None:
    """Bake an AMI holding RECIPE's image by digest, for `ami: baked` (docs/aws.md)."""
    from launcher.commands.image import bake_command
    from launcher.prepare.bake import BakeRequest

    try:
        code = bake_command(
            BakeRequest(recipe=recipe, profile=cluster, region=region), dry_run=dry_run
        )
    except ReproduceError as err:
        raise _fail(err) from None
    raise typer.Exit(code)


@image_app.command("prune")
def image_prune_cmd(
    recipe: Path | None = typer.Argument(
        None, help="Recipe whose image's baked AMIs are pruned (or --all-images)."
    ),
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    keep_newest: int = typer.Option(
        1,
        "--keep-newest",
        help="The newest available AMIs of each image that stay (1: the one runs use).",
    ),
    all_images: bool = typer.Option(False, "--all-images", help="Every image's baked AMIs."),
    dry_run: o.DryRun = False,
) -> None:
    """Remove this owner's older baked AMIs and their snapshots; the newest of each image stays (docs/aws.md)."""  # noqa: E501 - typer shows its line breaks
    from launcher.commands.image import prune_command
    from launcher.prepare.prune import PruneRequest

    req = PruneRequest(recipe, cluster, region, keep=keep_newest, all_images=all_images)
    try:
        code = prune_command(req, dry_run=dry_run)
    except ReproduceError as err:
        raise _fail(err) from None
    raise typer.Exit(code)


# --- the command table: `reproduce --help` shows the commands in these groups, in this order ---

COMMANDS: tuple[tuple[str, Callable[..., None] | None, str], ...] = (
    ("run", run_cmd, o.RUN),
    ("validate", validate, o.RUN),
    ("nightly", None, o.RUN),
    ("runs", None, o.WATCH),
    ("status", None, o.WATCH),
    ("logs", None, o.WATCH),
    ("attach", None, o.WATCH),
    ("cancel", None, o.WATCH),
    ("ssh", None, o.WATCH),
    ("measure", measure_cmd, o.JUDGE),
    ("compare", compare_cmd, o.JUDGE),
    ("history", None, o.JUDGE),
    ("attest", None, o.ATTEST),
    ("verify", None, o.ATTEST),
    ("bundle", None, o.ATTEST),
    ("keygen", None, o.ATTEST),
    ("down", down, o.AWS),
    ("reap", None, o.AWS),
    ("capacity", capacity, o.AWS),
    ("prepare", prepare_cmd, o.ASSETS),
)
_OPS: dict[str, Callable[..., None]] = dict(OPS_COMMANDS)  # declared in cli_ops.py
for _name, _command, _panel in COMMANDS:
    app.command(_name, rich_help_panel=_panel)(_command or _OPS.pop(_name))
assert not _OPS, f"commands of cli_ops.py in no group: {sorted(_OPS)}"
app.add_typer(image_app, name="image", rich_help_panel=o.ASSETS)


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
        raise SystemExit(_fail(err, "--json" in sys.argv[1:]).exit_code) from None
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
