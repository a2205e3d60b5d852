#!/usr/bin/env python3
r"""An existing Ray cluster, checked against the recipe from inside the reproduction's Ray job.

Runs as part of the job the launcher submits to a Ray cluster (`kind: ray` profiles), where
RAY_ADDRESS is set; it needs `ray`, which every node of a Ray cluster has, and never imports
`launcher`. Two commands:

    python3 ray_cluster.py check --nodes 4 --gpus-per-node 8 --gpu-type H200 \
        --digest sha256:... --digest-env REPRODUCE_IMAGE_DIGEST [--wait-s 60]
    python3 ray_cluster.py each --nodes 4 --gpus-per-node 8 [--env K=V ...] -- preflight.py ARGS

`check` waits (up to --wait-s, for an autoscaler to bring nodes up) until the cluster has --nodes
alive nodes with exactly --gpus-per-node GPUs, of --gpu-type where Ray knows the type, then asks
every such node, with a task pinned to it, for the image digest its environment carries in
--digest-env (the cluster's nodes say which image they run: a pod spec's env, or the environment
`ray start` ran in). The value is read from the node's own environment, that of its raylet (the
task's parent), never from the task's: a task's environment is the node's plus the job's runtime
env, which the submitter (the recipe, the profile) writes, so a job could otherwise vouch for
itself. Each node that differs, does not say, or whose raylet cannot be read is a problem. One
JSON report on stdout (kept as image.json); every problem on stderr, one line each; exit 1 when
there is one.

`each` runs a program from the job's working_dir (the launcher's node programs) on every such node
at once, each in a task that holds the node's GPUs (so it sees exactly those), with the --env
values added. Stdout is the program's stdout from the first node where it failed, else from the
first node (the launcher keeps one report per stage); everyone's stderr is passed on, each line
prefixed with its node's address. Exit 1 when it failed anywhere, naming the nodes.

Exit 2 for bad arguments or no Ray; 1 for a cluster that does not fit or a program that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

GPU = "GPU"
ACCELERATOR = "accelerator_type:"


def say(text):
    print(f"reproduce: {text}", file=sys.stderr, flush=True)


def _ray():
    try:
        import ray
    except ImportError:
        say("this node has no `ray` module: is it a node of a Ray cluster?")
        sys.exit(2)
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=True)
    return ray


def _gpus(node):
    return float(node.get("Resources", {}).get(GPU, 0))


def _types(node):
    return sorted(
        k[len(ACCELERATOR) :] for k in node.get("Resources", {}) if k.startswith(ACCELERATOR)
    )


def _describe(node):
    types = "/".join(_types(node)) or "GPU"
    return f"{node['NodeManagerAddress']} ({_gpus(node):g} {types})"


def fitting_nodes(ray, args):
    """The alive nodes the recipe can use, in address order; (nodes, problems). Waits up to
    --wait-s while there are too few, since an autoscaling cluster adds nodes on demand."""
    deadline = time.monotonic() + max(0.0, args.wait_s)
    want = args.gpu_type.upper() if args.gpu_type else None
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        gpu_nodes = [n for n in alive if _gpus(n) > 0]
        fit: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        for node in gpu_nodes:
            types = [t.upper() for t in _types(node)]
            same_type = want is None or not types or any(t.startswith(want) for t in types)
            (fit if _gpus(node) == args.gpus_per_node and same_type else other).append(node)
        fit.sort(key=lambda n: n["NodeManagerAddress"])
        if len(fit) >= args.nodes or time.monotonic() >= deadline:
            break
        time.sleep(2.0)
    problems = []
    if len(fit) < args.nodes:
        gpu_type = f" {args.gpu_type}" if args.gpu_type else ""
        have = ", ".join(_describe(n) for n in fit) or "none"
        rest = ", ".join(_describe(n) for n in other) or "none"
        problems.append(
            f"the Ray cluster has {len(fit)} alive node(s) with {args.gpus_per_node:g}{gpu_type} "
            f"GPUs ({have}); the recipe needs {args.nodes}. Other GPU nodes: {rest}; "
            f"nodes without GPUs: {len(alive) - len(gpu_nodes)} (waited {args.wait_s:g} s)."
        )
    return fit, problems


def _pinned(node):
    """Run on this node and nowhere else (a node that dies fails the task, never moves it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)


RAYLET = b"raylet"


def _parent(pid):
    """The parent pid of PID (from /proc/PID/stat, after the command name's closing paren)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[1])


def _node_env(name):
    """(raylet found, NAME's value in its environment or None), read in a task on the node.

    The raylet starts the workers, so it is the task's parent (an ancestor, allowing for a
    wrapper): its environment is what `ray start` ran with, the node's own; the job's runtime
    env (env_vars) is added only to the workers'."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0", 1)[0]
            if os.path.basename(argv0) == RAYLET:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environ = fh.read()
                want = name.encode()
                for item in environ.split(b"\0"):
                    key, sep, value = item.partition(b"=")
                    if sep and key == want:
                        return True, value.decode(errors="replace")
                return True, None
            pid = _parent(pid)
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
    return False, None


def check(args):
    ray = _ray()
    fit, problems = fitting_nodes(ray, args)
    report = {
        "kind": "ray",
        "image": args.image,
        "digest": args.digest,
        "digest_env": args.digest_env,
        "digest_from": "each node's raylet environment (never the job's runtime env)",
        "nodes_expected": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "nodes": [],
    }
    if not problems and args.digest_env:
        remote = ray.remote(_node_env)
        pending = []
        for node in fit:
            strategy = _pinned(node)
            pending.append(
                remote.options(num_cpus=0, scheduling_strategy=strategy).remote(args.digest_env)
            )
        for node, (seen, digest) in zip(fit, ray.get(pending, timeout=max(60.0, args.wait_s))):
            ok = seen and digest == args.digest
            report["nodes"].append(
                {"address": node["NodeManagerAddress"], "node_id": node["NodeID"],
                 "gpus": _gpus(node), "accelerator": _types(node), "digest": digest, "ok": ok}
            )  # fmt: skip
            if not seen:
                problems.append(
                    f"Ray node {node['NodeManagerAddress']}: its raylet's environment cannot be "
                    f"read from a task (/proc), so the image digest it says ({args.digest_env}) "
                    "cannot be told apart from what the job itself set; set image_digest_env: "
                    "null in the profile to rely on the stack check alone"
                )
            elif digest is None:
                problems.append(
                    f"Ray node {node['NodeManagerAddress']} does not say which image it runs: "
                    f"its environment has no {args.digest_env} (set it to the image's digest where "
                    "the node starts, e.g. the pod spec), or set image_digest_env: null in the "
                    "profile to rely on the stack check alone"
                )
            elif not ok:
                problems.append(
                    f"Ray node {node['NodeManagerAddress']} runs image {digest}, but the recipe "
                    f"pins {args.digest} ({args.digest_env})"
                )
    else:
        report["nodes"] = [
            {"address": n["NodeManagerAddress"], "node_id": n["NodeID"], "gpus": _gpus(n),
             "accelerator": _types(n), "digest": None, "ok": None}
            for n in fit
        ]  # fmt: skip
        if not args.digest_env:
            report["note"] = "the cluster's image digest is not checked (image_digest_env: null)"
    report["ok"] = not problems
    report["problems"] = problems
    print(json.dumps(report, indent=2), flush=True)
    for problem in problems:
        say(problem)
    return 1 if problems else 0


def _run_here(program, argv, env):
    """In a task on one node: the program from the job's working_dir (this task's cwd)."""
    full = dict(os.environ)
    full.update(env)
    path = os.path.join(os.getcwd(), program)
    proc = subprocess.run(
        [sys.executable, path, *argv],
        capture_output=True,
        env=full,
        check=False,
    )
    return (
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )


def each(args):
    if not args.command:
        say("each: give the program to run after --")
        return 2
    program, argv = args.command[0], args.command[1:]
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            say(f"--env {item!r}: expected NAME=VALUE")
            return 2
        env[key] = value
    ray = _ray()
    fit, problems = fitting_nodes(ray, args)
    if problems:
        for problem in problems:
            say(problem)
        return 1
    remote = ray.remote(_run_here)
    pending = []
    for node in fit:
        strategy = _pinned(node)
        task = remote.options(num_cpus=0, num_gpus=args.gpus_per_node, scheduling_strategy=strategy)
        pending.append(task.remote(program, argv, env))
    results = ray.get(pending)
    failed = []
    for node, (code, _, err) in zip(fit, results):
        where = node["NodeManagerAddress"]
        for line in err.splitlines():
            print(f"[{where}] {line}", file=sys.stderr)
        if code != 0:
            failed.append(f"{where} (exit {code})")
    first_failed = next((i for i, r in enumerate(results) if r[0] != 0), 0)
    sys.stdout.write(results[first_failed][1])
    sys.stdout.flush()
    if failed:
        say(f"{program} failed on Ray node(s) {', '.join(failed)}")
        return 1
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command_name", required=True)
    for name in ("check", "each"):
        p = sub.add_parser(name)
        p.add_argument("--nodes", type=int, required=True)
        p.add_argument("--gpus-per-node", type=float, required=True)
        p.add_argument("--gpu-type", default=None)
        p.add_argument("--wait-s", type=float, default=0.0)
        if name == "check":
            p.add_argument("--image", default=None)
            p.add_argument("--digest", default=None)
            p.add_argument("--digest-env", default=None)
        else:
            p.add_argument("--env", action="append", default=[])
            p.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command_name == "check":
        if args.digest_env and not args.digest:
            parser.error("--digest-env needs --digest")
        return check(args)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return each(args)


if __name__ == "__main__":
    sys.exit(main())
