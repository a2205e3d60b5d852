"""A hostile stand-in image: the test image (tests/infra/docker.py) whose every container, before
it runs its command, attacks whatever it can reach (docs/architecture.md, "The trust boundary").

At start, in every read-write mount it has (the docker-made /etc files excepted), the entrypoint:
- plants symlinks named like every file the host writes next (`<file>.partial` beside every file,
  the manifest, the pending marker, the result files, the asset plan, the build summary),
  pointing at a canary file outside every mount;
- poisons every asset directory with a manifest consistently: one byte of each listed file
  flipped and the manifest rewritten with the new sha256 (a cache that lies about itself);
- appends to every other regular file it can write;
- prepares `$REPRODUCE_NEW_DIR/torch_dist/` with a manifest link in it;
then it execs its command (the build, the conversion, the stand-in training) and exits as that
command does. It prints one `hostile: ...` line saying what it managed, so a test can tell an
attack that was blocked from one that never ran.
"""

from __future__ import annotations

import json
import tarfile
import textwrap
from pathlib import Path

from .docker import Registry, TestImage, build_rootfs, docker

PLANTED = [
    ".reproduce-manifest.json",
    ".reproduce-pending",
    "preflight.json",
    "preflight-gpu.json",
    "image.json",
    "stack.json",
    "exit_code",
    "assets-plan.json",
]

ENTRYPOINT = textwrap.dedent(
    """
    import hashlib, json, os, sys
    CANARY = {canary!r}
    PLANTED = {planted!r}
    done = {{"links": 0, "poisoned": 0, "appended": 0}}

    def rw_mounts():
        for line in open("/proc/self/mounts"):
            parts = line.split()
            point, opts = parts[1], parts[3].split(",")
            if "rw" not in opts or point == "/" or point.startswith(("/proc", "/sys", "/dev", "/etc")):
                continue
            yield point

    def link(path):
        try:
            os.symlink(CANARY, path)
            done["links"] += 1
        except OSError:
            pass

    def poison(d, names):
        try:
            m = json.load(open(os.path.join(d, ".reproduce-manifest.json")))
            for e in m["files"]:
                p = os.path.join(d, e["path"])
                data = bytearray(open(p, "rb").read())
                if data:
                    data[len(data) // 2] ^= 0xFF
                open(p, "wb").write(bytes(data))
                e["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
                names.discard(e["path"].split("/")[0])
            open(os.path.join(d, ".reproduce-manifest.json"), "w").write(json.dumps(m))
            done["poisoned"] += 1
        except (OSError, ValueError, KeyError):
            pass

    for mount in list(rw_mounts()):
        for d, dirs, files in os.walk(mount):
            names = set(files)
            if ".reproduce-manifest.json" in names and not os.path.islink(os.path.join(d, ".reproduce-manifest.json")):
                poison(d, names)
            for f in files:
                p = os.path.join(d, f)
                if not os.path.islink(p) and f in names and f != ".reproduce-manifest.json":
                    try:
                        with open(p, "ab") as fh:
                            fh.write(b"hostile")
                        done["appended"] += 1
                    except OSError:
                        pass
                link(p + ".partial")
            for n in PLANTED:
                link(os.path.join(d, n))
    new = os.environ.get("REPRODUCE_NEW_DIR")
    if new:
        try:
            os.makedirs(os.path.join(new, "torch_dist"), exist_ok=True)
        except OSError:
            pass
        link(os.path.join(new, "torch_dist", ".reproduce-manifest.json"))
    print("hostile: " + json.dumps(done, sort_keys=True), file=sys.stderr, flush=True)
    os.execvp(sys.argv[1], sys.argv[1:])
    """
)


def push_hostile_image(registry: Registry, workdir: Path, canary: Path) -> TestImage:
    """The test image plus the hostile entrypoint (run by the host's python3, lent read-only by
    the containers' /usr mount), pushed to the registry and referenced by digest."""
    tarball = build_rootfs(workdir / "rootfs-hostile.tar", marker="hostile")
    script = ENTRYPOINT.format(canary=str(canary), planted=PLANTED).encode()
    with tarfile.open(tarball, "a") as tar:
        info = tarfile.TarInfo("hostile.py")
        info.size, info.mode = len(script), 0o755
        import io

        tar.addfile(info, io.BytesIO(script))
    repo = f"{registry.address}/reproduce-test/hostile"
    docker(
        "import", "--change", 'ENTRYPOINT ["/usr/bin/python3", "/hostile.py"]',
        str(tarball), f"{repo}:v1",
    )  # fmt: skip
    docker("push", f"{repo}:v1")
    digests = json.loads(
        docker("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:v1").stdout
    )
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(repo + "@"))
    return TestImage(repo, digest)
