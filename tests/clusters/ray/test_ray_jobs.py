"""`kind: ray` against a real Ray cluster on loopback (tests/support/ray_cluster.py): four Ray nodes of 8
declared GPUs (head 127.0.0.1 with the job server on 127.0.0.1:8265, workers 127.0.0.2-4), each
saying it runs the 4-node recipe's image digest; the stand-in miles at /root/miles on every node.

Every path ends with the cluster still there (all its nodes alive, the job server answering): the
launcher stops its job, never the cluster. The worker-killed test runs last (it kills one node).
"""

from __future__ import annotations

import copy
import json
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from support.plan_env import REPO, seed_raw, write_recipe
from support.ray_cluster import SEED_DIGEST, LoopbackRay, available, ray_profile

# a loaded 2-core machine may need minutes to bring four Ray nodes up (the first test pays it)
pytestmark = [pytest.mark.ray, pytest.mark.multinode, pytest.mark.timeout(900)]

FOUR_NODE = REPO / "tests" / "data" / "recipes" / "qwen3-30b-a3b-h200-4node.yaml"
DIGEST = "sha256:" + "4" * 64  # the 4-node recipe's image
IPS = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
# 512 rows x 8192 tokens a step over 32 GPUs at the claimed 6500 tokens/s/GPU
STEP_TIME_S = 512 * 8192 / (6500.0 * 32)


@pytest.fixture(scope="module")
def cluster():
    why = available()
    if why:
        pytest.skip(f"the loopback Ray cluster {why}")
    ray = LoopbackRay()
    try:
        ray.start(workers=3, digest=DIGEST)  # every node says it runs the 4-node recipe's image
        yield ray
    finally:
        ray.stop()


def four_node_raw(**result: object) -> dict:
    raw = yaml.safe_load(FOUR_NODE.read_text())
    raw["result"].update(result)
    return raw


def one_node_raw(**result: object) -> dict:
    """The seed, on the cluster's image: one node, so the stand-in places no actors (quick)."""
    raw = seed_raw()
    raw["stack"]["image"] = {"repository": "radixark/miles", "digest": DIGEST}
    raw["result"].update(result)
    return raw


def setup_run(tmp_path: Path, raw: dict, **env: str) -> tuple[Path, Path]:
    recipe = write_recipe(tmp_path, raw=copy.deepcopy(raw), name="on-ray")
    if raw["gpu"]["count"] == 32:
        env = {"STANDIN_STEP_TIME_S": f"{STEP_TIME_S:.4f}", **env}
    return recipe, ray_profile(tmp_path, env={"STANDIN_NOISE_LINES": "1", **env})


def run_dir_of(runs: Path) -> Path:
    (record,) = runs.glob("**/run.json")
    return record.parent


def assert_cluster_intact(cluster: LoopbackRay, ips: list[str] = IPS) -> None:
    """The cluster outlives every run: all its nodes alive, its job server answering."""
    assert cluster.alive_nodes() == ips
    assert cluster.api("/api/version") is not None


# What a ray run says wherever it is shown, however it ended (launcher/clusters/trust.py): the
# cluster vouched for its own image and checks. The table of every ending and every surface is
# tests/results/test_cluster_trust.py; here each real run's own terminal and page.
VOUCHED = "the ray cluster was trusted for its image and its checks"


def assert_says_vouched(stderr: str, rd: Path) -> None:
    """The run's last words at the terminal and its page say it, once each."""
    assert stderr.count(VOUCHED) == 1, stderr
    assert (rd / "report.html").read_text().count(VOUCHED) == 1


def wait_for_stage(rd_glob: Path, stage: str, timeout_s: float = 120) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in rd_glob.glob("**/timeline.json"):
            stages = json.loads(record.read_text() or "{}").get("stages", [])
            if any(s["name"] == stage for s in stages):
                return record.parent
        time.sleep(0.2)
    raise AssertionError(f"stage {stage} never started under {rd_glob}")


def job_status(cluster: LoopbackRay, rd: Path) -> str | None:
    job = cluster.job(f"reproduce-{json.loads((rd / 'run.json').read_text())['run_id']}")
    return job and job["status"]


def wait_job_ended(cluster: LoopbackRay, rd: Path, timeout_s: float = 60) -> str:
    cluster.wait(
        lambda: job_status(cluster, rd) not in (None, "PENDING", "RUNNING"), timeout_s, "job end"
    )
    return str(job_status(cluster, rd))


def test_a_four_node_recipe_runs_to_a_verdict_as_the_dry_run_said(cluster, tmp_path):
    recipe, profile = setup_run(tmp_path, four_node_raw())
    runs = tmp_path / "runs"
    common = ("--cluster", str(profile), "--runs-dir", str(runs), "--run-id", "ray-e2e")
    dry = cluster.cli(str(recipe), *common, "--dry-run")
    assert dry.returncode == 0 and "REFUSED" not in dry.stdout, dry.stderr
    block = dry.stdout.split("(Jobs API; no secrets) ----\n", 1)[1].split("\n\n# ----", 1)[0]
    shown = json.loads(block)

    secret = "hf_" + "s3cr3t" * 6
    res = cluster.cli(str(recipe), *common, "--on-interrupt", "cancel", env={"HF_TOKEN": secret})
    rd = run_dir_of(runs)
    assert res.returncode == 0, res.stderr + (rd / "logs" / "node.log").read_text()[-3000:]
    assert "verdict: reproduced" in res.stderr
    assert_says_vouched(res.stderr, rd)
    assert json.loads((rd / "status.json").read_text())["state"] == "done"
    stages = [s["name"] for s in json.loads((rd / "timeline.json").read_text())["stages"]]
    assert stages[-2:] == ["ray", "train"] and "image" in stages

    # submitted exactly what the dry run printed; the job server holds the same
    record = json.loads((rd / "run.json").read_text())
    assert record["ray_job"] == shown and shown["submission_id"] == "reproduce-ray-e2e"
    job = cluster.job("reproduce-ray-e2e")
    assert job["status"] == "SUCCEEDED" and job["entrypoint"] == shown["entrypoint"]
    assert job["metadata"] == shown["metadata"]
    assert job["runtime_env"]["env_vars"] == shown["runtime_env"]["env_vars"]
    assert job["runtime_env"]["working_dir"].startswith("gcs://")
    assert (
        shown["runtime_env"]["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    )

    # the log streamed by offset is the job's log, byte for byte; the node's checks came back
    served = cluster.api("/api/jobs/reproduce-ray-e2e/logs")["logs"]
    assert (rd / "logs" / "node.log").read_bytes() == served.encode()
    assert " - step 19: " in (rd / "logs" / "train.log").read_text()
    image = json.loads((rd / "image.json").read_text())
    assert image["ok"] and [n["address"] for n in image["nodes"]] == IPS
    assert {n["digest"] for n in image["nodes"]} == {DIGEST}

    # no secret reached the cluster: not in the submission, not in what the job printed
    assert secret not in json.dumps(cluster.jobs()) and secret not in served
    assert_cluster_intact(cluster)


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda raw: raw["stack"]["image"].update(digest=SEED_DIGEST),
            f"Ray node 127.0.0.1 runs image {DIGEST}, but the recipe pins {SEED_DIGEST}",
        ),
        (
            lambda raw: (
                raw["gpu"].update(count=40),
                raw["layout"].update(dp=40),
                raw.update(run=raw["run"].replace("--actor-num-nodes 4", "--actor-num-nodes 5")),
            ),
            "the recipe needs 5",
        ),
    ],
    ids=["image-digest", "nodes"],
)
def test_a_cluster_that_is_not_the_recipes_is_refused_before_training(
    cluster, tmp_path, change, expected
):
    raw = four_node_raw()
    change(raw)
    recipe, profile = setup_run(tmp_path, raw)
    runs = tmp_path / "runs"
    res = cluster.cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs))
    assert runs.exists(), res.stderr
    rd = run_dir_of(runs)
    assert res.returncode == 3, res.stderr
    assert expected in res.stderr and "in stage image" in res.stderr, res.stderr
    assert_says_vouched(res.stderr, rd)  # failed before any verdict
    stages = json.loads((rd / "timeline.json").read_text())["stages"]
    assert "train" not in [s["name"] for s in stages]  # not a GPU minute of training
    assert wait_job_ended(cluster, rd) == "FAILED"
    assert json.loads((rd / "image.json").read_text())["ok"] is False
    assert_cluster_intact(cluster)


def test_the_jobs_own_environment_cannot_vouch_for_the_image(cluster, tmp_path):
    """Issue 19: on Ray the profile's env is the job's whole environment, the image digest probe's
    included, so a profile that set the variable each node reports its digest in could vouch for
    the image itself. It is refused at validate (launcher/inputs/envnames.py), before the cluster
    is asked anything: exit 2, no job, no run directory. What the nodes themselves say is
    believed (test_a_cluster_that_is_not_the_recipes_is_refused_before_training[image-digest])."""
    raw = four_node_raw()
    raw["stack"]["image"].update(digest=SEED_DIGEST)
    recipe, profile = setup_run(tmp_path, raw, REPRODUCE_IMAGE_DIGEST=SEED_DIGEST)
    runs = tmp_path / "runs"
    before = len(cluster.jobs())
    res = cluster.cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs))
    assert res.returncode == 2, res.stderr
    assert "REPRODUCE_IMAGE_DIGEST" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not list(runs.glob("**/run.json"))
    assert len(cluster.jobs()) == before
    assert_cluster_intact(cluster)


def test_cancel_from_run_json_stops_the_job_not_the_cluster(cluster, tmp_path):
    recipe, profile = setup_run(tmp_path, one_node_raw(), STANDIN_SLEEP_S="3")
    runs = tmp_path / "runs"
    proc = cluster.start_cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs))
    try:
        rd = wait_for_stage(runs, "train")
        res = cluster.cli("cancel", str(rd))
        assert res.returncode == 0, res.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert_says_vouched(err, rd)
    assert VOUCHED in res.stderr  # and `reproduce cancel` itself
    assert wait_job_ended(cluster, rd) == "STOPPED"
    assert json.loads((rd / "status.json").read_text())["state"] == "cancelled"
    assert_cluster_intact(cluster)


def test_ctrl_c_stops_the_job_and_a_dead_launcher_is_reattached(cluster, tmp_path):
    """Ctrl-C cancels (the job is stopped); a launcher killed outright leaves the job running, and
    `reproduce attach` follows it again from the byte where the run dir's log ends."""
    recipe, profile = setup_run(tmp_path, one_node_raw(), STANDIN_SLEEP_S="3")
    runs = tmp_path / "ctrl-c"
    args = ("--cluster", str(profile), "--on-interrupt", "cancel")
    proc = cluster.start_cli(str(recipe), *args, "--runs-dir", str(runs))
    try:
        rd = wait_for_stage(runs, "train")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert_says_vouched(err, rd)
    assert wait_job_ended(cluster, rd) == "STOPPED"

    recipe, profile = setup_run(tmp_path / "attach", one_node_raw(), STANDIN_SLEEP_S="0.3")
    runs = tmp_path / "attach" / "runs"
    proc = cluster.start_cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs))
    try:
        rd = wait_for_stage(runs, "train")
        proc.kill()  # the launcher dies; the job goes on
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert job_status(cluster, rd) == "RUNNING"
    res = cluster.cli("attach", str(rd))
    assert res.returncode == 0, res.stderr
    assert "reattaching" in res.stderr and "verdict: reproduced" in res.stderr
    assert_says_vouched(res.stderr, rd)
    run_id = json.loads((rd / "run.json").read_text())["run_id"]
    served = cluster.api(f"/api/jobs/reproduce-{run_id}/logs")
    assert (rd / "logs" / "node.log").read_bytes() == served["logs"].encode()
    assert_cluster_intact(cluster)


def test_the_budget_stops_the_job(cluster, tmp_path):
    # no GPU-hours claimed (nothing refused before the launch; 0.02, under the window's own time,
    # is refused by validate), a limit of 0.004 h (14 s): reached while training
    recipe, profile = setup_run(tmp_path, one_node_raw(gpu_hours=None), STANDIN_SLEEP_S="3")
    runs = tmp_path / "runs"
    res = cluster.cli(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--max-hours", "0.004"
    )
    rd = run_dir_of(runs)
    assert res.returncode == 1 and "budget reached" in res.stderr, res.stderr
    assert_says_vouched(res.stderr, rd)
    assert wait_job_ended(cluster, rd) == "STOPPED"
    assert_cluster_intact(cluster)


def test_a_worker_lost_mid_run_ends_the_run_naming_it(cluster, tmp_path):
    recipe, profile = setup_run(tmp_path, four_node_raw(), STANDIN_SLEEP_S="3")
    runs = tmp_path / "runs"
    proc = cluster.start_cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs))
    try:
        rd = wait_for_stage(runs, "train")
        cluster.kill_node("127.0.0.3")
        _, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    # Whichever sees it first: the launcher's look at the cluster (cluster.lost_nodes(): Ray's
    # word that the node is dead, exit 3), or training itself (an actor on the node died, exit 1)
    assert proc.returncode in (1, 3), err
    if proc.returncode == 3:
        assert re.search(r"Ray node 127\.0\.0\.3 \(id \w+, 8 GPUs\) is dead", err), err
    assert "127.0.0.3" in err, err
    assert_says_vouched(err, rd)
    assert json.loads((rd / "status.json").read_text())["state"] == "failed"
    assert json.loads((rd / "verdict.json").read_text())["status"] == "failed"
    assert wait_job_ended(cluster, rd) in ("STOPPED", "FAILED")  # nothing of the run left
    assert_cluster_intact(cluster, [ip for ip in IPS if ip != "127.0.0.3"])
