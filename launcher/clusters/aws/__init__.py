"""`--cluster aws`: EC2 GPU instances launched (or targeted) for one run, and ended again.

The package is split by phase (docs/aws.md has the full picture):

    settings.py   the profile's aws fields, checked once (AwsSettings)
    requests.py   the request bodies and tags, pure data (ApiCall)
    program.py    the launch program: ONE ordered list of steps (lookups.py, provision.py,
                  hostkeys.py: the SSH host key pinned from the console's fingerprints)
    executor.py   its three modes: print (dry run), DryRun=True (--check), send (launch)
    session.py    credentials, region, account, AWS errors in the launcher's words, the call record
    cluster.py    AwsCluster: acquire / transport / release; check (--check)
    ownership.py  what is this launch's: found by tag, and checked by tag before anything ends
    teardown.py   the one teardown (release, down and reap all use it)
    down.py       down (one run, from its directory) and reap (whatever has expired)
    state.py      run_dir/aws.json, written the moment each resource exists, and the launcher's
                  own record of each launch (outside every run directory)
    capacity.py   Capacity Block offerings and purchase
    prices.py     the run's price from AWS (Price List API, spot history, a block's fee)
    quota.py      the account's vCPU quota for the capacity type, read before anything is made
    bake.py       `reproduce image bake`'s AWS part: CreateImage of an instance that pulled the
                  image, its wait, a half-made AMI removed (`ami: baked` finds the AMI: lookups.py)
    prune.py      `reproduce image prune`'s rule: which baked AMIs are old, removed AMI first

Importing the package (and the dry run's provisioning_calls) imports no boto3 and no paramiko:
the backend's clients are made only when a real run or `--check` needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.clusters.aws.program import provisioning_calls
from launcher.clusters.aws.requests import ApiCall, to_jsonable
from launcher.clusters.contract import (
    NULL,
    Backend,
    RecordField,
    WithDryRunSection,
    WithLivePrice,
    WithMultiNode,
    WithNodeShape,
    WithProvisioning,
    WithReadyCheck,
)
from launcher.inputs.profile import AwsProfile
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from datetime import datetime

    from launcher.catalog import Price
    from launcher.clusters.aws.cluster import AwsCluster
    from launcher.clusters.base import LaunchOptions
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe
    from launcher.plan.plan import Plan

__all__ = ["BACKEND", "ApiCall", "AwsBackend", "provisioning_calls", "to_jsonable"]


class AwsBackend(
    Backend,
    WithReadyCheck,
    WithLivePrice,
    WithNodeShape,
    WithMultiNode,
    WithProvisioning,
    WithDryRunSection,
):
    """`kind: aws`: EC2 nodes launched for a run (or targeted), and ended again."""

    kind = "aws"
    record_fields: ClassVar[Mapping[str, RecordField]] = {
        "state_path": RecordField((str, NULL)),  # aws.json; null: found by the run's tags
        "region": RecordField((str, NULL)),
        "run_id": RecordField((str,)),  # the tag every resource of the run carries
        "launch_id": RecordField((str, NULL)),
        "keep": RecordField((bool,)),  # a kept node is not ended by a release
        "target": RecordField((str, NULL)),  # an existing instance: never terminated
        "ssh": RecordField((dict,)),
        "run_end_grace_s": RecordField((int, float, NULL), optional=True),  # older records
    }

    def from_plan(
        self,
        plan: Plan,
        options: LaunchOptions,
        run_dir: Path,
        *,
        log: Callable[[str], object] = print,
    ) -> AwsCluster:
        """The cluster for a new run. The state goes to run_dir/aws.json and the calls sent to
        run_dir/aws-calls.jsonl; `log` receives the launch's progress lines."""
        from launcher.clusters.aws.cluster import AwsCluster

        return AwsCluster(
            plan.recipe,
            plan.profile,
            plan.run_id,
            keep=options.keep,
            shared=options.shared,
            instance_id=plan.profile.instance_id if isinstance(plan.profile, AwsProfile) else None,
            owner=options.owner,
            price_per_hour=options.price_per_hour,
            state_path=Path(run_dir) / Files.AWS,
            log=log,
        )

    def from_record(
        self,
        record: Mapping[str, Any],
        run_dir: Path | None = None,
        *,
        log: Callable[[str], object] = print,
    ) -> AwsCluster:
        """The cluster of a recorded run (run.json): transports to its nodes, a release to end
        them. `run_dir`: where the record was read, which its aws.json path is read against."""
        from launcher.clusters.aws.cluster import AwsCluster

        return AwsCluster.from_record(record, run_dir=run_dir, log=log)

    def provisioning(
        self,
        recipe: Recipe,
        profile: Profile,
        run_id: str,
        *,
        owner: str,
        now: datetime,
        keep: bool,
    ) -> tuple[ApiCall, ...]:
        """The EC2 requests of the launch, in order (program.py), built offline."""
        return tuple(provisioning_calls(recipe, profile, run_id, owner=owner, now=now, keep=keep))

    def target_instance(self, profile: Profile, instance_id: str) -> Profile:
        """--instance-id: a run on this instance, which the run never terminates."""
        return profile.with_overrides(instance_id=instance_id)

    def dry_run_section(self, plan: Plan, price: Price | None) -> list[str]:
        """The price lookup a real run sends before its cost is shown (unless the user gave the
        price), then the provisioning requests, both from the definitions the launch uses."""
        import json

        lines = price_lookup_lines(plan.recipe, plan.profile, price)
        if plan.provisioning:
            lines += [
                "",
                "# ---- provisioning requests (boto3, in order; no credentials used or shown) ----",
                json.dumps(to_jsonable(list(plan.provisioning)), indent=2, sort_keys=False),
            ]
        return lines

    def check_ready(self, profile: Profile) -> None:
        """Credentials and a known region, checked before the run directory exists: without
        them BadInput, and nothing is made. No AWS call."""
        from launcher.clusters.aws.session import make_session

        make_session(profile.region)

    def node_shape(self, recipe: Recipe, profile: Profile) -> str:
        """Every launch setting (instance type, region, capacity, AMI, volume, ...): two recipes
        share a node only when their launches would be the same."""
        import json
        from dataclasses import asdict

        from launcher.clusters.aws.settings import settings_from

        s = settings_from(recipe, profile)
        return f"{s.instance_type} {s.region} {s.capacity_type} " + json.dumps(
            asdict(s), sort_keys=True, default=str
        )

    def live_price(
        self, recipe: Recipe, profile: Profile, fallback: Price | None
    ) -> tuple[Price | None, str | None]:
        """The run's price looked up from AWS before its cost is shown; the catalog's
        (`fallback`) and why, when the lookup fails."""
        from launcher.clusters.aws.prices import live_price

        return live_price(recipe, profile, fallback)


BACKEND = AwsBackend()


def price_lookup_lines(recipe: Recipe, profile: Profile, price: Price | None) -> list[str]:
    """The price lookup a real run sends before its cost is shown (no price given by the user):
    printed like the provisioning requests, from the same definition."""
    import json

    if price is not None and price.source in ("option", "profile"):
        return []
    from launcher.clusters.aws.prices import request
    from launcher.clusters.aws.settings import settings_from

    s = settings_from(recipe, profile)
    call = request(
        s.instance_type, s.region or "<the profile's region>", s.capacity_type, s.nodes, None
    )
    have = f"${price.value:g}/h" if price is not None else "NO PRICE"
    return [
        "",
        "# ---- price lookup (sent before the cost is shown; it decides the run's price, "
        f"recorded in run.json; if it fails: the catalog's {have} above, with a warning) ----",
        json.dumps(to_jsonable([call]), indent=2, sort_keys=False),
    ]
