"""Logs of miles and slime, written from a model of a run in each version's shape.

Why a model and not copied logs: every line here is printed the way the source prints it (the
shape table is launcher/judge/parse/shapes.py; docs/miles-log.md, "Which version prints what",
names the file and commit of each fact), from a run described by `Run`: its steps, times, losses, the
version's shape, and what went wrong (NaN, skipped optimizer steps, an OOM, a replayed step with
another loss, missing keys, noise lines, a critic's steps). The fixtures under tests/data/logs/
are `Run`s rendered by this module (regenerate: `python tests/support/log_shapes.py`), each with
its expected figures computed here from the model, never by the launcher; the property tests
(tests/judge/test_verdict_properties.py) draw `Run`s at random.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from launcher.judge.parse.clock import CLOCK_GAP_S

REPO = Path(__file__).resolve().parents[2]  # runnable as a script too: not via support.paths
FIXTURES = REPO / "tests" / "data" / "logs"
START = 1792576800.0  # 2026-10-21 10:00:00 UTC
TOKENS_PER_STEP = 128 * 8192  # the seed's global batch x row tokens
GPUS = 8
CLAIM = 6913.23  # the seed's tokens/s per GPU
BASE_STEP_S = TOKENS_PER_STEP / CLAIM / GPUS
WAIT_S = 0.4
STARTUP_S = 40.0
ACTOR = "(MegatronTrainRayActor pid=5123) "
ROLLOUT = "(RolloutManager pid=5101) "


@dataclass
class Run:
    """A run as the log would show it."""

    shape: str = "miles-v0.1.0"  # a name of launcher/judge/parse/shapes.py's SHAPES
    steps: int = 20
    times: list[float] = field(default_factory=list)  # per step (s); default: BASE_STEP_S, jitter
    losses: list[float] = field(default_factory=list)  # per step; default: a falling curve
    print_args: bool = True
    step_time_key: str | None = None  # None: the shape's; another name: a renamed key
    no_step_time: set[int] = field(default_factory=set)  # perf dicts with no time and no parts
    no_perf: set[int] = field(default_factory=set)  # steps whose train perf line is missing
    nan_grad_from: int | None = None
    skip_from: int | None = None  # miles' valid_step=false from this step on (loss frozen)
    error_at: int | None = None  # an error before this step's lines; the run ends there
    error: str = "oom"  # oom | illegal | exception | nccl (the watchdog's abort) | killed
    error_mid_step: bool = False  # the error comes during step error_at: its step line, no perf
    startup_traceback: bool = False  # a warning logged with its traceback at start-up
    recovered_after: int | None = None  # a retried call's traceback after this step; it goes on
    restart_after: int | None = None  # the trainer killed after this step and started again
    replay: dict[int, float] = field(default_factory=dict)  # step -> a second, different loss
    critic: bool = False  # PPO with a critic: `critic-step N:` lines beside the actor's
    noise: int = 0  # noise lines per step (warnings, Timer lines, dicts of other processes)
    # The host's clock (scripts/host_clock.py): whether its lines stand between the log's lines;
    # the host seconds from each step's lines to the next's (empty: what the steps claim); and
    # the clock lines the container forges itself (FORGERIES), none of which may count.
    clock: bool = False
    pace: list[float] = field(default_factory=list)
    forged: str | None = None


# The run's nonce (node.sh's, in node.log's first line), and what a container can forge.
NONCE = "5eed0c10c4a11e5a5eed0c10c4a11e5a"
FORGERIES = ("no-nonce", "wrong-nonce", "mid-line", "backwards")
HOST_START = START + 3.25  # the host's clock and the logging stamps are two clocks


def host_times(run: Run) -> list[float]:
    """When each step's lines reach the host (host epoch seconds)."""
    claimed = [t + (STARTUP_S if s == 0 else 0.0) for s, t in enumerate(times_of(run))]
    pace = run.pace or claimed
    out, h = [], HOST_START
    for s in range(run.steps):
        h += pace[s] if s < len(pace) else claimed[s]
        out.append(h)
    return out


def clock_line(t: float, nonce: str | None = NONCE) -> str:
    """A clock line as host_clock.py writes it (or forged: another nonce, or none)."""
    ns = round(t * 1e9)
    line = f"##reproduce clock t={ns // 10**9}.{ns % 10**9:09d}"
    return line + (f" n={nonce}" if nonce is not None else "")


def _forged(run: Run, s: int) -> list[str]:
    """What a container prints to pass its claimed times off as the host's (FORGERIES)."""
    claimed = HOST_START + sum(times_of(run)[: s + 1]) + STARTUP_S
    if run.forged == "no-nonce":
        return [clock_line(claimed, None)]
    if run.forged == "wrong-nonce":
        return [clock_line(claimed, "0" * 32)]
    if run.forged == "mid-line":  # the right nonce even, inside a line of its own output
        return [ACTOR + "note " + clock_line(claimed)]
    if run.forged == "backwards":  # a genuine-looking line older than the host's last one
        return [clock_line(HOST_START - 1000.0 + claimed - HOST_START)]
    return []


def times_of(run: Run) -> list[float]:
    if run.times:
        return list(run.times)
    return [BASE_STEP_S * (1.0 + 0.003 * math.sin(1.3 * s)) for s in range(run.steps)]


def losses_of(run: Run) -> list[float]:
    if run.losses:
        return list(run.losses)
    return [
        round(0.55 + 0.9 * math.exp(-s / 6.0) + 0.01 * math.sin(1.7 * s), 6)
        for s in range(run.steps)
    ]


def _stamp(t: float, shape: str) -> str:
    dt = datetime.fromtimestamp(t, tz=UTC)
    if shape == "miles-v0.1.0":
        return f"[{dt:%Y-%m-%d %H:%M:%S}.{dt.microsecond // 1000:03d} actor_cell0_rank0] "
    if shape == "step-time-logging":
        return f"[{dt:%Y-%m-%d %H:%M:%S}] "
    return ""  # the print() shapes: no logging prefix


def _line(shape: str, t: float, where: str, message: str, actor: str = ACTOR) -> str:
    stamp = _stamp(t, shape)
    return f"{actor}{stamp}{where + ' - ' if stamp else ''}{message}"


def _arguments() -> list[str]:
    """Megatron's listing of the seed's arguments, printed by the stand-in's own _print_args."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.measure import recipe_argv, seed_raw

    spec = importlib.util.spec_from_file_location(
        "standin_train", REPO / "tests/standin_miles/train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.print_arguments(recipe_argv(seed_raw(), 20) + QWEN3_30B_A3B)
    return out.getvalue().splitlines()


_ARGS: list[str] = []
# The model flags the seed's run block passes (miles' model_args_utils.py qwen3-30B-A3B; the same
# as slime's scripts/models/qwen3-30B-A3B.sh), as the real listing prints them with the rest.
QWEN3_30B_A3B = (
    "--num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 "
    "--group-query-attention --num-query-groups 4 --kv-channels 128 --swiglu "
    "--vocab-size 151936 --moe-ffn-hidden-size 768 --moe-router-topk 8 --num-experts 128"
).split()


def _perf(run: Run, s: int, wait: float, step_time: float) -> dict:
    train = step_time - wait
    actor = train - 0.05
    d: dict = {
        "perf/train_wait_time": wait,
        "perf/data_preprocess_time": 0.02,
        "perf/train_time": train,
    }
    d["perf/actor_train_time"] = actor
    tflops = 6 * 3.041656832e9 * TOKENS_PER_STEP / actor / GPUS / 1e12
    d["perf/actor_train_tflops"] = tflops
    if run.shape != "slime-v0.1.0":
        d["perf/actor_train_tok_per_s"] = TOKENS_PER_STEP / actor
    if run.shape == "miles-v0.1.0":
        d["perf/mfu_peak_tflops"] = 989.0
        d["perf/actor_train_mfu"] = tflops / 989.0
    key = run.step_time_key or (
        "perf/total_train_time" if run.shape == "slime-v0.1.0" else "perf/step_time"
    )
    d[key] = wait + train
    d["perf/wait_time_ratio"] = wait / (wait + train)
    if s in run.no_step_time:
        for k in (key, "perf/train_wait_time", "perf/train_time"):
            d.pop(k, None)
    return d


def _error_lines(run: Run) -> list[str]:
    if run.error == "nccl":  # PyTorch's watchdog, then the C++ and Python aborts: no traceback
        return [
            ACTOR + "[rank0]:[E1021 10:31:07.512345678 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600015 milliseconds before "
            "timing out.",
            ACTOR + "terminate called after throwing an instance of 'c10::DistBackendError'",
            ACTOR + "Fatal Python error: Aborted",
        ]
    if run.error == "killed":  # the kernel's OOM killer: bash reports its child (no prefix)
        return [KILLED]
    head = [
        "Traceback (most recent call last):",
        '  File "/root/miles/train.py", line 92, in <module>',
    ]
    if run.error == "oom":
        last = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB."
    elif run.error == "illegal":
        last = "RuntimeError: CUDA error: an illegal memory access was encountered"
    else:
        last = "ValueError: bad batch"
    return [ACTOR + h for h in head] + [ACTOR + last]


# The shell that runs the trainer, reporting the child the kernel killed (bash's job status line).
KILLED = "/tmp/reproduce-train.sh: line 7:  4242 Killed                  python3 train.py"
# miles v0.1.0 at actor start (miles/utils/env_report.py:171, `logger.warning(..., exc_info=True)`)
# when git times out on the checkout: logged with its traceback, and training goes on.
STARTUP_TRACEBACK = [
    "env_report.py:171 - Failed to collect git info for megatron-core at /root/Megatron-LM",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.12/subprocess.py", line 1209, in communicate',
    "subprocess.TimeoutExpired: Command '['git', 'diff', '--stat', 'HEAD']' timed out after 10 "
    "seconds",
]
# A call retried after a dropped connection (miles/utils/retry_utils.py logs the attempt with its
# traceback); the step goes on.
RETRY_TRACEBACK = [
    "retry_utils.py:36 - retry: attempt 1 failed, retrying",
    "Traceback (most recent call last):",
    '  File "/root/miles/miles/utils/retry_utils.py", line 30, in wrapper',
    "ConnectionResetError: [Errno 104] Connection reset by peer",
]


def render(run: Run) -> str:
    """The log of `run`, in its shape, as the train actor and the RolloutManager print it."""
    global _ARGS
    shape = run.shape
    lines = [f"[{datetime.fromtimestamp(START, tz=UTC):%Y-%m-%d %H:%M:%S}] train.py:48 - start"]
    if run.print_args:
        _ARGS = _ARGS or _arguments()
        lines += _ARGS
    if run.startup_traceback:
        lines += [ACTOR + line for line in STARTUP_TRACEBACK]
    times, losses = times_of(run), losses_of(run)
    host = host_times(run)
    if run.clock:  # the stamper's first line: before the log's first
        lines.insert(0, clock_line(HOST_START))
    last_clock = HOST_START
    t = START
    for s in range(run.steps):
        # this step's lines arrive at host[s]: the stamper's line first, when it is due
        if run.clock and host[s] - last_clock >= CLOCK_GAP_S:
            lines.append(clock_line(host[s]))
            last_clock = host[s]
        if run.forged:
            lines += _forged(run, s)
        if run.error_at is not None and s == run.error_at and not run.error_mid_step:
            lines += _error_lines(run)
            break
        wait = WAIT_S + (STARTUP_S if s == 0 else 0.0)
        step_time = times[s] + (STARTUP_S if s == 0 else 0.0)
        lines.append(
            _line(
                shape,
                t,
                "metrics.py:89",
                f"perf {s}: {{'rollout/response_len/mean': 5546.2, 'perf/rollout_time': 0.31}}",
                ROLLOUT,
            )
        )
        for i in range(run.noise):
            lines.append(
                _line(
                    shape, t, "fused_adam.py:11", f"UserWarning: deprecated kernel path taken ({i})"
                )
            )
            lines.append(
                _line(
                    shape,
                    t,
                    "train.py:120",
                    "[Rank 0] Memory-Usage after clear_memory: {'gpu': 0, 'used_GB': 21.0}",
                )
            )
        t += step_time
        skipped = run.skip_from is not None and s >= run.skip_from
        loss = losses[min(s, run.skip_from)] if skipped and run.skip_from is not None else losses[s]
        nan_grad = skipped or (run.nan_grad_from is not None and s >= run.nan_grad_from)
        grad = float("nan") if nan_grad else round(2.5 * math.exp(-s / 10.0) + 0.3, 6)
        d = {"train/loss": loss, "train/grad_norm": grad, "train/lr-pg_0": 1e-05}
        if shape != "slime-v0.1.0":
            d["train/step"] = s
        text = f"step {s}: {d}"
        lines.append(_line(shape, t, "log_utils.py:542", text))
        if shape == "miles-v0.1.0":
            lines.append(_line(shape, t, "log_utils.py:542", text))  # miles prints it twice
        if run.critic:
            c = {
                "train/critic-value_loss": round(0.3 + 0.1 * s, 6),
                "train/critic-grad_norm": 1.0,
                "train/step": s,
            }
            lines.append(_line(shape, t, "log_utils.py:542", f"critic-step {s}: {c}"))
        if run.error_at is not None and s == run.error_at:  # during the step: no perf line
            lines += _error_lines(run)
            break
        if s not in run.no_perf:
            lines.append(
                _line(
                    shape,
                    t,
                    "train_metric_utils.py:56",
                    f"perf {s}: {_perf(run, s, wait, step_time)}",
                )
            )
        if shape == "miles-v0.1.0":
            valid = "false" if skipped else "true"
            lines.append(
                _line(
                    shape,
                    t,
                    "model.py:636",
                    f"ft op=train_step rollout={s} step=0 attempt=0 outcome=NORMAL valid_step={valid}",
                )
            )
        if s in run.replay:
            replayed = dict(d, **{"train/loss": run.replay[s]})
            lines.append(_line(shape, t, "log_utils.py:542", f"step {s}: {replayed}"))
        if s == run.recovered_after:
            lines += [ACTOR + line for line in RETRY_TRACEBACK]
        if s == run.restart_after:
            lines.append(KILLED)
            lines += _ARGS if run.print_args else []
    return "\n".join(lines) + "\n"


def expected(run: Run) -> dict:
    """The figures and verdict the launcher must give for `run` (seed recipe), from the model."""
    window = range(5, 20)
    times = times_of(run)
    ran = run.steps if run.error_at is None else run.error_at
    have = [s for s in window if s < ran and s not in run.no_perf and s not in run.no_step_time]
    tps = TOKENS_PER_STEP * len(have) / sum(times[s] for s in have) / GPUS if have else None
    status, says = "reproduced", []
    if run.skip_from is not None and run.skip_from < ran:
        status, says = "failed", ["valid_step=false", "frozen"]
    elif run.nan_grad_from is not None and run.nan_grad_from < ran:
        status, says = "failed", [f"at step(s) {run.nan_grad_from}"]
    elif run.error_at is not None:
        word = {
            "oom": "OutOfMemoryError",
            "illegal": "illegal memory access",
            "nccl": "Watchdog caught collective operation timeout",
            "killed": "Killed",
        }.get(run.error, "ValueError: bad batch")
        where = (
            f"during step {run.error_at}"
            if run.error_mid_step
            else f"after step {run.error_at - 1}"
            if run.error_at
            else "before step 0"
        )
        status, says = "failed", ["training stopped with", where, word]
    elif run.no_step_time and len(run.no_step_time) >= run.steps:
        status, says = "unreadable", ["no step time"]
    elif run.no_step_time or any(run.replay[s] != losses_of(run)[s] for s in run.replay):
        status, says = "mismatch", []
    elif len(have) < len(window) or ran < 20 or run.steps < 20:
        status = "incomplete"
    elif disturbed(run):
        status, says = "incomplete", ["the run went on", "not one undisturbed run"]
    elif recovered_in_window(run):
        says = ["the run went on in the same process", "judged by the window's step times"]
    judged = status == "reproduced"
    return {
        "status": status,
        "tokens_per_s_per_gpu": tps if judged else None,
        "reasons_mention": says,
    }


def disturbed(run: Run) -> bool:
    """A trainer killed and started again inside the window (the step after it is a window
    step): not one undisturbed run, whatever its step times."""
    return run.restart_after is not None and 5 <= run.restart_after + 1 < run.steps


def recovered_in_window(run: Run) -> bool:
    """A retried call's traceback inside the window, the run going on in the same process: a
    note; the step times judge the window (here, the model's: undisturbed)."""
    return run.recovered_after is not None and 5 <= run.recovered_after + 1 < run.steps


FIXTURE_RUNS: dict[str, Run] = {
    "slime-v0.1.0": Run(shape="slime-v0.1.0"),
    "step-time-print": Run(shape="step-time-print"),
    "step-time-logging": Run(shape="step-time-logging"),
    "miles-v0.1.0": Run(shape="miles-v0.1.0", noise=2),
    "renamed-step-time": Run(step_time_key="perf/iteration_time"),
    "ppo-critic": Run(critic=True),
    "nan-grad-norm": Run(nan_grad_from=8),
    "skipped-optimizer-steps": Run(skip_from=8),
    "oom-at-step-12": Run(error_at=12, error="oom"),
    "illegal-memory-access": Run(error_at=9, error="illegal"),
    "oom-at-step-0": Run(error_at=0, error_mid_step=True),
    "oom-during-the-last-step": Run(error_at=19, error_mid_step=True),
    "startup-traceback-then-oom": Run(startup_traceback=True, error_at=13),
    "startup-traceback": Run(startup_traceback=True),
    "retry-in-the-window": Run(recovered_after=8),
    "retry-before-the-window": Run(recovered_after=2),
    "restart-before-the-window": Run(restart_after=2),
    "nccl-watchdog-timeout": Run(error_at=11, error="nccl"),
    "killed-by-the-kernel": Run(error_at=7, error="killed"),
    "replay-two-losses": Run(replay={7: 0.777}),
    "no-step-time": Run(no_step_time=set(range(20))),
}


def variant(name: str, **changes: object) -> Run:
    return replace(FIXTURE_RUNS[name], **changes)  # type: ignore[arg-type]


def write_fixtures() -> None:
    import yaml

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, run in FIXTURE_RUNS.items():
        (FIXTURES / f"{name}.log").write_text(render(run))
        (FIXTURES / f"{name}.expected.yaml").write_text(
            yaml.safe_dump(expected(run), sort_keys=False)
        )


if __name__ == "__main__":
    write_fixtures()
