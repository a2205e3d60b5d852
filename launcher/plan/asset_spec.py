"""A recipe's assets as the node programs' spec (scripts/asset_spec.py reads it).

The recipe states some of what the rows need in prose: the seed's `workload.dataset.build.
tokenizer` is "Qwen3-32B (revision 9216db57...; tokenizer.json sha256 aeb1...; tokenizer_config
.json sha256 d5d0...), byte-identical to Qwen3-30B-A3B's at revision ad44e777...". That text is
parsed here, once, into the files to fetch, the sha256 each must have, and the repos that may
supply them. A structured twin of the field (`tokenizer_files`, proposed for the schema in
docs/assets.md) wins when a recipe has it. What cannot be parsed makes the rows unbuildable on a
node (`build_problem`), which the resolve stage reports in the first minute unless the rows come
from a cache or a store.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.inputs.recipe import Recipe
from launcher.plan.nodelib import node_module

# What a run makes at the top of its cache_dir, and nothing else may be there: the cache is mounted
# into every container, so a cache_dir that is a home or system directory would show the recipe's
# code its keys and credentials (cache_entries_check, below, refuses it on the node).
CACHE_ENTRIES = (".incoming", "hf", "rows", "tokenizers", "torch_dist")
DEFAULT_DATASET_FILES = ("*.parquet",)  # what build_sft_rows reads from a dataset snapshot
HEX40 = r"[0-9a-f]{40}"
HEX64 = r"[0-9a-f]{64}"
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.\-/]*[A-Za-z0-9]"
_FILE_SHA = re.compile(rf"([A-Za-z0-9_.\-]+\.[A-Za-z0-9]+)\s+sha-?256[:=\s]+({HEX64})", re.I)
_REVISION = re.compile(rf"revision[:=\s]+({HEX40})", re.I)
_SAME_AS = re.compile(
    rf"(?:byte-identical|identical|same)\s+(?:to|as)\s+({_NAME})(?:'s)?\s+(?:tokenizer\s+)?"
    rf"at\s+revision[:=\s]+({HEX40})",
    re.I,
)
_HF_URL = re.compile(r"https?://huggingface\.co/(?:(datasets)/)?([^/\s]+/[^/\s?#]+)")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class TokenizerPin:
    """Tokenizer files by sha256 and the Hub repos (in order) that may supply them."""

    files: dict[str, str]
    sources: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _repo_for(name: str, checkpoint: tuple[str, str | None] | None) -> tuple[str, str | None]:
    """OWNER/NAME for a name the prose gives without its owner (a note says so), else as is."""
    if "/" in name:
        return name, None
    if checkpoint:
        owner, ckpt_name = checkpoint[0].split("/", 1)
        if name == ckpt_name:
            return checkpoint[0], None
        return f"{owner}/{name}", f"{name}: owner {owner} taken from the checkpoint's repo"
    raise ValueError(f"{name!r} names no owner and the recipe names no Hugging Face checkpoint")


def parse_tokenizer(
    text: str | Mapping[str, Any], checkpoint: tuple[str, str | None] | None
) -> TokenizerPin:
    """The pin in `workload.dataset.build.tokenizer` (prose) or `tokenizer_files` (structured)."""
    if isinstance(text, Mapping):
        pinned = {str(k): str(v).lower() for k, v in (text.get("sha256") or {}).items()}
        given = [{"repo": str(text["repo"]), "revision": str(text["revision"])}]
        given += [
            {"repo": str(a["repo"]), "revision": str(a["revision"])} for a in text.get("also") or []
        ]
        if not pinned:
            raise ValueError("tokenizer_files names no file sha256")
        return TokenizerPin(pinned, given)
    files = {name: digest.lower() for name, digest in _FILE_SHA.findall(text)}
    if not files:
        raise ValueError(f"no 'FILE sha256 HEX' in {text[:120]!r}")
    m = re.match(rf"\s*({_NAME})", text)
    head_rev = _REVISION.search(text)
    same = list(_SAME_AS.finditer(text))
    sources: list[dict[str, str]] = []
    notes: list[str] = []
    if m and head_rev and (not same or head_rev.start() < same[0].start()):
        repo, note = _repo_for(m.group(1), checkpoint)
        sources.append({"repo": repo, "revision": head_rev.group(1)})
        notes += [note] if note else []
    for s in same:
        repo, note = _repo_for(s.group(1), checkpoint)
        sources.append({"repo": repo, "revision": s.group(2)})
        notes += [note] if note else []
    if not sources:
        raise ValueError(f"no repo with a 40-hex revision in {text[:120]!r}")
    return TokenizerPin(files, sources, notes)


def dataset_repo(source: str) -> str | None:
    m = _HF_URL.match(source.strip())
    repo = m.group(2) if m else source.strip()
    return repo if _REPO.fullmatch(repo) else None


def _slug(repo: str) -> str:
    return repo.replace("/", "--")


def build_spec(
    recipe: Recipe,
    *,
    cache_dir: str,
    hf_ckpt: str,
    sft_data: str,
    torch_dist: str | None = None,
    converter: Mapping[str, Any] | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """The node programs' spec for RECIPE with these cache paths (the Plan's Assets) and STORE.

    `converter` identifies the conversion (image digest, converter, model args, ranks): with
    `torch_dist` it adds the converted checkpoint, so a store keeps one per conversion.
    """
    cache = cache_dir.rstrip("/") or "/"
    dataset = recipe.dataset
    build = dataset.build
    checkpoint = recipe.hf_model
    assets: list[dict[str, Any]] = []
    problems: list[str] = []

    try:
        pin = parse_tokenizer(build.tokenizer or "", checkpoint)
    except ValueError as err:
        pin = None
        problems.append(f"workload.dataset.build.tokenizer: {err}")
    if pin is not None:
        first = pin.sources[0]
        assets.append(
            {
                "name": "tokenizer",
                "kind": "hf-files",
                "files": pin.files,
                "sources": pin.sources,
                "notes": pin.notes,
                "path": f"{cache}/tokenizers/{_slug(first['repo'])}@{first['revision'][:12]}",
                "field": "workload.dataset.build.tokenizer",
            }
        )

    repo = dataset_repo(dataset.source or "")
    revision = dataset.revision
    if repo and revision:
        assets.append(
            {
                "name": "dataset",
                "kind": "hf-snapshot",
                "repo_type": "dataset",
                "repo": repo,
                "revision": str(revision),
                "include": list(DEFAULT_DATASET_FILES),
                "path": f"{cache}/hf/datasets/{_slug(repo)}@{str(revision)[:12]}",
                "field": "workload.dataset.source/revision",
            }
        )
    else:
        problems.append(
            "workload.dataset: source (a Hugging Face dataset) and revision are needed to build "
            "rows"
        )
    for key in ("rows", "row_tokens", "seed", "loss_mask"):
        if key not in build.stated:
            problems.append(f"workload.dataset.build.{key} is not stated")

    assets.append(
        {
            "name": "rows",
            "kind": "rows",
            "path": sft_data,
            "parquet_sha256": build.parquet_sha256,
            "rows_sha256": dataset.rows_sha256,
            "rows": build.rows,
            "row_tokens": build.row_tokens or recipe.row_tokens,
            "seed": build.seed,
            "loss_mask": build.loss_mask,
            "messages_column": "messages",
            "build_problem": "; ".join(problems) or None,
            "field": "workload.dataset.build",
            "hash_fields": {
                "parquet_sha256": "workload.dataset.build.parquet_sha256",
                "rows_sha256": "workload.dataset.rows_sha256",
            },
        }
    )

    if checkpoint and checkpoint[1]:
        assets.append(
            {
                "name": "hf_ckpt",
                "kind": "hf-snapshot",
                "repo_type": "model",
                "repo": checkpoint[0],
                "revision": checkpoint[1],
                "include": None,
                "path": hf_ckpt,
                "field": "result.active_params.source/revision",
            }
        )
        if torch_dist and converter is not None:
            assets.append(
                {
                    "name": "torch_dist",
                    "kind": "converted",
                    "path": torch_dist,
                    "identity": {
                        "from": {"repo": checkpoint[0], "revision": checkpoint[1]},
                        **dict(converter),
                    },
                    "field": "the conversion of result.active_params' checkpoint",
                }
            )
    return {"format": node_module("asset_spec").SPEC_FORMAT, "store": store, "assets": assets}


def converter_identity(recipe: Recipe, model_args: str) -> dict[str, Any]:
    """What makes two converted checkpoints the same: the image (its converter and Megatron),
    the model arguments and the number of ranks that wrote it."""
    return {
        "image": recipe.image.digest,
        "converter": "miles tools/convert_hf_to_torch_dist.py",
        "model_args": model_args,
        "ranks": recipe.gpus_per_node,
    }


def cache_entries_check(cache_dir: str = "", asset_paths: tuple[str, ...] = ()) -> list[str]:
    """Refuse a cache_dir that holds anything but what runs make there (`CACHE_ENTRIES`, and the
    top entry of any asset path the profile points into the cache): every container mounts the
    whole cache (read-only), so a cache_dir of ~ or /root would show the recipe's code the node's
    SSH keys and cloud credentials (docs/architecture.md, "The trust boundary")."""
    top = cache_dir.rstrip("/") + "/"
    own = {p[len(top) :].split("/")[0] for p in asset_paths if cache_dir and p.startswith(top)}
    names = shlex.quote("|".join(re.escape(n) for n in sorted(set(CACHE_ENTRIES) | own - {""})))
    return [
        "# the cache is mounted into every container: it may hold only what runs make there",
        f'_foreign="$(ls -Aq "$CACHE_DIR" | grep -vxE {names} | head -n 3 | tr '
        "'\\n' ' ')\" || true",
        'if [ -n "$_foreign" ]; then echo "reproduce: refusing cache_dir $CACHE_DIR: it holds what'
        " no run put there (${_foreign}...) and every container would see it; give cache_dir a"
        ' directory of its own" >&2; exit 1; fi',
    ]
