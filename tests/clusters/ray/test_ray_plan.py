"""`kind: ray` without a cluster: what the dry run shows is what is submitted, the job's node.sh,
the results block, the log offsets counted over the job server's tail, the job's states, the
cluster's lost nodes, and the cluster check's arithmetic. (The real cluster: test_ray_jobs.py.)"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from support.cli import REPO, SEED, reproduce_here

from launcher.clusters import BACKENDS, DRY_RUN_ONLY, multi_node
from launcher.clusters.base import Node
from launcher.clusters.execution import Place
from launcher.clusters.ray import cluster as ray_cluster
from launcher.clusters.ray import jobs
from launcher.errors import BadInput
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan import protocol
from launcher.plan.plan import build_plan
from launcher.plan.protocol import collect_command

RAY_PROFILE = REPO / "env" / "ray.yaml"


def ray_plan(tmp_path: Path, **fields):
    raw = yaml.safe_load(RAY_PROFILE.read_text())
    raw.update(fields)
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(raw))
    return build_plan(load_recipe(SEED), load_profile(str(path)), run_id="r1")


def submission_of(out: str) -> dict:
    block = out.split("(Jobs API; no secrets) ----\n", 1)[1].split("\n\n# ----", 1)[0]
    return json.loads(block)


# --- the dry run ---------------------------------------------------------------------------------


def test_ray_is_a_backend_that_runs_for_real_on_several_nodes():
    assert BACKENDS["ray"] == "launcher.clusters.ray.cluster"
    assert "ray" not in DRY_RUN_ONLY and multi_node("ray")


def test_the_dry_run_prints_the_submission_and_no_secret():
    secret = "hf_" + "x" * 30
    res = reproduce_here(
        SEED, "--cluster", "ray", "--dry-run", "--run-id", "r1", env={"HF_TOKEN": secret}
    )
    assert res.code == 0, res.err
    assert "REFUSED" not in res.out and secret not in res.out
    request = submission_of(res.out)
    assert request == ray_cluster.submission_request(
        build_plan(load_recipe(SEED), load_profile("ray"), run_id="r1")
    )
    assert request["submission_id"] == "reproduce-r1"
    assert request["entrypoint"] == 'REPRODUCE_SCRIPTS="$PWD" bash node.sh'
    env = request["runtime_env"]["env_vars"]
    # the recipe's env reaches every worker of the job; NVLink multicast off (the profile says so)
    assert list(env) == [
        "PYTHONPATH",
        "RAY_DEDUP_LOGS",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NCCL_NVLS_ENABLE",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST",
        "NVSHMEM_DISABLE_NVLS",
    ]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert env["PYTHONPATH"] == "/root/miles:/root/Megatron-LM" and env["RAY_DEDUP_LOGS"] == "0"
    assert "node.sh), the Ray job's entrypoint ----" in res.out


def test_the_profiles_env_comes_before_the_recipes_as_node_sh_exports_it(tmp_path):
    plan = ray_plan(tmp_path, env={"NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "x"})
    env = ray_cluster.job_env(plan)
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"  # the recipe's wins
    exports = plan.node_script.split("<<'REPRODUCE_CONTAINER_SCRIPT'", 1)[1]
    assert exports.index("export NCCL_DEBUG=INFO") < exports.index(
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
    )


def test_the_ray_dry_run_imports_no_heavy_library():
    code = (
        "import sys, io, contextlib\n"
        "from launcher.commands import cli\n"
        f"sys.argv = ['reproduce', {str(SEED)!r}, '--cluster', 'ray', '--dry-run']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        cli.main()\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, e.code\n"
        "print(','.join(sorted(m for m in ('ray', 'aiohttp', 'requests', 'boto3', 'paramiko')"
        " if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


# --- node.sh as the job's entrypoint -------------------------------------------------------------


def test_the_jobs_node_sh_runs_no_container_and_checks_the_cluster_first(tmp_path):
    script = ray_plan(tmp_path).node_script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "docker" not in script  # the cluster is the image
    assert not re.search(r"^\s*ray (start|stop|job)", script, re.MULTILINE)  # the cluster's Ray
    image = script.split("_stage_begin image\n", 1)[1].split("_stage_end", 1)[0]
    assert (
        'python3 "$REPRODUCE_SCRIPTS/ray_cluster.py" check --nodes 1 --gpus-per-node 8 '
        '--gpu-type H200 --wait-s 60 --image "$IMAGE" --digest "$IMAGE_DIGEST" '
        '--digest-env REPRODUCE_IMAGE_DIGEST > "$NODE_RUN_DIR/image.json"'
    ) in image
    for stage, program in (("preflight", "preflight.py"), ("preflight-gpu", "preflight.py")):
        body = script.split(f"_stage_begin {stage}\n", 1)[1].split("_stage_end", 1)[0]
        assert '"$REPRODUCE_SCRIPTS/ray_cluster.py" each --nodes 1 --gpus-per-node 8' in body
        assert f"-- {program} --json" in body
    assert "--env NCCL_NVLS_ENABLE=0" in script  # the GPU preflight never uses multicast
    assert "_cleanup() { _results; }" in script and jobs.RESULTS_BEGIN in script


def test_without_a_digest_variable_only_the_nodes_are_checked(tmp_path):
    script = ray_plan(tmp_path, image_digest_env=None).node_script
    assert "--digest" not in script and "image_digest_env: null" in script


def test_ray_fields_are_refused_on_other_kinds(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"kind": "local", "image_digest_env": "X"}))
    with pytest.raises(BadInput, match="image_digest_env"):
        load_profile(str(path))


def test_the_results_block_node_sh_prints_is_what_the_launcher_reads(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "image.json").write_text('{"ok": true}\n')
    (run_dir / "stack.json").write_bytes(b"\x00\xffbinary")
    (run_dir / "secret.txt").write_text("not a result file")
    (run_dir / "preflight.json").symlink_to(run_dir / "secret.txt")  # never through a link
    block = "\n".join(protocol.results_block(collect_command(str(run_dir))))
    out = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block}\necho noise\n_results"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got, refused = jobs.parse_results("earlier lines\n" + out + "later\n")
    assert got == {"image.json": b'{"ok": true}\n', "stack.json": b"\x00\xffbinary"}
    assert refused == []


def test_the_last_results_block_counts_and_a_cut_one_gives_nothing():
    def block(payload: str) -> str:
        return f"{jobs.RESULTS_BEGIN}\nimage.json\t{payload}\n{jobs.RESULTS_END}\n"

    # a run block that prints a block of its own earlier is overruled by node.sh's last one
    assert jobs.parse_results(block("Zm9yZ2Vk") + block("cmVhbA=="))[0] == {"image.json": b"real"}
    assert jobs.parse_results(f"{jobs.RESULTS_BEGIN}\nimage.json\tcmVhbA==\n") == ({}, [])


# --- the job through the Jobs API (a stand-in client) --------------------------------------------


class FakeJobs:
    """What RayJobExecution asks of JobSubmissionClient, answered from memory."""

    def __init__(self, log: str = "", chunks: list[str] | None = None) -> None:
        self.log = log
        self.chunks = chunks if chunks is not None else [log]
        self.status = "RUNNING"
        self.exit_code: int | None = None
        self.submitted: dict = {}
        self.stopped = False
        self.tail_fails = False

    def submit_job(self, **kwargs):
        wd = Path(kwargs["runtime_env"]["working_dir"])
        self.submitted = {**kwargs, "files": sorted(p.name for p in wd.iterdir())}
        self.submitted["node_sh"] = (wd / "node.sh").read_text()
        return kwargs["submission_id"]

    def get_job_info(self, job_id):
        return SimpleNamespace(
            status=SimpleNamespace(value=self.status), driver_exit_code=self.exit_code
        )

    def get_job_logs(self, job_id):
        return self.log

    async def tail_job_logs(self, job_id):
        if self.tail_fails:
            raise RuntimeError("websocket refused")
        for chunk in self.chunks:
            yield chunk

    def stop_job(self, job_id):
        self.stopped = True
        self.status = "STOPPED"
        return True


def execution(fake: FakeJobs, request: dict | None = None) -> jobs.RayJobExecution:
    node = Node(name="ray-job", host="127.0.0.1", meta={"submission_id": "reproduce-r1"})
    ex = jobs.RayJobExecution(
        node, Place("r1", "/w/runs/r1", "reproduce-r1"), "http://h:8265", request
    )
    ex._client = fake
    return ex


def read_all(ex: jobs.RayJobExecution, offset: int = 0, timeout_s: float = 5) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = ex.read_log(offset + len(got), 7)  # small reads: offsets move often
        got += data
        if not data:
            time.sleep(0.02)
            if (
                ex._tail is not None
                and ex._tail.done
                and ex._tail.read(offset + len(got), 1) == b""
            ):
                break
    return got


def test_the_log_streams_by_offset_over_the_tail_and_an_attach_skips_what_it_has():
    text = "héllo\nstep 1\nstep 2 ünïcode\n" * 5
    chunks = [text[i : i + 11] for i in range(0, len(text), 11)]
    assert read_all(execution(FakeJobs(text, chunks))) == text.encode()
    offset = len("héllo\nstep 1\n".encode())
    assert read_all(execution(FakeJobs(text, chunks)), offset) == text.encode()[offset:]


def test_a_tail_that_fails_falls_back_to_whole_reads_and_the_end_reads_it_all():
    fake = FakeJobs("a\nb\nc\n")
    fake.tail_fails = True
    ex = execution(fake)
    deadline = time.monotonic() + 5
    data = b""
    while not data and time.monotonic() < deadline:
        data = ex.read_log(0, 100)
    assert data == b"a\nb\nc\n"
    fake.log += "d\n"
    fake.status, fake.exit_code = "SUCCEEDED", 0
    assert ex.poll() == ("exit", 0)
    assert ex.read_log(6, 100) == b"d\n"  # once ended, the whole log is the authority


@pytest.mark.parametrize(
    "status, code, expected",
    [
        ("PENDING", None, ("alive", None)),
        ("RUNNING", None, ("alive", None)),
        ("SUCCEEDED", 0, ("exit", 0)),
        ("FAILED", 3, ("exit", 3)),
        ("FAILED", None, ("gone", None)),  # e.g. its runtime env could not be set up
        ("STOPPED", -15, ("exit", -15)),
    ],
)
def test_the_jobs_status_is_the_runs(status, code, expected):
    fake = FakeJobs()
    fake.status, fake.exit_code = status, code
    ex = execution(fake)
    assert ex.poll() == expected
    assert ex.was_cancelled() == (status == "STOPPED")


def test_cancel_stops_the_job_and_waits_for_it():
    fake = FakeJobs()
    ex = execution(fake)
    assert ex.cancel(timeout_s=5) == "" and fake.stopped and ex.was_cancelled()


def test_launch_submits_node_sh_and_the_node_programs_never_a_secret(tmp_path):
    scripts = tmp_path / "scripts"
    (scripts / "__pycache__").mkdir(parents=True)
    (scripts / "ray_cluster.py").write_text("print()")
    (scripts / "__pycache__" / "x.pyc").write_text("")
    request = {
        "submission_id": "reproduce-r1",
        "entrypoint": "e",
        "runtime_env": {"env_vars": {"A": "1"}},
        "metadata": {},
    }
    fake = FakeJobs()
    ex = execution(fake, request)
    ex.stage("#!/bin/bash\necho hi\n", scripts, {"HF_TOKEN": "hf_secret"})
    workdir = ex._workdir
    assert ex.launch({}) == "reproduce-r1"
    assert fake.submitted["files"] == ["node.sh", "ray_cluster.py"]
    assert fake.submitted["node_sh"] == "#!/bin/bash\necho hi\n"
    assert fake.submitted["runtime_env"]["env_vars"] == {"A": "1"}
    assert "hf_secret" not in json.dumps(fake.submitted)
    assert workdir is not None and not workdir.exists()  # uploaded: the local copy is gone


def test_a_job_server_that_does_not_answer_is_infra():
    from launcher.errors import InfraError

    class Down(FakeJobs):
        def get_job_info(self, job_id):
            raise ConnectionError("Failed to connect to Ray at address: http://h:8265.")

    with pytest.raises(InfraError, match="Ray job server http://h:8265: could not read"):
        execution(Down()).poll()


# --- the cluster ---------------------------------------------------------------------------------


def test_the_cluster_is_found_again_from_run_json_and_never_released():
    cluster = ray_cluster.BACKEND.from_record({"kind": "ray", "address": "http://head:8265"})
    assert cluster.to_record() == {"kind": "ray", "address": "http://head:8265"}
    assert cluster.release() is None
    with pytest.raises(BadInput, match="not a Ray job server"):
        ray_cluster.BACKEND.from_record({"kind": "ray", "address": "head:6379"})


def test_lost_nodes_names_the_dead_gpu_nodes_the_run_started_with(monkeypatch):
    cluster = ray_cluster.RayCluster("http://head:8265")
    cluster.started_with = [
        {"node_id": "a" * 40, "ip": "10.0.0.1", "gpus": 8.0},
        {"node_id": "b" * 40, "ip": "10.0.0.2", "gpus": 8.0},
        {"node_id": "c" * 40, "ip": "10.0.0.3", "gpus": 8.0},
    ]
    now = [
        {"node_id": "a" * 40, "ip": "10.0.0.1", "state": "ALIVE", "state_message": None, "gpus": 8.0},
        {"node_id": "b" * 40, "ip": "10.0.0.2", "state": "DEAD", "gpus": 8.0,
         "state_message": "Unexpected termination: health check failed"},
        {"node_id": "c" * 40, "ip": "10.0.0.3", "state": "DEAD", "gpus": 8.0,
         "state_message": "Expected termination: node is idle"},
    ]  # fmt: skip
    monkeypatch.setattr(jobs, "cluster_nodes", lambda address: now)
    assert cluster.lost_nodes() == [
        f"Ray node 10.0.0.2 (id {'b' * 12}, 8 GPUs) is dead: Unexpected termination: "
        "health check failed"
    ]


# --- scripts/ray_cluster.py's arithmetic ---------------------------------------------------------


def _node_program():
    spec = importlib.util.spec_from_file_location(
        "ray_cluster", REPO / "scripts" / "ray_cluster.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ray_with(nodes):
    return SimpleNamespace(nodes=lambda: nodes)


def _node(ip, gpus, alive=True, kind=None):
    resources = {"CPU": 1.0, **({"GPU": float(gpus)} if gpus else {})}
    if kind:
        resources[f"accelerator_type:{kind}"] = 1.0
    return {"NodeManagerAddress": ip, "NodeID": ip, "Alive": alive, "Resources": resources}


def test_the_cluster_check_counts_alive_nodes_of_the_recipes_gpus():
    program = _node_program()
    args = SimpleNamespace(nodes=2, gpus_per_node=8.0, gpu_type="H200", wait_s=0.0)
    nodes = [
        _node("10.0.0.9", 0),  # a head without GPUs
        _node("10.0.0.2", 8, kind="H200"),
        _node("10.0.0.1", 8),
        _node("10.0.0.3", 8, alive=False),
        _node("10.0.0.4", 4),
        _node("10.0.0.5", 8, kind="A100"),
    ]
    fit, problems = program.fitting_nodes(_ray_with(nodes), args)
    assert [n["NodeManagerAddress"] for n in fit] == ["10.0.0.1", "10.0.0.2"] and problems == []
    args.nodes = 3
    fit, problems = program.fitting_nodes(_ray_with(nodes), args)
    (problem,) = problems
    assert "has 2 alive node(s) with 8 H200 GPUs" in problem and "the recipe needs 3" in problem
    assert "10.0.0.4 (4 GPU)" in problem and "10.0.0.5 (8 A100)" in problem
    assert "nodes without GPUs: 1" in problem


def test_the_cluster_program_refuses_bad_arguments():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "ray_cluster.py"), "check", "--nodes", "1",
         "--gpus-per-node", "8", "--digest-env", "X"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "--digest-env needs --digest" in proc.stderr
