"""The pyxis/enroot path for real, on the loopback Slurm cluster with pyxis in its plugstack.

Outside pytest's collection on purpose: CI reaches package registries only, not GitHub, so it
cannot build enroot and pyxis, and a test that needs them would be skipped there. Run by hand
(root, Debian 12 with slurmctld, slurmd, munge, docker, docker-registry, libslurm-dev,
libbsd-dev, squashfs-tools, jq, parallel, zstd, curl):

    bash tests/manual/build_pyxis_enroot.sh BUILD NVIDIA-enroot.git NVIDIA-pyxis.git
    .venv/bin/python tests/manual/pyxis_loopback.py BUILD

What it runs: a local registry with the test image (pushed by digest), the loopback cluster
(tests/support/slurm_cluster.py) with `PlugStackConfig` naming the spank_pyxis.so built in BUILD,
and one 2-node batch job whose task runs, on each node's host, the launcher's own pyxis image
stage (launcher/plan/enroot_image.py: import by digest into a fresh .sqsh, the manifest hashed,
the blobs enroot used compared with it) and then the launcher's in-image step
(`srun --overlap --container-image=$IMAGE_SQSH ...`). It asserts: the image each node ran is the
pinned one (image.json; the container reads the image's own marker file, which the host lacks);
the host-side part ran on every node outside the container; a registry that serves another
manifest under the pinned digest is refused (enroot alone imports it); `scancel` mid-step ends
the step and leaves nothing in squeue and no enroot container. It exits 0 only if all hold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from support.docker import Registry, push_test_image  # noqa: E402
from support.slurm_cluster import NODES, SlurmLoop  # noqa: E402

from launcher.inputs.recipe import Image  # noqa: E402
from launcher.plan import enroot_image  # noqa: E402


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        raise SystemExit(1)


def node_script(image: Image, work: Path, payload: str) -> str:
    """What each node's task runs: the image stage on the host, then the payload in the image."""
    mounts = [(f"{work}/$SLURMD_NODENAME/out", "/out", False)]
    step = enroot_image.step_argv("--gres=gpu:8", [])
    step = step.replace("--container-mounts=''", '--container-mounts="$MOUNTS"')
    return "\n".join(
        [
            "set -euo pipefail",
            "export ENROOT_ALLOW_HTTP=yes  # the loopback registry speaks HTTP",
            f'NODE_RUN_DIR={work}/"$SLURMD_NODENAME"',
            'rm -rf "$NODE_RUN_DIR" && mkdir -p "$NODE_RUN_DIR/out"',
            f"IMAGE={image.ref} IMAGE_DIGEST={image.digest}",
            "# on the host: who runs here (the host's own /etc has no image marker)",
            'echo "host $SLURMD_NODENAME pid1=$(cat /proc/1/comm) '
            'marker=$(cat /etc/reproduce-test-image 2>/dev/null || echo none)" '
            '> "$NODE_RUN_DIR/host.txt"',
            *enroot_image.import_lines(image),
            f'MOUNTS="{mounts[0][0]}:{mounts[0][1]}"',
            f"{step} bash -c {payload!r}",
        ]
    )


def main() -> int:
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/reproduce-pyxis").resolve()
    enroot_bin = build / "enroot" / "bin"
    plugin = build / "pyxis-src" / "spank_pyxis.so"
    check(
        (enroot_bin / "enroot").is_file() and plugin.is_file(),
        f"enroot and pyxis built in {build}",
    )
    e = Path(tempfile.mkdtemp(prefix="reproduce-pyxis-loop-"))
    conf = build / "enroot" / "etc" / "enroot"
    # the cluster's own enroot settings, as an operator's: HTTP to the loopback registry, its
    # paths under this check's directory, and the host's /usr in every container (the test
    # image carries no programs, as under docker: tests/support/docker.py)
    (conf / "enroot.conf.d" / "50-loopback.conf").write_text(
        "ENROOT_ALLOW_HTTP yes\n"
        f"ENROOT_RUNTIME_PATH {e}/enroot-run\nENROOT_DATA_PATH {e}/enroot-data\n"
        f"ENROOT_CACHE_PATH {e}/enroot-cache\nENROOT_TEMP_PATH {e}/enroot-tmp\n"
    )
    (e / "enroot-tmp").mkdir()
    (conf / "mounts.d" / "50-host-usr.fstab").write_text(
        "/usr /usr none x-create=dir,bind,ro,nosuid,nodev 0 -1\n"
    )
    plugstack = e / "plugstack.conf"
    plugstack.write_text(f"required {plugin} runtime_path={e}/pyxis-run\n")
    path = f"{enroot_bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    os.environ["PATH"] = path
    print(f"enroot {subprocess.run(['enroot', 'version'], capture_output=True, text=True).stdout.strip()}, "
          f"pyxis {plugin}, dir {e}", flush=True)  # fmt: skip

    registry = Registry(e / "registry").start()
    loop = SlurmLoop(e / "slurm", plugstack=plugstack, node_env={"PATH": path})
    try:
        pushed = push_test_image(registry, e, tag="v1", marker="pinned-v1")
        repo = pushed.repo
        image = Image(repo, pushed.digest, "v1")
        loop.start()
        work = e / "work"
        work.mkdir()

        def job(payload: str, name: str) -> str:
            body = node_script(image, work, payload)
            (e / f"{name}.task").write_text(body + "\n")
            (e / f"{name}.sbatch").write_text(
                "#!/bin/bash\n"
                f"#SBATCH --job-name={name}\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                "#SBATCH --gres=gpu:8\n#SBATCH --exclusive\n#SBATCH --no-requeue\n"
                f"#SBATCH --output={e}/{name}-%j.out\n"
                f"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --gres=gpu:8 bash {e}/{name}.task\n"
            )
            out = loop.run("sbatch", "--parsable", str(e / f"{name}.sbatch"))
            check(out.returncode == 0, f"sbatch {name}: {out.stderr.strip()}")
            return out.stdout.strip()

        def state(jid: str) -> str:
            shown = loop.run("scontrol", "show", "job", jid).stdout
            found = re.search(r"JobState=(\S+)", shown)
            return found.group(1) if found else "?"

        def wait_end(jid: str, timeout_s: float = 240) -> str:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                s = state(jid)
                if s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                    return s
                time.sleep(1)
            return state(jid)

        # 1. a 2-node job to its end: the image stage on each node's host, the step in the image
        payload = (
            'echo "in-image $SLURMD_NODENAME marker=$(cat /etc/reproduce-test-image)" '
            "| tee /out/in-image.txt"
        )
        jid = job(payload, "pyxis-run")
        end = wait_end(jid)
        output = (e / f"pyxis-run-{jid}.out").read_text()
        print(output[-2500:], flush=True)
        check(end == "COMPLETED", f"job {jid} COMPLETED (was {end})")
        for node in NODES:
            d = work / node
            record = json.loads((d / "image.json").read_text())
            check(record["digest"] == pushed.digest, f"{node}: image.json has the pinned digest")
            check("pinned-v1" in (d / "out" / "in-image.txt").read_text(),
                  f"{node}: the step ran in the pinned image (its marker file)")  # fmt: skip
            host = (d / "host.txt").read_text()
            check(f"host {node}" in host and "marker=none" in host,
                  f"{node}: the host part ran on the node, outside the container")  # fmt: skip
            check(not (d / "image.check").exists(), f"{node}: the import's own cache removed")

        # 2. a registry serving another manifest under the pinned digest: enroot imports it
        # anyway; the image stage refuses it
        blob = next(registry.root.glob(f"storage/**/blobs/sha256/*/{pushed.digest[7:]}/data"))
        original = blob.read_bytes()
        blob.write_bytes(original.rstrip() + b"\n\n")
        try:
            alone = subprocess.run(
                ["enroot", "import", "--output", str(e / "alone.sqsh"),
                 enroot_image.enroot_uri(image)],
                capture_output=True, text=True, env={**os.environ, "ENROOT_ALLOW_HTTP": "yes"},
            )  # fmt: skip
            check(alone.returncode == 0, "enroot alone imports the tampered manifest's image")
            jid = job("echo should-not-run", "pyxis-tampered")
            end = wait_end(jid)
            output = (e / f"pyxis-tampered-{jid}.out").read_text()
            check(end != "COMPLETED" and "does not hash to" in output,
                  f"a manifest that does not hash to the pinned digest is refused ({end})")  # fmt: skip
            check("should-not-run" not in output, "nothing ran in the refused image")
        finally:
            blob.write_bytes(original)

        # 3. scancel mid-step: the step ends, nothing in squeue, no enroot container left
        jid = job("echo started > /out/started; sleep 613", "pyxis-cancel")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not all(
            (work / n / "out" / "started").exists() for n in NODES
        ):
            time.sleep(1)
        check(all((work / n / "out" / "started").exists() for n in NODES),
              "the long step started in the container on both nodes")  # fmt: skip
        loop.run("scancel", jid)
        end = wait_end(jid, 60)
        check(end == "CANCELLED", f"scancel ended job {jid} ({end})")
        time.sleep(2)
        check("pyxis-cancel" not in loop.squeue(), "nothing of it in squeue")
        left = subprocess.run(["enroot", "list"], capture_output=True, text=True).stdout.split()
        check(not left, f"no enroot container left ({left})")
        sleeping = subprocess.run(["pgrep", "-f", "sleep 613"], capture_output=True, text=True)
        check(not sleeping.stdout.strip(), "no process of the step left")
        print("pyxis loopback: all checks passed", flush=True)
        return 0
    finally:
        loop.stop()
        registry.stop()
        for f in ("enroot.conf.d/50-loopback.conf", "mounts.d/50-host-usr.fstab"):
            (conf / f).unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(e)], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
