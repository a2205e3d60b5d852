#!/usr/bin/env python3
r"""The Ray cluster of a multi-node run, assembled: node 0 waits for every node, node K for node 0.

Runs ON the node, inside the training container, in the ray stage of node.sh
(launcher/plan/multinode.py
renders the calls); standard library only, except `ray` for wait-nodes (the image has it). Never
imports `launcher`.

    python3 ray_nodes.py wait-head --address HEAD:6379 --timeout-s 900
    python3 ray_nodes.py wait-nodes --address HEAD:6379 --nodes 4 --gpus 32 \
        --expect "10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4" --timeout-s 900

wait-head: node K may reach its ray stage before node 0 started the head (a faster pull, assets
already cached): it waits until node 0's GCS port accepts a connection. wait-nodes: training may
start only once Ray reports every node alive and every GPU the recipe needs; past the deadline it
fails naming the nodes missing (from --expect, every node's address in rank order), so the run's
error says which node never joined. Both print one line per state change on stderr and exit 0 when
ready, 1 at the deadline, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from typing import Any


def say(text: str) -> None:
    print(f"reproduce: {text}", file=sys.stderr, flush=True)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"ray_nodes.py: --address must be HOST:PORT, not {address!r}")
    return host, int(port)


def wait_head(address: str, timeout_s: float, poll_s: float = 1.0) -> int:
    host, port = _split(address)
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(0.5, poll_s))):
                say(f"node 0's Ray answers at {address}")
                return 0
        except OSError as err:
            if time.monotonic() >= deadline:
                say(
                    f"node 0's Ray at {address} did not answer within {timeout_s:g} s ({err}); "
                    "node 0 failed before its ray stage, or its address or port is not reachable "
                    "from this node"
                )
                return 1
            if not said:
                say(f"waiting for node 0's Ray at {address} (up to {timeout_s:g} s)")
                said = True
            time.sleep(poll_s)


def cluster_state(ray: Any) -> tuple[list[str], float]:
    """The addresses of the alive nodes, and their GPUs together."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    addresses = sorted(str(n.get("NodeManagerAddress")) for n in alive)
    gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in alive)
    return addresses, gpus


def missing_nodes(expect: list[str], joined: list[str]) -> list[str]:
    """Which expected nodes (rank order) have not joined, as `node K (ADDRESS)`."""
    return [f"node {i} ({addr})" for i, addr in enumerate(expect) if addr not in joined]


def wait_nodes(
    address: str, nodes: int, gpus: float, expect: list[str], timeout_s: float, poll_s: float = 1.0
) -> int:
    import ray

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout_s
        last = None
        while True:
            joined, have = cluster_state(ray)
            state = (len(joined), have)
            if state != last:
                say(f"Ray reports {len(joined)} of {nodes} nodes, {have:g} of {gpus:g} GPUs")
                last = state
            if len(joined) >= nodes and have >= gpus:
                say(f"all {nodes} nodes joined: {' '.join(joined)}")
                return 0
            if time.monotonic() >= deadline:
                missing = missing_nodes(expect, joined)
                named = (
                    f"missing: {', '.join(missing)}"
                    if missing
                    else f"joined: {' '.join(joined) or 'none'}; expected: {' '.join(expect)}"
                )
                say(
                    f"after {timeout_s:g} s Ray reports {len(joined)} of {nodes} nodes and "
                    f"{have:g} of {gpus:g} GPUs; {named}"
                )
                return 1
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    head = sub.add_parser("wait-head", help="wait until node 0's Ray answers")
    head.add_argument("--address", required=True, help="node 0's GCS, HOST:PORT")
    head.add_argument("--timeout-s", type=float, required=True)
    every = sub.add_parser("wait-nodes", help="wait until every node and GPU joined")
    every.add_argument("--address", required=True, help="this cluster's GCS, HOST:PORT")
    every.add_argument("--nodes", type=int, required=True)
    every.add_argument("--gpus", type=float, required=True)
    every.add_argument("--expect", default="", help="every node's address in rank order")
    every.add_argument("--timeout-s", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "wait-head":
        return wait_head(args.address, args.timeout_s)
    return wait_nodes(args.address, args.nodes, args.gpus, args.expect.split(), args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
