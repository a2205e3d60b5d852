"""The launch program: the one ordered list of steps that provisions a run on AWS.

Why one list: the dry run, `--check` and the real launch must ask AWS for the same things in the
same order, and a sequence written three times drifts. Each step is written once against an
Executor, and the executor's mode decides what happens to each call (docs/aws.md, "One launch
program, three modes"):

- PRINT (the dry run): nothing is sent; each call is recorded as an ApiCall, and what only the
  launch can know comes back as a `<...>` placeholder.
- CHECK (`--check`): the read-only lookups are sent; every call that creates something is sent
  with DryRun=True (AWS checks permissions and parameters); calls that need what a DryRun did not
  create (the ingress rule, the address association, the waits) are skipped.
- SEND (the launch): everything is sent, each id written to aws.json the moment it exists.

The steps live in lookups.py and quota.py (what is read before anything is created),
provision.py (what is created, then waited for) and hostkeys.py (the SSH host key pin); the
modes in executor.py.
Nothing here imports boto3: the executor is handed a function that returns clients.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from launcher.clusters.aws import hostkeys, quota
from launcher.clusters.aws import lookups as look
from launcher.clusters.aws import provision as prov
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.settings import run_end_dir, settings_from

if TYPE_CHECKING:
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

Step = Callable[[Launch, Executor], None]


# a bake's one node needs no P-instance quota, no reservation's zone, no placement group, and
# has no nodes behind a head
_NOT_FOR_A_BAKE: tuple[Step, ...] = (
    quota.vcpu_quota,
    look.reservation_zone,
    prov.placement_group,
    prov.wait_behind_head,
)


def launch_program(launch: Launch) -> list[Step]:
    """The steps, in order: a new launch, or the targeting of an existing instance."""
    if launch.target:
        return [look.target_instance, look.target_type, prov.target_node]
    steps: list[Step] = [
        look.account,
        look.instance_type,
        quota.vcpu_quota,  # before anything is created: the account's quota can hold the nodes
        look.ami,
        look.reservation_zone,
        look.subnets,
        look.operator_address,
        prov.tag,
        prov.security_group,
        prov.open_ingress,
        prov.key_pair,
        prov.placement_group,
        prov.run_instances,
        prov.wait_running,
        prov.addresses,
        prov.wait_status_ok,
        prov.wait_ssh,
        hostkeys.host_keys,
        prov.wait_behind_head,
    ]
    if launch.bake:  # `reproduce image bake`: one non-GPU node (no P quota, zone or placement)
        return [step for step in steps if step not in _NOT_FOR_A_BAKE]
    return steps


def run(launch: Launch, api: Executor) -> Launch:
    for step in launch_program(launch):
        step(launch, api)
    return launch


def provisioning_calls(
    recipe: Recipe,
    profile: Profile,
    run_id: str,
    *,
    owner: str,
    now: datetime,
    operator_cidr: str | None = None,
    keep: bool = False,
) -> list[rq.ApiCall]:
    """Every AWS call a launch makes, in order, with placeholders for what only the launch knows.

    What the dry run prints; no credentials, no network, no boto3. `keep`: the launch keeps its
    node (no end at the run's end in its user data), as AwsCluster decides it.
    """
    s = settings_from(
        recipe, profile, run_end_watch=run_end_dir(profile, run_id, keep=keep, shared=False)
    )
    launch = Launch(
        recipe,
        s,
        run_id,
        owner,
        lambda: now,
        target=s.instance_id,
        region=s.region,
        operator_cidr=operator_cidr,
    )
    api = Executor(Mode.PRINT, s)
    run(launch, api)
    return api.printed
