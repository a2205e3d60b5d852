"""`reproduce image build`: the repository's Dockerfile FROM the recipe's image pinned by digest,
pushed, verified, recorded.

Why each step (docs/image.md has the whole story):
- The base is passed as repository + digest (build args); the Dockerfile's FROM names a digest,
  so the base cannot float on a tag.
- The EFA installer is a local file, checked against the checksum the user pins before docker
  sees it, and again inside the build; nothing in the build downloads it.
- The build runs in a context of its own (the Dockerfile, scripts/, the installer), not the
  checkout, and with the classic builder (`DOCKER_BUILDKIT=0`), which Debian 12's docker.io
  has and whose `--network` applies to RUN steps.
- After the push, the digest docker reports must be in the image's RepoDigests, and a pull by
  that digest must succeed: docker then fetched the manifest from the registry and checked it
  hashes to that digest, so the registry serves exactly what is recorded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput, CheckFailed, InfraError
from launcher.excerpt import excerpt
from launcher.inputs.recipe import Recipe, load_recipe
from launcher.plan.image_record import (
    BASE_DIGEST_LABEL,
    DIGEST,
    RECIPE_LABEL,
    default_record_path,
    new_record,
    write_record,
)
from launcher.prepare import dockercli
from launcher.prepare.registry import Login, Target, default_tag, ecr_login, push_target

if TYPE_CHECKING:
    from types_boto3_ecr import ECRClient

NETWORKS = ("none", "default", "host")
INSTALLER_NAME = re.compile(r"aws-efa-installer-(?P<version>[0-9]+(?:\.[0-9]+)+)\.tar\.gz")
_RECIPE_EFA = re.compile(r"\bEFA(?: installer)? v?(?P<version>[0-9]+(?:\.[0-9]+)+)")
_PUSHED = re.compile(r"digest: (sha256:[0-9a-f]{64})")
_PKG = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BuildRequest:
    recipe: Path
    push: str
    efa_installer: Path
    efa_sha256: str
    tag: str | None = None
    efa_version: str | None = None
    record: Path | None = None
    network: str = "default"
    dockerfile: Path | None = None
    runs_root: Path | None = None


@dataclass(frozen=True)
class BuildResult:
    ref: str
    digest: str
    base_ref: str
    record_path: Path
    record: dict[str, Any]


def repository_dockerfile() -> Path:
    """The Dockerfile in a checkout, or the copy a wheel carries (launcher/_data/Dockerfile)."""
    for candidate in (_PKG / "_data" / "Dockerfile", _PKG.parent / "Dockerfile"):
        if candidate.is_file():
            return candidate
    raise BadInput(
        f"the installation of reproduce has no Dockerfile (looked beside {_PKG}); pass "
        "--dockerfile."
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_installer(req: BuildRequest, recipe: Recipe) -> dict[str, Any]:
    """The installer file, its pinned checksum and its version, each refused with a reason."""
    path = req.efa_installer.expanduser()
    if not path.is_file():
        raise BadInput(f"--efa-installer {path}: no such file.")
    pinned = req.efa_sha256.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", pinned):
        raise BadInput(f"--efa-sha256 {req.efa_sha256!r}: expected 64 hex digits.")
    actual = file_sha256(path)
    if actual != pinned:
        raise BadInput(
            f"--efa-installer {path} has sha256 {actual}, not the pinned {pinned}: it is not the "
            "installer you verified; nothing was built."
        )
    named = INSTALLER_NAME.fullmatch(path.name)
    version = req.efa_version or (named.group("version") if named else None)
    if not version:
        raise BadInput(
            f"--efa-installer {path.name}: the version is not in the file name "
            "(aws-efa-installer-<version>.tar.gz); pass --efa-version."
        )
    said = _RECIPE_EFA.search(recipe.stack_source)
    if said and not (version + ".").startswith(said.group("version") + "."):
        raise BadInput(
            f"the EFA installer is version {version}, but the recipe's stack.source says EFA "
            f"{said.group('version')}; use that installer."
        )
    return {"version": version, "sha256": actual, "file": path.name}


def build_and_push(
    req: BuildRequest,
    *,
    say: Callable[[str], Any] = print,
    docker: str = "docker",
    ecr_client: ECRClient | None = None,
    now: datetime | None = None,
) -> BuildResult:
    """Build, push, verify and record; BadInput before docker runs for anything the user can fix."""
    recipe = load_recipe(req.recipe)
    base = recipe.image
    if not DIGEST.fullmatch(base.digest):
        raise BadInput(f"{recipe.path}: the image digest {base.digest!r} is not sha256:<64 hex>.")
    if req.network not in NETWORKS:
        raise BadInput(f"--network {req.network!r}: expected one of {', '.join(NETWORKS)}.")
    dockerfile = (req.dockerfile or repository_dockerfile()).expanduser()
    if not dockerfile.is_file():
        raise BadInput(f"--dockerfile {dockerfile}: no such file.")
    installer = check_installer(req, recipe)
    target = push_target(req.push, base, req.tag or default_tag(base, installer["version"]))
    if shutil.which(docker) is None:
        raise InfraError(f"{docker} is not installed here: `reproduce image build` runs docker.")

    with tempfile.TemporaryDirectory(prefix="reproduce-image-") as tmp:
        work = Path(tmp)
        context = _context(work / "context", dockerfile, req.efa_installer.expanduser())
        say(f"building {target.tagged} FROM {base.ref} (the recipe's {base.source_field})")
        argv = [
            docker,
            "build",
            "--network",
            req.network,
            "--iidfile",
            str(work / "iid"),
            *_build_args(
                BASE_IMAGE=base.repository,
                BASE_DIGEST=base.digest,
                EFA_INSTALLER_VERSION=installer["version"],
                EFA_INSTALLER_SHA256=installer["sha256"],
            ),
            "--label",
            f"{RECIPE_LABEL}={recipe.slug}",
            "--tag",
            target.tagged,
            str(context),
        ]
        _run(argv, say, "docker build", env={"DOCKER_BUILDKIT": "0"})
        image_id = (work / "iid").read_text(encoding="utf-8").strip()
        labels = _inspect(docker, image_id, "{{json .Config.Labels}}") or {}
        if labels.get(BASE_DIGEST_LABEL) != base.digest:
            raise CheckFailed(
                f"the built image {image_id} says {BASE_DIGEST_LABEL}="
                f"{labels.get(BASE_DIGEST_LABEL)!r}, not the recipe's {base.digest}: "
                f"{dockerfile} does not build FROM the BASE_IMAGE/BASE_DIGEST it is given."
            )
        base_layers = _base_layers(docker, base.ref, say)
        built_layers = _inspect(docker, image_id, "{{json .RootFS.Layers}}") or []
        if not base_layers or built_layers[: len(base_layers)] != base_layers:
            raise CheckFailed(
                f"the built image {image_id} carries {BASE_DIGEST_LABEL}={base.digest}, but its "
                f"layers do not begin with the {len(base_layers)} layer(s) of {base.ref}: "
                f"{dockerfile} does not build FROM the recipe's image (a label is only text; "
                "the layers are the content)."
            )
        config = _login(docker, target, work, say, ecr_client)
        say(f"pushing {target.tagged}")
        try:
            out = _run([*config, "push", target.tagged], say, "docker push")
        except InfraError as err:
            if target.kind != "ecr":
                raise
            name = target.repository.split("/", 1)[1]
            raise InfraError(
                err.message,
                hint=f"ECR creates no repository on push: `aws ecr create-repository "
                f"--repository-name {name} --region {target.ecr_region}` makes it.",
            ) from None
        digest = _pushed_digest(docker, target, out)
        say(f"checking that {target.registry} serves {target.repository}@{digest}")
        _run([*config, "pull", f"{target.repository}@{digest}"], say, "docker pull")

    record = new_record(
        repository=target.repository,
        digest=digest,
        tag=target.tag,
        image_id=image_id,
        recipe=recipe,
        base_layers=base_layers,
        installer=installer,
        registry=target.to_dict(),
        dockerfile_sha256=file_sha256(dockerfile),
        built_at=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
        built_by=_owner(),
    )
    from launcher.records.rundir import default_runs_root

    path = req.record or default_record_path(recipe, req.runs_root or default_runs_root())
    write_record(path, record)
    return BuildResult(f"{target.repository}@{digest}", digest, base.ref, path, record)


# ------------------------------------------------------------------------------------------------
# Steps


def _context(context: Path, dockerfile: Path, installer: Path) -> Path:
    """The build context: the Dockerfile, the node programs and the installer, nothing else."""
    from launcher.resources import data_dir

    context.mkdir()
    shutil.copyfile(dockerfile, context / "Dockerfile")
    shutil.copytree(
        data_dir("scripts"),
        context / "scripts",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    target = context / "efa-installer.tar.gz"
    try:
        os.link(installer, target)  # the installer is large; a hard link costs nothing
    except OSError:
        shutil.copyfile(installer, target)
    return context


def _build_args(**args: str) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        out += ["--build-arg", f"{key}={value}"]
    return out


def _login(
    docker: str,
    target: Target,
    work: Path,
    say: Callable[[str], Any],
    ecr_client: ECRClient | None,
) -> list[str]:
    """docker's leading arguments for the push: ECR gets a login of its own in a throwaway
    DOCKER_CONFIG; any other registry uses the user's docker configuration as it is."""
    if target.kind != "ecr":
        return [docker]
    login = ecr_login(target, client=ecr_client)
    config = work / "docker-config"
    config.mkdir(mode=0o700)
    say(f"logging in to {target.registry} (ECR, account {target.ecr_account})")
    docker_login(docker, config, login)
    return [docker, "--config", str(config)]


def docker_login(docker: str, config: Path, login: Login) -> None:
    """`docker login --password-stdin` into `config`: the password never on a command line."""
    proc = subprocess.run(
        [docker, "--config", str(config), "login", "--username", login.username]
        + ["--password-stdin", login.server],
        input=login.password,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise InfraError(f"docker login {login.server} failed: {excerpt(proc.stderr, 3)}")


def _pushed_digest(docker: str, target: Target, push_output: Sequence[str]) -> str:
    """The digest `docker push` printed, which must be among the image's RepoDigests."""
    found = [m.group(1) for line in push_output for m in [_PUSHED.search(line)] if m]
    repo_digests = _inspect(docker, target.tagged, "{{json .RepoDigests}}") or []
    mine = [d.split("@", 1)[1] for d in repo_digests if d.startswith(target.repository + "@")]
    if not found:
        raise InfraError(f"docker push {target.tagged} printed no digest.")
    digest = found[-1]
    if digest not in mine:
        raise InfraError(
            f"docker push reported {digest}, but the local image's digests for "
            f"{target.repository} are {mine or 'none'}."
        )
    return digest


def _base_layers(docker: str, ref: str, say: Callable[[str], Any]) -> list[str]:
    """The recipe image's layers (RootFS diff ids: the content, not a label): the build pulled it
    FROM its digest; a Dockerfile that did not is the case to catch, so pull it then (only when
    docker says it is not here: a docker that cannot answer is not an absent image)."""
    layers = dockercli.inspect(ref, "{{json .RootFS.Layers}}", docker=docker)
    if layers is None:
        _run([docker, "pull", ref], say, "docker pull (the recipe's image, to compare layers)")
        layers = _inspect(docker, ref, "{{json .RootFS.Layers}}")
    return list(layers or [])


def _inspect(docker: str, ref: str, fmt: str) -> Any:
    """An image that must be here (just built or pulled): absent is a failure too."""
    found = dockercli.inspect(ref, fmt, docker=docker)
    if found is None:
        raise InfraError(f"docker image inspect {ref}: docker says the image is not here")
    return found


def _run(
    argv: list[str],
    say: Callable[[str], Any],
    what: str,
    *,
    env: dict[str, str] | None = None,
) -> list[str]:
    """Run docker, passing each line of its output on as it comes; InfraError with the last
    lines when it fails."""
    lines: list[str] = []
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env={**os.environ, **(env or {})},
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            say(f"  {line}")
    if proc.returncode != 0:
        tail = excerpt("\n".join(lines[-15:]), 15)
        raise InfraError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return lines


def _owner() -> str:
    from launcher.records.rundir import owner

    return owner()
