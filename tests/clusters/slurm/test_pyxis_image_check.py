"""node.sh's pyxis image stage (templates/node.sh, block `pyxis_image`) run for real against a real
local registry: the manifest hashed against the pinned digest, the blobs enroot used compared with
the pinned manifest's. enroot itself cannot be built in CI (its sources are on GitHub), so a
stand-in (tests/standin_enroot/enroot) does to its cache what enroot 4.1.2's import does; the
real enroot and pyxis run in tests/manual/pyxis_loopback.py (docs/slurm.md, "pyxis/enroot").

The adversaries: a registry serving another manifest under the pinned digest (which enroot
imports: it never checks the manifest against the digest), an import that used more blobs than
the manifest names, an enroot older than 4.0 that imports the recipe's tag after the tag moved
to another image, and one with no tag to import."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from support.docker import Registry, push_test_image
from support.paths import STANDIN_ENROOT

from launcher.inputs.recipe import Image
from launcher.plan import enroot_image
from launcher.plan.bash_template import template

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def own_registry(docker_available, tmp_path_factory):
    """A registry of this module's own: one test rewrites a manifest in its storage."""
    reg = Registry(tmp_path_factory.mktemp("pyxis-registry")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def images(own_registry, tmp_path_factory):
    """Two images under one tag: `pinned` pushed first, then `moved` over the same tag."""
    work = tmp_path_factory.mktemp("pyxis-images")
    pinned = push_test_image(own_registry, work, tag="t", marker="pinned")
    moved = push_test_image(own_registry, work, tag="t", marker="moved")
    assert pinned.digest != moved.digest
    return Image(pinned.repo, pinned.digest, "t"), moved


def stage(tmp_path: Path, image: Image, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The image stage as node.sh runs it, in a fresh node run directory."""
    node = tmp_path / "node"
    node.mkdir(parents=True)
    body = template("node.sh").fill("pyxis_image", enroot_image.image_values(image), {})
    script = "\n".join(
        [
            "set -euo pipefail", f"IMAGE={image.ref}", f"IMAGE_DIGEST={image.digest}",
            f'IMAGE_SQSH="$NODE_RUN_DIR/{enroot_image.SQSH}"',  # as block pyxis_setup sets it
            *body,
        ]
    )  # fmt: skip
    ran = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120,
        env={
            "PATH": f"{STANDIN_ENROOT}:{os.environ['PATH']}", "NODE_RUN_DIR": str(node),
            "ENROOT_ALLOW_HTTP": "yes", "HOME": str(tmp_path), **env,
        },
    )  # fmt: skip
    return ran, node


def manifest_blobs(registry: Registry, image: Image) -> list[str]:
    import urllib.request

    _, name = enroot_image.registry_and_name(image.repository)
    request = urllib.request.Request(
        f"http://{registry.address}/v2/{name}/manifests/{image.digest}",
        headers={"Accept": enroot_image.MANIFEST_ACCEPT.split(": ", 1)[1]},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        manifest = json.loads(answer.read())
    digests = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]
    return sorted(d.removeprefix("sha256:") for d in digests)


def refused(ran: subprocess.CompletedProcess, node: Path, why: str) -> None:
    assert ran.returncode != 0, ran.stdout + ran.stderr
    assert why in ran.stderr, ran.stderr
    assert not (node / "image.json").exists() and not (node / enroot_image.SQSH).exists()


def test_the_pinned_image_is_imported_and_recorded(tmp_path, images, own_registry) -> None:
    pinned, _ = images
    ran, node = stage(tmp_path, pinned)
    assert ran.returncode == 0, ran.stderr
    record = json.loads((node / "image.json").read_text())
    assert record["digest"] == pinned.digest and record["runtime"] == "pyxis"
    assert record["enroot"] == "4.1.2"
    assert record["blobs"] == manifest_blobs(own_registry, pinned)
    assert f"@{pinned.digest}" in (node / enroot_image.SQSH).read_text()  # imported by digest
    assert not (node / "image.check").exists()  # the import's own cache is gone


def test_another_manifest_under_the_pinned_digest_is_refused(tmp_path, images, own_registry):
    pinned, _ = images
    hexdigest = pinned.digest.removeprefix("sha256:")
    (blob,) = own_registry.root.glob(f"storage/**/blobs/sha256/*/{hexdigest}/data")
    original = blob.read_bytes()
    blob.write_bytes(original.rstrip() + b"\n\n")  # still a manifest, of the same image even
    try:
        ran, node = stage(tmp_path, pinned)
    finally:
        blob.write_bytes(original)
    refused(ran, node, f"manifest for {pinned.digest} does not hash to")


def test_an_import_that_used_other_blobs_is_refused(tmp_path, images) -> None:
    pinned, _ = images
    ran, node = stage(tmp_path, pinned, STANDIN_ENROOT_EXTRA_BLOB="0" * 64)
    refused(ran, node, "enroot imported other blobs than the manifest of")


def test_old_enroot_imports_the_tag_and_the_blobs_tie_it_to_the_digest(
    tmp_path, images, own_registry
) -> None:
    pinned, moved = images
    # the tag now names `moved`: enroot 3.x imports that, and the check refuses it
    ran, node = stage(tmp_path / "moved", pinned, STANDIN_ENROOT_VERSION="3.5.0")
    refused(ran, node, "enroot imported other blobs than the manifest of")
    # the tag naming the pinned image again: imported by tag and accepted
    newest = Image(moved.repo, moved.digest, "t")
    ran, node = stage(tmp_path / "same", newest, STANDIN_ENROOT_VERSION="3.5.0")
    assert ran.returncode == 0, ran.stderr
    assert ":t\n" in (node / enroot_image.SQSH).read_text()
    assert json.loads((node / "image.json").read_text())["blobs"] == manifest_blobs(
        own_registry, newest
    )
    # no tag to import: refused, naming why
    untagged = replace(pinned, tag=None)
    ran, node = stage(tmp_path / "untagged", untagged, STANDIN_ENROOT_VERSION="3.5.0")
    refused(ran, node, "cannot import by digest (4.0 or newer can)")


@pytest.mark.parametrize(
    ("repository", "registry", "name", "uri"),
    [
        (
            "127.0.0.1:5000/team/img",
            "127.0.0.1:5000",
            "team/img",
            "docker://127.0.0.1:5000#team/img",
        ),
        ("nvcr.io/nvidia/pytorch", "nvcr.io", "nvidia/pytorch", "docker://nvcr.io#nvidia/pytorch"),
        ("localhost/img", "localhost", "img", "docker://localhost#img"),
        ("radixark/miles", enroot_image.DOCKER_HUB, "radixark/miles", "docker://radixark/miles"),
        ("ubuntu", enroot_image.DOCKER_HUB, "library/ubuntu", "docker://library/ubuntu"),
    ],
)
def test_a_repository_reaches_enroot_as_docker_names_it(repository, registry, name, uri) -> None:
    image = Image(repository, "sha256:" + "a" * 64, "v1")
    assert enroot_image.registry_and_name(repository) == (registry, name)
    assert enroot_image.enroot_uri(image) == f"{uri}@sha256:{'a' * 64}"
    assert enroot_image.enroot_uri(image, by_tag=True) == f"{uri}:v1"
