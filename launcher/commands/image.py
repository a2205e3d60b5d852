"""The bodies of `reproduce image build`, `bake` and `prune`: progress on stderr as it
comes, the result on stdout.

stdout carries only what a script or a person needs afterwards: the pushed reference, what it
was built FROM, the record, and the profile lines that make a run use it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from launcher.prepare.bake import BakeRequest
from launcher.prepare.image import BuildRequest, build_and_push
from launcher.prepare.prune import PruneRequest


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # a closed terminal never stops a build that is under way
        pass


def build_command(req: BuildRequest, *, ecr_client: Any = None) -> int:
    result = build_and_push(req, say=_say, ecr_client=ecr_client)
    record = Path(result.record_path).resolve()
    base = result.record["base"]
    print(f"image     {result.ref}")
    print(f"built     FROM {result.base_ref} (the recipe's {base['recipe_field']})")
    print(f"record    {record}")
    print("use it in a cluster profile (schema/profile.schema.yaml):")
    print("  image:")
    print(f"    record: {record}")
    return 0


def bake_command(req: BakeRequest, *, dry_run: bool = False) -> int:
    """`reproduce image bake`: the dry run prints the requests (nothing sent); the bake prints
    its progress on stderr and the AMI id and how to use it on stdout."""
    import json

    from launcher.clusters.aws import to_jsonable
    from launcher.prepare.bake import Bake, bake, state_dir_for
    from launcher.prepare.bake import dry_run as bake_dry_run

    job = Bake.read(req)  # bad input: BadInput (exit 2) before anything is asked or created
    t = job.target
    if dry_run:
        calls, commands = bake_dry_run(job)
        print(f"# bake      {t.image_ref} onto an AMI made from {t.base_ami}")
        print(
            f"# instance  1 x {t.settings.instance_type} (on-demand, no GPU), region "
            f"{t.settings.region or '<the session region>'}; ended whatever happens"
        )
        print(f"# bake id   {job.run_id}; aws.json under {state_dir_for(job, req.runs_root)}")
        print("# ---- requests (boto3, in order; no credentials used or shown) ----")
        print(json.dumps(to_jsonable(calls), indent=2, sort_keys=False))
        print("# ---- on the instance, over SSH (after the launch, before CreateImage) ----")
        for command in commands:
            print(command)
        print(
            "# ---- then, always: TerminateInstances, ReleaseAddress, DeleteSecurityGroup, "
            "DeleteKeyPair (the run's teardown); after a failure past CreateImage also "
            "DeregisterImage and DeleteSnapshot ----"
        )
        return 0
    from launcher.errors import Interrupted
    from launcher.runner.signals import release_hard, signals_cancel

    try:
        with signals_cancel():  # Ctrl-C, SIGTERM, SIGHUP: the instance is still ended
            result = bake(
                job,
                state_dir=state_dir_for(job, req.runs_root),
                log=_say,
                release=lambda cluster: release_hard(cluster, _say),
            )
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted: the bake's teardown ran (its lines above say what was ended)"
        ) from None
    print(f"ami       {result.image_id} ({result.region}, {result.name})")
    print(f"image     {result.image_ref} (tag reproduce:image-digest={result.digest})")
    print(f"base      {result.base_ami}")
    print("use it in the aws profile (a run then finds the newest such AMI by the digest):")
    print("  ami: baked")
    return 0


def prune_command(
    req: PruneRequest, *, dry_run: bool = False, session: Any = None, say: Any = _say
) -> int:
    """`reproduce image prune`: the plan on stdout, one line per AMI (keep / remove / left alone
    and why), then what was removed and what it saves; what could not be removed is exit 3."""
    from launcher.clusters.aws.prune import SNAPSHOT_USD_PER_GB_MONTH
    from launcher.errors import InfraError
    from launcher.prepare.prune import PruneJob, prune
    from launcher.records.rundir import owner

    job = PruneJob.read(req)  # bad input: BadInput (exit 2) before anything is asked
    me = owner()
    result = prune(job, owner=me, dry_run=dry_run, session=session, log=say)
    p = result.plan
    print(
        f"baked AMIs of {result.scope} image in {result.region}: {len(p.keep) + len(p.remove)} "
        f"of {me}'s (keeping the newest {job.keep} of each image), {len(p.left)} left alone"
    )
    for ami in p.keep:
        print(f"  keep    {ami.image_id}  {ami.created}  {ami.name}")
    verb = "would remove" if dry_run else "remove"
    for ami in p.remove:
        what = f"{ami.state}, snapshots {', '.join(ami.snapshots) or 'none'}"
        print(f"  {verb:<7} {ami.image_id}  {ami.created}  {ami.name}  ({what})")
    for ami, why in p.left:
        print(f"  left    {ami.image_id}  {ami.created}  {ami.name}  ({why})")
    gone = p.remove if dry_run else result.removed
    size = sum(a.size_gb for a in gone)
    saving = f"up to {size} GB of snapshots, up to ${size * SNAPSHOT_USD_PER_GB_MONTH:.2f} a month"
    if dry_run:
        print(f"dry run: nothing removed; removing them would free {saving}")
    elif gone:
        print(f"removed {len(gone)} AMI(s) and their snapshots: {saving}")
    else:
        print("nothing to remove")
    if result.left:
        raise InfraError(
            "prune could not remove: " + "; ".join(result.left) + f" (region {result.region})."
        )
    return 0
