"""The image path of the REAL Plan on this host (`--cluster local`, a real dockerd, the local
registry): the node script `build_plan` renders pulls by digest, starts Ray and the stand-in
miles in a `--network none` container, and is measured; a digest the registry or the node does not
have is refused before anything runs; a recipe naming its image by tag alone is refused before
anything starts; cancel and Ctrl-C leave no container and no process of the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.docker import containers_named, docker
from support.helpers import (
    assert_log_collected,
    cli,
    group_alive,
    processes_mentioning,
    processes_with_env,
    start_cli,
    wait_for,
)
from support.paths import STANDIN_GPU
from support.plan_env import assert_run_stages, plan_for, seed_raw, write_profile, write_recipe

from launcher.clusters.local import LocalCluster
from launcher.errors import InfraError, ReproduceError
from launcher.inputs.recipe import load_recipe
from launcher.records.rundir import RunDir, new_run_id
from launcher.runner.runner import Runner

pytestmark = pytest.mark.docker
LOCAL = {"kind": "local"}
# Runs before the recipe's own run block: a Ray client joining the head the Plan started (--num-gpus 8).
RAY_PROBE = (
    "python3 -c \"import ray; ray.init(address='auto', logging_level='ERROR'); "
    "print('RAY_OK', ray.cluster_resources().get('GPU'))\""
)


def _execute(plan, runs_root: Path):
    """The Plan's node script through the shared runner, as `reproduce RECIPE --cluster local` runs it."""
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    return rd, lambda: Runner(poll_s=0.2).execute(plan, rd, LocalCluster())


def test_pull_by_digest_then_ray_and_standin_miles_then_measure(
    test_image, container_run_args, tmp_path, runs_root
):
    docker("rmi", "-f", test_image.ref, check=False)  # make the pull real
    recipe = write_recipe(tmp_path, test_image, run_prefix=RAY_PROBE)
    plan = plan_for(recipe, write_profile(tmp_path, LOCAL, container_run_args))
    rd, run = _execute(plan, runs_root)
    outcome = run()
    node_log = Path(plan.node_run_dir, "node.log")
    assert outcome.state == "done", node_log.read_text()[-3000:]
    assert (
        (rd.path / "node.sh").read_text()
        == plan.node_script
        == Path(plan.node_run_dir, "node.sh").read_text()
    )
    assert_log_collected(rd.path)
    stages = rd.timeline().stages
    assert_run_stages([s.name for s in stages])
    assert all(s.status == "ok" for s in stages)
    # the pull was real, and the image that ran is the recipe's digest
    assert (
        test_image.ref
        in docker("image", "inspect", "--format", "{{json .RepoDigests}}", test_image.ref).stdout
    )
    image = json.loads((rd.path / "image.json").read_text())  # collected from the node
    assert image["image"] == test_image.ref and image["digest"] == test_image.digest
    assert test_image.ref in image["repo_digests"]  # docker's own RepoDigests, for an attestation
    # --network none: only loopback, so Ray binds 127.0.0.1; a client joins the Plan's head (8 GPUs declared)
    assert "Local node IP: 127.0.0.1" in (rd.logs / "ray.log").read_text()
    train_log = (rd.logs / "train.log").read_text()
    assert "RAY_OK 8.0" in train_log
    assert "log_utils.py" in train_log and " - step 19: " in train_log
    assert containers_named(plan.container) == []
    # no `ray stop` in a container: Ray's daemons and workers died with its PID namespace
    assert processes_with_env("RUN_ID", plan.run_id) == []
    _, verdict = outcome.measurement
    assert (rd.path / "steps.jsonl").read_text().count("\n") == 20
    assert verdict.status == "reproduced"  # the stand-in's default step time is the seed's claim
    # the run directory of a real pull and container run is attested and verifies
    from support.attest import keypair

    from launcher.results.attest_keys import load_signing_key
    from launcher.results.attest_run import attest_directory as attest
    from launcher.results.attest_verify import verify_dir

    key, pub = keypair(tmp_path)
    attest(rd.path, load_signing_key(key))
    assert verify_dir(rd.path, pub).status == "reproduced"


@pytest.mark.parametrize("case", ["digest-not-in-registry", "pull-off-and-digest-not-on-node"])
def test_wrong_digest_is_refused_and_nothing_runs(
    test_image, container_run_args, tmp_path, runs_root, case
):
    if case == "digest-not-in-registry":
        image = type(test_image)(test_image.repo, f"sha256:{'0' * 64}")
        profile = write_profile(tmp_path, LOCAL, container_run_args)
    else:  # docker.pull: false: the node must already hold the digest, and does not
        image = test_image
        docker("rmi", "-f", test_image.ref, check=False)
        profile = write_profile(tmp_path, LOCAL, container_run_args, docker={"pull": False})
    plan = plan_for(write_recipe(tmp_path, image, run_prefix="echo SHOULD-NOT-RUN"), profile)
    rd, run = _execute(plan, runs_root)
    with pytest.raises(InfraError, match="stage image") as err:
        run()
    assert err.value.exit_code == 3
    assert image.ref in str(err.value)  # the tail of the image stage's log names what was refused
    # the image failed; what ran beside it ended or was stopped, what needs the image never began
    status = {s.name: s.status for s in rd.timeline().stages}
    assert status.pop("image") == "failed"
    assert set(status) <= {"preflight", "resolve", "assets"}, status
    assert set(status.values()) <= {"ok", "stopped"}, status
    assert "SHOULD-NOT-RUN" not in (rd.logs / "node.log").read_text()
    assert not (rd.path / "image.json").exists() and not (rd.path / "steps.jsonl").exists()
    assert containers_named(plan.container) == [] and rd.status()["state"] == "failed"


@pytest.mark.parametrize("where", ["stack.image", "stack.source"])
def test_an_image_named_by_tag_alone_is_refused_before_anything_starts(
    test_image, container_run_args, tmp_path, runs_root, where
):
    raw = seed_raw()
    if where == "stack.image":  # the structured form requires a digest
        raw["stack"]["image"] = {"repository": test_image.repo, "tag": "v1"}
        raw["stack"]["source"] = "test: the image is named by its tag only"
    else:  # the prose form names no digest
        raw["stack"]["source"] = f"test: the image is {test_image.repo}:v1"
    recipe = write_recipe(tmp_path, raw=raw)
    profile = write_profile(tmp_path, LOCAL, container_run_args)
    run_id = new_run_id()
    result = cli(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs_root), "--run-id", run_id
    )
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and "digest" in result.stderr and "Traceback" not in result.stderr
    assert list(runs_root.iterdir()) == []  # no run dir
    assert not (tmp_path / "work").exists()  # nothing staged on the node
    assert containers_named(f"reproduce-{run_id}") == []


@pytest.mark.parametrize("how", ["cancel-command", "ctrl-c"])
def test_cancel_leaves_no_container_and_no_process(
    test_image, container_run_args, tmp_path, runs_root, how, monkeypatch
):
    # the host's GPU sampler meets the stand-in nvidia-smi (no GPU here): both must end with the run
    monkeypatch.setenv("PATH", f"{STANDIN_GPU}{os.pathsep}{os.environ['PATH']}")
    recipe = write_recipe(tmp_path, test_image)
    # the host's clock on: the container's last words (its end marker) pass its stamper after TERM
    profile = write_profile(
        tmp_path,
        LOCAL,
        container_run_args,
        env={"STANDIN_SLEEP_S": "300"},
        docker={"host_clock": True},
    )
    run_id = new_run_id()
    rd = RunDir(runs_root / load_recipe(recipe).slug / run_id)
    container = f"reproduce-{run_id}"
    proc = start_cli(
        str(recipe),
        "--cluster",
        str(profile),
        "--runs-dir",
        str(runs_root),
        "--run-id",
        run_id,
        "--on-interrupt",
        "cancel",
    )
    try:
        _interrupt_training(proc, rd, container, run_id, runs_root, tmp_path, how)
    finally:  # a failed assertion must not leave a run going on this host
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pid = rd.record().get("pid") if (rd.path / "run.json").exists() else None
        if containers_named(container) or (pid and group_alive(pid)):
            cli("cancel", run_id, "--runs-dir", str(runs_root))
    assert containers_named(container) == []
    assert (
        processes_mentioning(str(tmp_path)) == []
    )  # Ray and training in the container, the node script
    assert processes_with_env("RUN_ID", run_id) == []  # Ray's daemons, which name no path of it
    assert rd.status()["state"] == "cancelled"
    last = rd.timeline().stages[-1]
    assert last.name == "train" and last.end is not None and last.status == "cancelled"


def _interrupt_training(
    proc, rd: RunDir, container: str, run_id: str, runs_root: Path, tmp_path: Path, how: str
):
    train_log = rd.logs / "train.log"
    wait_for(
        lambda: train_log.exists() and b"miles stand-in:" in train_log.read_bytes(),
        timeout_s=120,
        what="the stand-in to start training in the container",
    )
    assert containers_named(container)
    # the training in the container names the run's cache dir: visible from here, and it must go
    assert processes_mentioning(str(tmp_path)), "the run's training should be running"
    ray = [p for p in processes_with_env("RUN_ID", run_id) if "raylet" in p]
    assert ray, "the run's Ray should be running in the container"
    host = processes_with_env("RUN_ID", run_id)
    assert any("gpu_sampler.py" in p for p in host), "the host's GPU sampler should be running"
    assert any("nvidia-smi" in p for p in host), "and the nvidia-smi it reads"
    pid = rd.record()["pid"]
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr
        assert "cancelled" in stderr
    else:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies; the run goes on until cancelled
        proc.wait()
        assert group_alive(pid) and containers_named(container)
        result = cli("cancel", run_id, "--runs-dir", str(runs_root))
        assert result.returncode == 0, result.stderr
    assert not group_alive(pid)


def test_the_container_cannot_change_what_the_host_runs_or_trusts(
    test_image, container_run_args, tmp_path, runs_root
):
    """The recipe's run block (root in the training container) attacks the node run dir: it
    appends to node.sh and the wrapper, forges pid and the cancel mark, writes the launcher's own
    files and plants symlinks to a private host file under result names. Nothing of it reaches
    the host; HF_TOKEN never reaches this container."""
    from launcher.plan.protocol import WRAPPER

    canary = tmp_path / "ran-on-the-host"
    private = tmp_path / "credentials"
    private.write_text("aws_secret_access_key = SECRET-CANARY\n")
    private.chmod(0o600)
    attack = f"""d="$NODE_RUN_DIR"
for f in node.sh run_node.sh; do printf '\\ntouch {canary}\\n' >> "$d/$f" 2>/dev/null || true; done
echo 1 > "$d/pid" 2>/dev/null || true
touch "$d/cancelled" "$d/state/cancelled" 2>/dev/null || true
echo '{{"forged": true}}' > "$d/run.json" 2>/dev/null || true
echo '{{"instances": ["i-0forged"]}}' > "$d/aws.json" 2>/dev/null || true
for f in stack.json extra.json image.json; do ln -sf {private} "$d/$f" 2>/dev/null || true; done
ln -sf {private} "$d/out/preflight.json" || true
echo "token-in-training=$(printenv HF_TOKEN || echo absent)"
"""
    recipe = write_recipe(tmp_path, test_image, run_prefix=attack)
    plan = plan_for(recipe, write_profile(tmp_path, LOCAL, container_run_args))
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    try:
        outcome = Runner(poll_s=0.2, measure=False).execute(
            plan, rd, LocalCluster(), secrets={"HF_TOKEN": "hf_canary"}
        )
    except ReproduceError as err:  # judged below, after what matters most
        outcome = err
    node = Path(plan.node_run_dir)
    wait_for(lambda: (node / "exit_code").exists(), 60, "the wrapper to finish on the node")
    time.sleep(0.5)
    assert not canary.exists(), "text the container appended ran on the host"
    assert (node / "node.sh").read_text() == plan.node_script
    assert (node / "run_node.sh").read_text() == WRAPPER
    assert (node / "pid").read_text().strip() == str(rd.record()["pid"])
    assert getattr(outcome, "state", None) == "done", (outcome, rd.status())
    assert "token-in-training=absent" in (rd.logs / "train.log").read_text()
    assert rd.record()["collected"] == [
        "assets-plan.json",
        "image.json",
        "stack.json",
    ]  # preflight is off here
    assert json.loads((rd.path / "image.json").read_text())["digest"] == test_image.digest
    assert not (rd.path / "aws.json").exists() and not (rd.path / "extra.json").exists()
    assert rd.record()["slug"] == plan.recipe.slug
    for path in rd.path.rglob("*"):
        if path.is_file():
            assert b"SECRET-CANARY" not in path.read_bytes(), path
            assert b"hf_canary" not in path.read_bytes(), path


@contextmanager
def slow_to_die(
    test_image, run_args: list[str], node: Path
) -> Iterator[tuple[str, subprocess.Popen]]:
    """The adversary of a cancel's race: a container whose EXIT trap always needs a second for its
    last words, run attached by `bash run_node.sh` in `node` (marked as a run's wrapper) with its
    output in out.log; yields its name and the wrapper once it has started; killed and removed
    after, whatever happened."""
    from launcher.plan import protocol

    container = f"reproduce-{new_run_id()}"
    docker("pull", test_image.ref)  # out.log then holds only what the container says
    trap = "trap 'sleep 1; echo last-words' EXIT; echo started; sleep 300"
    docker_run = [
        "docker", "run", "--rm", "--name", container, "--network", "none",
        *run_args, test_image.ref, "bash", "-c", trap,
    ]  # fmt: skip
    (node / protocol.WRAPPER_NAME).write_text(shlex.join(docker_run) + " > out.log 2>&1\n")
    wrapper = subprocess.Popen(
        ["bash", protocol.WRAPPER_NAME],
        cwd=node,
        env={**os.environ, protocol.RUN_MARK: str(node)},
        start_new_session=True,
    )
    try:
        (node / "pid").write_text(f"{wrapper.pid}\n")
        out = node / "out.log"
        wait_for(lambda: out.exists() and b"started" in out.read_bytes(), 120, what="the container")
        yield container, wrapper
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
        docker("rm", "-f", container, check=False)


def assert_it_said_its_last_words_and_is_gone(node: Path, container: str) -> None:
    assert (node / "out.log").read_text().split() == ["started", "last-words"]
    assert containers_named(container) == []


def test_cancel_lets_a_container_say_its_last_words_before_removing_it(
    test_image, container_run_args, tmp_path
):
    """The race a busy node lost (a cancelled run's train stage without its end): the cancel
    removed the container at once after TERM, cutting off the EXIT trap that prints the end
    marker. Here the container needs a second for its last words, always: they must reach its
    log, and nothing of the run may stay."""
    from launcher.clusters.local import LocalTransport
    from launcher.plan import protocol

    node = (tmp_path / "node").resolve()  # the cancel finds the run by its physical path
    (node / "state").mkdir(parents=True)
    with slow_to_die(test_image, container_run_args, node) as (container, wrapper):
        answer = LocalTransport().run(protocol.cancel_command(str(node), container), check=False)
        assert protocol.parse_cancel(answer.stdout) == "", answer.stdout
        wrapper.wait(timeout=30)
    assert_it_said_its_last_words_and_is_gone(node, container)


def test_node_sh_lets_the_training_container_say_its_last_words_before_removing_it(
    test_image, container_run_args, tmp_path
):
    """The second place of the same race: on a cancel's TERM node.sh's own EXIT trap runs too, and
    its `_cleanup` removed the training container at once, cutting off the container's end marker.
    node.sh's real `_cleanup` (the line the seed's node script renders, which its golden file
    holds) runs here against the same container, right after the container got its TERM as
    docker's client passes it on: the words must reach the log, and the container must be gone."""
    from support.paths import REPO

    script = (REPO / "tests" / "golden" / "seed-node-local.sh").read_text()
    [cleanup] = [
        line for line in script.splitlines() if line.startswith("_cleanup() {") and "docker" in line
    ]
    with slow_to_die(test_image, container_run_args, tmp_path) as (container, wrapper):
        node_sh = f"_bg_stop() {{ :; }}\n{cleanup}\nCONTAINER={shlex.quote(container)}\n"
        node_sh += 'docker kill --signal TERM "$CONTAINER" >/dev/null\n_cleanup\n'
        subprocess.run(["bash", "-c", node_sh], check=True, timeout=60)
        wrapper.wait(timeout=30)
    assert_it_said_its_last_words_and_is_gone(tmp_path, container)
