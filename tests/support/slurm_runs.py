"""What the slurm backend's end-to-end tests share (tests/clusters/slurm/): the profile and
recipes they run, and what must be left (nothing) after a run."""

from __future__ import annotations

from pathlib import Path

import yaml

from launcher.inputs.recipe import load_recipe
from support.cli import FOUR_NODES
from support.docker import docker
from support.plan_env import write_profile, write_recipe


def slurm_profile(tmp_path: Path, run_args: list[str], **fields: object) -> Path:
    base = {"kind": "slurm", "partition": "gpu", "gpu_option": "gres"}
    return write_profile(tmp_path, base, run_args, **fields)


def find_run(runs: Path, run_id: str) -> Path:
    found = list(runs.glob(f"**/*{run_id}/run.json"))
    assert found, f"no run dir for {run_id} under {runs}"
    return found[0].parent


def nothing_left(slurm, run_id: str) -> None:
    assert f"reproduce-{run_id}" not in slurm.squeue(), slurm.squeue()
    left = docker("ps", "-aq", "--filter", f"name=reproduce-{run_id}").stdout.split()
    assert not left, docker("ps", "-a").stdout


def run_argv(recipe: Path, profile: Path, runs: Path, run_id: str) -> list[str]:
    return [
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--run-id", run_id,
        "--on-interrupt", "cancel", "--yes",
    ]  # fmt: skip


def two_nodes(tmp_path: Path, test_image, run_args: list[str], netns, **env: str):
    raw = yaml.safe_load(FOUR_NODES.read_text())
    raw["gpu"]["count"] = 16
    raw["layout"]["dp"] = 16
    raw["run"] = raw["run"].replace("--actor-num-nodes 4", "--actor-num-nodes 2")
    raw["result"]["gpu_hours"] = raw["result"]["gpu_hours"] / 2
    recipe = write_recipe(tmp_path, test_image, raw=raw, name="standin-2node")
    r = load_recipe(recipe)
    claimed = r.claim.tokens_per_s_per_gpu
    assert claimed, "the 2-node recipe claims tokens/s per GPU"
    step_s = r.tokens_per_step / claimed / r.gpu_count
    profile = slurm_profile(
        tmp_path, run_args, docker={"network": netns.network},
        env={"STANDIN_STEP_TIME_S": f"{step_s:.4f}", "STANDIN_STARTUP_S": "0", **env},
        ray={"port": 6379, "join_timeout_s": 120},
    )  # fmt: skip
    return recipe, profile


def job_of(rd: Path) -> str:
    """The Slurm job id a run recorded (run.json's cluster)."""
    import json

    return str(json.loads((rd / "run.json").read_text())["cluster"]["job_id"])


def over_login(login) -> dict:
    """A slurm profile's fields that reach the login node over SSH, its host key pinned."""
    reach = login.profile()
    return {
        "login_host": "127.0.0.1", "port": reach["port"], "user": reach["user"],
        "identity_file": reach["identity_file"], "host_key_fingerprint": login.host_fingerprint,
    }  # fmt: skip


def seed_plan(tmp_path: Path, run_id: str = "20261201T120000Z-golden", **fields: object):
    """The seed's Plan on the shipped slurm profile (env/slurm.yaml) with `fields` over it."""
    from launcher.runner.prelaunch import RunOptions, prepare
    from support.cli import REPO, SEED

    raw = yaml.safe_load((REPO / "env" / "slurm.yaml").read_text())
    raw.update({"gpu_option": "gpus-per-node", **fields})
    path = tmp_path / "slurm-profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return prepare(SEED, RunOptions(cluster=str(path), run_id=run_id)).plan
