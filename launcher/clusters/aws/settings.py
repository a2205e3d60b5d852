"""The aws fields of a profile, read and checked once, and whether an instance type fits a recipe.

Why here and checked early: every mistake a user can fix in the profile (a wrong AMI form, a
reservation without its id, SSH opened to the world) is refused with the field named before any
call is printed or sent. See docs/aws.md for the fields themselves.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from launcher.catalog import InstanceType
from launcher.errors import BadInput
from launcher.inputs.profile import AwsProfile, Profile

if TYPE_CHECKING:
    from launcher.inputs.recipe import Image, Recipe

DEFAULT_USER = "ubuntu"  # the DLAMI's login user
DEFAULT_AMI = (
    "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
BAKED = "baked"  # `ami: baked`: the AMI `reproduce image bake` made for the run's image
CAPACITY_TYPES = ("on-demand", "reservation", "capacity-block", "spot")
EFA_LAYOUTS = ("efa-primary", "ena-primary")
MAX_TTL_HOURS = 168.0  # a week: an instance nobody ends still ends itself (schema: ttl_hours)
WIDEST_SSH_PREFIX = {4: 16, 6: 48}  # ssh_cidr may not open SSH to more than a /16 or a /48
GP3_MIBS_PER_IOPS = 0.25  # gp3: at most 0.25 MiB/s of throughput per provisioned IOPS (EBS)


@dataclass(frozen=True)
class AwsSettings:
    """The aws fields of a profile, with the recipe's defaults filled in and checked."""

    region: str | None
    instance_type: str
    nodes: int
    ami: str
    subnet_id: str | None
    key_name: str | None
    identity_file: str | None
    ssh_cidr: str | None
    capacity_type: str
    reservation_id: str | None
    max_spot_price: float | None
    ttl_hours: float
    root_volume_gb: int
    root_volume_throughput: int  # MiB/s, gp3's Ebs.Throughput: docker's image store is on it
    root_volume_iops: int  # gp3's Ebs.Iops: at least 4 per MiB/s of the throughput
    efa_layout: str
    extra_tags: dict[str, str]
    port: int
    user: str
    connect_host: str | None
    connect_timeout_s: float
    elastic_ip: bool
    self_terminate: bool
    ready_timeout_s: float
    price_per_hour: float | None
    instance_id: str | None = None
    known_hosts: str | None = None
    host_key_fingerprint: str | None = None
    accept_unknown_host: bool = False
    host_key_wait_s: float = 120.0
    # `ami: baked`: the image the run uses (the profile's built image, else the recipe's), whose
    # digest finds the AMI `reproduce image bake` made (its reproduce:image-digest tag)
    image_ref: str | None = None
    image_digest: str | None = None
    volume_initialization_rate: int | None = None  # MiB/s (RunInstances' root volume)
    # the image the instance starts pulling as it boots (its user data), None where its AMI holds
    # it (`ami: baked`) or the profile pulls nothing (docker.pull: false)
    prepull_ref: str | None = None
    # the node run directory whose end (its exit_code) ends the instance run_end_grace_s later
    # (its user data, requests.py); None: --keep, a nightly's shared node, no self_terminate
    run_end_watch: str | None = None
    run_end_grace_s: float = 600.0

    @property
    def ami_is_ssm(self) -> bool:
        return self.ami.startswith("ssm:")

    @property
    def ami_is_baked(self) -> bool:
        return self.ami == BAKED

    @property
    def ssm_parameter(self) -> str:
        return self.ami[len("ssm:") :]


def run_end_dir(profile: Profile, run_id: str, *, keep: bool, shared: bool) -> str | None:
    """The node run directory whose end ends the instance (docs/operator.md, "A node bills only
    while a run needs it"): the run's own (plan.py's `<work_dir>/runs/<run id>`), unless the
    user asked to keep the node, a nightly lends it to several runs, it does not end itself at
    all (self_terminate false) or it is not the launcher's (instance_id)."""
    if keep or shared or not isinstance(profile, AwsProfile):
        return None
    if not profile.self_terminate or profile.instance_id:
        return None
    return f"{profile.work_dir.rstrip('/') or ''}/runs/{run_id}"


def settings_from(
    recipe: Recipe, profile: Profile, *, run_end_watch: str | None = None
) -> AwsSettings:
    """Read and check the aws fields; BadInput names the field for anything that cannot work.
    `run_end_watch`: `run_end_dir`'s answer for a launch (None: the instance waits for its TTL)."""
    where = f"profile {profile.path}"
    if not isinstance(profile, AwsProfile):
        raise BadInput(f"{where}: kind {profile.kind}; expected a profile of kind aws.")
    instance_type = profile.instance_type or recipe.instance_type
    if not instance_type:
        raise BadInput(
            f"{recipe.path}: gpu.instance names no instance type and the profile sets no "
            "instance_type; expected e.g. `instance_type: p5en.48xlarge` in the aws profile."
        )
    provider = getattr(recipe, "provider", None)
    if not profile.instance_type and provider not in (None, "aws"):
        raise BadInput(
            f"{recipe.path}: gpu.instance is {recipe.hardware.instance!r}, not an AWS "
            "instance; set instance_type in the aws profile to the EC2 type to use."
        )
    ami = profile.ami or DEFAULT_AMI
    check_ami_form(where, "ami", ami, baked_allowed=True)
    run = run_image(recipe, profile)
    image = run if ami == BAKED else None
    prepull = run.ref if ami != BAKED and profile.docker.pull else None
    ctype = profile.capacity.type
    reservation_id = profile.capacity.reservation_id
    _check_capacity(where, ctype, reservation_id)
    layout = profile.efa_layout
    if layout not in EFA_LAYOUTS:
        raise BadInput(f"{where}: efa_layout {layout!r}; expected one of {', '.join(EFA_LAYOUTS)}.")
    cidr = profile.ssh_cidr
    if cidr is not None:
        cidr = _check_cidr(str(cidr), f"{where}: ssh_cidr")
    if profile.instance_id and int(recipe.nodes) > 1:
        raise BadInput(
            f"{where}: instance_id targets one existing instance, but the recipe needs "
            f"{recipe.nodes} nodes; leave instance_id out to launch them (one placement group)."
        )
    throughput, iops = int(profile.root_volume_throughput), int(profile.root_volume_iops)
    if throughput > iops * GP3_MIBS_PER_IOPS:
        raise BadInput(
            f"{where}: root_volume_throughput {throughput} MiB/s needs root_volume_iops of at "
            f"least {math.ceil(throughput / GP3_MIBS_PER_IOPS)} (gp3 allows "
            f"{GP3_MIBS_PER_IOPS:g} MiB/s per provisioned IOPS), but root_volume_iops is {iops}; "
            "raise root_volume_iops or lower root_volume_throughput."
        )
    price = profile.price_per_hour
    ttl_hours = _finite(where, "ttl_hours", profile.ttl_hours, above=0.0, at_most=MAX_TTL_HOURS)
    return AwsSettings(
        region=profile.region,
        instance_type=str(instance_type),
        nodes=int(recipe.nodes),
        ami=str(ami),
        subnet_id=profile.subnet_id,
        key_name=profile.key_name,
        identity_file=profile.identity_file,
        ssh_cidr=cidr,
        capacity_type=ctype,
        reservation_id=reservation_id,
        max_spot_price=_finite(where, "capacity.max_spot_price", profile.capacity.max_spot_price),
        ttl_hours=ttl_hours,
        root_volume_gb=int(profile.root_volume_gb),
        root_volume_throughput=throughput,
        root_volume_iops=iops,
        efa_layout=layout,
        extra_tags={str(k): str(v) for k, v in (profile.tags or {}).items()},
        port=int(profile.port),
        user=profile.user or DEFAULT_USER,
        connect_host=profile.connect_host,
        connect_timeout_s=_finite(where, "connect_timeout_s", profile.connect_timeout_s),
        elastic_ip=bool(profile.elastic_ip),
        self_terminate=bool(profile.self_terminate),
        ready_timeout_s=_finite(where, "ready_timeout_s", profile.ready_timeout_s),
        price_per_hour=_finite(where, "price_per_hour", price),
        instance_id=profile.instance_id,
        known_hosts=profile.known_hosts,
        host_key_fingerprint=profile.host_key_fingerprint,
        accept_unknown_host=bool(profile.accept_unknown_host),
        host_key_wait_s=_finite(where, "host_key_wait_s", profile.host_key_wait_s, above=-1),
        image_ref=image.ref if image else None,
        volume_initialization_rate=profile.volume_initialization_rate,
        prepull_ref=prepull,
        image_digest=image.digest if image else None,
        run_end_watch=run_end_watch,
        run_end_grace_s=_finite(
            where, "run_end_grace_s", profile.run_end_grace_s, above=-1.0, at_most=86400.0
        ),
    )


def check_ami_form(where: str, field: str, ami: str, *, baked_allowed: bool) -> None:
    """ami-<hex>, ssm:/<parameter> or (for the run's `ami`) `baked`; BadInput naming the field."""
    if re.fullmatch(r"ami-[0-9a-f]{8,17}", ami) or re.fullmatch(r"ssm:/\S+", ami):
        return
    if baked_allowed and ami == BAKED:
        return
    also = ", or baked (the AMI `reproduce image bake` made)" if baked_allowed else ""
    raise BadInput(
        f"{where}: {field} {ami!r}; expected ami-<hex> or ssm:/<public parameter name>{also}."
    )


def run_image(recipe: Recipe, profile: Profile) -> Image:
    """The image a run of the recipe on this profile pulls: the profile's built image (checked
    to be built FROM the recipe's digest, as the plan checks it), else the recipe's own."""
    from launcher.plan.image_record import profile_image

    built = profile_image(recipe, profile)
    return built.as_image() if built else recipe.image


@overload
def _finite(
    where: str, name: str, value: None, *, above: float = 0.0, at_most: float | None = None
) -> None: ...
@overload
def _finite(
    where: str, name: str, value: float | str, *, above: float = 0.0, at_most: float | None = None
) -> float: ...
def _finite(
    where: str, name: str, value: object, *, above: float = 0.0, at_most: float | None = None
) -> float | None:
    """A number the launcher can compute with: NaN and infinity would turn every budget and
    timeout comparison false (a NaN price never reaches --max-usd). None stays None."""
    if value is None:
        return None
    try:
        if not isinstance(value, int | float | str):
            raise TypeError(value)
        number = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"{where}: {name} {value!r} is not a number.") from None
    if not math.isfinite(number) or number <= above:
        raise BadInput(f"{where}: {name} {value!r}; expected a finite number above {above:g}.")
    if at_most is not None and number > at_most:
        raise BadInput(f"{where}: {name} {value!r}; at most {at_most:g} is allowed.")
    return number


def _check_capacity(where: str, ctype: str, reservation_id: object) -> None:
    if ctype not in CAPACITY_TYPES:
        raise BadInput(
            f"{where}: capacity.type {ctype!r}; expected one of {', '.join(CAPACITY_TYPES)}."
        )
    if ctype in ("reservation", "capacity-block") and not reservation_id:
        raise BadInput(
            f"{where}: capacity.type {ctype} needs capacity.reservation_id (cr-...).",
            hint="`reproduce capacity RECIPE --cluster aws` lists Capacity Block offerings.",
        )
    if reservation_id and not re.fullmatch(r"cr-[0-9a-f]{8,17}", str(reservation_id)):
        raise BadInput(f"{where}: capacity.reservation_id {reservation_id!r}; expected cr-<hex>.")
    if reservation_id and ctype not in ("reservation", "capacity-block"):
        raise BadInput(
            f"{where}: capacity.reservation_id is set but capacity.type is {ctype}; "
            "expected type reservation or capacity-block."
        )


def _check_cidr(cidr: str, where: str) -> str:
    """The network SSH is opened to, no wider than WIDEST_SSH_PREFIX (e.g. an office's /24)."""
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=False)
    except ValueError:
        raise BadInput(
            f"{where} {cidr!r} is not a CIDR; expected your address as a /32, e.g. 203.0.113.7/32."
        ) from None
    widest = WIDEST_SSH_PREFIX[net.version]
    if net.prefixlen < widest:
        raise BadInput(
            f"{where} {cidr} opens SSH to {net.num_addresses:,} addresses; at most a /{widest} "
            f"(IPv{net.version}) is allowed; expected the operator's address "
            f"(/{net.max_prefixlen}) or a small network."
        )
    return str(net)


def gpu_mismatch(recipe: Recipe, facts: InstanceType) -> str | None:
    """Why this instance type cannot run the recipe's nodes (GPU count or model), or None."""
    wanted = str(recipe.gpu_type).upper().replace("NVIDIA", "").strip()
    have = str(facts.gpu).upper().replace("NVIDIA", "").strip()
    problems = []
    if facts.gpus != recipe.gpus_per_node:
        problems.append(
            f"{facts.gpus} GPUs per instance, the recipe needs gpu.per_node={recipe.gpus_per_node}"
        )
    if wanted and have and wanted not in have and have not in wanted:
        problems.append(f"its GPUs are {facts.gpu}, the recipe's gpu.type is {recipe.gpu_type}")
    if not problems:
        return None
    return f"instance type {facts.name} does not match the recipe: " + "; ".join(problems) + "."


def check_instance_type(recipe: Recipe, facts: InstanceType | None) -> None:
    """BadInput when the instance type's GPUs cannot run the recipe (unknown facts pass)."""
    if facts is None:
        return
    problem = gpu_mismatch(recipe, facts)
    if problem:
        raise BadInput(
            problem, hint="Set instance_type in the aws profile to a type with the recipe's GPUs."
        )
