"""The batch script of a run on Slurm, as `reproduce RECIPE --cluster <slurm profile> --dry-run`
prints it: golden files for the seed (one node, every optional #SBATCH setting), a 2-node recipe
(--gres) and the pyxis path (its batch script and its node.sh); the time limit from --max-hours/--max-usd; every
value in the body quoted (a hostile work dir is refused before it reaches an #SBATCH line, a
hostile run id is quoted); the slurm profile's fields, and a dry run that imports no backend."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.cli import FOUR_NODES, REPO, SEED, reproduce
from support.golden import assert_golden
from support.slurm_runs import seed_plan

from launcher.clusters.slurm import script
from launcher.clusters.slurm.cluster import gpus_in, parse_scontrol

RUN_ID = "20261201T120000Z-golden"
SHIPPED = REPO / "env" / "slurm.yaml"
MACHINE = {str(REPO): "<repo>"}


def two_node_recipe(tmp_path: Path) -> Path:
    """The 4-node fixture's model on 2 x 8 GPUs (the loopback cluster's shape)."""
    raw = yaml.safe_load(FOUR_NODES.read_text())
    raw["gpu"]["count"] = 16
    raw["layout"]["dp"] = 16
    raw["run"] = raw["run"].replace("--actor-num-nodes 4", "--actor-num-nodes 2")
    raw["result"]["gpu_hours"] = raw["result"]["gpu_hours"] / 2
    path = tmp_path / "recipes" / "two-node.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def profile(tmp_path: Path, **fields: object) -> Path:
    raw = yaml.safe_load(SHIPPED.read_text())
    raw.update({"gpu_option": "gpus-per-node", **fields})
    path = tmp_path / "slurm-profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def batch_section(text: str) -> str:
    """The batch script out of a dry run: from its header line to the node script's."""
    start = text.index("# ---- Slurm batch script")
    end = text.index("\n\n# ---- node script")
    return text[start:end] + "\n"


def dry_run(recipe: Path, prof: Path, *extra: str) -> str:
    result = reproduce(str(recipe), "--cluster", str(prof), "--dry-run", "--run-id", RUN_ID, *extra)
    assert result.code == 0, result.err
    return result.out


def test_seed_batch_script_matches_golden(tmp_path: Path) -> None:
    prof = profile(
        tmp_path, account="ml-team", qos="high", reservation="bench", constraint="h200&ib"
    )
    text = batch_section(dry_run(SEED, prof))
    assert_golden("slurm-seed.sbatch", text, normalize=MACHINE)


def test_two_node_batch_script_matches_golden(tmp_path: Path) -> None:
    text = batch_section(dry_run(two_node_recipe(tmp_path), profile(tmp_path, gpu_option="gres")))
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gres=gpu:8\n" in text
    assert_golden("slurm-2node.sbatch", text, normalize={str(tmp_path): "<tmp>"})


def node_section(text: str) -> str:
    """The node script out of a dry run: from its header line to the end."""
    return text[text.index("\n\n# ---- node script") + 2 :]


def test_pyxis_batch_script_matches_golden(tmp_path: Path) -> None:
    text = batch_section(dry_run(SEED, profile(tmp_path, container_runtime="pyxis")))
    # node.sh runs on each node's host (its checks outside any container); its steps ask the
    # job's GPUs, and the run's image file goes when the node's wrapper ends
    assert "--container-image" not in text
    assert "export REPRODUCE_GPU_OPTION=--gpus-per-node=8\n" in text
    assert 'rm -f "$d/image.sqsh"' in text and "docker rm" not in text
    assert_golden("slurm-pyxis.sbatch", text, normalize=MACHINE)


def test_pyxis_node_script_matches_golden(tmp_path: Path) -> None:
    """node.sh on pyxis: the image imported by digest into a fresh .sqsh and checked, each
    in-image command a step of the job (`_in_image`) in that file, never docker, never a named
    container; the host's checks (host preflight, host clock, GPU sampler) in node.sh itself."""
    prof = profile(tmp_path, container_runtime="pyxis", docker={"host_clock": True})
    text = node_section(dry_run(SEED, prof))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "docker run" not in text and "docker pull" not in text
    assert "--container-name" not in text
    assert "_uri=docker://radixark/miles@sha256:" in text  # enroot >= 4.0: by digest
    assert "_uri=docker://radixark/miles:" in text  # older: the tag, then the blob check
    for stage in ("preflight-gpu", "stack", "rows", "convert"):
        assert f'_in_image "$CONTAINER-{stage}" ' in text, stage
    assert '_in_image "$CONTAINER" --gpus -- bash -c "$CONTAINER_SCRIPT" 2>&1' in text
    # the host's own programs run in node.sh, on the host: not inside any _in_image step
    for program in ("preflight.py", "gpu_sampler.py", "host_clock.py"):
        program = f'"$NODE_RUN_DIR/scripts/{program}"'
        lines = [line for line in text.splitlines() if program in line]
        assert lines and not any("_in_image" in line for line in lines), program
    assert "ray stop" not in text  # a shared PID namespace: only the step's own processes end
    assert_golden("slurm-pyxis-node.sh", text, normalize=MACHINE)


def test_a_pyxis_cache_dir_pyxis_cannot_mount_is_refused(tmp_path: Path) -> None:
    for bad in ("/var/cache/a,b", "/var/cache/a:b"):
        prof = profile(tmp_path, container_runtime="pyxis", cache_dir=bad)
        result = reproduce(str(SEED), "--cluster", str(prof), "--dry-run")
        assert result.code == 2, (bad, result.err)
        assert "cache_dir" in result.err and str(prof) in result.err, result.err
        assert "Traceback" not in result.err


def test_the_script_is_bash_and_every_body_value_is_quoted(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    weird = f"x';touch {canary};'$(touch {canary})"
    result = reproduce(
        str(two_node_recipe(tmp_path)), "--cluster", str(profile(tmp_path)), "--dry-run",
        "--run-id", "ok-id",
    )  # fmt: skip
    assert result.code == 0, result.err
    body = batch_section(result.out).split("\n", 1)[1]
    assert subprocess.run(["bash", "-n"], input=body, text=True).returncode == 0
    # a work dir an #SBATCH line could not carry unquoted is refused with the field named
    bad = profile(tmp_path, work_dir=f"/shared/{weird}")
    refused = reproduce(str(SEED), "--cluster", str(bad), "--dry-run")
    assert refused.code == 2 and "work_dir" in refused.err
    assert "Traceback" not in refused.err
    # what reaches the body is quoted: run the script with stand-ins for scontrol and srun (which
    # runs the task as node 0 would), and nothing of the hostile values runs
    b = script.Batch(
        job_name="reproduce-x", partition="gpu", account=None, qos=None, reservation=None,
        constraint=None, nodes=2, gpus_per_node=8, gpu_option="gres", time_minutes=90,
        run_dir=f"/w/{weird}", node_dirs=(f"/w/{weird}", f"/w/{weird}2"),
        containers=(f"c{weird}", "c2"), runtime="docker", image="img@sha256:" + "a" * 64,
    )  # fmt: skip
    rendered = script.render(b)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho n1\n")
    (bin_dir / "srun").write_text('#!/bin/bash\nSLURM_NODEID=0 exec bash -c "${@: -1}"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    job = tmp_path / "job.sbatch"
    job.write_text(rendered)
    ran = subprocess.run(
        ["bash", str(job)], capture_output=True, text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "1"},
    )  # fmt: skip
    assert ran.returncode == 3, ran.stderr  # `cd` into the (absent) hostile directory failed
    assert f"/w/{weird}" in ran.stderr  # named literally
    assert not canary.exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ((), "0-02:00:00"),  # the seed's claim (1.25 GPU-hours on 8 GPUs) -> the 2 h floor
        (("--max-hours", "1.5"), "0-01:30:00"),
        (("--max-usd", "100", "--price-per-hour", "40"), "0-02:00:00"),
        (("--max-usd", "20", "--price-per-hour", "40"), "0-00:30:00"),
    ],
)
def test_the_time_limit_is_the_shortest_of_the_budget_and_the_profile(
    tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    text = batch_section(dry_run(SEED, profile(tmp_path), "--yes", *extra))
    assert f"#SBATCH --time={expected}\n" in text


def test_a_cluster_without_a_price_in_the_profile_has_none(tmp_path: Path) -> None:
    text = dry_run(SEED, profile(tmp_path))
    assert "NO PRICE" in text or "no price" in text.lower()
    priced = dry_run(SEED, profile(tmp_path, price_per_hour=30))
    assert "$" in priced.split("# expected", 1)[1].splitlines()[0]


def test_profile_fields_are_checked(tmp_path: Path) -> None:
    no_partition = profile(tmp_path, partition=None)
    result = reproduce(str(SEED), "--cluster", str(no_partition), "--dry-run")
    assert result.code == 2 and "partition" in result.err
    for field, value in (("partition", "gpu --x"), ("account", "a b"), ("qos", "q\n")):
        bad = profile(tmp_path, **{field: value})
        result = reproduce(str(SEED), "--cluster", str(bad), "--dry-run")
        assert result.code == 2 and field in result.err, (field, result.err)
    elsewhere = profile(tmp_path, instance_id="i-123")
    result = reproduce(str(SEED), "--cluster", str(elsewhere), "--dry-run")
    assert result.code == 2 and "instance_id" in result.err


def test_gpu_option_follows_the_slurm_version() -> None:
    assert script.parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert script.parse_version("slurm 18.08.9") == (18, 8)
    assert script.parse_version("nonsense") is None
    assert script.gpu_option_for((22, 5), "auto") == "gpus-per-node"
    assert script.gpu_option_for((18, 8), "auto") == "gres"
    assert script.gpu_option_for(None, "auto") == "gpus-per-node"
    assert script.gpu_option_for((18, 8), "gpus-per-node") == "gpus-per-node"


def test_sinfo_gres_and_scontrol_are_read() -> None:
    assert gpus_in("gpu:8") == 8
    assert gpus_in("gpu:h100:8(S:0-1)") == 8
    assert gpus_in("gpu:a100:4,gpu:h100:4") == 8
    assert gpus_in("(null)") == 0 and gpus_in("mps:100") == 0
    fields = parse_scontrol("JobId=7 JobName=x JobState=NODE_FAIL Reason=NodeDown Restarts=1")
    assert fields["JobState"] == "NODE_FAIL" and fields["Restarts"] == "1"


def _seed_plan(tmp_path: Path, **fields: object):
    return seed_plan(tmp_path, RUN_ID, **fields)


def test_a_nightly_groups_allocation_script_matches_golden(tmp_path: Path) -> None:
    """A nightly group's allocation: the run's own #SBATCH header (the same nodes, GPUs and
    settings), its own name, directory and time (the sum of its recipes' own limits: two seeds,
    2 h each), and a body that only waits; each recipe is then a job step of it."""
    plan = _seed_plan(
        tmp_path, account="ml-team", qos="high", reservation="bench", constraint="h200&ib"
    )
    hours = script.group_hours([plan.recipe, plan.recipe], plan.profile, None, None, None)
    assert hours == 4.0
    text = script.render_allocation(script.allocation_of(plan, "gpus-per-node", hours))
    assert "#SBATCH --time=0-04:00:00\n" in text and "-ge 600 ]" in text  # the holder's grace
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert_golden("slurm-allocation.sbatch", text, normalize=MACHINE)
    budget = script.group_hours([plan.recipe, plan.recipe], plan.profile, 1.5, None, None)
    assert budget == 3.0  # --max-hours holds for each recipe: the group's sum of them


def test_a_runs_step_script_in_an_allocation_matches_golden(tmp_path: Path) -> None:
    """A run inside a group's allocation: its own body, without an #SBATCH header, whose srun is
    a step of the allocation (SLURM_JOB_ID, given when it starts) named after the run."""
    plan = _seed_plan(tmp_path)
    text = script.render(script.batch_of(plan, "gres"), step=True)
    assert "#SBATCH" not in text and "SLURM_RESTART_COUNT" not in text
    assert f'srun --jobid="$SLURM_JOB_ID" --job-name=reproduce-{RUN_ID} --nodes=1' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert_golden("slurm-step.sh", text, normalize=MACHINE)
