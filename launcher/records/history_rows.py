"""A run directory as the history keeps it: one row, read from the files the run left.

Why its own module: the history (launcher/records/history.py) is SQLite and the regression rules;
what a
row says about a run, and which recipe the run belongs to, is read here from the run directory,
which stays the record (docs/architecture.md).

A recipe's identity is its content-derived slug (launcher/inputs/recipe.py, `Recipe.slug`). Runs
made by
an older launcher were named by the recipe file's path; such a name is kept as `legacy_slug`, and
the row is keyed on the slug of the recipe.yaml the run kept, when it has one.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.excerpt import sha256_of
from launcher.records import jsonread
from launcher.records.jsonread import Fields
from launcher.records.plan_record import RecordedPlan
from launcher.records.result_record import RecordedResult
from launcher.records.rundir import Files
from launcher.records.verdict_record import RecordedVerdict

# A content-derived slug ends with the recipe's short content hash (launcher/inputs/recipe.py).
_CONTENT_SLUG = re.compile(r"^[^/]+/[^/]+/[^/]+-[0-9a-f]{10}$")


@dataclass
class RunRow:
    """One run as the history keeps it (the columns of the `runs` table)."""

    run_id: str
    slug: str
    recipe_sha256: str | None = None
    run_dir: str | None = None
    cluster_name: str | None = None
    cluster_kind: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    state: str | None = None  # status.json's state: done | failed | cancelled | ...
    verdict: str | None = None  # verdict.json's status, None when the run was never judged
    difference_percent: float | None = None  # signed, vs the recipe's claim
    claimed_tokens_per_s_per_gpu: float | None = None
    tolerance_percent: float | None = None  # the verdict's slower tolerance
    tokens_per_s_per_gpu: float | None = None
    step_time_cv_percent: float | None = None
    mfu: float | None = None
    usd_per_million_tokens: float | None = None
    gpu_hours: float | None = None
    image: str | None = None  # repository@sha256:... (verified on the node when image.json exists)
    detail: str | None = None  # status.json's detail, or why the run never started
    recorded_at: float = 0.0
    legacy_slug: str | None = None  # the name an older launcher gave the recipe (its file path)
    measured_runs: int | None = None  # K: the figures are the mean of K measured runs (result.yaml)
    # how strong the verdict's evidence is (verdict.json's assurance.level: judge/assurance.py)
    assurance: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_json(path: Path) -> dict[str, Any] | None:
    """A run directory's JSON object, None when the file is absent; BadInput when it is no JSON
    object. Bounded (launcher/records/jsonread.py): the directory may have come from anyone, and
    a nested or huge document must cost the history one skipped run, not a traceback."""
    try:
        data = jsonread.load_file(path)
    except jsonread.NodeJSONError as err:
        raise BadInput(f"{path} is not valid JSON: {err.message}") from None
    if data is None or isinstance(data, dict):
        return data
    raise BadInput(f"{path} holds no JSON object.")


# What a column of the history table holds (sqlite3's types).
_Cell = str | int | float | bytes | None


def num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def db_value(value: _Cell) -> _Cell:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def file_sha256(path: Path) -> str | None:
    """In chunks, never through a link nor from a FIFO: a run directory's file is anyone's."""
    try:
        return sha256_of(Path(path))
    except OSError:
        return None


def row_from_run_dir(run_dir: Path) -> RunRow:
    """The history row of a run directory, from the files the run path and evaluate write:
    run.json (id, slug), status.json (state), plan.json (recipe sha256, profile, image),
    timeline.json (acquired/released), result.yaml (figures, unrounded), verdict.json (status,
    difference, tolerance), image.json (the digest verified on the node), recipe.yaml.
    """
    run_dir = Path(run_dir)
    # each file read bounded, and each value typed (jsonread.Fields): a wrong type at any key of
    # a copied-in run directory is that value missing, never an AttributeError
    run = Fields(read_json(run_dir / Files.RUN))
    if not run.word("run_id"):
        raise BadInput(f"{run_dir} is not a run directory (no run.json with a run_id).")
    status = Fields(read_json(run_dir / Files.STATUS))
    plan = RecordedPlan.of(read_json(run_dir / Files.PLAN))
    timeline = Fields(read_json(run_dir / Files.TIMELINE))
    verdict = RecordedVerdict.of(read_json(run_dir / Files.VERDICT))
    image_facts = jsonread.read(run_dir / Files.IMAGE).fields  # the node's: hostile, typed
    result = RecordedResult.read(run_dir / Files.RESULT)
    figure = result.figure

    cluster = run.obj("cluster")
    state = status.text("state")
    started = num(timeline.raw("acquired_at")) or num(run.raw("created_at"))
    ended = num(timeline.raw("released_at"))
    if ended is None and state in ("done", "failed", "cancelled"):
        ended = num(status.raw("updated_at"))
    image = image_facts.text("image") or plan.image
    claimed = verdict.claim.tokens_per_s_per_gpu if verdict.claim is not None else None
    slug, legacy = identity(run_dir, run.word("slug") or plan.slug or run_dir.parent.name)
    return RunRow(
        run_id=run.word("run_id"),
        slug=slug,
        legacy_slug=legacy,
        recipe_sha256=plan.recipe_sha256 or file_sha256(run_dir / Files.RECIPE),
        run_dir=str(run_dir.resolve()),
        cluster_name=plan.profile_name or cluster.text("name"),
        cluster_kind=plan.profile_kind or cluster.text("kind"),
        started_at=started,
        ended_at=ended,
        state=state,
        verdict=verdict.status,
        difference_percent=verdict.difference_percent,
        claimed_tokens_per_s_per_gpu=num(claimed),
        tolerance_percent=verdict.slower_percent,
        tokens_per_s_per_gpu=figure("tokens_per_s_per_gpu"),
        step_time_cv_percent=figure("step_time_cv_percent"),
        mfu=figure("mfu"),
        usd_per_million_tokens=figure("usd_per_million_tokens"),
        gpu_hours=figure("gpu_hours"),
        image=image,
        detail=status.text("detail"),
        measured_runs=result.runs,
        assurance=verdict.assurance,
    )


def is_content_slug(slug: str) -> bool:
    return bool(_CONTENT_SLUG.match(slug))


def recipe_file_slug(path: Path) -> str | None:
    """The content slug of a recipe file, read without validating it (an old or invalid recipe
    still has an identity); None when the file is not a YAML mapping at all."""
    from launcher.inputs.recipe import recipe_slug
    from launcher.inputs.yamlschema import read_yaml_mapping

    try:
        raw, _ = read_yaml_mapping(Path(path), "recipe")
    except BadInput:
        return None
    return recipe_slug(raw)


def identity(run_dir: Path, recorded: str) -> tuple[str, str | None]:
    """(slug, legacy slug) of a run: the slug it recorded when that is content-derived; else
    the slug of the recipe.yaml it kept, the recorded path-derived name becoming its legacy."""
    if is_content_slug(recorded):
        return recorded, None
    content = recipe_file_slug(Path(run_dir) / Files.RECIPE)
    return (content, recorded) if content and content != recorded else (recorded, None)


def slug_of(recipe_or_slug: str) -> str:
    """A recipe file's slug (its content's; a file that is no YAML mapping gets one from its
    name and bytes, so even a broken recipe has a history), or the argument itself as a slug."""
    path = Path(recipe_or_slug)
    if path.is_file():
        found = recipe_file_slug(path)
        if found is not None:
            return found
        digest = file_sha256(path) or "0" * 10
        return f"unreadable-recipe/{re.sub(r'[^a-z0-9.]+', '-', path.stem.lower())}-{digest[:10]}"
    name = recipe_or_slug.strip("/").removesuffix(".yaml")
    shipped = _shipped_recipe(name)
    if shipped is not None:  # a recipe's name (its path under recipes/): its content's slug
        found = recipe_file_slug(shipped)
        if found is not None:
            return found
    return name


def _shipped_recipe(name: str) -> Path | None:
    """recipes/<name>.yaml, under the current directory or the recipes shipped with reproduce:
    so a recipe is named the way its file is (qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k), not
    only by its content-hash slug."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*", name):
        return None
    from launcher.resources import data_dir

    roots = [Path("recipes")]
    try:
        roots.append(data_dir("recipes"))
    except FileNotFoundError:
        pass
    for root in roots:
        candidate = root / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None
