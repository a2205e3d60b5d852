"""`--cluster aws`: provision (or target) EC2 GPU instances, and end every one of them.

The request bodies come from `aws_request` (the dry run prints the same ones). This module adds
what needs AWS: credentials and region checks, the instance type's facts, the AMI behind an SSM
parameter, the security group, key pair, placement group, Elastic IPs, waiting until the node
answers SSH, and the teardown. Every resource is written to the state file (run_dir/aws.json)
the moment it exists and tagged with the run id and an expiry, so `reproduce down RUN` and
`reproduce reap` can end it whatever happened to this process. Nodes are reached with the SSH
transport of launcher/clusters/ssh.py, unchanged.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.clusters import aws_request as rq
from launcher.clusters.aws_state import AwsState, state_root
from launcher.clusters.base import Node
from launcher.errors import BadInput, InfraError

TERMINATE_TIMEOUT_S = 1200.0
DELETE_RETRY_S = 300.0  # security and placement groups stay "in use" for a while after termination
CHECKIP_URL = "https://checkip.amazonaws.com"
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


# ------------------------------------------------------------------------------------------------
# Sessions, credentials, regions, errors


def make_session(region: str | None, session: Any = None) -> Any:
    """A boto3 session with credentials and a known region, or BadInput saying what is missing.

    boto3 honours AWS_ENDPOINT_URL, so the same code can be pointed at a moto server.
    """
    if session is None:
        import boto3

        try:
            session = boto3.Session(region_name=region) if region else boto3.Session()
        except Exception as err:  # noqa: BLE001 - a broken AWS config file or profile name
            raise BadInput(f"cannot read the AWS configuration: {err}") from err
    try:
        creds = session.get_credentials()
    except Exception as err:  # noqa: BLE001 - e.g. a profile whose SSO session expired
        raise BadInput(f"cannot load AWS credentials: {err}") from err
    if creds is None:
        raise BadInput(
            "no AWS credentials found, so nothing was launched.",
            hint="Set AWS_PROFILE (after `aws sso login` or `aws configure`), or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, and try again.",
        )
    chosen = region or session.region_name
    if not chosen:
        raise BadInput(
            "no AWS region: set `region` in the aws profile (or AWS_REGION); nothing was launched."
        )
    check_region(session, chosen)
    return session


def check_region(session: Any, region: str) -> None:
    """Refuse a region botocore does not know (a typo would otherwise fail later and obscurely)."""
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if known and region not in known:
        close = sorted(r for r in known if r.split("-")[0] == region.split("-")[0])[:8]
        raise BadInput(
            f"unknown AWS region {region!r}; nothing was launched.",
            hint=f"Expected a region such as {', '.join(close or sorted(known)[:8])}.",
        )


def _code(err: Exception) -> str:
    return (
        getattr(err, "response", {}).get("Error", {}).get("Code", "")
        if hasattr(err, "response")
        else ""
    )


def _message(err: Exception) -> str:
    return (
        getattr(err, "response", {}).get("Error", {}).get("Message", str(err))
        if hasattr(err, "response")
        else str(err)
    )


def capacity_alternatives(s: rq.AwsSettings, tried_zones: list[str] | None = None) -> str:
    zones = f" (tried {', '.join(tried_zones)})" if tried_zones else ""
    return (
        f"AWS has no {s.instance_type} capacity for this request{zones}. Alternatives: "
        "buy a Capacity Block (`reproduce capacity RECIPE --cluster aws` lists offerings with prices and start times, "
        "then set capacity: {type: capacity-block, reservation_id: cr-...}); "
        "use an existing capacity reservation (capacity: {type: reservation, reservation_id: cr-...}); "
        "try spot (capacity: {type: spot}); or another region or subnet (region, subnet_id)."
    )


def translate(err: Exception, doing: str, s: rq.AwsSettings | None = None) -> Exception:
    """A boto error as the launcher's own: BadInput for what the user can fix in the profile, else InfraError."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return BadInput(
            "no AWS credentials found, so nothing was launched.",
            hint="Set AWS_PROFILE or run `aws configure`.",
        )
    if isinstance(err, ClientError):
        code, msg = _code(err), _message(err)
        if code in (
            "InsufficientInstanceCapacity",
            "InsufficientCapacity",
            "InsufficientReservedInstanceCapacity",
        ):
            return InfraError(
                f"{doing}: {code}: {msg}", hint=capacity_alternatives(s) if s else None
            )
        if code in ("InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"):
            return InfraError(
                f"{doing}: {code}: {msg}",
                hint="Ask AWS for a higher quota (Service Quotas: 'Running On-Demand P instances').",
            )
        if code in (
            "AuthFailure",
            "InvalidClientTokenId",
            "ExpiredToken",
            "SignatureDoesNotMatch",
            "RequestExpired",
        ):
            return BadInput(f"{doing}: AWS rejected the credentials ({code}): {msg}")
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return InfraError(
                f"{doing}: the credentials may not do this ({code}). Grant the permission and retry."
            )
        if code.startswith(
            (
                "InvalidAMIID",
                "InvalidSubnetID",
                "InvalidKeyPair",
                "InvalidCapacityReservationId",
                "InvalidParameterValue",
                "ParameterNotFound",
                "InvalidInstanceID",
            )
        ):
            return BadInput(f"{doing}: {code}: {msg}")
        return InfraError(f"{doing}: {code or 'error'}: {msg}")
    if isinstance(err, BotoCoreError):
        return InfraError(f"{doing}: {err}")
    return err


def default_owner() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def lookup_operator_cidr(timeout_s: float = 5.0) -> str:
    """This machine's public address as a /32 (only when ssh_cidr is null; never in the dry run)."""
    import urllib.request

    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=timeout_s) as resp:  # noqa: S310 - fixed https URL
            text = resp.read(64).decode().strip()
        addr = ipaddress.ip_address(text)
    except Exception as err:  # noqa: BLE001
        raise InfraError(
            f"cannot find your public address at {CHECKIP_URL} ({err}).",
            hint="Set ssh_cidr in the aws profile to your address as a /32.",
        ) from err
    return f"{addr}/{addr.max_prefixlen}"


def ssm_ami_resolver(session: Any) -> Callable[[str], str]:
    """ssm:/aws/service/... -> ami-... (the public parameter of the Deep Learning AMI)."""

    def resolve(name: str) -> str:
        try:
            return session.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        except Exception as err:  # noqa: BLE001
            raise translate(err, f"resolving the AMI from SSM parameter {name}") from err

    return resolve


def price_of(s: rq.AwsSettings, region: str | None) -> float | None:
    from launcher.catalog import price_per_hour

    try:
        price = price_per_hour(s.instance_type, region, s.price_per_hour)
    except BadInput:
        return None
    return price.value if price else None


# ------------------------------------------------------------------------------------------------
# The cluster


class AwsCluster:
    """Acquire EC2 nodes for a run (launch or target) and release exactly what was launched."""

    name = "aws"

    def __init__(
        self,
        recipe: Any,
        profile: Any,
        run_id: str,
        *,
        keep: bool = False,
        instance_id: str | None = None,
        owner: str | None = None,
        session: Any = None,
        ami_resolver: Callable[[str], str] | None = None,
        log: Callable[[str], Any] = print,
        state_path: Path | None = None,
        operator_cidr: str | None = None,
        key_dir: Path | None = None,
        poll_s: float = 5.0,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.recipe = recipe
        self.profile = profile
        self.run_id = run_id
        self.keep = keep
        self.settings = rq.settings_from(recipe, profile) if recipe is not None else None
        self.target_id = instance_id or (self.settings.instance_id if self.settings else None)
        self.owner = owner or default_owner()
        self._session = session
        self.ami_resolver = ami_resolver
        self.log = log
        self.state_path = Path(state_path) if state_path else None
        self.operator_cidr = operator_cidr
        self.key_dir = Path(key_dir) if key_dir else state_root() / "keys"
        self.poll_s = poll_s
        self.now = now or (lambda: datetime.now(UTC))
        restoring = recipe is None and self.state_path is not None and self.state_path.is_file()
        self.state = AwsState.load(self.state_path) if restoring else AwsState(self.state_path)
        if restoring and not self.target_id and self.state.data["targeted"]:
            self.target_id = self.state.data["targeted"][0]
        s = self.settings
        self.ssh_opts: dict[str, Any] = {
            "connect_timeout_s": s.connect_timeout_s if s else 20.0,
            "known_hosts": s.known_hosts if s else None,
            "host_key_fingerprint": s.host_key_fingerprint if s else None,
            "accept_unknown_host": bool(s and s.accept_unknown_host),
        }
        self._ec2: Any = None
        self._checked = False
        self._released = False
        self._interfaces_requested = 1
        self._transports: list[Any] = []
        self.nodes: list[Node] = []

    # --- clients -----------------------------------------------------------------------------------
    @property
    def session(self) -> Any:
        """The boto3 session, after checking credentials and region (nothing is created before)."""
        if not self._checked:
            self._session = make_session(self.region_hint, self._session)
            self._checked = True
        return self._session

    @property
    def region_hint(self) -> str | None:
        return self.state.data.get("region") or (self.settings.region if self.settings else None)

    @property
    def region(self) -> str:
        return self.region_hint or self.session.region_name

    @property
    def ec2(self) -> Any:
        if self._ec2 is None:
            self._ec2 = self.session.client("ec2", region_name=self.region)
        return self._ec2

    def _call(self, operation: str, doing: str, **params: Any) -> Any:
        """One EC2 call with the launcher's error wording."""
        try:
            return getattr(self.ec2, operation)(**params)
        except Exception as err:  # noqa: BLE001
            raise translate(err, doing, self.settings) from err

    # --- Cluster protocol ---------------------------------------------------------------------------
    def acquire(self) -> list[Node]:
        """Launch (or target) the nodes and return them once each answers SSH."""
        s = self.settings
        if s is None:  # restored from a record: the nodes it already has
            return [Node(**n) for n in self.state.data["nodes"]]
        self.session  # noqa: B018 - credentials and region first: nothing is created without them
        self.state.set(
            region=self.region,
            run_id=self.run_id,
            recipe=str(self.recipe.slug),
            owner=self.owner,
            keep=self.keep,
            price_per_hour=price_of(s, self.region),
            nodes_wanted=s.nodes,
            state_path=str(self.state_path) if self.state_path else None,
        )
        if self.target_id:
            self.nodes = [self._target(self.target_id)]
        else:
            self.nodes = self._launch()
        self.state.set(nodes=[_node_record(n) for n in self.nodes])
        return list(self.nodes)

    def transport(self, node: Node) -> Any:
        """The SSH transport of launcher/clusters/ssh.py, set up as the ssh cluster sets it up."""
        from launcher.clusters.ssh import SSHSettings, SSHTransport

        for existing in self._transports:
            if existing.node == node:
                return existing
        opts = self.ssh_opts
        launched = bool(node.meta.get("launched"))
        known_hosts = opts.get("known_hosts")
        if launched and not known_hosts and self.state_path:
            known_hosts = str(self.state_path.with_name("aws_known_hosts"))
        # Built from profile-shaped fields, exactly as the ssh cluster builds its settings.
        settings = SSHSettings.from_mapping(
            {
                "host": node.host,
                "port": node.port,
                "user": node.user,
                "identity_file": node.identity_file,
                "connect_host": node.connect_host,
                "connect_timeout_s": float(opts.get("connect_timeout_s") or 20.0),
                "known_hosts": os.path.expanduser(known_hosts) if known_hosts else None,
                "host_key_fingerprint": opts.get("host_key_fingerprint"),
                # a host the launcher just created has a key nobody can have seen; a targeted one must be known
                "accept_unknown_host": launched or bool(opts.get("accept_unknown_host")),
            }
        )
        transport = SSHTransport(node, settings)
        self._transports.append(transport)
        return transport

    def release(self) -> None:
        """End what this run launched (never a targeted instance); idempotent and resumable."""
        for transport in self._transports:
            try:
                transport.close()
            except Exception:  # noqa: BLE001
                pass
        if self._released:
            return
        if self.keep and self.state.launched_instances:
            self._released = True
            self._print_kept()
            return
        if self.target_id or self.state.data.get("region") is None:
            self._released = True  # targeted only, or stopped before anything could be created
            return
        left = teardown(
            self.ec2, self.state, log=self.log, poll_s=self.poll_s, key_dir=self.key_dir
        )
        if left:
            raise InfraError(leftover_message(left, self.state_path, self.state.data.get("region")))
        self._released = True

    def leftovers(self) -> list[str]:
        """What is still allocated (for always_release's last message)."""
        return self.state.allocated() if not self.keep else []

    def down_command(self) -> str:
        where = self.state_path.parent if self.state_path else self.run_id
        return f"reproduce down {where}"

    def to_record(self) -> dict:
        """What attach/cancel need to reach and release this run's nodes again (run.json; no secrets)."""
        return {
            "kind": "aws",
            "state_path": str(self.state_path) if self.state_path else None,
            "region": self.region_hint,
            "run_id": self.run_id,
            "keep": self.keep,
            "target": self.target_id,
            "ssh": dict(self.ssh_opts),
        }

    @classmethod
    def from_record(
        cls, record: dict, *, session: Any = None, log: Callable[[str], Any] = print
    ) -> AwsCluster:
        """A cluster for a recorded run: transports to its nodes, and a release that ends what it launched."""
        cluster = cls(
            None,
            None,
            str(record.get("run_id") or ""),
            keep=bool(record.get("keep")),
            instance_id=record.get("target"),
            session=session,
            log=log,
            state_path=Path(record["state_path"]) if record.get("state_path") else None,
        )
        cluster.ssh_opts.update(record.get("ssh") or {})
        return cluster

    # --- targeting ------------------------------------------------------------------------------------
    def _target(self, instance_id: str) -> Node:
        s = self.settings
        assert s is not None
        self.state.set(targeted=[instance_id])
        resp = self._call(
            "describe_instances", f"describing instance {instance_id}", InstanceIds=[instance_id]
        )
        inst = _only_instance(resp, instance_id)
        state = inst["State"]["Name"]
        if state != "running":
            raise BadInput(
                f"instance {instance_id} is {state}, not running; start it first (the launcher never starts "
                "or ends an instance it only targets)."
            )
        facts = self._facts(inst["InstanceType"])
        rq.check_instance_type(self.recipe, inst["InstanceType"], facts)
        node = self._node_from(
            inst, index=0, launched=False, ami_id=inst.get("ImageId"), identity_file=s.identity_file
        )
        self.log(
            f"aws: targeting {instance_id} ({inst['InstanceType']}, {node.meta['az']}); it will not be terminated"
        )
        self._wait_ssh([node], time.monotonic() + s.ready_timeout_s)
        return node

    # --- launching ------------------------------------------------------------------------------------
    def _launch(self) -> list[Node]:
        s = self.settings
        assert s is not None
        facts = self._facts(s.instance_type)
        rq.check_instance_type(self.recipe, s.instance_type, facts)
        ami_id = self._resolve_ami()
        root_device = self._root_device(ami_id)
        reservation_az = self._reservation_zone()
        subnets = self._subnets(reservation_az)
        vpc_id = subnets[0]["VpcId"]
        cidr = s.ssh_cidr or self.operator_cidr or lookup_operator_cidr()
        now = self.now()
        expires = rq.expires_at(now, s.ttl_hours)
        tags = rq.run_tags(self.recipe, self.run_id, self.owner, expires, s.extra_tags)
        self.state.set(expires_at=expires, ami_id=ami_id)

        group = self._call(
            "create_security_group",
            "creating the security group",
            **rq.security_group_request(self.run_id, vpc_id, tags),
        )["GroupId"]
        self.state.set(security_group=group)
        self._call(
            "authorize_security_group_ingress",
            "opening SSH and EFA in the security group",
            **rq.ingress_request(group, s.port, cidr),
        )

        key_name, identity = s.key_name, s.identity_file
        if not key_name:
            key_name, identity = self._create_key_pair(tags)
        pg = None
        if s.nodes > 1:
            self._call(
                "create_placement_group",
                "creating the placement group",
                **rq.placement_group_request(self.run_id, tags),
            )
            pg = rq.resource_name(self.run_id)
            self.state.set(placement_group=pg)

        instances = self._run_instances(
            subnets,
            ami_id=ami_id,
            group=group,
            key_name=key_name,
            pg=pg,
            root_device=root_device,
            facts=facts,
            tags=tags,
            reservation_az=reservation_az,
        )
        deadline = time.monotonic() + s.ready_timeout_s
        ids = [i["InstanceId"] for i in instances]
        self.log(
            f"aws: launched {', '.join(ids)} ({s.instance_type}, {_capacity_words(s)}); waiting until running"
        )
        running = self._wait_running(ids, deadline)
        nodes = []
        for index, inst in enumerate(running):
            public = inst.get("PublicIpAddress")
            # AWS gives an instance launched with several interfaces no public address: attach one
            if s.elastic_ip and (not public or self._interfaces_requested > 1):
                public = self._elastic_ip(inst, tags)
                inst = {**inst, "PublicIpAddress": public}
            nodes.append(
                self._node_from(
                    inst, index=index, launched=True, ami_id=ami_id, identity_file=identity
                )
            )
        self._wait_status_ok(ids, deadline)
        self._wait_ssh(nodes, deadline)
        return nodes

    def _facts(self, instance_type: str) -> rq.InstanceFacts | None:
        try:
            resp = self.ec2.describe_instance_types(InstanceTypes=[instance_type])
        except Exception as err:  # noqa: BLE001
            if _code(err).startswith("InvalidInstanceType"):
                raise BadInput(
                    f"instance type {instance_type!r} does not exist in {self.region}."
                ) from err
            raise translate(
                err, f"describing instance type {instance_type}", self.settings
            ) from err
        types = resp.get("InstanceTypes") or []
        if not types:
            raise BadInput(f"instance type {instance_type!r} is not offered in {self.region}.")
        info = types[0]
        gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
        net = info.get("NetworkInfo") or {}
        return rq.InstanceFacts(
            gpus=sum(int(g.get("Count", 0)) for g in gpus),
            gpu_name=(gpus[0].get("Name", "") if gpus else "none"),
            network_cards=int(net.get("MaximumNetworkCards") or 1),
            max_efa=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 0)
            if net.get("EfaSupported")
            else 0,
        )

    def _resolve_ami(self) -> str:
        s = self.settings
        assert s is not None
        if not s.ami_is_ssm:
            return s.ami
        resolver = self.ami_resolver or ssm_ami_resolver(self.session)
        ami_id = resolver(s.ssm_parameter)
        self.log(f"aws: AMI {ami_id} (from {s.ami})")
        return ami_id

    def _root_device(self, ami_id: str) -> str:
        images = (
            self._call("describe_images", f"describing AMI {ami_id}", ImageIds=[ami_id]).get(
                "Images"
            )
            or []
        )
        if not images:
            raise BadInput(
                f"AMI {ami_id} does not exist in {self.region} (or is not visible to this account)."
            )
        return images[0].get("RootDeviceName") or "/dev/sda1"

    def _reservation_zone(self) -> str | None:
        s = self.settings
        assert s is not None
        if not s.reservation_id:
            return None
        try:
            resp = self.ec2.describe_capacity_reservations(
                CapacityReservationIds=[s.reservation_id]
            )
        except Exception as err:  # noqa: BLE001
            raise translate(err, f"describing capacity reservation {s.reservation_id}", s) from err
        res = (resp.get("CapacityReservations") or [None])[0]
        if not res:
            raise BadInput(f"capacity reservation {s.reservation_id} not found in {self.region}.")
        if res.get("InstanceType") and res["InstanceType"] != s.instance_type:
            raise BadInput(
                f"capacity reservation {s.reservation_id} is for {res['InstanceType']}, not {s.instance_type}."
            )
        state = res.get("State")
        if state == "scheduled":
            raise InfraError(
                f"the Capacity Block {s.reservation_id} has not started yet (starts {res.get('StartDate')}); "
                "run again once it is active."
            )
        if state not in (None, "active"):
            raise InfraError(f"capacity reservation {s.reservation_id} is {state}, not active.")
        if (
            res.get("AvailableInstanceCount") is not None
            and int(res["AvailableInstanceCount"]) < s.nodes
        ):
            raise InfraError(
                f"capacity reservation {s.reservation_id} has {res['AvailableInstanceCount']} free instances; "
                f"the recipe needs {s.nodes}."
            )
        return res.get("AvailabilityZone")

    def _subnets(self, zone: str | None) -> list[dict]:
        """The subnet(s) to try, in order: the profile's, or the default VPC's in zones offering the type."""
        s = self.settings
        assert s is not None
        if s.subnet_id:
            subnets = self._call(
                "describe_subnets", f"describing subnet {s.subnet_id}", SubnetIds=[s.subnet_id]
            )["Subnets"]
            if zone and subnets and subnets[0]["AvailabilityZone"] != zone:
                raise BadInput(
                    f"subnet {s.subnet_id} is in {subnets[0]['AvailabilityZone']}, but the capacity "
                    f"reservation is in {zone}; expected a subnet in {zone}."
                )
            return subnets
        defaults = self._call(
            "describe_subnets",
            "finding the default VPC's subnets",
            Filters=[{"Name": "default-for-az", "Values": ["true"]}],
        )["Subnets"]
        if zone:
            zones = [zone]
        else:
            offers = self._call(
                "describe_instance_type_offerings",
                f"finding zones offering {s.instance_type}",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [s.instance_type]}],
            )
            zones = sorted({o["Location"] for o in offers.get("InstanceTypeOfferings", [])})
        chosen = [sub for z in zones for sub in defaults if sub["AvailabilityZone"] == z]
        if not chosen:
            raise BadInput(
                f"no default subnet in a zone of {self.region} offering {s.instance_type}"
                + (f" (zones: {', '.join(zones)})" if zones else "")
                + "; nothing was launched.",
                hint="Set subnet_id in the aws profile.",
            )
        return chosen

    def _create_key_pair(self, tags: list[dict[str, str]]) -> tuple[str, str]:
        name = rq.resource_name(self.run_id)
        resp = self._call(
            "create_key_pair", "creating the key pair", **rq.key_pair_request(self.run_id, tags)
        )
        self.state.set(key_pair=name)
        self.key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.key_dir / f"{name}.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(resp["KeyMaterial"])
        self.state.set(key_file=str(path))
        return name, str(path)

    def _run_instances(self, subnets: list[dict], **kw: Any) -> list[dict]:
        """RunInstances, trying the next zone on InsufficientInstanceCapacity (on-demand/spot, no pinned subnet)."""
        from botocore.exceptions import ClientError

        s = self.settings
        assert s is not None
        tried: list[str] = []
        for attempt, subnet in enumerate(subnets):
            req = rq.run_instances_request(
                s,
                ami_id=kw["ami_id"],
                subnet_id=subnet["SubnetId"],
                group_id=kw["group"],
                key_name=kw["key_name"],
                placement_group=kw["pg"],
                root_device=kw["root_device"],
                network_cards=kw["facts"].network_cards if kw["facts"] else None,
                max_efa=kw["facts"].max_efa if kw["facts"] else None,
                tags=kw["tags"],
                client_token=rq.client_token(self.run_id, attempt),
            )
            self.state.set(
                pending_launch=req["ClientToken"]
            )  # a crash mid-call is still found (by tag)
            nics = req["NetworkInterfaces"]
            self._interfaces_requested = len(nics) if isinstance(nics, list) else 1
            try:
                resp = self.ec2.run_instances(**req)
            except ClientError as err:
                if _code(err) in (
                    "InsufficientInstanceCapacity",
                    "InsufficientCapacity",
                ) and attempt + 1 < len(subnets):
                    tried.append(subnet["AvailabilityZone"])
                    self.log(
                        f"aws: no {s.instance_type} capacity in {subnet['AvailabilityZone']}; trying the next zone"
                    )
                    continue
                if _code(err) in ("InsufficientInstanceCapacity", "InsufficientCapacity"):
                    tried.append(subnet["AvailabilityZone"])
                    raise InfraError(
                        f"launching {s.nodes} x {s.instance_type}: {_code(err)}: {_message(err)}",
                        hint=capacity_alternatives(s, tried),
                    ) from err
                raise translate(err, f"launching {s.nodes} x {s.instance_type}", s) from err
            except Exception as err:  # noqa: BLE001
                raise translate(err, f"launching {s.nodes} x {s.instance_type}", s) from err
            instances = resp["Instances"]
            for inst in instances:
                self.state.add("instances", inst["InstanceId"])
            self.state.set(pending_launch=None, availability_zone=subnet["AvailabilityZone"])
            return instances
        raise InfraError(
            "no subnet to launch into"
        )  # unreachable: _subnets never returns an empty list

    def _elastic_ip(self, inst: dict, tags: list[dict[str, str]]) -> str:
        alloc = self._call(
            "allocate_address", "allocating an Elastic IP", **rq.allocate_address_request(tags)
        )
        record = {
            "allocation_id": alloc["AllocationId"],
            "public_ip": alloc["PublicIp"],
            "association_id": None,
        }
        self.state.add("addresses", record)
        eni = _primary_interface(inst)
        assoc = self._call(
            "associate_address",
            "attaching the Elastic IP",
            **rq.associate_address_request(alloc["AllocationId"], eni),
        )
        record["association_id"] = assoc.get("AssociationId")
        self.state.save()
        return alloc["PublicIp"]

    def _node_from(
        self,
        inst: dict,
        *,
        index: int,
        launched: bool,
        ami_id: str | None,
        identity_file: str | None,
    ) -> Node:
        s = self.settings
        assert s is not None
        private = inst.get("PrivateIpAddress") or _primary_private_ip(inst)
        public = inst.get("PublicIpAddress")
        dial = s.connect_host or public or private
        return Node(
            name=f"node{index}",
            host=private or dial,
            connect_host=dial,
            port=s.port,
            user=s.user,
            identity_file=os.path.expanduser(identity_file) if identity_file else None,
            meta={
                "instance_id": inst["InstanceId"],
                "ami_id": ami_id,
                "instance_type": inst.get("InstanceType"),
                "az": (inst.get("Placement") or {}).get("AvailabilityZone"),
                "launched": launched,
                "private_ip": private,
                "public_ip": public,
                "region": self.region,
            },
        )

    # --- waiting -----------------------------------------------------------------------------------------
    def _wait(self, check: Callable[[], Any], deadline: float, what: str) -> Any:
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise InfraError(
                    f"{what} within ready_timeout_s={self.settings.ready_timeout_s:g} s "
                    "(everything launched is being torn down)"
                )
            time.sleep(self.poll_s)

    def _wait_running(self, ids: list[str], deadline: float) -> list[dict]:
        def check() -> list[dict] | None:
            resp = self._call(
                "describe_instances", "describing the launched instances", InstanceIds=ids
            )
            found = {i["InstanceId"]: i for r in resp["Reservations"] for i in r["Instances"]}
            for iid, inst in found.items():
                state = inst["State"]["Name"]
                if state in ("shutting-down", "terminated", "stopping", "stopped"):
                    reason = (inst.get("StateReason") or {}).get("Message") or state
                    raise InfraError(f"instance {iid} went {state} while starting: {reason}")
            if len(found) == len(ids) and all(
                i["State"]["Name"] == "running" for i in found.values()
            ):
                return [found[i] for i in ids]
            return None

        return self._wait(check, deadline, f"the instances {', '.join(ids)} did not reach running")

    def _wait_status_ok(self, ids: list[str], deadline: float) -> None:
        def check() -> bool:
            resp = self._call(
                "describe_instance_status", "reading instance status checks", InstanceIds=ids
            )
            statuses = resp.get("InstanceStatuses", [])
            ok = [
                st
                for st in statuses
                if st.get("InstanceStatus", {}).get("Status") == "ok"
                and st.get("SystemStatus", {}).get("Status") == "ok"
            ]
            bad = [
                st["InstanceId"]
                for st in statuses
                if st.get("InstanceStatus", {}).get("Status") == "impaired"
                or st.get("SystemStatus", {}).get("Status") == "impaired"
            ]
            if bad:
                raise InfraError(f"instance status checks failed (impaired) on {', '.join(bad)}")
            return len(ok) == len(ids)

        self._wait(
            check, deadline, f"the instances {', '.join(ids)} did not pass their status checks"
        )

    def _wait_ssh(self, nodes: list[Node], deadline: float) -> None:
        s = self.settings
        assert s is not None
        for node in nodes:
            where = f"{node.connect_host}:{node.port}"
            self._wait(
                lambda: ssh_banner(
                    node.connect_host or node.host, node.port, min(s.connect_timeout_s, 10.0)
                ),
                deadline,
                f"SSH on {where} ({node.meta['instance_id']}) never answered",
            )
            self.log(f"aws: {node.name} {node.meta['instance_id']} answers SSH at {where}")

    # --- keep ----------------------------------------------------------------------------------------------
    def _print_kept(self) -> None:
        price = self.state.data.get("price_per_hour")
        n = len(self.state.launched_instances)
        cost = (
            f"${price * n:.2f}/h ({n} x ${price:.3f}/h)"
            if price
            else "an unknown $/h (no price for this type/region)"
        )
        self.log(
            f"aws: kept {', '.join(self.state.launched_instances)} (--keep): it costs {cost} until you end it with "
            f"`{self.down_command()}`; `reproduce reap` ends it after {self.state.data.get('expires_at')}"
            + (
                " (and it powers itself off then: self_terminate)."
                if self.settings is None or self.settings.self_terminate
                else "."
            )
        )


def check(
    recipe: Any,
    profile: Any,
    run_id: str,
    *,
    owner: str | None = None,
    session: Any = None,
    ami_resolver: Callable[[str], str] | None = None,
    operator_cidr: str | None = None,
    log: Callable[[str], Any] = print,
) -> list[str]:
    """`--check`: the launch's calls with DryRun=True, where credentials exist; nothing is created.

    The read-only lookups (instance type, AMI, subnets, reservation) run for real; every call that
    would create something is sent with DryRun=True, so AWS checks permissions and parameters.
    Returns one line per call; raises InfraError (or BadInput) naming the first refusal.
    """
    c = AwsCluster(
        recipe,
        profile,
        run_id,
        owner=owner,
        session=session,
        ami_resolver=ami_resolver,
        operator_cidr=operator_cidr,
        log=log,
    )
    s = c.settings
    assert s is not None
    lines: list[str] = []
    if c.target_id:
        inst = _only_instance(
            c._call("describe_instances", f"describing {c.target_id}", InstanceIds=[c.target_id]),
            c.target_id,
        )
        rq.check_instance_type(recipe, inst["InstanceType"], c._facts(inst["InstanceType"]))
        return [
            f"ok   DescribeInstances {c.target_id}: {inst['State']['Name']}, {inst['InstanceType']}"
        ]
    facts = c._facts(s.instance_type)
    rq.check_instance_type(recipe, s.instance_type, facts)
    lines.append(
        f"ok   DescribeInstanceTypes {s.instance_type}: {facts.gpus} x {facts.gpu_name}, "
        f"{facts.network_cards} network cards, {facts.max_efa} EFA"
    )
    ami_id = c._resolve_ami()
    root = c._root_device(ami_id)
    lines.append(f"ok   AMI {ami_id} (root device {root})")
    zone = c._reservation_zone()
    subnets = c._subnets(zone)
    lines.append(f"ok   subnet {subnets[0]['SubnetId']} in {subnets[0]['AvailabilityZone']}")
    tags = rq.run_tags(recipe, run_id, c.owner, rq.expires_at(c.now(), s.ttl_hours), s.extra_tags)
    default_group = c._call(
        "describe_security_groups",
        "finding the VPC's default security group",
        Filters=[
            {"Name": "vpc-id", "Values": [subnets[0]["VpcId"]]},
            {"Name": "group-name", "Values": ["default"]},
        ],
    )["SecurityGroups"]
    group = default_group[0]["GroupId"] if default_group else "sg-00000000"
    dry: list[tuple[str, str, dict]] = [
        (
            "CreateSecurityGroup",
            "create_security_group",
            rq.security_group_request(run_id, subnets[0]["VpcId"], tags),
        )
    ]
    if not s.key_name:
        dry.append(("CreateKeyPair", "create_key_pair", rq.key_pair_request(run_id, tags)))
    if s.nodes > 1:
        dry.append(
            (
                "CreatePlacementGroup",
                "create_placement_group",
                rq.placement_group_request(run_id, tags),
            )
        )
    dry.append(
        (
            "RunInstances",
            "run_instances",
            rq.run_instances_request(
                s,
                ami_id=ami_id,
                subnet_id=subnets[0]["SubnetId"],
                group_id=group,
                key_name=s.key_name or "",
                placement_group=None,
                root_device=root,
                network_cards=facts.network_cards,
                max_efa=facts.max_efa,
                tags=tags,
                client_token=rq.client_token(run_id, 99),
            ),
        )
    )
    if not s.key_name:
        dry[-1][2].pop("KeyName")  # the run's own key pair does not exist yet
    if s.elastic_ip:
        dry.append(("AllocateAddress", "allocate_address", rq.allocate_address_request(tags)))
    for name, method, params in dry:
        try:
            getattr(c.ec2, method)(DryRun=True, **params)
        except Exception as err:  # noqa: BLE001
            if _code(err) == "DryRunOperation":
                lines.append(f"ok   {name} (DryRun: would succeed)")
                continue
            for line in lines:
                log(line)
            raise translate(err, f"{name} with DryRun=True", s) from err
        lines.append(f"ok   {name} (the endpoint accepted it without DryRun checks)")
    for line in lines:
        log(line)
    return lines


def from_record(record: dict) -> AwsCluster:
    """Rebuild the cluster of a recorded run (see launcher.execute.cluster_from_record)."""
    return AwsCluster.from_record(record)


# ------------------------------------------------------------------------------------------------
# Teardown, shared by release, down and reap


def teardown(
    ec2: Any,
    state: AwsState,
    *,
    log: Callable[[str], Any] = print,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
    terminate_timeout_s: float = TERMINATE_TIMEOUT_S,
) -> list[str]:
    """End everything the state (and the run's tags) name; return what is still allocated.

    Order matters: instances first (and wait until terminated), because their interfaces keep the
    security group and placement group in use; then Elastic IPs, groups and the key pair.
    """
    run_id = state.data.get("run_id")
    if run_id:
        _discover(ec2, state, run_id)
    ids = state.launched_instances
    live: list[str] = []
    if ids:
        log(f"aws: terminating {', '.join(ids)}")
        refused = False
        try:
            ec2.terminate_instances(InstanceIds=ids)
        except Exception as err:  # noqa: BLE001
            if not _code(err).startswith("InvalidInstanceID.NotFound"):
                refused = (
                    True  # waiting for a termination that was never accepted would only burn money
                )
                log(f"aws: terminate failed: {translate(err, 'terminating')}")
        deadline = time.monotonic() + (0 if refused else terminate_timeout_s)
        while True:
            live = _live_instances(ec2, ids)
            if not live:
                break
            if time.monotonic() >= deadline:
                if not refused:
                    log(
                        f"aws: {', '.join(live)} still not terminated after {terminate_timeout_s:.0f} s"
                    )
                break
            time.sleep(poll_s)
        gone = [i for i in ids if i not in live]
        state.set(
            instances=[i for i in state.data["instances"] if i not in gone],
            terminated=sorted(set(state.data.get("terminated", []) + gone)),
        )
    for addr in list(state.data["addresses"]):
        try:
            if addr.get("association_id"):
                try:
                    ec2.disassociate_address(AssociationId=addr["association_id"])
                except Exception:  # noqa: BLE001 - termination usually removed it already
                    pass
            ec2.release_address(AllocationId=addr["allocation_id"])
        except Exception as err:  # noqa: BLE001
            if not _code(err).startswith("InvalidAllocationID.NotFound"):
                log(f"aws: releasing Elastic IP {addr['allocation_id']} failed: {_message(err)}")
                continue
        state.data["addresses"].remove(addr)
        state.save()
    # groups stay "in use" for a while after their instances terminate; none left running: retry for longer
    deadline = time.monotonic() + (
        DELETE_RETRY_S if ids and not live else 30.0 if not live else 0.0
    )
    if state.data["placement_group"]:
        if _delete_retrying(
            lambda: ec2.delete_placement_group(GroupName=state.data["placement_group"]),
            ("InvalidPlacementGroup.Unknown",),
            deadline,
            poll_s,
            log,
            "placement group",
        ):
            state.set(placement_group=None)
    if state.data["security_group"]:
        if _delete_retrying(
            lambda: ec2.delete_security_group(GroupId=state.data["security_group"]),
            ("InvalidGroup.NotFound",),
            deadline,
            poll_s,
            log,
            "security group",
        ):
            state.set(security_group=None)
    if state.data["key_pair"]:
        if _delete_retrying(
            lambda: ec2.delete_key_pair(KeyName=state.data["key_pair"]),
            ("InvalidKeyPair.NotFound",),
            deadline,
            poll_s,
            log,
            "key pair",
        ):
            state.set(key_pair=None)
    key_file = state.data.get("key_file") or (
        str(key_dir / f"{rq.resource_name(run_id)}.pem") if key_dir and run_id else None
    )
    if key_file and not state.data["key_pair"]:
        try:
            os.unlink(key_file)
        except FileNotFoundError:
            pass
        state.set(key_file=None)
    left = state.allocated()
    state.set(released=not left, left=left)
    if not left:
        log("aws: everything this run created is gone")
    return left


def _delete_retrying(
    call: Callable[[], Any],
    gone_codes: tuple[str, ...],
    deadline: float,
    poll_s: float,
    log: Callable[[str], Any],
    what: str,
) -> bool:
    while True:
        try:
            call()
            return True
        except Exception as err:  # noqa: BLE001
            code = _code(err)
            if code.startswith(gone_codes):
                return True
            if (
                code
                not in (
                    "DependencyViolation",
                    "InvalidPlacementGroup.InUse",
                    "RequestLimitExceeded",
                )
                or time.monotonic() >= deadline
            ):
                log(
                    f"aws: deleting the {what} failed: {code or type(err).__name__}: {_message(err)}"
                )
                return False
        time.sleep(poll_s)


def _live_instances(ec2: Any, ids: list[str]) -> list[str]:
    try:
        resp = ec2.describe_instances(InstanceIds=ids)
    except Exception as err:  # noqa: BLE001
        if _code(err).startswith("InvalidInstanceID.NotFound"):
            return []
        raise translate(err, "describing instances being terminated") from err
    return [
        i["InstanceId"]
        for r in resp["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]


def _tag_filter(run_id: str) -> list[dict]:
    return [{"Name": f"tag:{rq.TAG_RUN_ID}", "Values": [run_id]}]


def _discover(ec2: Any, state: AwsState, run_id: str) -> None:
    """Add what AWS holds under this run's tag but the state missed (a crash between call and write)."""
    try:
        resp = ec2.describe_instances(
            Filters=_tag_filter(run_id) + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        )
        for r in resp["Reservations"]:
            for inst in r["Instances"]:
                if (
                    inst["InstanceId"] not in state.data["targeted"]
                    and inst["InstanceId"] not in state.data["instances"]
                ):
                    state.data["instances"].append(inst["InstanceId"])
        known = {a["allocation_id"] for a in state.data["addresses"]}
        for addr in ec2.describe_addresses(Filters=_tag_filter(run_id)).get("Addresses", []):
            if addr["AllocationId"] not in known:
                state.data["addresses"].append(
                    {
                        "allocation_id": addr["AllocationId"],
                        "public_ip": addr.get("PublicIp"),
                        "association_id": addr.get("AssociationId"),
                    }
                )
        if not state.data["security_group"]:
            groups = ec2.describe_security_groups(Filters=_tag_filter(run_id)).get(
                "SecurityGroups", []
            )
            if groups:
                state.data["security_group"] = groups[0]["GroupId"]
        if not state.data["key_pair"]:
            keys = ec2.describe_key_pairs(Filters=_tag_filter(run_id)).get("KeyPairs", [])
            if keys:
                state.data["key_pair"] = keys[0]["KeyName"]
        if not state.data["placement_group"]:
            try:
                pgs = ec2.describe_placement_groups(Filters=_tag_filter(run_id)).get(
                    "PlacementGroups", []
                )
            except Exception:  # noqa: BLE001 - not every endpoint (moto) implements placement groups
                pgs = []
            if pgs:
                state.data["placement_group"] = pgs[0]["GroupName"]
    except Exception as err:  # noqa: BLE001 - discovery is a safety net; the state still drives teardown
        if _code(err) in ("AuthFailure", "UnauthorizedOperation"):
            raise translate(err, "finding the run's resources") from err
    state.save()


def leftover_message(left: list[str], state_path: Path | None, region: str | None) -> str:
    where = state_path.parent if state_path else "RUN"
    return (
        f"teardown did not finish; still allocated in {region}: {', '.join(left)}. "
        f"End them with `reproduce down {where}` (or in the EC2 console); they are tagged "
        f"{rq.TAG_RUN_ID} and `reproduce reap` ends them after their expires-at."
    )


# ------------------------------------------------------------------------------------------------
# down and reap


def down(
    run_dir: Path,
    *,
    session: Any = None,
    log: Callable[[str], Any] = print,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
) -> list[str]:
    """End what a run launched (a kept node, or what a crash left), from run_dir/aws.json.

    Returns the ids that were allocated before; raises InfraError naming what could not be ended.
    """
    run_dir = Path(run_dir)
    path = run_dir if run_dir.is_file() else run_dir / "aws.json"
    if not path.is_file():
        raise BadInput(
            f"{run_dir}: no aws.json here; this run did not use --cluster aws (or its directory moved)."
        )
    state = AwsState.load(path)
    before = state.allocated()
    if state.data.get("targeted") and not state.launched_instances:
        log(
            f"aws: {', '.join(state.data['targeted'])} was only targeted by this run; the launcher never ends it"
        )
    session = make_session(state.data.get("region"), session)
    ec2 = session.client("ec2", region_name=state.data.get("region") or session.region_name)
    left = teardown(ec2, state, log=log, poll_s=poll_s, key_dir=key_dir or state_root() / "keys")
    if left:
        raise InfraError(leftover_message(left, path, state.data.get("region")))
    return before


def down_run(
    ref: str, *, runs_root: Path | None = None, log: Callable[[str], Any] = print
) -> list[str]:
    """`reproduce down RUN`: RUN is a run directory, its aws.json, or a run id under the runs root."""
    path = Path(ref)
    if not (path.is_file() or (path / "aws.json").is_file()):
        from launcher.rundir import RunDir

        path = RunDir.find(ref, runs_root).path
    before = down(path, log=log)
    log(
        f"aws: ended {', '.join(before)}"
        if before
        else "aws: nothing of this run was still allocated"
    )
    return before


def reap_command(
    cluster: str = "aws",
    region: str | None = None,
    *,
    dry_run: bool = False,
    log: Callable[[str], Any] = print,
) -> list[str]:
    """`reproduce reap`: the region from --region, else from the aws profile, else the AWS configuration."""
    if region is None:
        from launcher.profile import load_profile

        profile = load_profile(cluster)
        if profile.kind != "aws":
            raise BadInput(
                f"--cluster {cluster} is of kind {profile.kind}; reap ends AWS instances, give an aws profile."
            )
        region = profile.get("region")
    if region is None:
        region = make_session(None).region_name
    return reap(region, dry_run=dry_run, log=log)


def _expired(tags: list[dict] | None, now: datetime) -> tuple[str, str] | None:
    """(run id, expires-at) of a resource whose expiry has passed, else None."""
    values = {t["Key"]: t["Value"] for t in tags or []}
    run_id, when = values.get(rq.TAG_RUN_ID), values.get(rq.TAG_EXPIRES)
    if not run_id or not when:
        return None
    try:
        at = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return (run_id, when) if at <= now else None


def reap(
    region: str,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    session: Any = None,
    log: Callable[[str], Any] = print,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
) -> list[str]:
    """End every resource the launcher tagged whose expires-at has passed; return their ids.

    Only resources carrying the launcher's run-id and expires-at tags are touched, so a targeted
    instance (never tagged) or anything made by hand is safe.
    """
    now = now or datetime.now(UTC)
    session = make_session(region, session)
    ec2 = session.client("ec2", region_name=region)
    has_expiry = [{"Name": "tag-key", "Values": [rq.TAG_EXPIRES]}]
    runs: dict[str, AwsState] = {}

    def state_for(run_id: str) -> AwsState:
        return runs.setdefault(run_id, AwsState(None, {"run_id": run_id, "region": region}))

    try:
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=has_expiry + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        ):
            for r in page["Reservations"]:
                for inst in r["Instances"]:
                    hit = _expired(inst.get("Tags"), now)
                    if hit:
                        state_for(hit[0]).data["instances"].append(inst["InstanceId"])
        for addr in ec2.describe_addresses(Filters=has_expiry).get("Addresses", []):
            hit = _expired(addr.get("Tags"), now)
            if hit:
                state_for(hit[0]).data["addresses"].append(
                    {
                        "allocation_id": addr["AllocationId"],
                        "association_id": addr.get("AssociationId"),
                        "public_ip": addr.get("PublicIp"),
                    }
                )
        for group in ec2.describe_security_groups(Filters=has_expiry).get("SecurityGroups", []):
            hit = _expired(group.get("Tags"), now)
            if hit:
                state_for(hit[0]).data["security_group"] = group["GroupId"]
        for key in ec2.describe_key_pairs(Filters=has_expiry).get("KeyPairs", []):
            hit = _expired(key.get("Tags"), now)
            if hit:
                state_for(hit[0]).data["key_pair"] = key["KeyName"]
        try:
            pgs = ec2.describe_placement_groups(Filters=has_expiry).get("PlacementGroups", [])
        except Exception:  # noqa: BLE001 - moto does not implement placement groups
            pgs = []
        for pg in pgs:
            hit = _expired(pg.get("Tags"), now)
            if hit:
                state_for(hit[0]).data["placement_group"] = pg["GroupName"]
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"listing the launcher's resources in {region}") from err

    ended: list[str] = []
    left: list[str] = []
    for run_id, state in sorted(runs.items()):
        things = state.allocated()
        if dry_run:
            log(f"aws: would end run {run_id}: {', '.join(things)}")
            ended += things
            continue
        log(f"aws: run {run_id} is past its expires-at: ending {', '.join(things)}")
        left += teardown(
            ec2, state, log=log, poll_s=poll_s, key_dir=key_dir or state_root() / "keys"
        )
        ended += [t for t in things if t not in left]
    if not runs:
        log(f"aws: nothing of the launcher's is past its expires-at in {region}")
    if left:
        raise InfraError(
            f"reap could not end: {', '.join(left)} (in {region}); run `reproduce reap` again or end "
            "them in the EC2 console."
        )
    return ended


# ------------------------------------------------------------------------------------------------
# Helpers


def ssh_banner(host: str, port: int, timeout_s: float) -> bool:
    """True once something on host:port speaks SSH (an open port alone is not enough)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _only_instance(resp: dict, instance_id: str) -> dict:
    for r in resp.get("Reservations", []):
        for inst in r.get("Instances", []):
            if inst["InstanceId"] == instance_id:
                return inst
    raise BadInput(f"instance {instance_id} not found.")


def _primary_interface(inst: dict) -> str:
    for eni in inst.get("NetworkInterfaces", []):
        att = eni.get("Attachment") or {}
        if att.get("DeviceIndex", 0) == 0 and att.get("NetworkCardIndex", 0) == 0:
            return eni["NetworkInterfaceId"]
    raise InfraError(
        f"instance {inst['InstanceId']} has no primary network interface to attach an Elastic IP to"
    )


def _primary_private_ip(inst: dict) -> str | None:
    for eni in inst.get("NetworkInterfaces", []):
        if eni.get("PrivateIpAddress"):
            return eni["PrivateIpAddress"]
    return None


def _node_record(node: Node) -> dict:
    return {
        "name": node.name,
        "host": node.host,
        "connect_host": node.connect_host,
        "port": node.port,
        "user": node.user,
        "identity_file": node.identity_file,
        "meta": node.meta,
    }


def _capacity_words(s: rq.AwsSettings) -> str:
    return rq._capacity_note(s)  # noqa: SLF001 - one wording for the dry run and the log
