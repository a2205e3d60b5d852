"""The node script's stages and which waits for which: the one stage graph, as data.

node.sh runs the stages of PARALLEL at once, each as soon as the stages it names in AFTER ended
ok, then joins them (one wait: the first to fail ends the run and stops the others), then runs the
rest one after another in SERIAL order. The renderer (launcher/plan/node_script.py) draws node.sh
from this table, and anything else that models a run's stages (the cost estimate, a page) reads
the same table, so the order a run really has is written down once (docs/node-scripts.md, "What
runs at once").

Why these edges: the image pull, the host preflight, the asset resolve and the host's checkpoint
fetch need nothing from each other. The GPU preflight and the stack probe run in the image, so
they wait for it; the rows are fetched, built (CPU, in the image) and checked by the rollout
function (in the image), so they wait for the image and for resolve's plan, like the checkpoint
fetch waits for resolve. The conversion needs the GPUs (after the GPU preflight passed) and the
checkpoint; training needs every check passed, so everything after the join is serial.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.plan.placement import Stage

# stage -> the stages that must have ended ok before it starts (the parallel part of node.sh)
AFTER: Mapping[str, tuple[str, ...]] = {
    "preflight": (),
    "resolve": (),
    "image": (),
    "preflight-gpu": ("image",),
    "stack": ("image",),
    "rows": ("resolve", "image"),
    "assets": ("resolve",),
}
# The parallel stages, in the order node.sh starts them (each waits for its AFTER itself).
PARALLEL: tuple[str, ...] = tuple(AFTER)
# After the join, one after another; ray and train run inside the training container and push
# (only with an asset store) after it ended.
SERIAL: tuple[str, ...] = ("convert", "ray", "train", "push")
# The stages that run one-off containers, each named $CONTAINER-<stage> (node_script.in_image):
# stopping such a stage, or a cancel (protocol.cancel_command), removes its container by name.
IN_IMAGE: tuple[str, ...] = ("preflight-gpu", "stack", "rows", "convert")
# Every node stage in the order the dry run lists them (a topological order of the graph).
NODE_STAGES: tuple[str, ...] = PARALLEL + SERIAL


def waits_for(stage: str) -> tuple[str, ...]:
    """The stages `stage` starts after: its AFTER in the parallel part; after the join, every
    parallel stage (for the first serial one) or the serial one before it."""
    if stage in AFTER:
        return AFTER[stage]
    i = SERIAL.index(stage)
    return PARALLEL if i == 0 else (SERIAL[i - 1],)


def at_once(profile_kind: str) -> bool:
    """Does node.sh run PARALLEL at once? Not as a job on an existing Ray cluster: there the
    checks are Ray tasks that hold the same GPUs, so they would only queue behind each other."""
    return profile_kind != "ray"


def describe(names: Sequence[str], profile_kind: str) -> str:
    """The stages as the dry run's `# stages` line: what runs at once in braces, with what each
    waits for."""
    if not at_once(profile_kind):
        return " -> ".join(names)
    group = [f"{n} (after {', '.join(AFTER[n])})" if AFTER[n] else n for n in names if n in AFTER]
    out: list[str] = []
    for name in names:
        if name not in AFTER:
            out.append(name)
        elif not any(n in AFTER for n in names[: names.index(name)]):  # the first of them
            out.append(f"at once {{{'; '.join(group)}}}")
    return " -> ".join(out)


def _comment(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


def inline(stage: Stage) -> list[str]:
    """A stage run in node.sh's own shell, between its markers."""
    return [
        "",
        _comment(f"# ---- stage {stage.name}: {stage.title}"),
        f"_stage_begin {stage.name}",
        *stage.commands,
        "_stage_end",
    ]


def at_once_lines(by: Mapping[str, Stage]) -> list[str]:
    """The parallel part of node.sh: each stage of PARALLEL a function, started by `_bg` once the
    stages it waits for ended ok, all joined by one `_join` (background.BACKGROUND_FUNCTIONS)."""
    lines: list[str] = []
    for name in PARALLEL:
        stage = by[name]
        commands = list(stage.commands)
        if all(not c.strip() or c.lstrip().startswith("#") for c in commands):
            commands.append(":")  # a function needs a command (a skipped stage is a comment)
        lines += [
            "",
            _comment(f"# ---- stage {name}: {stage.title}"),
            f"{function_name(name)}() {{",
            *commands,
            "}",
        ]
    lines += [
        "",
        "# ---- these stages run at once, each once the stages named after it ended ok",
        "# (launcher/plan/stage_graph.py); _join fails the run naming the first that failed",
    ]
    for name in PARALLEL:
        after = "".join(f" {a}" for a in AFTER[name])
        lines.append(f"_bg {name} {function_name(name)}{after}")
    return [*lines, "_join"]


def function_name(stage: str) -> str:
    """The bash function a background stage's commands are in."""
    return f"_{stage.replace('-', '_')}_stage"


def _check() -> None:
    """The table is a graph whose edges point back only (so node.sh can never wait forever)."""
    seen: set[str] = set()
    for stage in PARALLEL:
        missing = [s for s in AFTER[stage] if s not in seen]
        assert not missing, f"stage {stage} waits for {missing}, which start later"
        seen.add(stage)


_check()
