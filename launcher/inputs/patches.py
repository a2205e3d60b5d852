"""`patches`: the recipe's local changes to a checkout in the image, applied before training.

Why: a recipe measured with a patched framework claims figures an unpatched run cannot be judged
against. Before, nothing read `patches`, so an unpatched run was judged against the patched claim.
The promise (docs/recipe-fields.md):

- each patch is a unified diff, inline (`diff`) or a file beside the recipe (`file`), with the
  sha256 of its bytes and the checkout it applies to (`checkout`, one the image holds: /root/miles
  or /root/Megatron-LM); `validate` checks the hash against the bytes;
- node.sh carries the bytes, checks each hash again on the node and applies each with
  `git apply` in the training container before the `ray` stage (on every node, before any miles
  code is imported); a patch that does not apply stops the run there, before training;
- plan.json (`patches`) records what was applied (name, checkout, sha256), node.log the lines
  the node printed when it applied each;
- where a patch cannot be applied, the recipe is refused before anything is paid for: its bytes
  are missing, its hash differs, its checkout is not one the image holds, or the target runs no
  container of its own (a Ray cluster's nodes, `runtime: host`: the checkout would be changed for
  good, for every later run).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput

if TYPE_CHECKING:
    from launcher.inputs.profile import Profile

# The checkouts the training image holds (node_script.MILES_PYTHONPATH's parts).
CHECKOUTS = ("/root/miles", "/root/Megatron-LM")
_SAFE_FILE = re.compile(r"(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_][A-Za-z0-9._/-]{0,255}")
MAX_PATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Patch:
    """One patch, its bytes read and checked."""

    index: int
    name: str
    checkout: str
    text: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "checkout": self.checkout, "sha256": self.sha256}


def _items(raw: dict[str, Any]) -> list[Any]:
    items = raw.get("patches")
    return list(items) if isinstance(items, list) else []


def _read(item: dict[str, Any], base: Path | None, index: int) -> tuple[str | None, str | None]:
    """(the patch's text, why it cannot be read)."""
    if "diff" in item and "file" in item:
        return None, "gives both diff and file; expected one of them"
    if "diff" in item:
        return str(item["diff"]), None
    if "file" not in item:
        return None, "gives neither diff (the unified diff) nor file (one beside the recipe)"
    name = str(item["file"])
    if not _SAFE_FILE.fullmatch(name):
        return None, f"file {name!r}: expected a path relative to the recipe's directory, no '..'"
    if base is None:
        return None, None  # read where the recipe's directory is known (load_recipe)
    from launcher.inputs.yamlschema import read_text_capped

    try:
        return read_text_capped(base / name, "patch", MAX_PATCH_BYTES), None
    except BadInput as err:
        return None, f"file {name!r}: the patch's bytes are not available ({err})"


def problems(raw: dict[str, Any], base: Path | None) -> list[tuple[str, str]]:
    """Why a patch cannot be applied, as (field, message); checked by `validate`. `base`: the
    recipe's directory, where `file` patches are read (None: they are not read here)."""
    out: list[tuple[str, str]] = []
    for i, item in enumerate(_items(raw)):
        where = f"patches[{i}]"
        if not isinstance(item, dict):
            out.append((where, "expected a mapping {checkout, diff or file, sha256}"))
            continue
        if item.get("checkout") not in CHECKOUTS:
            out.append(
                (
                    f"{where}.checkout",
                    f"{item.get('checkout')!r} is not a checkout the training image holds; "
                    f"expected one of {', '.join(CHECKOUTS)}",
                )
            )
        text, why = _read(item, base, i)
        if why:
            out.append((where, why))
            continue
        if text is None:
            continue  # a file, checked by load_recipe where the recipe's directory is known
        got = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if got != item.get("sha256"):
            out.append(
                (
                    f"{where}.sha256",
                    f"{item.get('sha256')!r}, but the patch's bytes hash to {got}; expected the "
                    "sha256 of the diff as written",
                )
            )
        elif not re.search(r"^(---|\+\+\+|diff --git) ", text, re.M):
            out.append((where, "is not a unified diff (no '---', '+++' or 'diff --git' line)"))
    return out


def resolved(raw: dict[str, Any], path: Path) -> list[Patch]:
    """The patches of the recipe `raw` read from the file at `path`, bytes read (load_recipe
    checked them: problems()); inputs/recipe.py's Recipe.patches, read once."""
    out = []
    for i, item in enumerate(_items(raw)):
        text, why = _read(item, path.parent, i)
        if why or text is None:
            raise BadInput(f"{path}: patches[{i}]: {why}")
        name = str(item.get("name") or f"patch-{i}")
        out.append(Patch(i, name, item["checkout"], text, item["sha256"]))
    return out


def refuse_unappliable(patches: Sequence[Patch], where: Path, profile: Profile) -> None:
    """BadInput, before anything is paid for, where the target cannot apply the patches of the
    recipe at `where`."""
    if not patches:
        return
    why = None
    if profile.kind == "ray":
        why = (
            "a Ray cluster's nodes are the image, and one job cannot patch every node's checkout "
            "before miles is imported"
        )
    elif profile.runtime != "docker":
        why = (
            "runtime: host runs in the node's own checkout, which a patch would change for every "
            "later run"
        )
    if why:
        raise BadInput(
            f"{where}: {len(patches)} patch(es) in `patches`, but --cluster "
            f"{profile.name} cannot apply them: {why}. Nothing was started.",
            hint="Use a profile with runtime: docker (each run's container gets its own copy), "
            "or an image with the patches already applied.",
        )


def patches_for_plan(patches: Sequence[Patch]) -> list[dict[str, Any]]:
    """plan.json's `patches`: what the node applies (name, checkout, sha256)."""
    return [p.to_dict() for p in patches]


def header_lines(patches: Sequence[Patch]) -> list[str]:
    """The dry run's line on the patches (without '# ')."""
    if not patches:
        return ["patches   none (the image's checkouts as they are)"]
    listed = ", ".join(f"{p.name} -> {p.checkout} (sha256 {p.sha256[:12]})" for p in patches)
    return [f"patches   {len(patches)} applied in the container before training: {listed}"]


APPLY_FN = r"""_apply_patch() {  # checkout, sha256, name; the diff on stdin
  local file got
  file="$(mktemp)"
  cat > "$file"
  got="$(sha256sum "$file" | cut -d' ' -f1)"
  if [ "$got" != "$2" ]; then echo "patch $3: its bytes hash to $got, the recipe says $2" >&2; exit 1; fi
  if [ ! -d "$1" ]; then echo "patch $3: $1 is not a checkout in this image" >&2; exit 1; fi
  if ! (cd "$1" && git apply --check "$file"); then
    echo "patch $3 does not apply to $1 ($(git -C "$1" rev-parse HEAD 2>/dev/null || echo 'not a git checkout'))" >&2
    exit 1
  fi
  (cd "$1" && git apply "$file")
  rm -f "$file"
  echo "reproduce: patch $3 applied to $1 (sha256 $2)"
}"""  # noqa: E501 - bash, as node.sh prints it


def apply_lines(patches: Sequence[Patch]) -> list[str]:
    """node.sh's part (in the training container, before the ray stage): every patch checked by
    its hash and applied, in order. Empty without patches, so other recipes' scripts are as they
    were. Plain bash; every value quoted."""
    if not patches:
        return []
    lines = [
        "# ---- the recipe's patches: each checked by its sha256 and applied before training",
        "command -v git >/dev/null || { echo 'the image has no git: the recipe patches "
        "cannot be applied' >&2; exit 1; }",
        APPLY_FN,
    ]
    q = shlex.quote
    for p in patches:
        lines.append(
            f"printf '%s' {q(p.text)} | _apply_patch {q(p.checkout)} {q(p.sha256)} {q(p.name)}"
        )
    return lines
