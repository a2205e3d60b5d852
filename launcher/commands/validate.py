"""`reproduce validate RECIPE...`: each recipe against the schema and against itself."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def validate_cmd(
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
