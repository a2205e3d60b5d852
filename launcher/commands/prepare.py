"""`reproduce prepare RECIPE`: a recipe's assets into a store, with progress on the terminal.

On a terminal the transfers show as rich progress bars (one per file in flight); otherwise (a
log file, CI) as plain lines, at most one per file every 15 s. Ctrl-C stops every transfer at its
next chunk and exits 130; running the same command again resumes.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from launcher.commands import options as o
from launcher.commands.output import ask, fail
from launcher.commands.throttle import Throttle
from launcher.errors import BadInput, Interrupted, ReproduceError


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
        raise fail(err) from None
    raise typer.Exit(code)


DEFAULT_WORK_DIR = Path("~/.cache/reproduce/assets")


class PlainEvents:
    """Lines on stderr: what a log file or CI shows."""

    def __init__(
        self, every_s: float = 15.0, stream: Any = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.throttle = Throttle(every_s, clock)  # each file's first line is always shown
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)

    def progress(self, asset: str, path: str, done: int, total: int) -> None:
        finished = total > 0 and done >= total
        if not self.throttle.due((asset, path), force=finished):
            return
        pct = f" ({100 * done / total:.0f}%)" if total > 0 else ""
        self.say(f"{asset}: {path}: {done / 1e6:.1f} of {max(total, 0) / 1e6:.1f} MB{pct}")


class RichEvents:
    """Progress bars on a terminal, one per file in flight; lines scroll above them."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.tasks: dict[tuple[str, str], Any] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> RichEvents:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def say(self, text: str) -> None:
        self.bars.console.print(text, markup=False, highlight=False)

    def progress(self, asset: str, path: str, done: int, total: int) -> None:
        key = (asset, path)
        with self.lock:
            task = self.tasks.get(key)
            if task is None:
                task = self.bars.add_task(f"{asset}: {path}", total=total if total > 0 else None)
                self.tasks[key] = task
        self.bars.update(task, completed=done)
        if total > 0 and done >= total:
            with self.lock:
                self.tasks.pop(key, None)
            self.bars.remove_task(task)


def _yes(question: str) -> bool:
    """`--yes`: the question is still shown, and answered for the user."""
    try:
        sys.stderr.write(f"{question}y (--yes)\n")
        sys.stderr.flush()
    except OSError:
        pass
    return True


def store_of(store: str | None, cluster: str | None) -> str:
    """--store, else the profile's assets.store."""
    if store:
        return store
    if cluster:
        from launcher.inputs.profile import load_profile

        profile = load_profile(cluster)
        value = profile.assets.store
        if value:
            return str(value)
        raise BadInput(f"--cluster {cluster}: its profile sets no assets.store; give --store")
    raise BadInput(
        "give --store s3://BUCKET/PREFIX or a directory (or --cluster with assets.store)"
    )


def prepare_command(
    recipe_path: Path,
    *,
    store: str | None,
    cluster: str | None = None,
    work_dir: Path | None = None,
    rows_file: Path | None = None,
    rows_builder: str = "auto",
    threads: int = 8,
    encoder: str | None = None,
    yes: bool = False,
) -> int:
    """`reproduce prepare RECIPE --store URL`: exit 0 when every asset is in the store. What it
    would ask (pulling the training image) is asked at a terminal, answered yes by `yes`."""
    from launcher.inputs.recipe import load_recipe
    from launcher.plan.nodelib import node_module
    from launcher.prepare.assets import PrepareOptions, prepare

    if threads < 1:
        raise BadInput("--threads must be at least 1")
    recipe = load_recipe(recipe_path)
    options = PrepareOptions(
        store=store_of(store, cluster),
        work_dir=(work_dir or DEFAULT_WORK_DIR).expanduser(),
        rows_file=rows_file,
        rows_builder=rows_builder,
        encoder=encoder,
        threads=threads,
        confirm=_yes if yes else (ask if sys.stdin.isatty() and sys.stderr.isatty() else None),
    )
    hub = node_module("hf_hub")
    hub.CANCEL.clear()

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        hub.CANCEL.set()  # transfers in worker threads stop at their next chunk
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        if sys.stderr.isatty():
            with RichEvents() as events:
                done = prepare(recipe, options, events)
        else:
            done = prepare(recipe, options, PlainEvents())
    except (KeyboardInterrupt, hub.Cancelled):
        raise Interrupted(
            "interrupted; run the same command again to resume (verified files are kept, "
            "unfinished uploads continue)"
        ) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"prepare: {recipe.slug} -> {options.store}")
    for name, what in done.items():
        print(f"  {name}: {what}")
    return 0
