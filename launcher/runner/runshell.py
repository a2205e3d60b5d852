"""`reproduce ssh RUN`: a shell on a node the run holds, trusting only the host key the run pinned.

Why the system ssh: a person wants their own terminal, agent, escape keys and window size, which
OpenSSH gives and a Python shell loop would imitate badly. Why not the user's known_hosts: the
run's trust is its own (a profile's pinned fingerprint, its known_hosts file, or for a launched
instance the keys its console printed: launcher/clusters/aws/hostkeys.py). So the launcher first
connects with the run's own transport, which checks the node's key exactly as the run did, takes
the key that passed, and writes it to a known_hosts file of this run alone (under
$REPRODUCE_HOME/ssh/, mode 0600) under an alias; ssh is then run with StrictHostKeyChecking=yes
against that file only, with the key's algorithm only, so it connects to that key or not at all.
A node behind another (a cloud worker behind its head) is reached with a ProxyCommand that is
the same kind of ssh to the head.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.clusters.contract import WithNodeShell, WithStepShell
from launcher.errors import BadInput, InfraError
from launcher.records.atomic import write_atomic
from launcher.records.rundir import RunDir

if TYPE_CHECKING:
    from launcher.clusters.base import Cluster, Node, Transport
    from launcher.clusters.execution import Place

# A key type as paramiko names it -> the host key algorithms OpenSSH accepts for it.
_ALGORITHMS = {
    "ssh-rsa": "rsa-sha2-512,rsa-sha2-256,ssh-rsa",
    "ssh-ed25519": "ssh-ed25519",
    "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384": "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521": "ecdsa-sha2-nistp521",
}


@dataclass(frozen=True)
class Hop:
    """One SSH connection of the way to the node: where to dial and the key it must show."""

    dial: str
    port: int
    user: str | None
    identity_file: str | None
    alias: str  # the name its key is filed under in the run's known_hosts
    key_type: str
    key_base64: str


def ssh_argv(
    hops: list[Hop], known_hosts: Path, remote: list[str], *, tty: bool = True
) -> list[str]:
    """The ssh command line to the last hop (through the ones before it), trusting only the
    keys in `known_hosts`. `remote`: the command to run there (empty: a login shell)."""
    argv = ["ssh", *_hop_options(hops, known_hosts, tty=tty), "--", _destination(hops[-1])]
    return argv + list(remote)


def _destination(hop: Hop) -> str:
    """user@host, always after `--` on ssh's command line: a profile's host or user that starts
    with `-` (`-oProxyCommand=...`) is then a name that fails to resolve, never an option that
    runs a command on the operator's machine (the schema refuses them too)."""
    return f"{hop.user}@{hop.dial}" if hop.user else hop.dial


def _hop_options(hops: list[Hop], known_hosts: Path, *, tty: bool) -> list[str]:
    *before, last = hops
    options = _options(last, known_hosts)
    if before:
        jump = ["ssh", *_hop_options(before, known_hosts, tty=False)]
        proxy = [*jump, "-W", f"{last.dial}:{last.port}", "--", _destination(before[-1])]
        options += ["-o", f"ProxyCommand={shlex.join(proxy)}"]
    return options + (["-t"] if tty else [])


def _options(hop: Hop, known_hosts: Path) -> list[str]:
    options = [
        "-p",
        str(hop.port),
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"HostKeyAlias={hop.alias}",
        "-o",
        f"HostKeyAlgorithms={_ALGORITHMS.get(hop.key_type, hop.key_type)}",
        "-o",
        "UpdateHostKeys=no",
    ]
    if hop.identity_file:
        options += ["-i", hop.identity_file, "-o", "IdentitiesOnly=yes"]
    return options


def known_hosts_text(hops: list[Hop]) -> str:
    return "".join(f"{h.alias} {h.key_type} {h.key_base64}\n" for h in hops)


def login_command(node_run_dir: str) -> list[str]:
    """The default: a login shell in the run's directory on the node."""
    return [f'cd {shlex.quote(node_run_dir)} 2>/dev/null; exec "${{SHELL:-/bin/bash}}" -l']


def shell_argv(rd: RunDir, index: int, remote: list[str]) -> list[str]:
    """The command line that opens a shell (or runs `remote`) on node `index` of the run: ssh
    to the node (through the hops it needs, `WithNodeShell`), or for a scheduler's job a step
    of it on that node (`WithStepShell`), run on the login node: here when the launcher runs
    there, else over ssh to it, its host key pinned as the run pinned it."""
    cluster, nodes, place = _recorded(rd, index)
    if isinstance(cluster, WithStepShell):
        transport = cluster.step_transport()
        try:
            step = cluster.step_argv(index, place.node_run_dir, remote)
            if transport is None:
                return step  # the launcher runs on the login node: srun here
            hops = _verified_hops(transport, rd.run_id, index)
        finally:
            if transport is not None:
                transport.close()
        known = write_known_hosts(rd.run_id, index, hops)
        return ssh_argv(hops, known, [shlex.join(step)], tty=not remote)
    hops, node_run_dir = _node_hops(rd, cluster, nodes[index], place.node_run_dir, index)
    known = write_known_hosts(rd.run_id, index, hops)
    command = list(remote) or login_command(node_run_dir)
    return ssh_argv(hops, known, command, tty=not remote)


def _recorded(rd: RunDir, index: int) -> tuple[Cluster, list[Node], Place]:
    """The run's cluster, its nodes and node `index`'s place, as its record keeps them."""
    from launcher import clusters
    from launcher.clusters.base import Node
    from launcher.runner.nodes import place_of
    from launcher.runner.runlogs import recorded_nodes

    record = rd.record()
    nodes = [Node(**n) for n in recorded_nodes(record)]
    if not nodes or "cluster" not in record:
        raise BadInput(f"run {rd.path.name} never reached a node: there is no shell to open.")
    if not 0 <= index < len(nodes):
        raise BadInput(
            f"--node {index}: run {rd.path.name} has {len(nodes)} node(s), numbered 0 to "
            f"{len(nodes) - 1}."
        )
    place = place_of(
        nodes[index],
        index,
        len(nodes),
        str(record.get("run_id")),
        str(record.get("node_run_dir")),
        str(record.get("container")),
    )
    return clusters.from_record(record["cluster"], rd.path), nodes, place


def hops_for(rd: RunDir, index: int) -> tuple[list[Hop], str]:
    """The verified way to node `index` of the run, and its run directory there. Connects once
    with the run's own transport (its host key checked as the run checks it); InfraError when
    the node cannot be reached or shows another key, BadInput when the run has no shell."""
    cluster, nodes, place = _recorded(rd, index)
    return _node_hops(rd, cluster, nodes[index], place.node_run_dir, index)


def _node_hops(
    rd: RunDir, cluster: Cluster, node: Node, node_run_dir: str, index: int
) -> tuple[list[Hop], str]:
    if not isinstance(cluster, WithNodeShell):
        raise BadInput(
            f"run {rd.path.name} ran on a {cluster.name} cluster, which gives no shell on its "
            "nodes (only its job server): use `reproduce logs RUN`."
        )
    why = cluster.shell_refusal(rd.path.name, rd.status().get("state"), node_run_dir)
    if why:
        raise BadInput(why)
    transport = cluster.transport(node)
    try:
        return _verified_hops(transport, rd.run_id, index), node_run_dir
    finally:
        transport.close()


def _verified_hops(given: Transport, run_id: str, index: int) -> list[Hop]:
    """Connect through the run's transport (its host-key policy decides) and keep each key that
    passed, the jump's first. InfraError for a transport that is not SSH's (ssh, aws and a
    Slurm login node are reached by SSH; the callers refuse the other kinds first)."""
    from launcher.clusters.ssh import SSHTransport

    if not isinstance(given, SSHTransport):
        raise InfraError(f"run {run_id}: node {index} is not reached over SSH")
    transport = given
    transport.connect()
    hops: list[Hop] = []
    chain: list[SSHTransport] = []
    here: SSHTransport | None = transport
    while here is not None:
        chain.append(here)
        here = here.jump
    for depth, hop in enumerate(reversed(chain)):
        client = getattr(hop, "_client", None)  # the connection connect() just checked
        link = client.get_transport() if client is not None else None
        if link is None:
            raise InfraError(f"no SSH connection to {hop.node.name} to take its host key from")
        key = link.get_remote_server_key()
        settings = hop.settings
        hops.append(
            Hop(
                dial=hop.dial,
                port=int(hop.node.port),
                user=hop.node.user or settings.user,
                identity_file=hop.node.identity_file or settings.identity_file,
                alias=f"reproduce-{run_id}-node{index}-hop{depth}",
                key_type=key.get_name(),
                key_base64=key.get_base64(),
            )
        )
    return hops


def write_known_hosts(run_id: str, index: int, hops: list[Hop]) -> Path:
    """The run's known_hosts for node `index` (0600, under $REPRODUCE_HOME/ssh/)."""
    from launcher.records import state

    folder = state.home() / "ssh"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{run_id}-node{index}.known_hosts"
    if path.parent != folder or "/" in run_id or run_id in ("", ".", ".."):
        # run.json's run_id is checked when read (launcher/records/recordform.py); this file is
        # written only in its folder whatever a caller hands in
        raise BadInput(f"run id {run_id!r} cannot name a file under {folder}.")
    write_atomic(path, known_hosts_text(hops), mode=0o600, chmod=0o600)
    return path
