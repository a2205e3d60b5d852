"""The bodies of `reproduce history` and `reproduce nightly`: printing and exit codes.

launcher/records/history.py and launcher/runner/nightly.py return values; this is where they meet
the console.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.commands.output import say
from launcher.errors import BadInput
from launcher.pages.report import history_report
from launcher.records.history import (
    History,
    assess_history,
    default_history_path,
    runs_of_recipe,
    slug_of,
)


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


def run_nightly(
    recipes: list[Path],
    cluster: str,
    *,
    runs_dir: Path | None = None,
    history: Path | None = None,
    max_usd: float | None = None,
    max_hours: float | None = None,
    yes: bool = False,
    attest_key: Path | None = None,
) -> int:
    """`reproduce nightly`: each recipe's progress and the summary table, line by line (a
    nightly runs unattended: plain lines, no live display, no question)."""
    from functools import partial

    from launcher.commands.run import ConsoleReporter
    from launcher.runner.nightly import nightly, run_recipe

    result = nightly(
        recipes,
        cluster,
        runs_dir=runs_dir,
        history=history,
        max_usd=max_usd,
        max_hours=max_hours,
        yes=yes,
        runner=partial(run_recipe, reporter=ConsoleReporter(live=False)),
        echo=say,
        attest_key=attest_key,
    )
    return result.exit_code
