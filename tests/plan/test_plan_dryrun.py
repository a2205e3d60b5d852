"""`reproduce RECIPE --cluster NAME --dry-run`: the exact script, for every profile, without credentials."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.cli import FIXTURES, SEED, reproduce_here

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan import stage_graph
from launcher.plan.plan import build_plan

DIGEST = "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"
NO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_PROFILE": "",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}


def node_script_of(out: str) -> str:
    marker = "# ---- node script (node.sh), run detached on the node ----\n"
    assert marker in out
    return out.split(marker, 1)[1]


@pytest.mark.parametrize("cluster", ["aws", "ssh", "local"])
def test_dry_run_shows_digest_env_run_and_ray_before_train(cluster: str, tmp_path: Path) -> None:
    res = reproduce_here(SEED, "--cluster", cluster, "--dry-run", env=NO_CREDENTIALS)
    assert res.code == 0, res.err
    script = node_script_of(res.out)
    assert f"radixark/miles@{DIGEST}" in res.out
    assert f"IMAGE=radixark/miles@{DIGEST}" in script
    recipe = yaml.safe_load(SEED.read_text())
    # every export of the recipe's env, in order, after miles' PYTHONPATH
    positions = [script.index(f"export {k}={v}\n") for k, v in recipe["env"].items()]
    assert positions == sorted(positions)
    assert script.index("export PYTHONPATH=/root/miles:/root/Megatron-LM") < positions[0]
    # every line (so every argument) of the run block, verbatim and in order
    run_at = script.index("# ----- recipe run block (verbatim) -----")
    assert recipe["run"].rstrip("\n") in script[run_at:]
    assert "--distributed-timeout-minutes 30" in script
    # Ray starts before train.py
    assert script.index("ray start --head") < script.index("python3 train.py")
    assert "--num-gpus 8" in script
    # the script is plain bash
    path = tmp_path / "node.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_dry_run_header_has_nodes_image_and_cost() -> None:
    res = reproduce_here(SEED, "--cluster", "aws", "--dry-run", env=NO_CREDENTIALS)
    header = res.out.split("\n\n", 1)[0]
    assert "1 x 8 H200" in header and "p5en.48xlarge" in header
    assert "1.25 GPU-hours" in header and "$63.296/h" in header and "$9.89" in header


def test_price_override_changes_the_expected_cost() -> None:
    res = reproduce_here(
        SEED, "--cluster", "aws", "--dry-run", "--price-per-hour", "40", env=NO_CREDENTIALS
    )
    assert "$40/h = $6.25" in res.out and "override" in res.out


def test_aws_dry_run_prints_the_run_instances_request_without_secrets() -> None:
    canary = {
        "AWS_ACCESS_KEY_ID": "AKIACANARYCANARY0000",
        "AWS_SECRET_ACCESS_KEY": "secret-canary-value",
        "HF_TOKEN": "hf_canary_token_value",
    }
    res = reproduce_here(SEED, "--cluster", "aws", "--dry-run", env=canary)
    assert res.code == 0, res.err
    for value in canary.values():
        assert value not in res.out and value not in res.err
    requests = res.out.split("# ---- provisioning requests", 1)[1].split("# ---- node script", 1)[0]
    calls = json.loads(requests.split("\n", 1)[1])
    run = next(c for c in calls if c["operation"] == "RunInstances")
    assert run["params"]["InstanceType"] == "p5en.48xlarge"
    assert len(run["params"]["NetworkInterfaces"]) == 16


def test_ssh_and_local_print_no_provisioning_request() -> None:
    for cluster in ("ssh", "local"):
        res = reproduce_here(SEED, "--cluster", cluster, "--dry-run")
        assert "provisioning requests" not in res.out


def test_script_out_writes_the_same_script(tmp_path: Path) -> None:
    out = tmp_path / "node.sh"
    res = reproduce_here(
        SEED, "--cluster", "aws", "--dry-run", "--script-out", out, "--run-id", "r1"
    )
    assert res.code == 0
    assert out.read_text() == node_script_of(res.out)


def test_same_run_id_gives_byte_identical_scripts() -> None:
    a = reproduce_here(SEED, "--cluster", "ssh", "--dry-run", "--run-id", "fixed-1")
    b = reproduce_here(SEED, "--cluster", "ssh", "--dry-run", "--run-id", "fixed-1")
    assert a.out == b.out


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_other_recipes_dry_run(fixture: str, tmp_path: Path) -> None:
    path = FIXTURES / fixture
    recipe = load_recipe(path)
    res = reproduce_here(path, "--cluster", "aws", "--dry-run", env=NO_CREDENTIALS)
    assert res.code == 0, res.err
    script = node_script_of(res.out)
    assert recipe.image.ref in script
    assert f"--num-gpus {recipe.gpus_per_node}" in script
    assert f"{recipe.nodes} x {recipe.gpus_per_node} {recipe.gpu_type}" in res.out
    (tmp_path / "n.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "n.sh")], check=True)


def test_multi_node_recipe_is_refused_on_a_single_host_profile() -> None:
    res = reproduce_here(FIXTURES / "llama3.1-70b-h100-2node.yaml", "--cluster", "ssh", "--dry-run")
    assert res.code == 2 and "2 nodes" in res.err and "Traceback" not in res.err


def test_plan_stages_in_order_and_the_same_object_renders_the_script() -> None:
    plan = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1")
    node = list(stage_graph.NODE_STAGES[:-1])  # push: only with an asset store
    assert [s.name for s in plan.stages] == ["acquire", *node, "collect", "release"]
    script = plan.node_script
    # the parallel stages: each a function, started by _bg after what it waits for, one _join
    starts = []
    for name in stage_graph.PARALLEL:
        after = "".join(f" {a}" for a in stage_graph.AFTER[name])
        starts.append(script.index(f"\n_bg {name} {stage_graph.function_name(name)}{after}\n"))
        assert script.index(f"\n{stage_graph.function_name(name)}() {{\n") < starts[0]
    assert starts == sorted(starts) and script.count("\n_join\n") == 1
    order = [script.index(f"_stage_begin {s}") for s in ("convert", "ray", "train")]
    assert starts[-1] < script.index("\n_join\n") < order[0] and order == sorted(order)
    assert plan.to_dict()["stages"][10]["commands"][0] == load_recipe(SEED).run_script.rstrip("\n")


def test_the_dry_run_says_what_runs_at_once() -> None:
    plan = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1")
    line = stage_graph.describe([s.name for s in plan.stages], "aws")
    assert line.startswith("acquire -> at once {preflight; resolve; image; preflight-gpu (after")
    assert "rows (after resolve, image); assets (after resolve)} -> convert -> ray" in line
    assert (
        stage_graph.describe(["a", "preflight", "image", "b"], "ray")
        == "a -> preflight -> image -> b"
    )


def test_skip_preflight_removes_the_checks() -> None:
    plan = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1", skip_preflight=True)
    assert "preflight.py" not in plan.node_script


def test_nvlink_multicast_forced_off_on_shared_hosts_and_never_turned_on() -> None:
    shared = build_plan(load_recipe(SEED), load_profile("ssh"), run_id="r1").node_script
    dedicated = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1").node_script
    container = shared.split("<<'REPRODUCE_CONTAINER_SCRIPT'", 1)[1]
    assert container.index("export CUDA_DEVICE_MAX_CONNECTIONS") < container.index(
        "export NCCL_NVLS_ENABLE=0"
    )
    for script in (shared, dedicated):
        assert not re.search(r"NCCL_NVLS_ENABLE=1|DISABLE_MULTICAST=0|DISABLE_NVLS=0", script)


def test_efa_devices_and_docker_flags() -> None:
    script = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1").node_script
    assert "for dev in /dev/infiniband/*" in script
    for flag in (
        "--gpus all",
        "--ipc host",
        "--network host",
        "--ulimit memlock=-1",
        "--ulimit stack=67108864",
        "--shm-size 32g",
    ):
        assert flag in script


@pytest.mark.parametrize(
    "profile, field, expected",
    [
        ({"kind": "ssh"}, "host", "needs the node's host name"),
        ({"kind": "local", "host": "x"}, "host", "applies to kind ssh"),
        ({"kind": "aws", "ssh_cidr": "0.0.0.0/0"}, "ssh_cidr", "whole internet"),
        ({"kind": "local", "dockr": {}}, "dockr", "unknown field"),
        ({"kind": "moon"}, "kind", "expected one of local, ssh, aws, ray"),
        ({"kind": "local", "docker": {"gpus": 8}}, "docker.gpus", "expected text or null"),
        # a host list's entry is text or a mapping: each is explained as what it was meant to be
        (
            {"kind": "ssh", "hosts": ["a", {"host": "b", "colour": "blue"}]},
            "hosts[1].colour",
            "unknown field; expected one of: accept_unknown_host",
        ),
        (
            {"kind": "ssh", "hosts": ["a", 42]},
            "hosts[1]",
            "expected text or a mapping, got integer",
        ),
        ({"kind": "ssh", "hosts": ["a", {"port": 22}]}, "hosts[1].host", "missing required field"),
    ],
)
def test_bad_profiles_exit_2(profile: dict, field: str, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile))
    res = reproduce_here(SEED, "--cluster", path, "--dry-run")
    assert res.code == 2 and "Traceback" not in res.err
    assert str(path) in res.err and f"- {field}:" in res.err and expected in res.err, res.err


def test_unknown_profile_name_lists_the_known_ones() -> None:
    res = reproduce_here(SEED, "--cluster", "gcp", "--dry-run")
    assert res.code == 2 and "aws, local, ray, slurm, ssh" in res.err


def test_ray_profile_submits_to_the_existing_cluster() -> None:
    """The launcher submits node.sh as one job (tests/clusters/ray/test_ray_plan.py: the request printed)."""
    res = reproduce_here(SEED, "--cluster", "ray", "--dry-run")
    script = res.out.split("# ---- node script (node.sh), the Ray job's entrypoint ----\n", 1)[1]
    assert "ray start --head" not in script and "ray job submit" not in script
    assert "# ---- Ray job submission to http://127.0.0.1:8265" in res.out


def test_real_runs_refuse_what_this_version_cannot_execute(tmp_path: Path) -> None:
    """Multi-node recipes where the kind cannot run them are planned (dry run) but refused for real, before anything starts."""
    runs = tmp_path / "runs"
    # a multi-node recipe on a profile that gives one node (ssh host lists, aws and ray run them)
    multi = reproduce_here(
        FIXTURES / "llama3.1-70b-h100-2node.yaml", "--cluster", "local", "--runs-dir", runs
    )
    assert multi.code == 2 and "2 nodes" in multi.err and "gives one node" in multi.err
    assert not runs.exists()


def test_dry_run_imports_no_heavy_library() -> None:
    """Start-up stays light: boto3, paramiko, ray and matplotlib are imported only where a real run needs them."""
    code = (
        "import sys, io, contextlib\n"
        "from launcher.commands import cli\n"
        f"sys.argv = ['reproduce', {str(SEED)!r}, '--cluster', 'aws', '--dry-run']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        cli.main()\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, e.code\n"
        "heavy = sorted(m for m in ('boto3', 'botocore', 'paramiko', 'ray', 'matplotlib', 'pydantic', 'cryptography', 'securesystemslib') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_ray_log_dedup_is_off_before_ray_starts_and_the_recipe_can_still_set_it() -> None:
    """Ray folds lines that differ only in digits ('step 7: {...}'); the measurement needs every step line."""
    script = build_plan(load_recipe(SEED), load_profile("aws"), run_id="r1").node_script
    container = script.split("<<'REPRODUCE_CONTAINER_SCRIPT'", 1)[1]
    assert container.index("export RAY_DEDUP_LOGS=0") < container.index(
        "export CUDA_DEVICE_MAX_CONNECTIONS"
    )
    assert container.index("export RAY_DEDUP_LOGS=0") < container.index("ray start --head")
