"""`--cluster aws`: acquire EC2 nodes for a run (launch or target), reach them, end what it made.

acquire runs the launch program (program.py) in SEND mode, the same steps the dry run printed;
every call it sends is written to run_dir/aws-calls.jsonl and every id to run_dir/aws.json the
moment it exists, so `reproduce down RUN` and `reproduce reap` can end it whatever happens to this
process. Nodes are reached with the SSH transport of launcher/clusters/ssh.py: the head directly,
every other node through the head (`Node.via`: an SSH jump to its private address), so the runner
needs no AWS knowledge to follow N nodes.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import program
from launcher.clusters.aws.down import load_state
from launcher.clusters.aws.executor import Executor, Launch, Mode, wait_until
from launcher.clusters.aws.requests import Service
from launcher.clusters.aws.session import (
    CallLog,
    caller_account,
    make_session,
    recorded,
    recorded_client,
)
from launcher.clusters.aws.settings import AwsSettings, run_end_dir, settings_from
from launcher.clusters.aws.state import AwsState, state_root, write_launch_record
from launcher.clusters.aws.teardown import (
    after_run_message,
    kept_message,
    leftover_message,
    safe,
    teardown,
    unfound_message,
)
from launcher.clusters.base import Node
from launcher.clusters.contract import (
    WithBudgetWatch,
    WithDownCommand,
    WithLeftovers,
    WithNodeAfterRun,
    WithNodeHealth,
    WithNodeShell,
)
from launcher.errors import BadInput, InfraError, ReproduceError
from launcher.records.rundir import FINAL_STATES, Files, RunDir

if TYPE_CHECKING:
    from boto3.session import Session
    from botocore.client import BaseClient
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.type_defs import InstanceTypeDef

    from launcher.clusters.ssh import SSHTransport
    from launcher.cost.budget import Budget
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

CALLS_FILE = Files.AWS_CALLS
RELEASE_ATTEMPTS = 5  # a teardown stopped by something not AWS's (EIO from a print) goes again
HEALTH_EVERY_S = 10.0  # lost_nodes asks EC2 at most this often (one DescribeInstances)


class AwsCluster(
    WithBudgetWatch,
    WithNodeHealth,
    WithLeftovers,
    WithDownCommand,
    WithNodeAfterRun,
    WithNodeShell,
):
    """Acquire EC2 nodes for a run (launch or target) and release exactly what was launched."""

    name = "aws"

    def __init__(
        self,
        recipe: Recipe | None,
        profile: Profile | None,
        run_id: str,
        *,
        keep: bool = False,
        instance_id: str | None = None,
        owner: str = "unknown",
        session: Session | None = None,
        ami_resolver: Callable[[str], str] | None = None,
        log: Callable[[str], Any] = lambda _line: None,
        state_path: Path | None = None,
        operator_cidr: str | None = None,
        key_dir: Path | None = None,
        poll_s: float = 5.0,
        now: Callable[[], datetime] | None = None,
        price_per_hour: float | None = None,
        shared: bool = False,
    ) -> None:
        self.recipe = recipe
        self.price_per_hour = price_per_hour  # the run's decided price (else the catalog's)
        self.profile = profile
        self.run_id = run_id
        self.keep = keep
        self.settings: AwsSettings | None = None
        self.run_end_grace_s: float | None = None  # the node ends itself after its run (aws.md)
        if recipe is not None and profile is not None:
            watch = run_end_dir(profile, run_id, keep=keep, shared=shared)  # its run's end
            self.settings = settings_from(recipe, profile, run_end_watch=watch)
            self.run_end_grace_s = self.settings.run_end_grace_s if watch else None
        self.target_id = instance_id or (self.settings.instance_id if self.settings else None)
        self.owner = owner
        self._session = session
        self.ami_resolver = ami_resolver
        self.log = log
        self.state_path = Path(state_path).absolute() if state_path else None
        self.unfound: str | None = None  # a recorded run's aws.json not found: release fails
        self.calls = CallLog(self.state_path.with_name(CALLS_FILE) if self.state_path else None)
        self.operator_cidr = operator_cidr
        self.key_dir = Path(key_dir) if key_dir else state_root() / "keys"
        self.poll_s = poll_s
        self.now = now or (lambda: datetime.now(UTC))
        # Drawn anew for every launch: names, tags and the RunInstances token carry it, so two
        # launches with the same run id never share (or end) each other's resources.
        self.launch_id = secrets.token_hex(6)
        self.restored = recipe is None
        self.state = AwsState(self.state_path)
        self._over_budget: Callable[[], str | None] | None = None
        s = self.settings
        self.ssh_opts: dict[str, Any] = {
            "connect_timeout_s": s.connect_timeout_s if s else 20.0,
            "known_hosts": s.known_hosts if s else None,
            "host_key_fingerprint": s.host_key_fingerprint if s else None,
            "accept_unknown_host": bool(s and s.accept_unknown_host),
        }
        self._clients: dict[str, BaseClient] = {}
        self._ec2: EC2Client | None = None
        self._checked = False
        self._released = False
        self._transports: list[SSHTransport] = []
        self.nodes: list[Node] = []
        self.health_every_s = HEALTH_EVERY_S
        self._health_at: float | None = None  # the last DescribeInstances; None: never asked
        self._lost: list[str] = []

    # --- clients -------------------------------------------------------------------------------
    @property
    def session(self) -> Session:
        """The boto3 session, after checking credentials and region (nothing is created before)."""
        if self._session is None or not self._checked:
            self._session = make_session(self.region_hint, self._session)
            self._checked = True
        return self._session

    @property
    def region_hint(self) -> str | None:
        recorded_region = self.state.data.get("region")
        if isinstance(recorded_region, str) and recorded_region:
            return recorded_region
        return self.settings.region if self.settings else None

    @property
    def region(self) -> str:
        return self.region_hint or self.session.region_name

    def client(self, service: Service) -> BaseClient:
        """A client whose every call is written to aws-calls.jsonl."""
        if service == "ec2":
            return self.ec2
        if service not in self._clients:
            self._clients[service] = recorded_client(self.session, service, self.region, self.calls)
        return self._clients[service]

    @property
    def ec2(self) -> EC2Client:
        if self._ec2 is None:
            self._ec2 = recorded(
                self.session.client("ec2", region_name=self.region), "ec2", self.calls
            )
        return self._ec2

    def watch_budget(self, budget: Budget, started: float) -> None:
        """Check the run's budget while acquiring (a boot and its status checks take up to
        ready_timeout_s, billed from the launch): the runner hands it over before acquire."""
        self._over_budget = lambda: budget.check(time.time() - started)

    # --- Cluster protocol ----------------------------------------------------------------------
    def acquire(self) -> list[Node]:
        """Launch (or target) the nodes and return them once each answers SSH."""
        s = self.settings
        if s is None:  # restored from a record: the nodes it already has
            self.nodes = [Node(**n) for n in self.state.data["nodes"]]
            return list(self.nodes)
        self.session  # noqa: B018 - credentials and region first: nothing is created without them
        self.state.set(
            region=self.region,
            run_id=self.run_id,
            launch_id=self.launch_id,
            recipe=str(self.recipe.slug) if self.recipe else None,
            owner=self.owner,
            keep=self.keep,
            price_per_hour=self.price_per_hour or price_of(s, self.region),
            nodes_wanted=s.nodes,
            state_path=str(self.state_path) if self.state_path else None,
        )
        launch = self.launch_context(state=self.state)
        api = Executor(Mode.SEND, s, self.client, self.poll_s, over_budget=self._over_budget)
        program.run(launch, api)
        self.nodes = list(launch.nodes)
        self.state.set(nodes=[_node_record(n) for n in self.nodes])
        return list(self.nodes)

    def _record_launch(self) -> None:
        """The launcher's own record of who this launch is, outside the run directory (state.py)."""
        d = self.state.data
        write_launch_record(
            {
                "launch_id": self.launch_id,
                "run_id": self.run_id,
                "region": d.get("region"),
                "account": d.get("account"),
                "state_path": str(self.state_path.resolve()) if self.state_path else None,
                "created_at": self.now().astimezone(UTC).isoformat(),
            }
        )

    def launch_context(self, state: AwsState | None = None) -> Launch:
        """What the launch program starts from (also used by `--check`, without state)."""
        assert self.settings is not None and self.recipe is not None
        return Launch(
            self.recipe,
            self.settings,
            self.run_id,
            self.owner,
            self.now,
            launch_id=self.launch_id,
            target=self.target_id,
            region=self.region,
            operator_cidr=self.operator_cidr,
            state=state,
            key_dir=self.key_dir,
            log=self.log,
            ami_resolver=self.ami_resolver,
            make_node=self._node_from,
            wait_ssh=self._wait_ssh,
            record_launch=self._record_launch if self.state_path else None,
        )

    def transport(self, node: Node) -> SSHTransport:
        """The SSH transport of launcher/clusters/ssh.py, set up as the ssh cluster sets it up;
        a node behind the head (`via`) goes through the head's transport (one connection)."""
        from launcher.clusters.ssh import SSHSettings, SSHTransport

        for existing in self._transports:
            if existing.node == node:
                return existing
        jump = self.transport(node.via) if node.via is not None else None
        opts = self.ssh_opts
        launched = bool(node.meta.get("launched"))
        known_hosts = opts.get("known_hosts")
        pinned = opts.get("host_key_fingerprint")
        console = node.meta.get("host_key_fingerprints")
        if launched and console:
            # the fingerprints the instance printed on its console (hostkeys.py): any of them
            pinned = " ".join(str(fp) for fp in console)
        elif launched and not known_hosts and self.state_path:
            known_hosts = str(self.state_path.with_name(Files.AWS_KNOWN_HOSTS))
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
                "host_key_fingerprint": pinned,
                # a launched host whose console showed no fingerprints: trusted on first use
                # (said at launch); a targeted one must be known
                "accept_unknown_host": (launched and not console)
                or bool(opts.get("accept_unknown_host")),
            }
        )
        transport = SSHTransport(node, settings, jump=jump)
        self._transports.append(transport)
        return transport

    def lost_nodes(self, *, now: bool = False) -> list[str]:
        """The nodes EC2 no longer runs (terminated, stopped: a spot interruption, a failed
        host), one sentence each naming the node, so a run stops on a lost node at once instead
        of waiting out the SSH timeouts. One DescribeInstances at most every health_every_s
        (`now`: ask anyway, a node just vanished); an answer AWS cannot give now (throttled,
        offline) is no news."""
        ids = {str(n.meta["instance_id"]): n for n in self.nodes if n.meta.get("instance_id")}
        at = time.monotonic()
        recent = self._health_at is not None and at - self._health_at < self.health_every_s
        if not ids or self._lost or (not now and recent):
            return list(self._lost)
        self._health_at = at
        try:
            resp = self.ec2.describe_instances(
                Filters=[{"Name": "instance-id", "Values": sorted(ids)}]
            )
        except Exception:  # noqa: BLE001 - no answer is not a lost node
            return []
        seen = {i["InstanceId"]: i for r in resp.get("Reservations", []) for i in r["Instances"]}
        for iid, node in ids.items():
            inst = seen.get(iid)
            state = inst["State"]["Name"] if inst else "gone"
            if state in ("running", "pending"):
                continue
            reason = ((inst or {}).get("StateReason") or {}).get("Message")
            self._lost.append(f"{node.name} ({iid}) is {state}" + (f": {reason}" if reason else ""))
        return list(self._lost)

    def release(self) -> None:
        """End what this launch made (never a targeted instance); idempotent and resumable.

        Nothing outside AWS's own refusals stops it: log lines go to a terminal that may be gone
        (EIO), so they never raise, and a teardown cut short by anything else (an exception out
        of a signal handler) is simply run again, up to RELEASE_ATTEMPTS times.
        """
        log = safe(self.log)
        for transport in self._transports:
            try:
                transport.close()
            except Exception:  # noqa: BLE001, S110 - a dead connection must not stop the teardown
                pass
        if self._released:
            return
        if self.keep and self.state.launched_instances:
            self._released = True
            # what this launcher really made, over any aws.json collected from the node since
            self.state.strict = False
            self.state.save()
            log(kept_message(self.state, self.down_command(), self.settings))
            return
        if self.unfound is not None and not self.target_id:
            raise InfraError(self.unfound)  # what it must end cannot be found: never "released"
        if self.target_id or self.state.data.get("region") is None:
            self._released = True  # targeted only, or stopped before anything could be created
            return
        if not self.restored and not self.state.data.get("creating") and not self.state.allocated():
            # this launch stopped in its lookups (credentials, AMI, subnets...): no create call
            # was sent, so there is nothing to end and nothing to search for by tag
            self._released = True
            log("aws: nothing was created (the launch stopped before its first create call)")
            return
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            try:
                left = self._teardown(log)
                break
            except ReproduceError:
                raise
            except Exception as err:  # noqa: BLE001 - not AWS's: teardown is idempotent, go again
                if attempt == RELEASE_ATTEMPTS:
                    raise InfraError(f"teardown failed: {type(err).__name__}: {err}") from err
                time.sleep(min(self.poll_s, 1.0))
        if left:
            raise InfraError(leftover_message(left, self.state_path, self.state.data.get("region")))
        self._released = True

    def _teardown(self, log: Callable[[str], Any]) -> list[str]:
        # A run found again from its record may be released under other credentials: check
        # the account (a launch in this process released with the session it launched with).
        account = (
            caller_account(
                recorded(self.session.client("sts", region_name=self.region), "sts", self.calls),
                "finding the account of these credentials",
            )
            if self.restored
            else None
        )
        return teardown(
            self.ec2,
            self.state,
            account=account,
            log=log,
            poll_s=self.poll_s,
            key_dir=self.key_dir,
        )

    def leftovers(self) -> list[str]:
        """What is still allocated (for the last message after a failed release)."""
        return self.state.allocated() if not self.keep else []

    def node_after_run(self) -> str:
        """What happens to this run's node once nobody follows it (teardown.py words it)."""
        return after_run_message(self.run_end_grace_s, self.keep, self.down_command())

    def shell_refusal(self, run: str, state: str | None, node_run_dir: str) -> str | None:
        """A run that ended ended its instance with it, unless it was kept (--keep)."""
        del node_run_dir
        if state in FINAL_STATES and not self.keep:
            return (
                f"run {run} has ended ({state}) and its instance was ended with it: there is no "
                "node to open a shell on."
            )
        return None

    def down_command(self) -> str:
        """`reproduce down` with the run's absolute directory: it works from any directory,
        and without the user's index too (another $HOME)."""
        where = self.state_path.parent if self.state_path else self.run_id
        return f"reproduce down {where}"

    def to_record(self) -> dict[str, Any]:
        """What attach/cancel need to reach and release this run's nodes (run.json; no secrets).
        aws.json is named by its absolute path, so the record holds from any directory (and,
        read through RunDir.recorded_path, after the run directory is moved)."""
        return {
            "kind": "aws",
            "state_path": str(self.state_path) if self.state_path else None,
            "region": self.region_hint,
            "run_id": self.run_id,
            "launch_id": self.launch_id,
            "keep": self.keep,
            "run_end_grace_s": self.run_end_grace_s,  # the node ends itself (None: it does not)
            "target": self.target_id,
            "ssh": dict(self.ssh_opts),
        }

    @classmethod
    def from_record(
        cls,
        record: Mapping[str, Any],
        *,
        run_dir: Path | None = None,
        session: Session | None = None,
        log: Callable[[str], Any] = lambda _line: None,
    ) -> AwsCluster:
        """A cluster for a recorded run: transports to its nodes, a release that ends them.

        Its identity comes as `reproduce down` finds it (down.py): the launcher's own record over
        aws.json, and run.json's record when aws.json cannot be read (then its resources are
        found by tag). aws.json is read against `run_dir` (RunDir.recorded_path), never against
        the directory the command runs in; when it is not there, release is an error naming
        the run's instances and `reproduce down`.
        """
        recorded = record.get("state_path")
        state_path: Path | None = None
        if isinstance(recorded, str) and recorded:
            state_path = (
                RunDir(run_dir).recorded_path(recorded, "cluster.state_path")
                if run_dir is not None
                else Path(recorded)
            )
        cluster = cls(
            None,
            None,
            str(record.get("run_id") or ""),
            keep=bool(record.get("keep")),
            instance_id=record.get("target"),
            session=session,
            log=log,
            state_path=state_path,
        )
        cluster.ssh_opts.update(record.get("ssh") or {})
        if isinstance(grace := record.get("run_end_grace_s"), (int, float)):
            cluster.run_end_grace_s = float(grace)
        path = cluster.state_path
        if path is None or not path.is_file():
            ids = RunDir(run_dir).instance_ids() if run_dir is not None else []
            cluster.unfound = unfound_message(ids, path, record.get("region"), run_dir)
        else:
            given = {k: record.get(k) for k in ("region", "run_id", "launch_id")}
            cluster.state = load_state(path, safe(log), **given)
            cluster.launch_id = str(cluster.state.data.get("launch_id") or cluster.launch_id)
            if cluster.state.path is None:  # aws.json was unreadable: write a fresh one
                cluster.state.path = path
            if not cluster.target_id and cluster.state.data["targeted"]:
                cluster.target_id = cluster.state.data["targeted"][0]
        return cluster

    # --- the launch program's hands ------------------------------------------------------------
    def _node_from(
        self,
        inst: InstanceTypeDef,
        index: int,
        launched: bool,
        ami_id: str | None,
        identity_file: str | None,
        via: Node | None = None,
    ) -> Node:
        """A launched (or targeted) instance as a Node: the head dialled at connect_host or its
        public address, any other node at its private address from the head (`via`)."""
        s = self.settings
        assert s is not None
        private = inst.get("PrivateIpAddress") or _primary_private_ip(inst)
        public = inst.get("PublicIpAddress") if via is None else None
        dial = (s.connect_host or public or private) if via is None else private
        return Node(
            name=f"node{index}",
            host=str(private or dial),
            connect_host=dial,
            via=via,
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

    def _wait_ssh(self, nodes: list[Node], deadline: float) -> None:
        """Until each node's sshd greets: dialled from here, or through the head for a node
        behind it (the head's own connection must work: a refused key is no reason to wait)."""
        s = self.settings
        assert s is not None
        timeout_s = min(s.connect_timeout_s, 10.0)
        for node in nodes:
            host, port = node.connect_host or node.host, node.port
            where = f"{host}:{port}"
            jump = None
            if node.via is not None:
                jump = self.transport(node.via)
                where += f" through {node.via.name}"
                jump.connect()

            def answers(
                host: str = host, port: int = port, jump: SSHTransport | None = jump
            ) -> bool:
                if jump is not None:
                    return ssh_banner_through(jump, host, port, timeout_s)
                return ssh_banner(host, port, timeout_s)

            wait_until(
                answers,
                deadline,
                f"SSH on {where} ({node.meta['instance_id']}) never answered",
                s.ready_timeout_s,
                self.poll_s,
                self._over_budget,
            )
            self.log(f"aws: {node.name} {node.meta['instance_id']} answers SSH at {where}")


def check(
    recipe: Recipe,
    profile: Profile,
    run_id: str,
    *,
    owner: str = "unknown",
    session: Session | None = None,
    ami_resolver: Callable[[str], str] | None = None,
    operator_cidr: str | None = None,
    log: Callable[[str], Any] = lambda _line: None,
) -> list[str]:
    """`--check`: the launch program with DryRun=True, where credentials exist; nothing is created.

    The read-only lookups (instance type, AMI, subnets, reservation) run for real; every call that
    would create something is sent with DryRun=True, so AWS checks permissions and parameters.
    Returns one line per call; raises InfraError (or BadInput) naming the first refusal, after
    logging the lines that passed.
    """
    cluster = AwsCluster(
        recipe,
        profile,
        run_id,
        owner=owner,
        session=session,
        ami_resolver=ami_resolver,
        operator_cidr=operator_cidr,
        log=log,
    )
    assert cluster.settings is not None
    cluster.session  # noqa: B018 - credentials and region first
    api = Executor(Mode.CHECK, cluster.settings, cluster.client, cluster.poll_s)
    api.lines.append(price_line(recipe, profile, cluster.settings, cluster.session))
    try:
        program.run(cluster.launch_context(), api)
    finally:
        for line in api.lines:
            log(line)
    return api.lines


def price_line(recipe: Recipe, profile: Profile, s: AwsSettings, session: Session) -> str:
    """`--check`'s line for the run's price: the lookup a real run makes before its cost is
    shown, sent (a failure is a warning: the catalog's price stands in)."""
    from launcher.catalog import price_per_hour
    from launcher.clusters.aws.prices import live_price

    if s.price_per_hour is not None:
        return f"ok   price ${s.price_per_hour:g}/h per node: given (profile or --price-per-hour)"
    try:
        fallback = price_per_hour(s.instance_type, s.region or session.region_name)
    except BadInput:
        fallback = None
    price, why = live_price(recipe, profile, fallback, session=session)
    if why:
        return f"warn price: {why}"
    assert price is not None
    return f"ok   price ${price.value:g}/h per node ({price.describe()})"


def price_of(s: AwsSettings, region: str | None) -> float | None:
    from launcher.catalog import price_per_hour

    try:
        price = price_per_hour(s.instance_type, region, s.price_per_hour)
    except BadInput:
        return None
    return price.value if price else None


def ssh_banner(host: str, port: int, timeout_s: float) -> bool:
    """True once something on host:port speaks SSH (an open port alone is not enough)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def ssh_banner_through(jump: SSHTransport, host: str, port: int, timeout_s: float) -> bool:
    """ssh_banner, dialled from the jump node (an SSHTransport) instead of from here."""
    try:
        chan = jump.open_tunnel(host, port, timeout_s)
    except InfraError:
        return False
    try:
        chan.settimeout(timeout_s)
        return bool(chan.recv(64).startswith(b"SSH-"))
    except (OSError, EOFError):
        return False
    finally:
        chan.close()


def _primary_private_ip(inst: InstanceTypeDef) -> str | None:
    for eni in inst.get("NetworkInterfaces", []):
        if address := eni.get("PrivateIpAddress"):
            return address
    return None


def _node_record(node: Node) -> dict[str, Any]:
    """aws.json's record of a node (its head, as `via`, nested): Node(**record) restores it."""
    return asdict(node)
