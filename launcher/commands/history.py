"""`reproduce history [RECIPE]`: a recipe's past runs, their trend, and whether the latest is a
regression.

launcher/records/history.py returns values; this is where they meet the console.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from launcher.commands import options as o
from launcher.commands.options import output_file
from launcher.commands.output import fail, say
from launcher.errors import BadInput, ReproduceError


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


def run_history(
    recipe_or_slug: str | None,
    *,
    import_dir: Path | None = None,
    json_out: bool = False,
    limit: int = 20,
    db: Path | None = None,
    runs_dir: Path | None = None,
    cluster: str | None = None,
    html_out: Path | None = None,
) -> int:
    """`reproduce history`: exit 0, or 1 when the latest run is a regression."""
    from launcher.pages.report import history_report
    from launcher.records.history import (
        History,
        assess_history,
        default_history_path,
        runs_of_recipe,
        slug_of,
    )

    if limit < 1:
        raise BadInput(f"--limit must be at least 1, got {limit}.")
    path = db if db is not None else default_history_path()
    imported: dict[str, Any] | None = None
    # a query makes no file: only --import (or a run's end) creates the database
    with History(path, create=import_dir is not None) as hist:
        if import_dir is not None:
            recorded, skipped = hist.import_runs(import_dir)
            imported = {
                "from": str(import_dir),
                "recorded": [r.run_id for r in recorded],
                "skipped": skipped,
            }
            if not json_out:
                say(f"recorded {len(recorded)} run(s) from {import_dir} into {hist.path}")
                for line in skipped:
                    say(f"skipped {line}")
            if recipe_or_slug is None:
                if json_out:
                    print(json.dumps({"history": str(hist.path), "import": imported}, indent=2))
                return 0
        if recipe_or_slug is None:
            raise BadInput("give a recipe (file or slug), or --import RUNS_DIR.")
        slug = slug_of(recipe_or_slug)
        all_rows = runs_of_recipe(hist, slug, runs_dir=runs_dir, cluster=cluster)
    assessment = assess_history(all_rows)
    page = None
    if html_out is not None:  # every row: each run is assessed against those before it
        from launcher.pages import write_history_page

        try:
            page = write_history_page(html_out, slug, all_rows, history_path=path)
        except OSError as err:
            raise BadInput(f"--html {html_out}: cannot write it: {err.strerror or err}") from None
    shown = all_rows[-limit:]
    if json_out:
        out = {
            "slug": slug,
            "history": str(path),
            "runs": [r.to_dict() for r in shown],
            "latest": assessment.to_dict() if assessment else None,
            "html": str(page) if page else None,
        }
        if imported is not None:
            out["import"] = imported
        print(json.dumps(out, indent=2))
    else:
        say(history_report(slug, shown, assessment), end="")
        if page is not None:
            say(f"history page: {page}")
    return 1 if assessment is not None and assessment.regression else 0
