"""Stand-in for miles' train.py (tests only: this is NOT miles; see README.md here).

Prints, on stderr, the log lines a real miles SFT run prints per step, in miles' format, for
`--num-rollout` steps, with the step times it is told (STANDIN_* environment variables). It
computes timestamps instead of sleeping, unless STANDIN_SLEEP_S asks it to sleep.
Standard library only.
"""

import argparse
import math
import os
import re
import sys
import time
from datetime import UTC, datetime

TRAIN_PID, ROLLOUT_PID = 5123, 5101


def _env_float(name, default):
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


class Clock:
    """Log time: starts at STANDIN_START_EPOCH (or now) and moves as the steps say."""

    def __init__(self, start):
        self.t = start

    def advance(self, seconds):
        self.t += seconds

    def stamp(self):
        dt = datetime.fromtimestamp(self.t, tz=UTC)
        return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d}"


class Log:
    def __init__(self, clock):
        self.clock = clock
        self.color = os.environ.get("STANDIN_COLOR", "1") != "0"
        self.ip = os.environ.get("STANDIN_IP")

    def ray(self, actor, pid):
        inner = f"{actor} pid={pid}" + (f", ip={self.ip}" if self.ip else "")
        return f"\x1b[36m({inner})\x1b[0m " if self.color else f"({inner}) "

    def line(self, prefix, proc, where, message, end="\n"):
        sys.stderr.write(f"{prefix}[{self.clock.stamp()} {proc}] {where} - {message}{end}")
        sys.stderr.flush()

    def actor(self, where, message, end="\n"):
        self.line(
            self.ray("MegatronTrainRayActor", TRAIN_PID), "actor_cell0_rank0", where, message, end
        )

    def rollout(self, where, message):
        self.line(self.ray("RolloutManager", ROLLOUT_PID), "rollout_manager", where, message)

    def main(self, where, message):
        self.line("", "main", where, message)


def step_times(n):
    listed = os.environ.get("STANDIN_STEP_TIMES")
    if listed:
        values = [float(v) for v in listed.split(",") if v.strip()]
        return [values[min(i, len(values) - 1)] for i in range(n)]
    return [_env_float("STANDIN_STEP_TIME_S", 18.96)] * n


def loss_at(step, scale):
    # A falling SFT-like curve with a small deterministic wiggle.
    return scale * (0.55 + 0.9 * math.exp(-step / 6.0) + 0.01 * math.sin(1.7 * step))


# Defaults of the arguments a recipe also states, as miles (and Megatron) print them when the
# command line does not set them.
ARG_DEFAULTS = {
    "actor_num_nodes": 1,
    "actor_num_gpus_per_node": 8,
    "num_gpus_per_node": 8,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
    "virtual_pipeline_model_parallel_size": None,
    "sequence_parallel": False,
    "n_samples_per_prompt": 1,
    "rollout_batch_size": None,
    "global_batch_size": None,
    "num_rollout": None,
    "max_tokens_per_gpu": None,
    "recompute_granularity": None,
    "recompute_method": None,
    "recompute_num_layers": None,
    "rank": 0,
}
_NUMBER = re.compile(r"^[-+]?(\d+|\d*\.\d+([eE][-+]?\d+)?|\d+[eE][-+]?\d+)$")


def print_arguments(argv):
    """Megatron's `_print_args("arguments", args)`, which miles' parse_args reaches through
    Megatron's validate_args on the driver: a title line, one `  name ..... value` line per
    argument (dots to column 48, sorted case-insensitively), an end line; plain print() to stdout.
    Every option given is listed under its dest name, as argparse stores it, beside the defaults.
    """
    values = dict(ARG_DEFAULTS)
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            continue
        name, eq, inline = word[2:].partition("=")
        dest = name.replace("-", "_")
        if eq:
            values[dest] = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            values[dest] = argv[i]
            i += 1
        else:
            values[dest] = True
    for dest, value in values.items():
        if isinstance(value, str) and _NUMBER.match(value):
            values[dest] = int(value) if value.lstrip("+-").isdigit() else float(value)
    per_vstage = values.get("num_layers_per_virtual_pipeline_stage")
    if per_vstage and values["virtual_pipeline_model_parallel_size"] is None:
        # Megatron's validate_args: layers // pp // layers per virtual stage (1: no virtual pipeline)
        vpp = int(values.get("num_layers", 0)) // int(values["pipeline_model_parallel_size"])
        vpp //= int(per_vstage)
        values["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    if values["expert_tensor_parallel_size"] is None:  # Megatron: defaults to tp
        values["expert_tensor_parallel_size"] = values["tensor_model_parallel_size"]
    if values["tensor_model_parallel_size"] == 1:  # Megatron turns it off without tp
        values["sequence_parallel"] = False
    print("------------------------ arguments ------------------------", flush=True)
    lines = [f"  {name} {'.' * (48 - len(name))} {value}" for name, value in values.items()]
    for line in sorted(lines, key=lambda x: x.lower()):
        print(line, flush=True)
    print("-------------------- end of arguments ---------------------", flush=True)


class Placement:
    """Several nodes: the run's GPUs reserved across the cluster in a placement group, one bundle
    and one Ray actor per node holding all of that node's GPUs, kept to the end. Fails unless
    every one is placed; each step pings them all, so a node that dies fails training as it would
    miles. (miles places one actor per GPU; one per node reserves the same GPUs on the same
    nodes with an eighth of the worker processes, which on a 2-core test machine is most of a
    multi-node run's CPU.) Ray only here: a one-node run never imports it (its output stays byte
    for byte as before)."""

    def __init__(self, nodes, gpus_per_node, timeout_s):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray = ray
        self.gpus_per_node = gpus_per_node
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
        group = placement_group([{"GPU": gpus_per_node}] * nodes, strategy="STRICT_SPREAD")
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            have = ray.cluster_resources().get("GPU", 0)
            raise SystemExit(
                f"stand-in: could not place {nodes} actors of {gpus_per_node} GPUs on {nodes} "
                f"nodes within {timeout_s:g} s (the cluster has {have:g} GPUs)"
            )

        @ray.remote(num_gpus=gpus_per_node, num_cpus=0)
        class Node:
            def where(self):
                return ray.util.get_node_ip_address()

            def ping(self):
                return True

        self.actors = [
            Node.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=i
                )
            ).remote()
            for i in range(nodes)
        ]
        self.nodes = ray.get([a.where.remote() for a in self.actors], timeout=timeout_s)

    def summary(self):
        counts = {}
        for ip in self.nodes:
            counts[ip] = counts.get(ip, 0) + self.gpus_per_node
        where = ", ".join(f"{ip} x{n}" for ip, n in sorted(counts.items()))
        gpus = len(self.actors) * self.gpus_per_node
        return f"placed {gpus} GPUs ({len(self.actors)} actors) on {len(counts)} nodes: {where}"

    def check(self, timeout_s):
        self.ray.get([a.ping.remote() for a in self.actors], timeout=timeout_s)


def main(argv):
    if os.environ.get("STANDIN_PRINT_ARGS", "1") != "0":
        print_arguments(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--num-rollout", type=int, default=None)
    parser.add_argument("--num-epoch", type=int, default=None)
    parser.add_argument("--rollout-batch-size", type=int, default=128)
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--actor-num-nodes", type=int, default=1)
    parser.add_argument("--actor-num-gpus-per-node", type=int, default=8)
    args, _ignored = parser.parse_known_args(argv)
    if args.num_rollout is None and args.num_epoch is not None:
        # miles/ray/placement_group.py, after the listing printed num_rollout None: the
        # dataset's rows (the stand-in reads no parquet: STANDIN_PROMPT_ROWS) // rollout batch
        rows = int(os.environ["STANDIN_PROMPT_ROWS"])
        args.num_rollout = args.num_epoch * (rows // args.rollout_batch_size)
    elif args.num_rollout is None:
        args.num_rollout = 20

    row_tokens = int(_env_float("STANDIN_ROW_TOKENS", 8192))
    tokens = args.global_batch_size * row_tokens
    gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
    peak = _env_float("STANDIN_MFU_PEAK_TFLOPS", 989.0)
    startup = _env_float("STANDIN_STARTUP_S", 40.0)
    sleep_s = _env_float("STANDIN_SLEEP_S", 0.0)
    scale = _env_float("STANDIN_LOSS_SCALE", 1.0)
    nan_at, fail_at, cut_at = (
        _env_int("STANDIN_NAN_AT"),
        _env_int("STANDIN_FAIL_AT"),
        _env_int("STANDIN_CUT_AT"),
    )
    noise = int(_env_float("STANDIN_NOISE_LINES", 3))
    # Failure shapes (docs/miles-log.md): a NaN grad norm from a step on; miles skipping the
    # optimizer step from a step on (valid_step=false: the loss then stays where it was); a
    # CUDA OOM at a step (PyTorch's exception through a traceback; the run exits 1).
    nan_grad_at, skip_from, oom_at = (
        _env_int("STANDIN_NAN_GRAD_AT"),
        _env_int("STANDIN_SKIP_FROM"),
        _env_int("STANDIN_OOM_AT"),
    )
    times = step_times(args.num_rollout)

    clock = Clock(_env_float("STANDIN_START_EPOCH", time.time()))
    log = Log(clock)
    log.main(
        "train.py:48",
        f"miles stand-in: {args.num_rollout} rollouts, global batch {args.global_batch_size}",
    )
    sys.stderr.write("2026-10-21 10:00:00,001\tINFO worker.py:1888 -- Connected to Ray cluster.\n")
    log.actor(
        "initialize.py:71",
        "[Rank 0] Memory-Usage after init: {'gpu': 0, 'total_GB': 139.8, 'free_GB': 120.3, 'used_GB': 19.5}",
    )
    sys.stderr.write(
        f"{log.ray('MegatronTrainRayActor', TRAIN_PID)}[{clock.stamp()} actor_cell0_rank1] "
        f"initialize.py:71 - [Rank 1] Memory-Usage after init: {{'gpu': 1, 'used_GB': 19.5}} "
        f"[repeated 7x across cluster]\n"
    )

    placement = None
    if args.actor_num_nodes > 1 and os.environ.get("RAY_ADDRESS"):  # a log test has no cluster
        timeout_s = _env_float("STANDIN_PLACE_TIMEOUT_S", 120.0)
        placement = Placement(args.actor_num_nodes, args.actor_num_gpus_per_node, timeout_s)
        log.main("train.py:60", placement.summary())

    for step in range(args.num_rollout):
        if placement is not None:
            placement.check(_env_float("STANDIN_PLACE_TIMEOUT_S", 120.0))
        if os.environ.get("STANDIN_ECHO") and step == _env_int("STANDIN_ECHO_AT"):
            # lines the recipe's code prints into the log (an adversary's: forged markers)
            text = os.environ["STANDIN_ECHO"].replace("{now}", f"{time.time():.6f}")
            sys.stdout.write("".join(f"{line}\n" for line in text.split("|")))
            sys.stdout.flush()
        if fail_at is not None and step == fail_at:
            sys.stderr.write(
                'Traceback (most recent call last):\n  File "/root/miles/train.py", line 92, in <module>\n'
                "RuntimeError: CUDA error: an illegal memory access was encountered (stand-in)\n"
            )
            sys.stderr.flush()
            return 1
        if oom_at is not None and step == oom_at:
            sys.stderr.write(
                "Traceback (most recent call last):\n"
                '  File "/root/miles/miles/backends/megatron_utils/model.py", line 560, in train\n'
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 "
                "has a total capacity of 139.81 GiB of which 3.12 GiB is free. (stand-in)\n"
            )
            sys.stderr.flush()
            return 1
        wait = 0.4 + (startup if step == 0 else 0.0)
        step_time = times[step] + (startup if step == 0 else 0.0)
        train_time = step_time - wait
        actor_train_time = train_time - 0.05
        if sleep_s > 0:
            time.sleep(sleep_s)

        # The RolloutManager: this rollout's data.
        log.rollout(
            "metrics.py:89",
            f"perf {step}: {{'rollout/response_len/mean': 5546.2, 'rollout/response_len/median': 5601.0, "
            f"'rollout/response_len/max': 8191, 'rollout/response_len/min': 3, 'perf/rollout_time': np.float64(0.31)}}",
        )
        log.rollout(
            "rollout.py:301",
            f"rollout {step}: {{'rollout/total_lengths': {float(row_tokens)}, 'rollout/response_lengths': 5546.2}}",
        )
        log.actor("timer.py:24", "Timer train start")
        for i in range(noise):
            log.actor("fused_adam.py:11", f"UserWarning: deprecated kernel path taken ({i})")
        clock.advance(step_time)
        nan = nan_at is not None and step >= nan_at
        skipped = skip_from is not None and step >= skip_from
        loss_step = min(step, skip_from) if skipped and skip_from is not None else step
        loss = "nan" if nan else repr(round(loss_at(loss_step, scale), 6))
        grad = "nan" if nan else repr(round(2.5 * math.exp(-step / 10.0) + 0.3, 6))
        if (nan_grad_at is not None and step >= nan_grad_at) or skipped:
            grad = "nan"
        lr = 1e-5 * min(1.0, (step + 1) / max(1, int(0.1 * args.num_rollout)))
        payload = (
            f"{{'train/loss': {loss}, 'train/grad_norm': {grad}, 'train/lr-pg_0': {lr!r}, "
            f"'train/lr-pg_1': {lr!r}, 'train/step': {step}}}"
        )
        if cut_at is not None and step == cut_at:
            log.actor("log_utils.py:542", f"step {step}: " + payload[: len(payload) // 2], end="")
            return 137
        log.actor("log_utils.py:542", f"step {step}: {payload}")
        log.actor("log_utils.py:542", f"step {step}: {payload}")  # miles prints it twice
        log.actor("timer.py:31", f"Timer train end (elapsed: {train_time:.1f}s)")
        tflops = 6 * 3.041656832e9 * tokens / actor_train_time / gpus / 1e12
        log.actor(
            "train_metric_utils.py:56",
            f"perf {step}: {{'perf/train_wait_time': {wait!r}, 'perf/data_preprocess_time': 0.02, "
            f"'perf/train_time': {train_time!r}, 'perf/actor_train_time': {actor_train_time!r}, "
            f"'perf/actor_train_tflops': np.float64({tflops!r}), "
            f"'perf/actor_train_tok_per_s': np.float64({tokens / actor_train_time!r}), "
            f"'perf/mfu_peak_tflops': {peak!r}, 'perf/actor_train_mfu': {tflops / peak!r}, "
            f"'perf/step_time': {step_time!r}, 'perf/wait_time_ratio': {wait / step_time!r}}}",
        )
        log.actor(
            "train.py:120",
            "[Rank 0] Memory-Usage after clear_memory: {'gpu': 0, 'used_GB': 21.0}",
        )
        # miles/backends/megatron_utils/model.py:636 (v0.1.0): log_structured(logger.info,
        # op="train_step", rollout=, step=, attempt=, outcome=, valid_step=) -> logfmt after "ft ".
        log.actor(
            "model.py:636",
            f"ft op=train_step rollout={step} step=0 attempt=0 outcome=NORMAL "
            f"valid_step={'false' if skipped else 'true'}",
        )
    log.main("train.py:140", "training finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
