"""The SSH host keys of a launched instance, pinned from what it printed on its own console.

Why: a host the launcher just created has a key nobody has seen, and trusting whatever answers
first on its address (trust on first use) lets anyone who can answer there first read the run's
secrets. cloud-init prints the instance's host key fingerprints on the serial console
(`-----BEGIN SSH HOST KEY FINGERPRINTS-----`), and EC2 hands that output only to the account that
owns the instance (GetConsoleOutput), so it is a channel the network cannot forge. The fingerprints
become the pin the SSH transport checks (any of them, whichever key type the server offers).

When the console shows none within `host_key_wait_s` (an AMI without cloud-init, a console that
lags), the launcher says so and falls back to trust on first use, recording the key it was shown in
the run's aws_known_hosts; docs/aws.md explains the choice.
"""

from __future__ import annotations

import re
import time
from typing import Any

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.executor import Executor, Launch, Mode, stop_if_over
from launcher.errors import ReproduceError

BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
END = "-----END SSH HOST KEY FINGERPRINTS-----"
_SHA256 = re.compile(r"\bSHA256:[A-Za-z0-9+/]{43}\b")


def fingerprints(console: str) -> list[str]:
    """The SHA256 fingerprints of the last complete block cloud-init printed ([] when none)."""
    end = console.rfind(END)
    begin = console.rfind(BEGIN, 0, end) if end >= 0 else -1
    if begin < 0:
        return []
    block = console[begin + len(BEGIN) : end]
    return list(dict.fromkeys(_SHA256.findall(block)))


def host_keys(launch: Launch, api: Executor) -> None:
    """Each launched node's host key fingerprints, from its console output (node.meta).

    The nodes are waited for together, within one host_key_wait_s: a cluster of many nodes
    whose consoles show nothing must not wait that long once per node.
    """
    note = "the SSH host key fingerprints cloud-init printed: the key SSH accepts (no TOFU)"
    if api.mode is Mode.CHECK:
        return  # nothing was launched to read
    if api.mode is Mode.PRINT:
        for index in range(launch.s.nodes):
            iid = rq.placeholder(f"instance of node {index}")
            api.read("ec2", "GetConsoleOutput", {"InstanceId": iid, "Latest": True}, note, "")
        return
    until = time.monotonic() + launch.s.host_key_wait_s
    waiting = list(launch.nodes)
    why = {}
    while True:
        for node in list(waiting):
            iid = str(node.meta["instance_id"])
            found, failed = _console_fingerprints(api, iid)
            if failed:
                why[node.name] = failed
            if found or failed:
                waiting.remove(node)
            if found:
                node.meta["host_key_fingerprints"] = found
                launch.log(f"aws: {node.name} host key pinned to its console: {', '.join(found)}")
        if not waiting or time.monotonic() >= until:
            break
        stop_if_over(api.over_budget)
        time.sleep(api.poll_s)
    for node in waiting:
        why[node.name] = f"within host_key_wait_s={launch.s.host_key_wait_s:g} s"
    for node in launch.nodes:
        if node.name in why:
            node.meta["host_key"] = "trusted on first use"
            launch.log(
                f"aws: no SSH host key fingerprints on the console of {node.meta['instance_id']} "
                f"{why[node.name]}: its key is trusted on first use (recorded in the run's "
                "aws_known_hosts)"
            )


def _console_fingerprints(api: Executor, iid: str) -> tuple[list[str], str]:
    """The fingerprints on an instance's console now, or why they cannot be read ('' if they
    may still come)."""
    params = {"InstanceId": iid, "Latest": True}
    try:
        resp: Any = api.read("ec2", "GetConsoleOutput", params, "", f"reading {iid}'s console")
    except ReproduceError as err:  # not allowed, throttled: fall back, saying why
        return [], f"(GetConsoleOutput failed: {err})"
    return fingerprints(str((resp or {}).get("Output") or "")), ""
