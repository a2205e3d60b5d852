"""The image of a run on pyxis/enroot, pinned by digest: imported once per node into a fresh
squashfs file of the run's own, its content checked against the pinned manifest, and every
in-image command run as a step of the job in a container pyxis makes from that file (the bash:
templates/node.sh, blocks `pyxis_setup` and `pyxis_image`).

Why not `srun --container-image=IMAGE@sha256:...` for each command: each such step imports the
image again (a 30 GB image once per stage), and a named container (`--container-name`) can hold
an older image. Why a check of our own: enroot fetches `manifests/sha256:D` and checks every blob
against that manifest, but never the manifest against D, so a registry (or anything between, over
HTTP) could serve another image under the pinned digest and enroot would import it. The check, in
bash on the node (curl, jq and sha256sum, which enroot needs too):

1. the manifest fetched by digest must hash to the pinned digest (an index: its entry for the
   node's architecture, fetched by that entry's digest and hashed again);
2. enroot imports with a cache directory made fresh for this import, so that afterwards it holds
   exactly the blobs the import used, each named by the sha256 enroot checked it against;
3. those names must be the pinned manifest's config and layers, no more and no fewer.

enroot before 4.0 does not parse `IMAGE@sha256:...`: it imports the recipe's tag, and step 3 is
what ties the file to the digest (an image the tag names now that is not the pinned one has other
blobs, and is refused). A recipe without a tag cannot run on such enroot.
"""

from __future__ import annotations

import shlex

from launcher.errors import BadInput
from launcher.inputs.recipe import Image

DOCKER_HUB = "registry-1.docker.io"
SQSH = "image.sqsh"  # in the node run directory, which no container mounts
MANIFEST_ACCEPT = (
    "Accept: application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.oci.image.index.v1+json"
)
# what pyxis's --container-mounts cannot carry in a path (SRC:DST[:FLAGS],...)
MOUNT_UNSAFE = (",", ":")


def registry_and_name(repository: str) -> tuple[str, str]:
    """`127.0.0.1:5000/team/img` -> ("127.0.0.1:5000", "team/img"); `radixark/miles` ->
    (Docker Hub, "radixark/miles"); `ubuntu` -> (Docker Hub, "library/ubuntu"): docker's rule,
    a first part with a dot or a colon (or `localhost`) names a registry."""
    first, sep, rest = repository.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, repository if "/" in repository else f"library/{repository}"


def enroot_uri(image: Image, *, by_tag: bool = False) -> str:
    """enroot's `docker://[REGISTRY#]NAME@sha256:...` (`:TAG` for enroot before 4.0)."""
    registry, name = registry_and_name(image.repository)
    where = "" if registry == DOCKER_HUB else f"{registry}#"
    return f"docker://{where}{name}" + (f":{image.tag}" if by_tag else f"@{image.digest}")


def image_values(image: Image) -> dict[str, str]:
    """The values of the template's `pyxis_image` block, each shell-quoted."""
    q = shlex.quote
    registry, name = registry_and_name(image.repository)
    return {
        "registry": q(registry),
        "name": q(name),
        "accept": q(MANIFEST_ACCEPT),
        "by_digest": q(enroot_uri(image)),
        "by_tag": q(enroot_uri(image, by_tag=True)) if image.tag else "''",
    }


def mountable(path: str, field: str, source: str) -> str:
    """`path`, which must reach pyxis's --container-mounts whole: BadInput naming the profile's
    field when it holds a character that list cannot carry."""
    bad = [c for c in MOUNT_UNSAFE if c in path]
    if bad:
        raise BadInput(
            f"{source}: {field} {path!r} holds {' and '.join(repr(c) for c in bad)}, which pyxis "
            "reads as separators in --container-mounts (SRC:DST[:FLAGS],...): expected a path "
            "without them for container_runtime: pyxis."
        )
    return path


def in_image(
    stage_name: str,
    command: str,
    *,
    gpus: bool,
    makes: bool,
    host_user: bool,
) -> str:
    """One in-image command as node.sh's `_in_image` runs it (a step of the job on this node).
    No stage is offline here: pyxis 0.24's --container-unshare=net needs enroot's
    ENROOT_UNSHARE_NET, which no enroot release has yet (4.1.2 lacks it; docs/slurm.md)."""
    flags = [
        *(["--gpus"] if gpus else []),
        *(["--new"] if makes else []),
        *(["--host-user"] if host_user else []),
    ]
    return f'_in_image "{stage_name}" {" ".join([*flags, "--"])} bash -c {shlex.quote(command)}'
