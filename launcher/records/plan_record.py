"""plan.json read back, once, into a typed record: what the history row, `runs` and the run
page read of what a run was planned as.

Why a record: plan.json is written by the launcher (plan/plan.py, Plan.to_dict), but a run
directory read back may have been copied in from anyone or written by an older launcher, and
each reader picked its keys and checked their types on its own. Here each field is read once,
of its type or None. What quotes the file as written (an attestation) still reads the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.records.jsonread import Fields


@dataclass(frozen=True)
class RecordedPlan:
    """One plan.json as read back; every field None (or empty) where the file lacks it."""

    run_id: str | None = None
    slug: str | None = None  # the recipe's slug, as the plan recorded it
    recipe_sha256: str | None = None  # the recipe file's sha256
    profile_name: str | None = None
    profile_kind: str | None = None  # the cluster kind the run was planned on
    image: str | None = None  # the image the recipe pins (repository@digest)
    nodes: int | float | None = None
    gpus_per_node: int | float | None = None
    assets: tuple[tuple[str, object], ...] = ()  # name -> where it is, as written
    measured_runs: int | None = None  # result.runs as the run accepted it (`runs.measured`)

    @classmethod
    def of(cls, document: object) -> RecordedPlan:
        """The record of a decoded plan.json (anything else: a plan with nothing recorded)."""
        plan = Fields(document)
        recipe, profile = plan.obj("recipe"), plan.obj("profile")
        assets = plan.raw("assets")
        runs = plan.obj("runs").raw("measured")
        return cls(
            run_id=plan.word("run_id") or None,
            slug=recipe.word("slug") or None,
            recipe_sha256=recipe.text("sha256"),
            profile_name=profile.text("name"),
            profile_kind=profile.text("kind"),
            image=plan.text("image"),
            nodes=plan.number("nodes"),
            gpus_per_node=plan.number("gpus_per_node"),
            assets=tuple((str(k), v) for k, v in assets.items())
            if isinstance(assets, dict)
            else (),
            measured_runs=runs if isinstance(runs, int) and not isinstance(runs, bool) else None,
        )
