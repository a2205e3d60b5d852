"""The runner with a real dockerd and a real registry: pull by digest (a wrong digest or a bare tag
is refused), Ray and the stand-in miles inside the container, measurement, and cancel/Ctrl-C
leaving no container and no process of the run."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from infra.docker import containers_named, docker
from infra.helpers import cli, group_alive, start_driver, wait_for
from infra.nodescript import docker_body, script
from launcher.clusters.ssh import SSHCluster
from launcher.errors import InfraError
from launcher.execute import execute
from launcher.rundir import RunDir

pytestmark = [pytest.mark.docker, pytest.mark.ssh]
SEED = Path(__file__).resolve().parents[1] / "recipes" / "qwen3-30b-a3b" / "h200" / "attune-tp1-pp1-ep8-mt16k.yaml"


def _job(tmp_path, runs_root, image_ref, run_args, train, *, ray=False, env=None):
    rd = RunDir.create(runs_root, "test/docker")
    node_dir = str(tmp_path / "node" / rd.run_id)
    container = f"reproduce-{rd.run_id}"
    body = docker_body(image_ref, run_args, train, ray=ray, env=env)
    return rd, node_dir, container, script(rd.run_id, node_dir, container, body)


def test_pull_by_digest_then_ray_and_standin_miles_then_measure(sshd, test_image, container_run_args, tmp_path, runs_root):
    docker("rmi", "-f", test_image.ref, check=False)  # make the pull real
    train = (
        "python3 -c \"import ray; ray.init(address='auto', logging_level='ERROR'); "
        "print('RAY_OK', ray.cluster_resources().get('CPU'))\"\n"
        'MODEL_ARGS_LINE="$(python3 miles/utils/external_utils/model_args_utils.py qwen3-30B-A3B)"\n'
        'read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE"\n'
        'python3 train.py --num-rollout 20 --global-batch-size 128 "${MODEL_ARGS[@]}"'
    )
    rd, node_dir, container, text = _job(tmp_path, runs_root, test_image.ref, container_run_args, train, ray=True,
                                         env={"STANDIN_NOISE_LINES": "1"})
    recipe_raw = yaml.safe_load(SEED.read_text())
    outcome = execute(SSHCluster.from_profile(sshd.profile()), node_script=text, run_id=rd.run_id,
                      node_run_dir=node_dir, container=container, run_dir=rd, recipe_raw=recipe_raw, poll_s=0.2)
    assert outcome.state == "done", (rd.logs / "node.log").read_text()[-3000:]
    assert (rd.logs / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
    train_log = (rd.logs / "train.log").read_text()
    assert "RAY_OK 1.0" in train_log  # the Ray CLI from the venv started a head inside the container
    assert "log_utils.py" in train_log and " - step 19: " in train_log
    assert [s["name"] for s in rd.timeline().stages] == ["preflight", "image", "train"]
    assert test_image.digest in docker("image", "inspect", "--format", "{{json .RepoDigests}}", test_image.ref).stdout
    assert containers_named(container) == []  # container (and Ray in it) gone
    assert yaml.safe_load((rd.path / "stack.json").read_text())["image"] == test_image.ref  # collected
    result, verdict = outcome.measurement
    assert (rd.path / "steps.jsonl").read_text().count("\n") == 20
    assert verdict.status == "reproduced"  # the stand-in's default step time is the seed's claim


def test_wrong_digest_is_refused_and_nothing_runs(sshd, test_image, container_run_args, tmp_path, runs_root):
    wrong = f"{test_image.repo}@sha256:{'0' * 64}"
    rd, node_dir, container, text = _job(tmp_path, runs_root, wrong, container_run_args, "echo SHOULD-NOT-RUN")
    with pytest.raises(InfraError, match="stage image") as err:
        execute(SSHCluster.from_profile(sshd.profile()), node_script=text, run_id=rd.run_id, node_run_dir=node_dir,
                container=container, run_dir=rd, poll_s=0.1)
    assert err.value.exit_code == 3
    assert "SHOULD-NOT-RUN" not in (rd.logs / "node.log").read_text()
    assert containers_named(container) == [] and rd.status()["state"] == "failed"


def test_a_tag_alone_is_refused(sshd, test_image, container_run_args, tmp_path, runs_root):
    rd, node_dir, container, text = _job(tmp_path, runs_root, f"{test_image.repo}:v1", container_run_args, "true")
    with pytest.raises(InfraError, match="pin the image by digest"):
        execute(SSHCluster.from_profile(sshd.profile()), node_script=text, run_id=rd.run_id, node_run_dir=node_dir,
                container=container, run_dir=rd, poll_s=0.1)


@pytest.mark.parametrize("how", ["cancel-command", "ctrl-c"])
def test_cancel_leaves_no_container_and_no_process(sshd, test_image, container_run_args, tmp_path, runs_root, how):
    train = "echo training-started; sleep 300"
    rd, node_dir, container, text = _job(tmp_path, runs_root, test_image.ref, container_run_args, train)
    proc = start_driver(
        {"cluster": SSHCluster.from_profile(sshd.profile()).to_record(), "node_script": text, "run_id": rd.run_id,
         "node_run_dir": node_dir, "container": container, "run_dir": str(rd.path), "on_interrupt": "cancel",
         "poll_s": 0.1},
        tmp_path,
    )
    wait_for(lambda: (rd.logs / "train.log").exists() and b"training-started" in (rd.logs / "train.log").read_bytes(),
             timeout_s=120, what="the container to start")
    assert containers_named(container)
    pid = rd.record()["pid"]
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        assert proc.returncode == 130
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        result = cli("cancel", str(rd.path))
        assert result.returncode == 0, result.stderr
    assert containers_named(container) == []
    assert not group_alive(pid)
    assert rd.status()["state"] == "cancelled"
