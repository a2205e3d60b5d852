"""Which variables a recipe's or a profile's `env` may set (docs/architecture.md, "A recipe's
environment").

Why its own module: the env of a recipe and of a profile reach the same places (the training
container everywhere; on a Ray cluster the job's whole environment, node.sh and its checks
included), so one list, read the same way for both, says which names the launcher keeps for
itself and which change how a program starts.
"""

from __future__ import annotations

from typing import Any

# Variables the launcher binds for the `run` block (docs/miles-log.md).
BOUND_VARIABLES = ("HF_CKPT", "TORCH_DIST", "SFT_DATA")

# Variables the launcher itself sets or reads to check or control a run: a recipe's `env` may set
# none of them, on any target (docs/architecture.md, "A recipe's environment"). The recipe's env
# reaches the training container and, on Ray, every process of the job: the image digest probe,
# the preflights, the stack probe and the asset programs run there too, so a recipe that set
# REPRODUCE_IMAGE_DIGEST (or CUDA_VISIBLE_DEVICES, HF_ENDPOINT, ...) could vouch for itself. This
# is the one list; launcher/plan/plan.py adds the profile's `image_digest_env` where it is known.
LAUNCHER_ENV_PREFIXES = ("REPRODUCE_", "AWS_")
LAUNCHER_ENV = frozenset(
    {
        *BOUND_VARIABLES,  # the assets the checks verified: HF_CKPT, TORCH_DIST, SFT_DATA
        "RUN_ID",
        "NODE_RUN_DIR",
        "NODE_RANK",
        "NODE_IP",
        "HEAD_ADDR",
        "NODE_ADDRS",
        "RAY_ADDRESS",  # which cluster the job runs on
        "RAY_DEDUP_LOGS",  # every step line must reach the log
        "PYTHONUNBUFFERED",  # ... when it is printed (the host's clock stamps its arrival)
        "PYTHONPATH",  # miles' path and the launcher's node programs (the rows' check)
        "CUDA_VISIBLE_DEVICES",  # which GPUs the preflight sees
        "HF_TOKEN",  # a secret: never in a recipe (a Ray submission is readable by all)
        "HF_ENDPOINT",  # where the assets and their pins come from
        "HF_HUB_OFFLINE",
    }
)


# Variables that change how a program starts: the shell's start-up files and options, the dynamic
# loader, where programs and Python come from. Where the env reaches only the training container
# (local, SSH, AWS), that is the recipe's business; on a Ray cluster the job's env is the env of
# node.sh itself and of every check it runs (`BASH_ENV: '$(...)'` would run the recipe's code in
# the job's shell before the image digest check), so there none may be set.
STARTUP_ENV = frozenset(
    {
        *("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "GLOBIGNORE"),
        *("CDPATH", "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PATH", "PYTHONHOME"),
        *("PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONEXECUTABLE"),
    }
)
STARTUP_ENV_PREFIXES = ("BASH_FUNC_",)  # bash imports a function from such a variable

# Variables miles' model scripts read to change the model they describe: at miles 78527b91,
# scripts/models/*.py read MODEL_ARGS_NUM_LAYERS (qwen3-30B-A3B.py: `--num-layers` from it, else
# 48), MODEL_ARGS_ROTARY_BASE and MODEL_ARGS_FIRST_K_DENSE_REPLACE from the environment (the
# scripts/models/*.sh before them read the same names). A recipe is a claim about its `model`:
# one that sets them trains another architecture (24 layers of a 48-layer model) under its name.
MODEL_ENV_PREFIX = "MODEL_ARGS_"
MODEL_ENV_READ = (
    "MODEL_ARGS_NUM_LAYERS",
    "MODEL_ARGS_ROTARY_BASE",
    "MODEL_ARGS_FIRST_K_DENSE_REPLACE",
)
MODEL_ENV_WHY = (
    "which miles' model scripts read to change the model's architecture (scripts/models/*.py: "
    "MODEL_ARGS_NUM_LAYERS, MODEL_ARGS_ROTARY_BASE, MODEL_ARGS_FIRST_K_DENSE_REPLACE), so the "
    "run would train another model than the recipe's `model`"
)


def launcher_env_problems(
    env: dict[str, Any],
    also: dict[str, str] | None = None,
    *,
    field: str = "env",
    reaches_checks: bool = False,
) -> list[tuple[str, str]]:
    """(field, message) for each name in an ENV (a recipe's or a profile's) that the launcher uses
    itself (LAUNCHER_ENV, LAUNCHER_ENV_PREFIXES, and ALSO: name -> where that name comes from),
    and, where the env reaches the launcher's own checks (a Ray job), each that changes how a
    program starts (STARTUP_ENV)."""
    also = also or {}
    problems = []
    for name in env:
        name = str(name)
        if reaches_checks and (name in STARTUP_ENV or name.startswith(STARTUP_ENV_PREFIXES)):
            problems.append(
                (
                    f"{field}.{name}",
                    f"sets {name}, which changes how a program starts (the shell, the loader, "
                    "Python): on a Ray cluster the job's env is that of node.sh and of every check "
                    "it runs, so it could run code before the checks; expected it removed from "
                    "env (set it in the run block, which only the training runs)",
                )
            )
            continue
        if name.startswith(MODEL_ENV_PREFIX):
            problems.append(
                (
                    f"{field}.{name}",
                    f"sets {name}, {MODEL_ENV_WHY}; expected it removed (a recipe of another "
                    "architecture names that model and its own active_params)",
                )
            )
            continue
        if name in also:
            why = f"the variable {also[name]} names"
        elif name in LAUNCHER_ENV:
            why = "a variable the launcher itself sets or reads to check or control the run"
        elif name.startswith(LAUNCHER_ENV_PREFIXES):
            prefix = next(p for p in LAUNCHER_ENV_PREFIXES if name.startswith(p))
            why = f"a {prefix}* variable, which the launcher keeps for itself"
        else:
            continue
        problems.append(
            (
                f"{field}.{name}",
                f"sets {name}, {why}: an env reaches the checks (the image digest "
                "probe, the preflights, the stack probe, the asset programs), so it may not set "
                "it; expected it removed from env (set what the training needs in the run block)",
            )
        )
    return problems
