"""The account's vCPU quota for the run's capacity type, read before anything is created.

Why before: most accounts hold no quota for P instances (the default is 0 vCPUs in many
regions), and a p5en needs 192. Without this step a launch would create a security group, a key
pair and a placement group, then learn from RunInstances (VcpuLimitExceeded) that it could never
have run. So the launch program reads, right after the instance type:

- the quota, Service Quotas GetServiceQuota for ec2: 'Running On-Demand P instances'
  (L-417A185B) for on-demand and reservation launches, 'All P Spot Instance Requests'
  (L-7212CCBC) for spot; both count vCPUs;
- what already runs against it: DescribeInstances of the P family, pending or running, their
  vCPUs (CpuOptions, else the catalog's count for the type), on-demand ones for the on-demand
  quota (not spot, not those in a Capacity Block), spot ones for the spot quota;

and refuses when the quota cannot hold the recipe's nodes (vCPUs per node from the instance
type's facts), with both numbers and where to ask for more. The refusal is exit 3 (InfraError),
like the VcpuLimitExceeded it prevents: the recipe and profile are valid, the account cannot hold
them now (a quota increase or another run's end changes that), and a script sees the same code
whether the shortfall is found here or by RunInstances.

Not checked: a Capacity Block (its own capacity is checked: DescribeCapacityReservations) and
instance families other than P (the recipes here run on P instances). A quota that cannot be read
(no servicequotas:GetServiceQuota or ec2:DescribeInstances permission, an endpoint that does not
answer, moto) is a warning, never a refusal: RunInstances still refuses a real shortfall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher import catalog
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.requests import Service
from launcher.clusters.aws.session import aws_said_no, error_code, error_message
from launcher.errors import InfraError

if TYPE_CHECKING:
    from types_boto3_service_quotas.type_defs import GetServiceQuotaResponseTypeDef

ON_DEMAND_P = ("L-417A185B", "Running On-Demand P instances")
SPOT_P = ("L-7212CCBC", "All P Spot Instance Requests")
ACTIVE = ["pending", "running"]


def quota_of(instance_type: str, capacity_type: str) -> tuple[str, str] | None:
    """The (code, name) of the vCPU quota a launch counts against, or None when not checked."""
    if capacity_type == "capacity-block" or not instance_type.lower().startswith("p"):
        return None
    return SPOT_P if capacity_type == "spot" else ON_DEMAND_P


def vcpu_quota(launch: Launch, api: Executor) -> None:
    """The launch program's step: refuse before anything exists when the quota is short."""
    s = launch.s
    quota = quota_of(s.instance_type, s.capacity_type)
    if quota is None:
        api.checked(
            f"skip vCPU quota: not checked for {s.capacity_type} {s.instance_type} "
            "(a Capacity Block's own capacity is checked; only P instances are counted)"
        )
        return
    code, name = quota
    facts = launch.facts or catalog.instance(s.instance_type)
    per_node = facts.vcpus if facts is not None else None
    needed = per_node * s.nodes if per_node else None
    need = f"{s.nodes} x {s.instance_type} = {needed} vCPUs" if needed else "the recipe's nodes"
    problems: list[str] = []
    answer = _read(
        api,
        "service-quotas",
        "GetServiceQuota",
        {"ServiceCode": "ec2", "QuotaCode": code},
        f"the account's vCPU quota '{name}' ({code}): {need} must fit beside what runs; "
        "refused before anything is created when it cannot",
        problems,
    )
    used, count = _in_use(launch, api, s.capacity_type, problems)
    if api.mode is Mode.PRINT:
        return
    value = _value(answer)
    if value is None or used is None or needed is None:
        why = "; ".join(problems) or "no quota value in the answer"
        _say(
            launch,
            api,
            f"warn vCPU quota '{name}' ({code}) could not be checked ({why}); the launch goes "
            "on (RunInstances refuses a real shortfall with VcpuLimitExceeded)",
        )
        return
    if used + needed > value:
        raise InfraError(
            f"the account's quota '{name}' ({code}) in {launch.region} is {value:g} vCPUs; "
            f"{used:g} are in use by {count} pending or running P instance(s) and the recipe's "
            f"{need} ({per_node} each): {used + needed:g} > {value:g}. Nothing was created.",
            hint=f"Ask AWS for at least {used + needed:g}: Service Quotas console > Amazon "
            f"EC2 > '{name}' > Request increase at account level (or `aws service-quotas "
            f"request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value {used + needed:g} --region {launch.region}`); or end the P "
            "instances that hold it, or use a Capacity Block (capacity.type capacity-block).",
        )
    _say(
        launch,
        api,
        f"ok   vCPU quota '{name}' ({code}): {value:g}; in use {used:g}, the recipe needs {needed}",
    )


def _in_use(
    launch: Launch, api: Executor, capacity_type: str, problems: list[str]
) -> tuple[float | None, int]:
    """vCPUs of the pending or running P instances that count against the same quota."""
    params: dict[str, Any] = {
        "Filters": [
            {"Name": "instance-type", "Values": ["p*"]},
            {"Name": "instance-state-name", "Values": ACTIVE},
        ]
    }
    note = "the P instances already pending or running: their vCPUs count against the quota"
    used, count = 0.0, 0
    while True:
        answer = _read(api, "ec2", "DescribeInstances", params, note, problems)
        if answer is None:
            return (None, 0) if api.mode is not Mode.PRINT or problems else (0.0, 0)
        for reservation in answer.get("Reservations") or []:
            for inst in reservation.get("Instances") or []:
                if _counts(inst, capacity_type):
                    vcpus = _vcpus(inst)
                    if vcpus is None:
                        problems.append(f"the vCPUs of {inst.get('InstanceId')} are unknown")
                        return None, count
                    used += vcpus
                    count += 1
        token = answer.get("NextToken")
        if not token:
            return used, count
        params = {**params, "NextToken": token}


def _counts(inst: dict[str, Any], capacity_type: str) -> bool:
    lifecycle = inst.get("InstanceLifecycle")
    if capacity_type == "spot":
        return lifecycle == "spot"
    return lifecycle not in ("spot", "capacity-block")


def _vcpus(inst: dict[str, Any]) -> float | None:
    cpu = inst.get("CpuOptions") or {}
    cores, threads = cpu.get("CoreCount"), cpu.get("ThreadsPerCore")
    if isinstance(cores, int) and isinstance(threads, int) and cores * threads > 0:
        return float(cores * threads)
    facts = catalog.instance(str(inst.get("InstanceType") or ""))
    return float(facts.vcpus) if facts is not None else None


def _read(
    api: Executor,
    service: Service,
    operation: str,
    params: dict[str, Any],
    note: str,
    problems: list[str],
) -> Any:
    """A lookup whose AWS refusal is a problem to report, not an error (None then)."""
    try:
        return api.read(service, operation, params, note, "", raw=True)
    except Exception as err:  # noqa: BLE001 - AWS's refusals become a warning; others go on up
        if not aws_said_no(err):
            raise
        code = error_code(err)
        problems.append(f"{operation}: {code or type(err).__name__}: {error_message(err)}")
        return None


def _value(answer: GetServiceQuotaResponseTypeDef | None) -> float | None:
    quota = answer.get("Quota") if answer else None
    value: object = quota.get("Value") if quota else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value >= 0 else None


def _say(launch: Launch, api: Executor, line: str) -> None:
    api.checked(line)
    if api.sending:
        launch.log(f"aws: {line}")
