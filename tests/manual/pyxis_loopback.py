"""`reproduce RECIPE --cluster <slurm pyxis profile>` for real, on the loopback Slurm cluster with
pyxis in its plugstack and enroot on its nodes.

Outside pytest's collection on purpose: CI reaches package registries only, not GitHub, so it
cannot build enroot and pyxis, and a test that needs them would be skipped there. Run by hand
(root; Debian 12 with slurmctld, slurmd, munge, docker, docker-registry, libslurm-dev, libbsd-dev,
squashfs-tools, jq, parallel, zstd, curl), from the repository with its .venv:

    bash tests/manual/build_pyxis_enroot.sh BUILD NVIDIA-enroot.git NVIDIA-pyxis.git
    .venv/bin/python tests/manual/pyxis_loopback.py BUILD

What it runs: a local registry with the test image (pushed by digest), the loopback cluster
(tests/support/slurm_cluster.py) with `PlugStackConfig` naming the spank_pyxis.so built in BUILD
and the enroot built there first on every node's PATH, then the real CLI with the stand-in miles:

1. a 1-node and a 2-node recipe to a verdict: node.sh on each node's host (the host clock and the
   GPU sampler beside the training step), its image stage importing the pinned image into a
   fresh .sqsh and checking it, every in-image command a step of the job in that image; asserted:
   each node's image.json has the pinned digest, the stand-in ran in that image (its marker
   file, which the host lacks), each node's host wrote its GPU samples, nothing left in squeue,
   no enroot container, no .sqsh;
2. the registry serving another manifest under the pinned digest (enroot alone imports it): the
   run is refused without a verdict, naming the digest;
3. Ctrl-C mid-training: the job is cancelled, nothing left in squeue, no enroot container, no
   process of the run.

It prints each check and exits 0 only if all hold; what it started it stops (PYXIS_KEEP=1 keeps
its directory, the runs' evidence; PYXIS_SKIP_ONE=1 leaves out the 1-node run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from support.cli import FOUR_NODES  # noqa: E402
from support.docker import Registry, TestImage, build_rootfs, docker  # noqa: E402
from support.paths import STANDIN_GPU  # noqa: E402
from support.plan_env import write_recipe  # noqa: E402
from support.slurm_cluster import SlurmLoop  # noqa: E402
from support.slurm_runs import find_run, slurm_profile  # noqa: E402

from launcher.inputs.recipe import Image  # noqa: E402
from launcher.plan import enroot_image  # noqa: E402

MARKER = "pinned-v1"


def check(ok: bool, what: str, detail: str = "") -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        print(detail[-4000:], flush=True)
        raise SystemExit(1)


class Setup:
    def __init__(self, build: Path) -> None:
        self.build = build
        self.root = Path(tempfile.mkdtemp(prefix="reproduce-pyxis-loop-"))
        self.enroot_bin = build / "enroot" / "bin"
        self.conf = build / "enroot" / "etc" / "enroot"
        # the stand-in nvidia-smi first: the host's GPU sampler reads it on every node
        self.path = f"{STANDIN_GPU}:{sys.prefix}/bin:{self.enroot_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        self.enroot_env = {**os.environ, "PATH": self.path}

    def configure_enroot(self) -> None:
        """The cluster's own enroot settings, as an operator's: HTTP to the loopback registry,
        enroot's paths under this check's directory, and this host's /usr and venv in every
        container (the test image carries no programs, as under docker: tests/support/docker.py)."""
        e = self.root
        (e / "enroot-tmp").mkdir()
        (self.conf / "enroot.conf.d" / "50-loopback.conf").write_text(
            "ENROOT_ALLOW_HTTP yes\n"
            f"ENROOT_RUNTIME_PATH {e}/enroot-run\nENROOT_DATA_PATH {e}/enroot-data\n"
            f"ENROOT_CACHE_PATH {e}/enroot-cache\nENROOT_TEMP_PATH {e}/enroot-tmp\n"
        )
        lent = [Path("/usr"), Path(sys.prefix), Path(sys.base_prefix).resolve()]  # as run_args()
        (self.conf / "mounts.d" / "50-loopback.fstab").write_text(
            "".join(f"{p} {p} none x-create=dir,bind,ro,nosuid,nodev 0 -1\n" for p in lent)
        )

    def unconfigure_enroot(self) -> None:
        for f in ("enroot.conf.d/50-loopback.conf", "mounts.d/50-loopback.fstab"):
            (self.conf / f).unlink(missing_ok=True)

    def enroot_containers(self) -> list[str]:
        out = subprocess.run(
            ["enroot", "list"], capture_output=True, text=True, env=self.enroot_env
        )
        return out.stdout.split()


def push_image(registry: Registry, work: Path) -> TestImage:
    """The test image (tests/support/docker.py), its config naming this venv first on its PATH
    as a real image names its own: the container's PATH is the image's under pyxis."""
    tarball = build_rootfs(work / "rootfs.tar", marker=MARKER)
    repo = f"{registry.address}/reproduce-test/standin"
    path = f"PATH={sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"
    docker("import", "--change", f"ENV {path}", str(tarball), f"{repo}:v1")
    docker("push", f"{repo}:v1")
    digests = json.loads(
        docker("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:v1").stdout
    )
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(repo + "@"))
    docker("rmi", "-f", f"{repo}:v1", check=False)
    return TestImage(repo, digest)


def two_node_raw() -> dict:
    """The 4-node fixture's model on 2 x 8 GPUs (the loopback cluster's shape)."""
    raw = yaml.safe_load(FOUR_NODES.read_text())
    raw["gpu"]["count"] = 16
    raw["layout"]["dp"] = 16
    raw["run"] = raw["run"].replace("--actor-num-nodes 4", "--actor-num-nodes 2")
    raw["result"]["gpu_hours"] = raw["result"]["gpu_hours"] / 2
    return raw


def cli_env(loop: SlurmLoop, setup: Setup) -> dict[str, str]:
    return {
        **os.environ, **loop.env, "PATH": setup.path, "REPRODUCE_HOME": str(setup.root / "home"),
        "ENROOT_ALLOW_HTTP": "yes",
    }  # fmt: skip


def argv(recipe: Path, profile: Path, runs: Path, run_id: str) -> list[str]:
    return [
        sys.executable, "-m", "launcher", str(recipe), "--cluster", str(profile), "--runs-dir",
        str(runs), "--run-id", run_id, "--on-interrupt", "cancel", "--yes",
    ]  # fmt: skip


def nothing_left(loop: SlurmLoop, setup: Setup, run_id: str, what: str) -> None:
    check(f"reproduce-{run_id}" not in loop.squeue(), f"{what}: nothing in squeue", loop.squeue())
    left = setup.enroot_containers()
    check(not left, f"{what}: no enroot container", str(left))
    procs = subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True).stdout
    mine = [line for line in procs.splitlines() if run_id in line]
    check(not mine, f"{what}: no process of the run", "\n".join(mine))


def verdict_run(loop, setup, recipe, profile, runs, nodes: int, *, clock: bool) -> None:
    run_id = f"pyxis{nodes}-{uuid.uuid4().hex[:6]}"
    done = subprocess.run(
        argv(recipe, profile, runs, run_id), capture_output=True, text=True,
        env=cli_env(loop, setup), timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    check(bool(list(runs.glob(f"**/*{run_id}/run.json"))), f"{nodes}-node run started", done.stderr)
    rd = find_run(runs, run_id)
    log = (rd / "logs" / "node.log").read_text() if (rd / "logs" / "node.log").exists() else ""
    verdict = (
        json.loads((rd / "verdict.json").read_text()) if (rd / "verdict.json").exists() else {}
    )
    want = "mismatch" if clock else "reproduced"  # the clock: a stand-in faster than it claims
    check(
        done.returncode == (1 if clock else 0) and verdict.get("status") == want,
        f"{nodes}-node run to the verdict {verdict.get('status')!r} (exit {done.returncode})",
        done.stderr[-3000:] + "\n---- node.log\n" + log,
    )
    record = json.loads((rd / "run.json").read_text())
    job = record["cluster"]["job_id"]
    shown = loop.run("scontrol", "show", "job", job).stdout
    check("JobState=COMPLETED" in shown, f"job {job} COMPLETED", shown)
    submitted = (rd / "job.sbatch").read_text()
    check("--container-image" not in submitted, "the batch step runs node.sh on the hosts")
    node0 = Path(record["node_run_dir"])
    dirs = [node0] + [
        node0.parents[1] / "nodes" / str(k) / "runs" / run_id for k in range(1, nodes)
    ]
    for k, d in enumerate(dirs):
        image = json.loads((d / "image.json").read_text())
        pinned = record.get("image_digest") or image["digest"]
        check(image["digest"] == pinned and image["runtime"] == "pyxis",
              f"node {k}: image.json has the pinned digest {image['digest'][:19]}...")  # fmt: skip
        check(not (d / enroot_image.SQSH).exists(), f"node {k}: the run's .sqsh removed")
        if clock:
            samples = d / "gpu-samples.csv"
            check(samples.exists() and "standin" not in samples.read_text()[:0],
                  f"node {k}: the host's GPU sampler wrote {samples.name}")  # fmt: skip
    check(f"image marker: {MARKER}" in log, "the run block ran in the pinned image (its marker)")
    if clock:
        reasons = " ".join(verdict.get("reasons", []))
        check("host clock:" in reasons and "##reproduce clock t=" in log,
              "the host's clock stamped the training step's output and judged it", reasons)  # fmt: skip
    nothing_left(loop, setup, run_id, f"{nodes}-node run")


def main() -> int:
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/reproduce-pyxis").resolve()
    setup = Setup(build)
    plugin = build / "pyxis-src" / "spank_pyxis.so"
    check((setup.enroot_bin / "enroot").is_file() and plugin.is_file(),
          f"enroot and pyxis built in {build}")  # fmt: skip
    version = subprocess.run(["enroot", "version"], capture_output=True, text=True,
                             env=setup.enroot_env).stdout.strip()  # fmt: skip
    print(f"enroot {version}, pyxis {plugin}")
    setup.configure_enroot()
    e = setup.root
    plugstack = e / "plugstack.conf"
    plugstack.write_text(f"required {plugin} runtime_path={e}/pyxis-run\n")
    registry = Registry(e / "registry").start()
    loop = SlurmLoop(e / "slurm", plugstack=plugstack, node_env={"PATH": setup.path})
    try:
        pushed = push_image(registry, e)
        loop.start()
        print(loop.run("sinfo", "--version").stdout.strip(), flush=True)
        runs = e / "runs"
        # the stand-in writes the image's marker into the run's out dir, from inside its step
        prefix = 'echo "image marker: $(cat /etc/reproduce-test-image)"'
        one = e / "one"
        recipe = write_recipe(one, pushed, run_prefix=prefix)
        profile = slurm_profile(one, [], container_runtime="pyxis", stack_check="warn")
        if not os.environ.get("PYXIS_SKIP_ONE"):
            verdict_run(loop, setup, recipe, profile, runs, 1, clock=False)

        two = e / "two"
        recipe2 = write_recipe(two, pushed, raw=two_node_raw(), name="standin-2node",
                               run_prefix=prefix)  # fmt: skip
        profile2 = slurm_profile(
            two, [], container_runtime="pyxis", docker={"host_clock": True},
            env={"STANDIN_STEP_TIME_S": "0.02", "STANDIN_SLEEP_S": "0.4", "STANDIN_STARTUP_S": "0"},
            ray={"port": 6379, "join_timeout_s": 120},
        )  # fmt: skip
        verdict_run(loop, setup, recipe2, profile2, runs, 2, clock=True)

        # another manifest under the pinned digest: enroot alone imports it; the run refuses it
        blob = next(registry.root.glob(f"storage/**/blobs/sha256/*/{pushed.digest[7:]}/data"))
        original = blob.read_bytes()
        blob.write_bytes(original.rstrip() + b"\n\n")
        try:
            alone = subprocess.run(
                ["enroot", "import", "--output", str(e / "alone.sqsh"),
                 enroot_image.enroot_uri(Image(pushed.repo, pushed.digest))],
                capture_output=True, text=True, env={**setup.enroot_env, "ENROOT_ALLOW_HTTP": "yes"},
            )  # fmt: skip
            check(alone.returncode == 0, "enroot alone imports the tampered manifest's image")
            run_id = f"pyxis-bad-{uuid.uuid4().hex[:6]}"
            done = subprocess.run(
                argv(recipe, profile, runs, run_id), capture_output=True, text=True,
                env=cli_env(loop, setup), timeout=600, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            rd = find_run(runs, run_id)
            check(done.returncode not in (0, 1) and not (rd / "verdict.json").exists()
                  and "does not hash to" in (rd / "logs" / "node.log").read_text(),
                  f"a manifest that does not hash to the pinned digest: refused, no verdict "
                  f"(exit {done.returncode})", done.stderr)  # fmt: skip
            nothing_left(loop, setup, run_id, "the refused run")
        finally:
            blob.write_bytes(original)

        # Ctrl-C while the stand-in trains
        run_id = f"pyxis-int-{uuid.uuid4().hex[:6]}"
        slow = e / "slow"
        recipe3 = write_recipe(slow, pushed, run_prefix=prefix)
        profile3 = slurm_profile(slow, [], container_runtime="pyxis", env={"STANDIN_SLEEP_S": "3"})
        proc = subprocess.Popen(
            argv(recipe3, profile3, runs, run_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, env=cli_env(loop, setup), start_new_session=True, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 400
        seen = ""
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list(runs.glob(f"**/*{run_id}/logs/node.log"))
            seen = logs[0].read_text() if logs else ""
            if " - step 1: " in seen:
                break
            time.sleep(1)
        check(proc.poll() is None, "the slow run is training", seen)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
        check(proc.returncode == 130, f"Ctrl-C: exit 130 (was {proc.returncode})", err)
        nothing_left(loop, setup, run_id, "Ctrl-C")
        print("pyxis loopback: all checks passed", flush=True)
        return 0
    finally:
        loop.stop()
        registry.stop()
        setup.unconfigure_enroot()
        if not os.environ.get("PYXIS_KEEP"):  # a failed check's evidence, kept on request
            subprocess.run(["rm", "-rf", str(e)], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
