"""Helpers for the aws tests: moto for the lifecycle, a recording client for exact payloads and faults.

moto keeps instances, security groups, Elastic IPs, key pairs and tags, but drops what matters
most on p5en (the network-card indices, the placement group, the capacity reservation target,
the market type) and does not implement placement groups or capacity reservations. So the
session below hands out clients that record every call's parameters exactly as the launcher
passed them (before moto sees them), answer the calls moto lacks from a table, and raise
injected faults at a chosen call.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.paths import REPO, SEED

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata address for credentials
}


def console(*fingerprints: str) -> dict:
    """GetConsoleOutput's answer once cloud-init has printed the host key fingerprints."""
    lines = "\n".join(f"ec2: 256 {fp} root@ip-10-0-0-1 (ED25519)" for fp in fingerprints)
    text = (
        "[   12.3] cloud-init[1234]: Cloud-init v. 24.1 running 'modules:final'\n"
        "ec2: #############################################################\n"
        "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
        f"{lines}\n"
        "ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        "ec2: #############################################################\n"
    )
    return {"InstanceId": "i-x", "Output": text}


STANDIN_FINGERPRINT = "SHA256:" + "C" * 43  # a launched instance's key in the moto tests
QUOTA_NAMES = {
    "L-417A185B": "Running On-Demand P instances",
    "L-7212CCBC": "All P Spot Instance Requests",
}


def service_quota(params: dict, value: float = 1536.0) -> dict:
    """GetServiceQuota's answer, shaped as AWS gives it (the service model's fields)."""
    code = params["QuotaCode"]
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:us-east-1:123456789012:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": QUOTA_NAMES.get(code, code),
            "Value": value,
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }
    }


def client_error(code: str, message: str = "injected", operation: str = "Op") -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@dataclass
class Calls:
    """Every call made through the recording clients, in order."""

    log: list[tuple[str, dict]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.log]

    def params(self, name: str) -> list[dict]:
        return [params for n, params in self.log if n == name]

    def one(self, name: str) -> dict:
        found = self.params(name)
        assert len(found) == 1, f"{name} called {len(found)} times: {self.names()}"
        return found[0]


@dataclass
class AnswerLost:
    """A fault that lets the call take effect and then loses its answer (the connection reset, or
    Ctrl-C while the reply was on its way): what the call made exists, and the caller never
    learnt its name."""

    error: BaseException


class RecordingClient:
    """A boto3 client that records parameters, answers some calls itself and fails others on
    demand: a fault is an exception (raised before the call), a callable of the parameters
    (returning an exception to raise, an answer, or None to go on), or AnswerLost."""

    def __init__(
        self, real: Any, calls: Calls, canned: dict[str, Any], faults: dict[str, Any]
    ) -> None:
        self._real = real
        self._calls = calls
        self._canned = canned
        self._faults = faults
        self.meta = real.meta
        self.exceptions = real.exceptions

    def get_paginator(self, name: str) -> Any:
        return self._real.get_paginator(name)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        real_method = getattr(self._real, name)

        def call(**params: Any) -> Any:
            self._calls.log.append((name, params))
            fault = self._faults.get(name)
            if isinstance(fault, AnswerLost):
                self._answer(name, real_method, params)
                raise fault.error
            if fault is not None:
                result = fault(params) if callable(fault) else fault
                if isinstance(result, BaseException):
                    raise result
                if result is not None:
                    return result
            return self._answer(name, real_method, params)

        return call

    def _answer(self, name: str, real_method: Callable[..., Any], params: dict) -> Any:
        if name in self._canned:
            answer = self._canned[name]
            return answer(params) if callable(answer) else answer
        return real_method(**params)


class PlacementGroups:
    """Placement groups with their tags, as EC2 keeps them (moto does not implement them)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict] = {}

    def create(self, params: dict) -> dict:
        tags = [t for spec in params.get("TagSpecifications", []) for t in spec.get("Tags", [])]
        group = {"GroupName": params["GroupName"], "Strategy": params.get("Strategy"), "Tags": tags}
        self.groups[params["GroupName"]] = group
        return {"PlacementGroup": group}

    def describe(self, params: dict) -> dict:
        found = list(self.groups.values())
        for f in params.get("Filters", []):
            name, values = f["Name"], f["Values"]
            if name == "group-name":
                found = [g for g in found if g["GroupName"] in values]
            elif name == "tag-key":
                found = [g for g in found if any(t["Key"] in values for t in g["Tags"])]
            elif name.startswith("tag:"):
                key = name[len("tag:") :]
                found = [
                    g
                    for g in found
                    if any(t["Key"] == key and t["Value"] in values for t in g["Tags"])
                ]
        return {"PlacementGroups": found}

    def delete(self, params: dict) -> dict:
        if self.groups.pop(params["GroupName"], None) is None:
            raise client_error("InvalidPlacementGroup.Unknown", "no such group", "Delete")
        return {}


class RecordingSession:
    """Wraps a boto3 Session: clients record, credentials and regions come from the real one."""

    def __init__(self, real: Any, calls: Calls | None = None) -> None:
        self._real = real
        self.calls = calls or Calls()
        self.placement_groups = PlacementGroups()
        self.canned: dict[str, Any] = {
            # moto does not implement placement groups
            "create_placement_group": self.placement_groups.create,
            "delete_placement_group": self.placement_groups.delete,
            "describe_placement_groups": self.placement_groups.describe,
            # moto's console output is a fixed kernel log without cloud-init's fingerprints
            "get_console_output": console(STANDIN_FINGERPRINT),
            # moto's Service Quotas know only vpc: an account with room for 8 p5en nodes
            "get_service_quota": service_quota,
        }
        self.faults: dict[str, Any] = {}

    @property
    def region_name(self) -> str | None:
        return self._real.region_name

    def get_credentials(self) -> Any:
        return self._real.get_credentials()

    def get_available_partitions(self) -> list[str]:
        return self._real.get_available_partitions()

    def get_available_regions(self, *args: Any, **kw: Any) -> list[str]:
        return self._real.get_available_regions(*args, **kw)

    def client(self, name: str, **kw: Any) -> RecordingClient:
        return RecordingClient(self._real.client(name, **kw), self.calls, self.canned, self.faults)


def write_profile(tmp: Path, **fields: Any) -> Path:
    """An aws profile file (validated by load_profile like any user's)."""
    data = {
        "kind": "aws",
        "region": "us-east-1",
        "ssh_cidr": "127.0.0.1/32",
        "connect_host": "127.0.0.1",
        "connect_timeout_s": 2,
        "ready_timeout_s": 5,
        "host_key_wait_s": 0.5,  # a moto server's console never shows fingerprints
    }
    data.update(fields)
    path = tmp / f"aws-{abs(hash(tuple(sorted(map(str, data.items())))))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(tmp: Path, **fields: Any):
    from launcher.inputs.profile import load_profile

    return load_profile(str(write_profile(tmp, **fields)))


def seed_recipe():
    from launcher.inputs.recipe import load_recipe

    return load_recipe(SEED)


def two_node_recipe(tmp: Path):
    """The seed on 2 nodes (16 GPUs, DP 16): the case that needs a placement group."""
    return nodes_recipe(tmp, 2)


class BannerServer:
    """A loopback TCP listener that greets like sshd (for 'SSH answers' without a real server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.sendall(b"SSH-2.0-OpenSSH_test\r\n")
            finally:
                conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def live_resources(ec2: Any) -> dict[str, list[str]]:
    """What is still allocated in the (moto) account: the assertion of every fault test."""
    instances = [
        i["InstanceId"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    return {
        "instances": instances,
        "addresses": [a["AllocationId"] for a in ec2.describe_addresses()["Addresses"]],
        "security_groups": [
            g["GroupId"]
            for g in ec2.describe_security_groups()["SecurityGroups"]
            if g["GroupName"] != "default"
        ],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]],
    }


NOTHING = {"instances": [], "addresses": [], "security_groups": [], "key_pairs": []}


def fake_env() -> dict[str, str]:
    return dict(FAKE_ENV)


def set_fake_env(monkeypatch: Any) -> None:
    for key, value in FAKE_ENV.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


# --- fixtures (imported by the tests/test_aws*.py modules) -------------------------------------------


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """A moto account in us-east-1 behind a recording session; fake credentials only here."""
    set_fake_env(monkeypatch)
    monkeypatch.setenv("REPRODUCE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(
        "MOTO_EC2_LOAD_DEFAULT_AMIS", "false"
    )  # seconds per test otherwise; `ami` registers one
    from moto import mock_aws

    from launcher.clusters.aws.session import new_session

    with mock_aws():
        yield RecordingSession(new_session("us-east-1"))


@pytest.fixture
def ami(aws) -> str:
    """A registered image standing in for the Deep Learning AMI (moto has no such SSM parameter)."""
    return aws._real.client("ec2").register_image(
        Name="dlami-standin", RootDeviceName="/dev/sda1", Architecture="x86_64"
    )["ImageId"]


@pytest.fixture
def banner():
    server = BannerServer()
    yield server
    server.close()


@pytest.fixture
def moto_server(monkeypatch, tmp_path):
    """A moto server on loopback, reached through AWS_ENDPOINT_URL (as a real launcher would be)."""
    from moto.server import ThreadedMotoServer

    set_fake_env(monkeypatch)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto keeps its accounts in the process, not the server: without a reset a test would see
    # what an earlier test on the same worker left (its "empty account" assertions then lie)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    yield endpoint
    server.stop()


# --- several SSH "nodes" on loopback (the jump through the head) ---------------------------------


def loopback_sshd(root: Path, address: str, port: int | None = None, user_key: Path | None = None):
    """A real sshd listening on `address` only (127.0.0.2, 127.0.0.5, ...), with its own host key;
    `user_key` (a private key file) is let in besides its own (every node takes the run's key).

    The nodes behind a head are reached at their private addresses from the head's sshd; on one
    machine those are other loopback addresses, which the launcher itself must never dial.
    """
    import subprocess

    from support.ports import free_port, wait_for_port
    from support.sshd import SSHD, SshServer

    server = SshServer(root, port=port or free_port())
    config = server.root / "sshd_config"
    config.write_text(
        config.read_text().replace("ListenAddress 127.0.0.1\n", f"ListenAddress {address}\n")
    )
    host_pub = (server.root / "ssh_host_ed25519_key.pub").read_text().split()
    server.known_hosts.write_text(f"[{address}]:{server.port} {host_pub[0]} {host_pub[1]}\n")
    if user_key is not None:
        with open(server.root / "authorized_keys", "a") as fh:
            fh.write(Path(f"{user_key}.pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)
    with open(server.log, "ab") as log:
        server.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
    try:
        wait_for_port(server.port, host=address)
    except RuntimeError as err:
        server.stop()
        raise RuntimeError(
            f"sshd on {address} did not start: {server.log.read_text()[-2000:]}"
        ) from err
    return server


# A subnet of 127.0.0.0/24 in moto gives its instances 127.0.0.4, .5, ... in launch order: the
# "private addresses" of a cluster's nodes are then loopback addresses an sshd can listen on.
LOOPBACK_VPC = "127.0.0.0/16"
LOOPBACK_SUBNET = "127.0.0.0/24"
WORKER_ADDRESSES = ("127.0.0.5", "127.0.0.6", "127.0.0.7")  # nodes 1-3 of a 4-node launch
OPERATOR_KEY = "operator"


@dataclass
class LoopbackNodes:
    """The SSH side of a multi-node launch on one machine: the session's sshd is the head
    (dialled at connect_host 127.0.0.1), one sshd per worker on its "private address" at the
    same port, each with its own host key, reachable by the launcher only through the head."""

    head: Any
    workers: dict[str, Any]

    def fingerprint(self, private_ip: str | None) -> str:
        worker = self.workers.get(str(private_ip))
        return (worker or self.head).host_fingerprint

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()


@pytest.fixture(scope="module")
def loopback_nodes(sshd, tmp_path_factory):
    workers = {}
    try:
        for address in WORKER_ADDRESSES:
            root = tmp_path_factory.mktemp(f"node-{address}")
            workers[address] = loopback_sshd(
                root, address, port=sshd.port, user_key=sshd.identity_file
            )
        nodes = LoopbackNodes(sshd, workers)
        yield nodes
    finally:
        for worker in workers.values():
            worker.stop()


def multinode_fields(aws: RecordingSession, nodes: LoopbackNodes) -> dict[str, Any]:
    """Profile fields for a launch whose nodes are `nodes`: a loopback subnet, the sshd user's key
    imported as the key pair, and each instance's console showing its own sshd's fingerprint."""
    ec2 = aws._real.client("ec2")
    vpc = ec2.create_vpc(CidrBlock=LOOPBACK_VPC)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=LOOPBACK_SUBNET, AvailabilityZone="us-east-1a")[
        "Subnet"
    ]["SubnetId"]
    pub = Path(f"{nodes.head.identity_file}.pub").read_bytes()
    ec2.import_key_pair(KeyName=OPERATOR_KEY, PublicKeyMaterial=pub)

    def console_of(params: dict) -> dict:
        [inst] = ec2.describe_instances(InstanceIds=[params["InstanceId"]])["Reservations"][0][
            "Instances"
        ]
        if inst["AmiLaunchIndex"] == 0:  # the head: dialled at connect_host, the session's sshd
            return console(nodes.head.host_fingerprint)
        return console(nodes.fingerprint(inst.get("PrivateIpAddress")))

    aws.canned["get_console_output"] = console_of
    return {
        "subnet_id": subnet,
        "key_name": OPERATOR_KEY,
        "identity_file": str(nodes.head.identity_file),
        "user": nodes.head.user,
        "port": nodes.head.port,
        "connect_host": "127.0.0.1",
        "ready_timeout_s": 20,
    }


def seed_on_nodes(nodes: int) -> dict[str, Any]:
    """The seed recipe's YAML on `nodes` nodes (8 GPUs each, DP over all of them, the batch
    `nodes` times the seed's: the same work per GPU, so the claimed tokens/s per GPU holds)."""
    raw = yaml.safe_load(SEED.read_text())
    batch = raw["workload"]["global_batch"]
    raw["gpu"]["count"] = 8 * nodes
    raw["layout"]["dp"] = 8 * nodes
    raw["workload"]["global_batch"] = batch * nodes
    raw["result"]["window_tokens"] *= nodes
    raw["result"]["gpu_hours"] *= nodes
    raw["run"] = (
        raw["run"]
        .replace("--actor-num-nodes 1", f"--actor-num-nodes {nodes}")
        .replace(f"--rollout-batch-size {batch} ", f"--rollout-batch-size {batch * nodes} ")
        .replace(f"--global-batch-size {batch} ", f"--global-batch-size {batch * nodes} ")
    )
    return raw


def nodes_recipe(tmp: Path, nodes: int):
    """The seed on `nodes` nodes (8 GPUs each, DP over all of them, the batch `nodes` times the
    seed's: the same work per GPU, so the claimed tokens/s per GPU still holds)."""
    from launcher.inputs.recipe import load_recipe

    raw = seed_on_nodes(nodes)
    path = tmp / f"{nodes}-node.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def live_with_operator_key(ec2: Any) -> dict[str, list[str]]:
    """live_resources, the operator's own (imported) key pair aside: it is not the run's."""
    live = live_resources(ec2)
    live["key_pairs"] = [k for k in live["key_pairs"] if k != OPERATOR_KEY]
    return live


# --- a moto server for the CLI in its own process ---------------------------------------------------


class MotoAws:
    """A moto server on 127.0.0.1 and what a CLI process needs to reach it (and nothing else)."""

    def __init__(self, endpoint: str, state_dir: Path) -> None:
        import boto3

        self.endpoint = endpoint
        self.entry: Path | None = None
        self.placement_groups: PlacementGroups | None = None
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
        self.env.update(FAKE_ENV)
        self.env.update(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "REPRODUCE_STATE_DIR": str(state_dir),
                "PYTHONPATH": str(REPO),
            }
        )
        self.ec2 = boto3.client(
            "ec2",
            region_name="us-east-1",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def command(self, *args: str) -> list[str]:
        """`reproduce ARGS` as a command line (`entry`: a test's own way into the launcher)."""
        start = [str(self.entry)] if self.entry else ["-m", "launcher"]
        return [sys.executable, *start, *args]

    def reproduce(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`reproduce ARGS` with this account's environment (stdin not a terminal)."""
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=self.env,
            timeout=timeout,
            cwd=REPO,
        )


def serve_placement_groups(monkeypatch: Any) -> PlacementGroups:
    """Placement groups in a moto SERVER (which lacks them), kept with their tags by the same
    stand-in as the recording session's. The server's backends run in this process, so the
    three actions are added to moto's EC2 responder for the test's duration."""
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response

    groups = PlacementGroups()

    def create_placement_group(self: Any) -> Any:
        self.error_on_dryrun()
        tags = self._parse_tag_specification("placement-group").get("placement-group", {})
        spec = [{"Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        params = {
            "GroupName": self._get_param("GroupName"),
            "Strategy": self._get_param("Strategy"),
            "TagSpecifications": spec,
        }
        return ActionResult(groups.create(params))

    def describe_placement_groups(self: Any) -> Any:
        filters = [
            {"Name": name, "Values": values}
            for name, values in self._filters_from_querystring().items()
        ]
        return ActionResult(groups.describe({"Filters": filters}))

    def delete_placement_group(self: Any) -> Any:
        self.error_on_dryrun()
        name = self._get_param("GroupName")
        if name not in groups.groups:
            raise EC2ClientError(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
            )
        groups.delete({"GroupName": name})
        return ActionResult({})

    for action in (create_placement_group, describe_placement_groups, delete_placement_group):
        monkeypatch.setattr(EC2Response, action.__name__, action, raising=False)
    return groups


@pytest.fixture
def moto_aws(monkeypatch, tmp_path):
    from moto.server import ThreadedMotoServer

    monkeypatch.setenv(
        "MOTO_EC2_LOAD_DEFAULT_AMIS", "false"
    )  # read by the in-process backend: seconds otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"

    # the server's backends live in this process and outlive a server: each test starts from an empty account
    def reset() -> None:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))

    reset()
    placement_groups = serve_placement_groups(monkeypatch)
    try:
        moto = MotoAws(endpoint, tmp_path / "state")
        moto.placement_groups = placement_groups
        yield moto
    finally:
        reset()
        server.stop()


class StubbedSession:
    """A real boto3 session whose clients are botocore Stubbers (one per service; nothing leaves
    the process): each request is checked against the service model and the expected payload,
    each answer against the model's response shape. For the calls moto lacks or fakes (Service
    Quotas for ec2, the Price List)."""

    def __init__(self, region: str = "us-east-1") -> None:
        from launcher.clusters.aws.session import new_session

        self.real = new_session(region)
        self.region_name = region
        self.stubs: dict[str, Any] = {}
        self.clients: dict[str, Any] = {}

    def stub(self, service: str) -> Any:
        from botocore.stub import Stubber

        if service not in self.stubs:
            client = self.real.client(service, region_name=self.region_name)
            self.clients[service] = client
            self.stubs[service] = Stubber(client)
            self.stubs[service].activate()
        return self.stubs[service]

    def get_credentials(self) -> Any:
        return self.real.get_credentials()

    def get_available_partitions(self) -> list[str]:
        return self.real.get_available_partitions()

    def get_available_regions(self, *args: Any, **kw: Any) -> list[str]:
        return self.real.get_available_regions(*args, **kw)

    def client(self, name: str, **kw: Any) -> Any:
        if name not in self.clients:
            raise AssertionError(f"unexpected {name} client: nothing was stubbed for it")
        return self.clients[name]

    def done(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()
            stub.deactivate()


def cluster(
    aws,
    ami,
    tmp_path,
    where: str = "run",
    run_id: str = "o1",
    *,
    recipe=None,
    profile=None,
    owner: str = "test",
    **fields,
):
    """The real AwsCluster on moto (the seed recipe unless `recipe`; the profile `load`ed from
    `fields` unless `profile`), its state under tmp_path/`where`, its messages kept in `.logs`."""
    from launcher.clusters.aws.cluster import AwsCluster

    logs: list[str] = []
    keep = bool(fields.pop("keep", False))
    c = AwsCluster(
        recipe or seed_recipe(),
        profile or load(tmp_path, **fields),
        run_id,
        keep=keep,
        session=aws,
        ami_resolver=lambda name: ami,
        state_path=tmp_path / where / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        log=logs.append,
        owner=owner,
    )
    c.logs = logs
    return c


def ec2_of(aws):
    """The moto EC2 client behind a RecordingSession."""
    return aws._real.client("ec2")


def quiet_down(path, aws, **kw):
    """`down` of a state file, its messages kept: (what ended, the lines)."""
    from launcher.clusters.aws.down import down

    lines: list[str] = []
    ended = down(path, session=aws, poll_s=0.01, log=lines.append, **kw)
    return ended, lines


def aws_profile(
    moto: MotoAws,
    sshd,
    tmp_path: Path,
    container_run_args: list[str],
    *,
    env: dict[str, str] | None = None,
) -> Path:
    """An aws profile whose instance is the sshd fixture (key pair imported, AMI registered in moto),
    for the real CLI end to end (tests/e2e/)."""
    from support.plan_env import write_profile as write_run_profile

    ami = moto.ec2.register_image(
        Name="dlami-standin", RootDeviceName="/dev/sda1", Architecture="x86_64"
    )["ImageId"]
    moto.ec2.import_key_pair(
        KeyName=OPERATOR_KEY, PublicKeyMaterial=Path(f"{sshd.identity_file}.pub").read_bytes()
    )
    base = {
        "kind": "aws",
        "region": "us-east-1",
        "ami": ami,
        "key_name": OPERATOR_KEY,
        "identity_file": str(sshd.identity_file),
        "user": sshd.user,
        "port": sshd.port,
        "connect_host": "127.0.0.1",
        "connect_timeout_s": 5,
        "ssh_cidr": "127.0.0.1/32",
        "ready_timeout_s": 30,
        "host_key_wait_s": 1,  # a moto server's console shows no fingerprints: trusted on first use
    }
    return write_run_profile(tmp_path, base, container_run_args, env=env)
