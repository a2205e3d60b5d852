"""`reproduce image build` and the profile's `image`, with real parts on loopback.

A tiny base (the stand-in miles tree plus this host's sh, tar, gzip and sha256sum, so the
Dockerfile's RUN step has a shell) is pushed by digest to the local registry; the repository's
Dockerfile is built FROM it with `--network none` (the RUN step sees only loopback) and a
stand-in EFA installer fed from a local file; the result is pushed to the same registry, and
what the registry serves is checked over its HTTP API. A run of the real Plan with that profile
image then pulls the new digest, checks its base label on the node, and runs to a verdict. The ECR
path is tested with botocore's Stubber and a stand-in docker executable: nothing leaves loopback.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from support import docker as infra_docker
from support.cli import REPO, SEED
from support.docker import build_rootfs, docker
from support.helpers import cli
from support.plan_env import plan_for, write_profile, write_recipe

from launcher.errors import BadInput, InfraError
from launcher.inputs.recipe import Image, load_recipe
from launcher.plan.image_record import BASE_DIGEST_LABEL, RECORD_SCHEMA
from launcher.prepare.image import BuildRequest, build_and_push
from launcher.prepare.registry import Login, ecr_host, ecr_login, push_target

LOCAL = {"kind": "local"}
MARKER = "/opt/amazon/efa/reproduce-test-installed"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
SEED_DIGEST = load_recipe(SEED).image.digest
OTHER_DIGEST = "sha256:" + "1" * 64
BUILT_DIGEST = "sha256:" + "2" * 64
HOST_TOOLS = ("sh", "dash", "bash", "sha256sum", "tar", "gzip", "rm", "mkdir", "cat")


# ------------------------------------------------------------------------------------------------
# The tiny base, the stand-in installer, one build shared by the tests that need it


def _tool_files() -> set[str]:
    """This host's tools for the RUN step, with every library they load (from ldd)."""
    files: set[str] = set()
    for tool in HOST_TOOLS:
        path = shutil.which(tool)
        assert path, f"{tool} is not installed here"
        files.add(path)
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        files.update(tok for tok in out.split() if tok.startswith("/"))
    return files


def _in_merged_usr(path: str) -> str:
    """/bin/x, /lib/x -> usr/bin/x, usr/lib/x: the stand-in rootfs links bin, lib, lib64 there."""
    name = path.lstrip("/")
    return name if name.startswith("usr/") else f"usr/{name}"


def build_base_rootfs(target: Path) -> Path:
    """The stand-in rootfs (tests/support/docker.py) plus the host tools, in one tarball."""
    standin = build_rootfs(target.with_name("standin-rootfs.tar"), marker="efa-base")
    seen: set[str] = set()
    with tarfile.open(standin) as src, tarfile.open(target, "w") as tar:
        for member in src.getmembers():
            seen.add(member.name)
            tar.addfile(member, src.extractfile(member) if member.isfile() else None)
        for path in sorted(_tool_files()):
            name = _in_merged_usr(path)
            parts = name.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if parent not in seen:
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    seen.add(parent)
            if name in seen:
                continue
            seen.add(name)
            real = Path(path).resolve()
            if Path(path).name == "sh":  # /bin/sh -> dash (or bash): keep it a link
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, real.name
                tar.addfile(info)
                continue
            data = real.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return target


def write_installer(directory: Path, version: str = "1.49.0") -> tuple[Path, str]:
    """A stand-in aws-efa-installer tarball: efa_installer.sh writes a marker (its arguments and
    the network interfaces the RUN step saw) where the real one puts libfabric."""
    script = (
        "#!/bin/sh\nset -e\nmkdir -p /opt/amazon/efa\n"
        f'{{ echo "args: $*"; echo "net: $(echo /sys/class/net/*)"; }} > {MARKER}\n'
    ).encode()
    path = directory / f"aws-efa-installer-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("aws-efa-installer")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return path, subprocess.run(
        ["sha256sum", str(path)], capture_output=True, text=True, check=True
    ).stdout.split()[0]


@pytest.fixture(scope="module")
def efa_base(registry, tmp_path_factory) -> infra_docker.TestImage:
    """The tiny base, pushed by digest; the local copy dropped, so the build really pulls it."""
    work = tmp_path_factory.mktemp("efa-base")
    repo = f"{registry.address}/reproduce-test/miles"
    docker("import", str(build_base_rootfs(work / "base.tar")), f"{repo}:v0.1.0")
    docker("push", f"{repo}:v0.1.0")
    digests = json.loads(
        docker("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:v0.1.0").stdout
    )
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(repo + "@"))
    docker("rmi", "-f", f"{repo}:v0.1.0", check=False)
    return infra_docker.TestImage(repo, digest)


@pytest.fixture(scope="module")
def built(efa_base, registry, tmp_path_factory) -> SimpleNamespace:
    """`reproduce image build` as a user runs it, FROM the tiny base, pushed to the registry."""
    work = tmp_path_factory.mktemp("built")
    recipe = write_recipe(work, efa_base)
    installer, sha = write_installer(work)
    record = work / "images" / "built.json"
    record.parent.mkdir()  # --record names a file in a directory that exists
    res = cli(
        "image",
        "build",
        str(recipe),
        "--push",
        f"{registry.address}/built",
        "--efa-installer",
        str(installer),
        "--efa-sha256",
        sha,
        "--record",
        str(record),
        "--network",
        "none",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(record.read_text())
    return SimpleNamespace(
        work=work, recipe=recipe, record=record, data=data, res=res, sha=sha, base=efa_base
    )


def _registry_get(registry, path: str, accept: str = MANIFEST_V2) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(f"http://{registry.address}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(resp.headers), resp.read()


# ------------------------------------------------------------------------------------------------
# The build, for real


@pytest.mark.docker
def test_build_pushes_what_the_registry_serves_labelled_with_the_base_digest(built, registry):
    data, base = built.data, built.base
    image = data["image"]
    assert data["schema"] == RECORD_SCHEMA
    assert image["repository"] == f"{registry.address}/built/miles"
    assert image["tag"] == f"{base.digest.removeprefix('sha256:')[:12]}-efa1.49.0"
    assert data["base"]["digest"] == base.digest and data["base"]["repository"] == base.repo
    assert data["base"]["recipe_field"] == "stack.image"
    assert data["efa_installer"] == {
        "version": "1.49.0",
        "sha256": built.sha,
        "file": "aws-efa-installer-1.49.0.tar.gz",
    }
    assert data["registry"]["kind"] == "registry" and data["recipe"]["path"] == str(built.recipe)
    assert image["ref"] in built.res.stdout and f"record: {built.record}" in built.res.stdout
    # what the registry serves under the tag is the recorded digest ...
    headers, body = _registry_get(registry, f"/v2/built/miles/manifests/{image['tag']}")
    assert headers["Docker-Content-Digest"] == image["digest"]
    # ... and the image config it points to carries the base digest as its label
    config_digest = json.loads(body)["config"]["digest"]
    _, config = _registry_get(registry, f"/v2/built/miles/blobs/{config_digest}", "*/*")
    labels = json.loads(config)["config"]["Labels"]
    assert labels[BASE_DIGEST_LABEL] == base.digest
    assert labels["org.opencontainers.image.base.name"] == base.ref
    assert labels["dev.reproduce.efa-installer.sha256"] == built.sha


@pytest.mark.docker
def test_built_image_holds_what_the_local_installer_did_and_not_the_installer(built):
    ref = built.data["image"]["ref"]
    docker("rmi", "-f", ref, check=False)
    docker("pull", ref)
    out = docker("run", "--rm", "--network", "none", ref, "/bin/cat", MARKER).stdout
    assert "args: -y --skip-kmod --skip-limit-conf --no-verify" in out
    assert "net: /sys/class/net/lo\n" in out  # RUN ran with --network none: loopback only
    gone = docker(
        "run", "--rm", "--network", "none", ref, "/bin/sh", "-c",
        "test ! -e /tmp/efa-installer.tar.gz && test ! -e /tmp/aws-efa-installer "
        "&& test -f /opt/reproduce/scripts/preflight.py",
        check=False,
    )  # fmt: skip
    assert gone.returncode == 0, gone.stderr


@pytest.mark.docker
def test_a_run_with_the_profile_image_pulls_the_built_digest_and_says_so(
    built, container_run_args, tmp_path, runs_root
):
    ref, digest = built.data["image"]["ref"], built.data["image"]["digest"]
    profile = write_profile(
        tmp_path, LOCAL, container_run_args, image={"record": str(built.record)}
    )
    dry = cli(str(built.recipe), "--cluster", str(profile), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"# image     {ref}  (from profile image.record; record {built.record}; built FROM " in (
        dry.stdout
    )
    assert f"IMAGE={ref}\n" in dry.stdout and f"IMAGE_DIGEST={digest}\n" in dry.stdout
    assert f"IMAGE_BASE_DIGEST={built.base.digest}\n" in dry.stdout

    docker("rmi", "-f", ref, check=False)  # the run's pull is real
    res = cli(str(built.recipe), "--cluster", str(profile), "--runs-dir", str(runs_root))
    (run_json,) = runs_root.rglob("run.json")
    rd = run_json.parent
    assert res.returncode == 0, res.stderr[-3000:]  # reproduced (the stand-in's step time)
    ran = json.loads((rd / "image.json").read_text())  # the node's report, collected
    assert ran["image"] == ref and ran["digest"] == digest
    record = json.loads((rd / "plan.json").read_text())
    assert record["image"] == ref
    assert record["built_image"]["built_from"]["digest"] == built.base.digest
    assert record["built_image"]["recipe_image"] == built.base.ref
    assert record["built_image"]["derives_from_recipe_image"] is True
    assert record["built_image"]["record"] == str(built.record)
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"


@pytest.mark.docker
def test_the_node_refuses_an_image_whose_label_does_not_name_the_recipes_digest(
    efa_base, built, container_run_args, tmp_path, runs_root
):
    """The profile says the base itself was "built FROM" the recipe's digest (its layers do
    begin with the recipe image's: it is that image): the record check passes, but the pulled
    image carries no base label, so the image stage stops the run."""
    from launcher.clusters.local import LocalCluster
    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    recipe = write_recipe(tmp_path, efa_base, run_prefix="echo SHOULD-NOT-RUN")
    lie = {
        "repository": efa_base.repo,
        "digest": efa_base.digest,
        "base_digest": efa_base.digest,
        "base_layers": json.loads(built.record.read_text())["base"]["layers"],
    }
    plan = plan_for(recipe, write_profile(tmp_path, LOCAL, container_run_args, image=lie))
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    with pytest.raises(InfraError, match="stage image") as err:
        Runner(poll_s=0.2).execute(plan, rd, LocalCluster())
    assert BASE_DIGEST_LABEL in str(err.value)
    assert "SHOULD-NOT-RUN" not in (rd.logs / "node.log").read_text()


# --- a label is only text: the layers are checked (issue 19) ------------------------------------

IMPOSTOR_DOCKERFILE = f"""FROM reproduce-test/impostor-base:v1
ARG BASE_DIGEST
LABEL {BASE_DIGEST_LABEL}=$BASE_DIGEST
"""


@pytest.fixture(scope="module")
def impostor_base(efa_base, tmp_path_factory) -> str:
    """Another base (the stand-in rootfs with another marker): not the recipe's image."""
    work = tmp_path_factory.mktemp("impostor")
    docker("import", str(build_rootfs(work / "other.tar", marker="impostor")),
           "reproduce-test/impostor-base:v1")  # fmt: skip
    return "reproduce-test/impostor-base:v1"


@pytest.mark.docker
def test_a_build_whose_image_carries_the_label_but_another_base_is_refused(
    efa_base, impostor_base, registry, tmp_path
):
    recipe = write_recipe(tmp_path, efa_base)
    installer, sha = write_installer(tmp_path)
    dockerfile = tmp_path / "Dockerfile.impostor"
    dockerfile.write_text(IMPOSTOR_DOCKERFILE)
    res = cli(
        "image", "build", str(recipe), "--push", f"{registry.address}/impostor",
        "--efa-installer", str(installer), "--efa-sha256", sha, "--dockerfile", str(dockerfile),
        "--record", str(tmp_path / "record.json"), "--network", "none",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    assert "layers do not begin with" in res.stderr and "a label is only text" in res.stderr
    assert not (tmp_path / "record.json").exists()  # nothing recorded, nothing pushed
    assert "pushing" not in res.stderr


@pytest.mark.docker
def test_the_node_refuses_a_pulled_image_whose_layers_are_not_the_recipes(
    built, impostor_base, registry, container_run_args, tmp_path, runs_root
):
    """The record is the real build's (its base layers), but the registry serves an impostor
    under the recorded digest's name: it carries the label, so only the layers tell."""
    from launcher.clusters.local import LocalCluster
    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    repo = f"{registry.address}/impostor/miles"
    (tmp_path / "Dockerfile").write_text(IMPOSTOR_DOCKERFILE)
    subprocess.run(
        ["docker", "build", "--network", "none", "--build-arg", f"BASE_DIGEST={built.base.digest}",
         "-t", f"{repo}:x", str(tmp_path)],
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    docker("push", f"{repo}:x")
    digests = json.loads(
        docker("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:x").stdout
    )
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(repo + "@"))
    lie = json.loads(built.record.read_text())
    assert lie["base"]["layers"]  # the real build recorded the recipe image's layers
    lie["image"].update(repository=repo, digest=digest, ref=f"{repo}@{digest}")
    record = tmp_path / "lie.json"
    record.write_text(json.dumps(lie))
    recipe = write_recipe(tmp_path, built.base, run_prefix="echo SHOULD-NOT-RUN")
    plan = plan_for(
        recipe, write_profile(tmp_path, LOCAL, container_run_args, image={"record": str(record)})
    )
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    with pytest.raises(InfraError, match="stage image") as err:
        Runner(poll_s=0.2).execute(plan, rd, LocalCluster())
    assert "layers do not begin with the layers of the recipe's image" in str(err.value)
    assert "SHOULD-NOT-RUN" not in (rd.logs / "node.log").read_text()


@pytest.mark.docker
def test_docker_login_goes_to_a_throwaway_config_with_the_password_on_stdin(registry, tmp_path):
    from launcher.prepare.image import docker_login

    config = tmp_path / "docker-config"
    config.mkdir(mode=0o700)
    docker_login("docker", config, Login(f"http://{registry.address}", "AWS", "not-a-secret"))
    auths = json.loads((config / "config.json").read_text())["auths"]
    assert base64.b64decode(auths[registry.address]["auth"]).decode() == "AWS:not-a-secret"
    mine = Path(os.environ.get("DOCKER_CONFIG", "~/.docker")).expanduser() / "config.json"
    assert not mine.exists() or registry.address not in mine.read_text()


# ------------------------------------------------------------------------------------------------
# The profile's image against the recipe (no docker: the plan and the dry run)


LAYERS = ["sha256:" + "3" * 64, "sha256:" + "4" * 64]


def _record(
    path: Path,
    base_digest: str,
    repository: str = "127.0.0.1:5000/built/miles",
    layers: list[str] | None = LAYERS,
) -> Path:
    base: dict[str, Any] = {"repository": "radixark/miles", "digest": base_digest}
    if layers is not None:
        base["layers"] = layers
    path.write_text(
        json.dumps(
            {
                "schema": RECORD_SCHEMA,
                "image": {"repository": repository, "digest": BUILT_DIGEST, "tag": "t"},
                "base": base,
            }
        )
    )
    return path


def _profile(tmp_path: Path, image: dict[str, Any]) -> Path:
    path = tmp_path / "with-image.yaml"
    path.write_text(yaml.safe_dump({"kind": "local", "image": image}))
    return path


def test_the_dry_run_shows_the_profile_image_and_the_node_checks_its_label(tmp_path):
    _record(tmp_path / "rec.json", SEED_DIGEST)
    res = cli(str(SEED), "--cluster", str(_profile(tmp_path, {"record": "rec.json"})), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "# image     127.0.0.1:5000/built/miles@" + BUILT_DIGEST in res.stdout
    assert f"built FROM radixark/miles@{SEED_DIGEST}, the recipe's stack.source digest" in (
        res.stdout
    )
    script = res.stdout.split("# ---- node script (node.sh), run detached on the node ----\n")[1]
    assert f"IMAGE=127.0.0.1:5000/built/miles@{BUILT_DIGEST}\n" in script
    assert f"IMAGE_DIGEST={BUILT_DIGEST}\n" in script
    assert f"IMAGE_BASE_DIGEST={SEED_DIGEST}\n" in script and BASE_DIGEST_LABEL in script
    assert "IMAGE_BASE_LAYERS=" in script and LAYERS[1] in script  # the layers, not only the label
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("form", ["record", "record-empty", "inline"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_profile_image_naming_no_base_layers_is_refused(tmp_path, form, dry_run):
    """Without the recipe image's layers the node could check only the label, which any image
    can carry: such a record (or inline image) is refused before anything starts."""
    if form == "inline":
        image: dict[str, Any] = {
            "repository": "r.example/miles",
            "digest": BUILT_DIGEST,
            "base_digest": SEED_DIGEST,
        }
    else:
        layers = None if form == "record" else []
        image = {"record": str(_record(tmp_path / "rec.json", SEED_DIGEST, layers=layers))}
    args = [str(SEED), "--cluster", str(_profile(tmp_path, image)), "--runs-dir", str(tmp_path)]
    res = cli(*args, *(["--dry-run"] if dry_run else []))
    assert res.returncode == 2, res.stderr
    assert "names no layers of the recipe's image" in res.stderr
    assert ("image.base_layers" if form == "inline" else "base.layers") in res.stderr
    assert "nothing was started" in res.stderr and "Traceback" not in res.stderr
    assert not list(tmp_path.rglob("run.json"))


def test_an_inline_image_with_base_layers_is_checked_by_them_on_the_node(tmp_path):
    image = {
        "repository": "r.example/miles",
        "digest": BUILT_DIGEST,
        "base_digest": SEED_DIGEST,
        "base_layers": LAYERS,
    }
    res = cli(str(SEED), "--cluster", str(_profile(tmp_path, image)), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "IMAGE_BASE_LAYERS=" in res.stdout and LAYERS[0] in res.stdout


@pytest.mark.parametrize("form", ["record", "inline"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_profile_image_built_from_another_base_is_refused(tmp_path, form, dry_run):
    if form == "record":
        image: dict[str, Any] = {"record": str(_record(tmp_path / "rec.json", OTHER_DIGEST))}
    else:
        image = {
            "repository": "r.example/miles",
            "digest": BUILT_DIGEST,
            "base_digest": OTHER_DIGEST,
        }
    args = [str(SEED), "--cluster", str(_profile(tmp_path, image)), "--runs-dir", str(tmp_path)]
    res = cli(*args, *(["--dry-run"] if dry_run else []))
    assert res.returncode == 2, res.stderr
    assert OTHER_DIGEST in res.stderr and SEED_DIGEST in res.stderr  # both named
    assert "nothing was started" in res.stderr and "Traceback" not in res.stderr
    assert not list(tmp_path.rglob("run.json"))


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ({"record": "missing.json"}, "no such image record"),
        ({"record": "rec.json", "digest": BUILT_DIGEST}, "not both"),
        ({"repository": "r.example/miles", "digest": BUILT_DIGEST}, "missing base_digest"),
    ],
)
def test_a_broken_profile_image_is_bad_input(tmp_path, image, words):
    _record(tmp_path / "rec.json", SEED_DIGEST)
    res = cli(str(SEED), "--cluster", str(_profile(tmp_path, image)), "--dry-run")
    assert res.returncode == 2 and words in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------
# What is refused before docker runs


def test_an_installer_that_is_not_the_pinned_one_is_refused_before_docker(tmp_path):
    installer, sha = write_installer(tmp_path)
    wrong = "0" * 64
    res = cli(
        "image", "build", str(SEED), "--push", "127.0.0.1:5000", "--efa-installer",
        str(installer), "--efa-sha256", wrong, "--record", str(tmp_path / "rec.json"),
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert sha in res.stderr and wrong in res.stderr and "nothing was built" in res.stderr
    assert not (tmp_path / "rec.json").exists()


def test_an_installer_of_another_version_than_the_recipe_says_is_refused(tmp_path):
    installer, sha = write_installer(tmp_path, version="1.48.0")  # the seed says "EFA 1.49"
    res = cli(
        "image", "build", str(SEED), "--push", "127.0.0.1:5000",
        "--efa-installer", str(installer), "--efa-sha256", sha,
    )  # fmt: skip
    assert res.returncode == 2 and "1.48.0" in res.stderr and "EFA 1.49" in res.stderr


def test_push_needs_a_registry_host_and_tags_are_checked():
    base = Image("radixark/miles", SEED_DIGEST, "v0.1.0")
    t = push_target("127.0.0.1:5000/team", base, "v0.1.0-efa1.49.0")
    assert (t.repository, t.kind, t.tagged) == (
        "127.0.0.1:5000/team/miles",
        "registry",
        "127.0.0.1:5000/team/miles:v0.1.0-efa1.49.0",
    )
    assert push_target("docker.io/me", base, "x").repository == "docker.io/me/miles"
    for bad, tag in (("me", "x"), ("me/team", "x"), ("127.0.0.1:5000/Bad", "x"), ("r.io", "a b")):
        with pytest.raises(BadInput):
            push_target(bad, base, tag)


def test_ecr_hosts_are_told_apart_from_other_registries():
    t = push_target(ECR, Image("radixark/miles", SEED_DIGEST), "t")
    assert (t.kind, t.ecr_account, t.ecr_region) == ("ecr", "123456789012", "us-west-2")
    assert t.repository == f"{ECR}/miles"
    assert ecr_host("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com")
    assert ecr_host("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn")
    for other in (
        "registry.example.com",
        "127.0.0.1:5000",
        "12345.dkr.ecr.us-west-2.amazonaws.com",  # not a 12-digit account
        f"{ECR}.evil.example",
        "public.ecr.aws",
    ):
        assert ecr_host(other) is None, other


# ------------------------------------------------------------------------------------------------
# ECR: the login request (Stubber), and the whole path with a stand-in docker


def _stubbed_ecr(password: str = "s3cret-token", error: str | None = None) -> Any:
    import boto3
    from botocore.stub import Stubber

    client = boto3.client(
        "ecr",
        region_name="us-west-2",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    stub = Stubber(client)
    if error:
        stub.add_client_error("get_authorization_token", error, "no", expected_params={})
    else:
        token = base64.b64encode(f"AWS:{password}".encode()).decode()
        stub.add_response(
            "get_authorization_token",
            {
                "authorizationData": [
                    {
                        "authorizationToken": token,
                        "expiresAt": datetime(2030, 1, 1, tzinfo=UTC),
                        "proxyEndpoint": "https://999999999999.dkr.ecr.us-west-2.amazonaws.com",
                    }
                ]
            },
            expected_params={},
        )
    stub.activate()
    return client


@pytest.mark.aws
def test_ecr_login_asks_for_a_token_and_logs_in_to_the_target_registry():
    target = push_target(ECR, Image("radixark/miles", SEED_DIGEST), "t")
    login = ecr_login(target, client=_stubbed_ecr())
    assert (login.server, login.username, login.password) == (
        f"https://{ECR}",
        "AWS",
        "s3cret-token",
    )
    assert "s3cret-token" not in repr(login)
    with pytest.raises(InfraError, match="may not do this"):
        ecr_login(target, client=_stubbed_ecr(error="AccessDeniedException"))
    with pytest.raises(BadInput):
        ecr_login(push_target("127.0.0.1:5000", Image("radixark/miles", SEED_DIGEST), "t"))


FAKE_DOCKER = """#!{python}
import json, os, sys
argv = sys.argv[1:]
stdin = sys.stdin.read() if "--password-stdin" in argv else None
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argv": argv, "stdin": stdin,
                         "buildkit": os.environ.get("DOCKER_BUILDKIT")}}) + "\\n")
if "--config" in argv:
    config = argv[argv.index("--config") + 1]
    assert os.path.isdir(config) and (os.stat(config).st_mode & 0o777) == 0o700
    argv = argv[argv.index("--config") + 2:]
cmd = argv[0]
if cmd == "build":
    open(argv[argv.index("--iidfile") + 1], "w").write("sha256:" + "3" * 64)
elif argv[:2] == ["image", "inspect"]:
    fmt = argv[argv.index("--format") + 1]
    if "Labels" in fmt:
        print(json.dumps({{{label!r}: {base!r}}}))
    elif "RootFS" in fmt:  # the built image (by its id) is the base's layers plus one
        base_layers = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
        built = argv[-1] == "sha256:" + "3" * 64
        print(json.dumps(base_layers + (["sha256:" + "c" * 64] if built else [])))
    else:
        print(json.dumps([{repo!r} + "@" + {digest!r}]))
elif cmd == "push":
    print("t: digest: " + {digest!r} + " size: 527")
"""


@pytest.mark.aws
def test_the_ecr_path_logs_in_pushes_and_pulls_with_a_config_that_is_then_deleted(
    tmp_path, monkeypatch
):
    log = tmp_path / "docker-calls.jsonl"
    fake = tmp_path / "docker"
    repo = f"{ECR}/miles"
    fake.write_text(
        FAKE_DOCKER.format(
            python=sys.executable,
            log=str(log),
            label=BASE_DIGEST_LABEL,
            base=SEED_DIGEST,
            repo=repo,
            digest=BUILT_DIGEST,
        )
    )
    fake.chmod(0o755)
    installer, sha = write_installer(tmp_path)
    record = tmp_path / "rec.json"
    said: list[str] = []
    result = build_and_push(
        BuildRequest(SEED, ECR, installer, sha, tag="t", record=record, network="none"),
        say=said.append,
        docker=str(fake),
        ecr_client=_stubbed_ecr(),
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    words = [
        c["argv"][c["argv"].index("--config") + 2 if "--config" in c["argv"] else 0] for c in calls
    ]
    # the label, the recipe image's layers, the built image's layers; then login, push, pull
    assert words == ["build", "image", "image", "image", "login", "push", "image", "pull"]
    build, login, push, pull = calls[0], calls[4], calls[5], calls[7]
    assert build["buildkit"] == "0" and "--config" not in build["argv"]
    assert ["--network", "none"] == build["argv"][1:3]
    assert (
        "BASE_IMAGE=radixark/miles" in build["argv"]
        and f"BASE_DIGEST={SEED_DIGEST}" in build["argv"]
    )
    assert f"EFA_INSTALLER_SHA256={sha}" in build["argv"]
    assert login["stdin"] == "s3cret-token"
    assert all("s3cret-token" not in " ".join(c["argv"]) for c in calls)
    config = login["argv"][1]
    assert push["argv"][:2] == pull["argv"][:2] == ["--config", config]
    assert login["argv"][-1] == f"https://{ECR}" and push["argv"][-1] == f"{repo}:t"
    assert pull["argv"][-1] == f"{repo}@{BUILT_DIGEST}"
    assert not Path(config).exists()  # the token's docker config is gone with the build
    assert result.ref == f"{repo}@{BUILT_DIGEST}"
    data = json.loads(record.read_text())
    assert data["registry"] == {
        "host": ECR,
        "kind": "ecr",
        "ecr_account": "123456789012",
        "ecr_region": "us-west-2",
    }
    assert data["base"]["digest"] == SEED_DIGEST and data["image"]["id"] == "sha256:" + "3" * 64
    assert "s3cret-token" not in record.read_text()


# ------------------------------------------------------------------------------------------------
# The Dockerfile


def test_the_dockerfile_builds_from_a_digest_and_downloads_nothing():
    text = (REPO / "Dockerfile").read_text()
    froms = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert froms == ["FROM ${BASE_IMAGE}@${BASE_DIGEST}"]
    assert f"ARG BASE_DIGEST={SEED_DIGEST}\n" in text  # by hand, the seed's base
    steps = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any(word in line for line in steps for word in ("curl", "wget", "http"))
    assert 'org.opencontainers.image.base.digest="${BASE_DIGEST}"' in text


def test_the_command_explains_itself_and_refuses_missing_options():
    helped = cli("image", "build", "--help")
    assert helped.returncode == 0 and "--efa-sha256" in helped.stdout, helped.stderr
    missing = cli("image", "build", str(SEED), "--push", "127.0.0.1:5000")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
