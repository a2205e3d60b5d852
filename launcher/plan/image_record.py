"""The record of a built image, and the profile's `image` field resolved against a recipe.

Why a record: a recipe pins its image by digest, and an image built from it (the seed's base with
the EFA installer added) has another digest. The only claim that makes the built image the
recipe's is "built FROM the recipe's digest", meaning: its RootFS layers begin with the layers
of the recipe's image. `reproduce image build` checks it and writes it down (this record, with
the recipe image's layers, and the image's own label `org.opencontainers.image.base.digest`, which
is only text), a run refuses a profile image whose recorded base is another digest, and the node
checks the label and the layers of the image it pulled before any GPU minute. Only json and
pathlib here: the dry run reads this module.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.inputs.profile import Profile
from launcher.inputs.recipe import Image, Recipe
from launcher.inputs.yamlschema import read_text_capped
from launcher.records import jsonread
from launcher.records.atomic import write_atomic

RECORD_SCHEMA = "reproduce-image/1"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
RECIPE_LABEL = "dev.reproduce.recipe"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# host[:port]/path, lower case (docker's reference grammar, without tag or digest)
REPOSITORY = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)


@dataclass(frozen=True)
class BuiltImage:
    """An image built FROM the recipe's image (by digest) and pushed: what a run pulls instead."""

    repository: str
    digest: str
    base_digest: str
    base_repository: str | None = None  # the profile's inline form names only the base's digest
    tag: str | None = None
    origin: str = "profile image"  # where the launcher read it, for messages and node.sh comments
    record_path: str | None = None
    # the recipe image's RootFS layers as the build saw them: the built image's must begin with
    # them (content, not a label); a profile image without them is refused (profile_image)
    base_layers: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.repository}@{self.digest}"

    def as_image(self) -> Image:
        return Image(self.repository, self.digest, self.tag, self.origin)

    def describe(self, recipe: Recipe) -> str:
        """One line for the dry run: which image runs and what it derives from."""
        record = f"; record {self.record_path}" if self.record_path else ""
        return (
            f"from {self.origin}{record}; built FROM {recipe.image.ref}, the recipe's "
            f"{recipe.image.source_field} digest"
        )

    def to_dict(self, recipe: Recipe) -> dict[str, Any]:
        """plan.json: which image ran, and the evidence that it derives from the recipe's."""
        return {
            "ref": self.ref,
            "repository": self.repository,
            "digest": self.digest,
            "tag": self.tag,
            "built_from": {"repository": self.base_repository, "digest": self.base_digest},
            "recipe_image": recipe.image.ref,
            "recipe_image_field": recipe.image.source_field,
            "derives_from_recipe_image": self.base_digest == recipe.image.digest,
            "origin": self.origin,
            "record": self.record_path,
            "label_checked_on_node": BASE_DIGEST_LABEL,
            "base_layers_checked_on_node": len(self.base_layers),
        }


# ------------------------------------------------------------------------------------------------
# The record file


def default_record_path(recipe: Recipe, runs_root: Path) -> Path:
    """`images/<recipe slug>.json` beside the runs root (./runs -> ./images)."""
    return runs_root.parent / "images" / f"{recipe.slug}.json"


def new_record(
    *,
    repository: str,
    digest: str,
    tag: str,
    image_id: str,
    recipe: Recipe,
    base_layers: list[str],
    installer: dict[str, Any],
    registry: dict[str, Any],
    dockerfile_sha256: str,
    built_at: str,
    built_by: str,
) -> dict[str, Any]:
    base = recipe.image
    return {
        "schema": RECORD_SCHEMA,
        "image": {
            "repository": repository,
            "digest": digest,
            "tag": tag,
            "ref": f"{repository}@{digest}",
            "id": image_id,
        },
        "base": {
            "repository": base.repository,
            "digest": base.digest,
            "ref": base.ref,
            "recipe_field": base.source_field,
            "label": BASE_DIGEST_LABEL,
            "layers": list(base_layers),  # the built image's layers begin with these
        },
        "recipe": {
            "slug": recipe.slug,
            "path": str(recipe.path),
            "content_sha256": recipe.content_hash,
        },
        "efa_installer": installer,
        "dockerfile_sha256": dockerfile_sha256,
        "registry": registry,
        "built_at": built_at,
        "built_by": built_by,
    }


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Atomically: a reader sees the previous record or this one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, indent=2) + "\n")
    except OSError as err:
        raise BadInput(f"--record {path}: cannot write the image record: {err.strerror}.") from None


def read_record(path: Path, origin: str, where: str | None = None) -> BuiltImage:
    """A record written by `reproduce image build`; BadInput naming the file when it is not one.

    `origin` is a fixed phrase (it reaches node.sh comments); `where` names the field that gave
    the path, for messages.
    """
    where = where or origin
    if not path.exists():
        raise BadInput(f"{where}: no such image record ({path}).")
    try:  # a regular file, capped: a FIFO or /dev/zero named as the record had hung the dry run
        data = jsonread.loads(read_text_capped(path, "image record"))
    except (OSError, UnicodeDecodeError, ValueError, jsonread.NodeJSONError) as err:
        raise BadInput(f"{where}: {path} is not a readable image record ({err}).") from None
    try:
        if data["schema"] != RECORD_SCHEMA:
            raise BadInput(
                f"{where}: {path} has schema {data['schema']!r}, expected {RECORD_SCHEMA!r}."
            )
        image, base = data["image"], data["base"]
        built = BuiltImage(
            repository=str(image["repository"]),
            digest=str(image["digest"]),
            base_digest=str(base["digest"]),
            base_repository=str(base["repository"]),
            tag=image.get("tag"),
            origin=origin,
            record_path=str(path),
            base_layers=tuple(str(x) for x in base.get("layers") or ()),
        )
    except (KeyError, TypeError) as err:
        raise BadInput(f"{where}: {path} is not an image record (missing {err}).") from None
    _check_digests(built, f"{where} ({path})")
    return built


def _check_digests(built: BuiltImage, where: str) -> None:
    if not REPOSITORY.fullmatch(built.repository):
        raise BadInput(f"{where}: {built.repository!r} is not an image repository name.")
    layers = [("base layer", x) for x in built.base_layers]
    for name, value in (("digest", built.digest), ("base digest", built.base_digest), *layers):
        if not DIGEST.fullmatch(value):
            raise BadInput(f"{where}: the image's {name} {value!r} is not sha256:<64 hex>.")


# ------------------------------------------------------------------------------------------------
# The profile's field


def profile_image(recipe: Recipe, profile: Profile) -> BuiltImage | None:
    """The profile's `image` (a record file, or repository + digest + base_digest), checked to
    derive from the recipe's image; None when the profile has none (the recipe's image runs).

    A record path is taken relative to the profile file. A built image whose base is not the
    recipe's digest is refused (BadInput), naming both digests.
    """
    raw = profile.raw.get("image")
    if not raw:
        return None
    if profile.runtime != "docker":
        raise BadInput(
            f"{profile.path}: image applies to runtime docker (the node pulls it by digest); "
            f"this profile's runtime is {profile.runtime}."
        )
    inline = [k for k in ("repository", "digest", "base_digest") if k in raw]
    if raw.get("record"):
        if inline:
            raise BadInput(
                f"{profile.path}: image.record and image.{inline[0]} are both set; give the "
                "record written by `reproduce image build`, or repository, digest and "
                "base_digest, not both."
            )
        path = Path(str(raw["record"])).expanduser()
        if not path.is_absolute():
            path = profile.path.parent / path
        built = read_record(path, "profile image.record", where=f"{profile.path}: image.record")
    else:
        missing = [k for k in ("repository", "digest", "base_digest") if not raw.get(k)]
        if missing:
            raise BadInput(
                f"{profile.path}: image needs `record` (written by `reproduce image build`) or "
                f"repository, digest and base_digest; missing {', '.join(missing)}."
            )
        built = BuiltImage(
            repository=str(raw["repository"]),
            digest=str(raw["digest"]),
            base_digest=str(raw["base_digest"]),
            tag=raw.get("tag"),
            origin="profile image",
            base_layers=tuple(str(x) for x in raw.get("base_layers") or ()),
        )
        _check_digests(built, f"{profile.path}: image")
    if built.base_digest != recipe.image.digest:
        raise BadInput(
            f"{profile.path}: {built.origin} {built.ref} was built FROM {built.base_digest}, "
            f"but the recipe {recipe.path} pins {recipe.image.digest} "
            f"({recipe.image.source_field}): an image built from another base is not this "
            "recipe's image; nothing was started.",
            hint="Build one from this recipe: reproduce image build RECIPE --push REGISTRY.",
        )
    if not built.base_layers:
        field = "its base.layers" if built.record_path else "image.base_layers"
        raise BadInput(
            f"{profile.path}: {built.origin} {built.ref} names no layers of the recipe's image "
            f"({field} is missing or empty): its {BASE_DIGEST_LABEL} label alone is text any "
            f"image can carry, so the node could not check that it was built FROM "
            f"{recipe.image.digest}; nothing was started.",
            hint="Build it again with `reproduce image build` (the record keeps the layers), or "
            "give image.base_layers: the recipe image's RootFS layers, as `docker image inspect "
            "--format '{{json .RootFS.Layers}}' REPOSITORY@DIGEST` prints them.",
        )
    return built


def base_label_check(built: BuiltImage) -> list[str]:
    """node.sh lines: what the node checks of the pulled image before any GPU minute. Its label
    must name the recipe's digest as its base (text any image can carry), and, when the record
    holds the recipe image's layers (`reproduce image build` writes them), the image's own
    RootFS layers must begin with them: the content the recipe pinned is really underneath."""
    fmt = "{{index .Config.Labels " + json.dumps(BASE_DIGEST_LABEL) + "}}"
    lines = [
        f"# built by `reproduce image build` FROM the recipe's image; its label {BASE_DIGEST_LABEL}"
        " must say so",
        f"IMAGE_BASE_DIGEST={shlex.quote(built.base_digest)}",
        f'IMAGE_BASE_LABEL="$(docker image inspect --format {shlex.quote(fmt)} "$IMAGE")"',
        'if [ "$IMAGE_BASE_LABEL" != "$IMAGE_BASE_DIGEST" ]; then',
        f"  echo \"image $IMAGE: label {BASE_DIGEST_LABEL} is '$IMAGE_BASE_LABEL', not the "
        "recipe's digest $IMAGE_BASE_DIGEST\" >&2",
        "  exit 1",
        "fi",
    ]
    if built.base_layers:
        prefix = json.dumps(list(built.base_layers), separators=(",", ":"))[:-1]
        lines += [
            f"# and its layers begin with the {len(built.base_layers)} layer(s) of the recipe's "
            "image (the content, not a label)",
            f"IMAGE_BASE_LAYERS={shlex.quote(prefix)}",
            'IMAGE_LAYERS="$(docker image inspect --format \'{{json .RootFS.Layers}}\' "$IMAGE")"',
            'case "$IMAGE_LAYERS" in',
            '  "$IMAGE_BASE_LAYERS"[],]*) ;;',
            "  *) echo \"image $IMAGE: its layers do not begin with the layers of the recipe's "
            'image $IMAGE_BASE_DIGEST: not built FROM it" >&2',
            "     exit 1 ;;",
            "esac",
        ]
    return lines


def present_or_pull(pull: list[str]) -> list[str]:
    """node.sh's image lines for `ami: baked`: the node's AMI holds the image (`reproduce image
    bake`), so no pull when docker has it by digest (`pull` only when it does not); either way
    the digest is checked after it, as after any pull, and IMAGE_SOURCE goes into image.json."""
    return [
        "# ami: baked - the node's AMI holds the image (`reproduce image bake`): no pull when "
        "docker has it by digest; the digest is checked below as after a pull",
        "IMAGE_SOURCE=pulled",
        'if docker image inspect "$IMAGE" >/dev/null 2>&1; then',
        "  IMAGE_SOURCE=ami",
        '  echo "image $IMAGE: on the node from its AMI, not pulled"',
        *(["else", *(f"  {line}" for line in pull)] if pull else []),
        "fi",
    ]
