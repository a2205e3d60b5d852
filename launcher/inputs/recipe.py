"""Load a recipe file, validate it, and expose the facts the launcher needs.

Validation has two layers: the shape (schema/recipe.schema.yaml, the single source of truth, checked
with jsonschema) and the recipe's consistency with itself (the window inside the run, the tokens of
the window, the layout fitting the GPUs, the variables the `run` block uses). Both report every
problem at once, each naming the file, the field path and what was expected, so a recipe author
fixes a file in one pass.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import yaml

from launcher import catalog
from launcher.errors import BadInput
from launcher.inputs.claims import claim_problems
from launcher.inputs.envnames import BOUND_VARIABLES, launcher_env_problems
from launcher.inputs.patches import Patch
from launcher.inputs.patches import problems as patch_problems
from launcher.inputs.patches import resolved as resolved_patches
from launcher.inputs.runargs import Arg, run_block_problems
from launcher.inputs.stack import expected_versions, stack_problems, stack_version
from launcher.inputs.yamlschema import (
    FastSafeLoader,
    format_problems,
    read_yaml_mapping,
    schema_problems,
)
from launcher.resources import data_dir

SUPPORTED_SCHEMA_VERSIONS = (1,)

# Variables the `run` block may read without defining them: the container's own environment and
# what the launcher exports around the recipe.
AMBIENT_VARIABLES = frozenset(
    {
        "HOME",
        "PATH",
        "PWD",
        "USER",
        "HOSTNAME",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "NNODES",
        "WORLD_SIZE",
        "RAY_ADDRESS",
        "RANDOM",
        "SECONDS",
        "BASH_SOURCE",
        "RUN_ID",
        "NODE_RUN_DIR",
        "IFS",
    }
)

# The recipe's fields that are blocks of text (a script, a diff, prose): the only ones whose text
# may break lines (launcher/inputs/yamlschema.py, document_problems).
# An env value may too: it reaches node.sh quoted, and a variable may hold several lines.
TEXT_BLOCKS = (("run",), ("notes",), ("patches", "*", "diff"), ("env", "*"))

_DIGEST_RE = re.compile(r"sha256:([0-9a-fA-F]+)")
_REPO_BEFORE_DIGEST_RE = re.compile(
    r"(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)+)"
    r"(?:[ :@](?P<tag>v?[0-9][A-Za-z0-9_.-]*))?"
)
_VAR_REF_RE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_VAR_DEF_RE = re.compile(
    r"(?:^|[\s;(])(?:export\s+|local\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)="
)
_READ_DEF_RE = re.compile(r"\bread\s+(?:-\w+\s+)*([A-Za-z_][A-Za-z0-9_ ]*)")
_FOR_DEF_RE = re.compile(r"\bfor\s+([A-Za-z_][A-Za-z0-9_]*)\s+in\b")


@dataclass(frozen=True)
class Image:
    """The training image, always addressed by digest."""

    repository: str
    digest: str  # "sha256:<64 hex>"
    tag: str | None = None
    source_field: str = "stack.image"

    @property
    def ref(self) -> str:
        """What `docker pull` gets: repository@digest (a tag alone is never trusted)."""
        return f"{self.repository}@{self.digest}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    """An integer field (a bool is not one, though Python says so)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    """A finite number field as written (an int stays an int, so what is copied reads the same);
    NaN or infinity is no number (docs/architecture.md, "Numbers are finite")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _word(value: object) -> str | None:
    """A field shown as text, whatever YAML read it as."""
    return None if value is None else str(value)


def _date_text(value: object) -> str | None:
    """A date as ISO text (YAML reads `measured: 2026-10-21` as a date)."""
    if value is None:
        return None
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _block(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Hardware:
    """The recipe's `gpu` block. None where a field is absent or not of its type: a validated
    recipe has every required one; a run directory's recipe read back may not."""

    type: str | None
    count: int | None
    per_node: int | None
    instance: str | None  # as written: "AWS p5en.48xlarge"
    memory_gb: float | None

    @property
    def stated(self) -> bool:
        """Whether the block states any of these fields."""
        return any(v is not None for v in (self.type, self.count, self.per_node, self.instance))

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Hardware:
        gpu = _block(raw, "gpu")
        return cls(
            type=_text(gpu.get("type")),
            count=_count(gpu.get("count")),
            per_node=_count(gpu.get("per_node")),
            instance=_text(gpu.get("instance")),
            memory_gb=_number(gpu.get("memory_gb")),
        )


@dataclass(frozen=True)
class RowsBuild:
    """`workload.dataset.build`: how the fixed-length rows were built, and their pins."""

    name: str | None = None
    tokenizer: str | None = None
    loss_mask: str | None = None
    rows: int | None = None
    row_tokens: int | None = None
    seed: int | None = None
    parquet_sha256: str | None = None
    parquet_bytes: int | None = None
    stated: frozenset[str] = frozenset()  # the keys the block writes, null or not

    @classmethod
    def of(cls, build: Mapping[str, Any]) -> RowsBuild:
        return cls(
            name=_text(build.get("name")),
            tokenizer=_text(build.get("tokenizer")),
            loss_mask=_text(build.get("loss_mask")),
            rows=_count(build.get("rows")),
            row_tokens=_count(build.get("row_tokens")),
            seed=_count(build.get("seed")),
            parquet_sha256=_text(build.get("parquet_sha256")),
            parquet_bytes=_count(build.get("parquet_bytes")),
            stated=frozenset(k for k, v in build.items() if v is not None),
        )


@dataclass(frozen=True)
class Dataset:
    """`workload.dataset`: the rows' source data set and their build."""

    name: str | None = None
    source: str | None = None
    revision: str | None = None
    license: str | None = None
    rows_sha256: str | None = None
    build: RowsBuild = RowsBuild()
    stated: bool = False  # whether the recipe has the block at all

    @classmethod
    def of(cls, dataset: Mapping[str, Any]) -> Dataset:
        return cls(
            name=_text(dataset.get("name")),
            source=_text(dataset.get("source")),
            revision=_text(dataset.get("revision")),
            license=_text(dataset.get("license")),
            rows_sha256=_text(dataset.get("rows_sha256")),
            build=RowsBuild.of(_block(dataset, "build")),
            stated=bool(dataset),
        )


@dataclass(frozen=True)
class Workload:
    """The recipe's `workload` block: one step is global_batch rows of row_tokens tokens."""

    global_batch: int | None
    row_tokens: int | None
    dataset: Dataset

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Workload:
        workload = _block(raw, "workload")
        return cls(
            global_batch=_count(workload.get("global_batch")),
            row_tokens=_count(workload.get("row_tokens")),
            dataset=Dataset.of(_block(workload, "dataset")),
        )


@dataclass(frozen=True)
class Layout:
    """The recipe's `layout` block: the parallel layout (absent degrees are None)."""

    tp: int | None
    pp: int | None
    cp: int | None
    dp: int | None
    ep: int | None
    etp: int | None
    label: str | None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Layout:
        layout = _block(raw, "layout")
        return cls(
            tp=_count(layout.get("tp")),
            pp=_count(layout.get("pp")),
            cp=_count(layout.get("cp")),
            dp=_count(layout.get("dp")),
            ep=_count(layout.get("ep")),
            etp=_count(layout.get("etp")),
            label=_text(layout.get("label")),
        )


# The claimed figures of `result`, by the name the result and the verdict give them.
FIGURES = (
    "tokens_per_s_per_gpu",
    "step_time_cv_percent",
    "mfu",
    "usd_per_million_tokens",
    "gpu_hours",
)


@dataclass(frozen=True)
class Claim:
    """The recipe's `result` block: what it claims, and over which steps."""

    tokens_per_s_per_gpu: float | None
    step_time_cv_percent: float | None
    mfu: float | None
    usd_per_million_tokens: float | None
    gpu_hours: float | None
    window: tuple[int, int] | None  # None: absent, or not two integer steps
    window_tokens: int | None
    steps_per_run: int | None
    runs: int | None
    measured: str | None  # the date the claim was measured on
    active_params: int | None  # active_params.count
    active_params_source: str | None
    active_params_revision: str | None
    written: tuple[str, ...]  # the fields `result` writes (null ones too), in its order

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Claim:
        return cls.of_block(_block(raw, "result"))

    @classmethod
    def of_block(cls, result: Mapping[str, Any]) -> Claim:
        """The claim of a `result` block alone (a verdict's `claimed` has its shape)."""
        window = result.get("window")
        pair = (
            (window[0], window[1])
            if isinstance(window, list | tuple)
            and len(window) == 2
            and all(_count(w) is not None for w in window)
            else None
        )
        params = _block(result, "active_params")
        measured = result.get("measured")
        return cls(
            tokens_per_s_per_gpu=_number(result.get("tokens_per_s_per_gpu")),
            step_time_cv_percent=_number(result.get("step_time_cv_percent")),
            mfu=_number(result.get("mfu")),
            usd_per_million_tokens=_number(result.get("usd_per_million_tokens")),
            gpu_hours=_number(result.get("gpu_hours")),
            window=pair,
            window_tokens=_count(result.get("window_tokens")),
            steps_per_run=_count(result.get("steps_per_run")),
            runs=_count(result.get("runs")),
            measured=_date_text(measured),
            active_params=_count(params.get("count")),
            active_params_source=_text(params.get("source")),
            active_params_revision=_text(params.get("revision")),
            written=tuple(str(k) for k in result),
        )

    def stated(self, name: str) -> float | list[int] | str | None:
        """A field of `result` by its name, typed (the window as a list): for the records that
        copy the claim beside the measured figures (the attestation's predicate)."""
        fields: dict[str, float | list[int] | str | None] = {
            "window": list(self.window) if self.window is not None else None,
            "window_tokens": self.window_tokens,
            "steps_per_run": self.steps_per_run,
            "measured": self.measured,
        }
        return fields[name] if name in fields else self.figure(name)

    def figure(self, name: str) -> float | None:
        """One claimed figure of FIGURES by its name (the tables that show them side by side)."""
        figures: dict[str, float | None] = {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_cv_percent": self.step_time_cv_percent,
            "mfu": self.mfu,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "gpu_hours": self.gpu_hours,
        }
        return figures[name]


Scalar = str | int | float | bool | None


def _scalar(value: object) -> Scalar:
    return value if isinstance(value, str | int | float | bool) else None


@dataclass(frozen=True)
class Stack:
    """The recipe's `stack` block as the card states it: each component's version text in the
    order written (a nested value is not a version and is left out), and how they were read."""

    stated: bool  # the block holds anything at all
    versions: tuple[tuple[str, Scalar], ...] = ()  # (component, its text), `source` apart
    source: str | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Stack:
        block = _block(raw, "stack")
        return cls(
            stated=bool(block),
            versions=tuple(
                (str(k), _scalar(v))
                for k, v in block.items()
                if k != "source" and not isinstance(v, dict | list)
            ),
            source=_text(block.get("source")),
        )


@dataclass(frozen=True)
class Convergence:
    """The card's own convergence check (`correctness.convergence`): its figures as published,
    None where one is not stated."""

    stated: bool
    correlation: Scalar = None
    final_loss_difference: Scalar = None
    pointwise_failures: Scalar = None
    steps: Scalar = None
    result: Scalar = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Convergence:
        block = _block(_block(raw, "correctness"), "convergence")
        return cls(
            stated=bool(block),
            correlation=_scalar(block.get("correlation")),
            final_loss_difference=_scalar(block.get("final_loss_difference")),
            pointwise_failures=_scalar(block.get("pointwise_failures")),
            steps=_scalar(block.get("steps")),
            result=_scalar(block.get("result")),
        )


@dataclass(frozen=True)
class Sections:
    """A recipe mapping's typed sections: a validated recipe's (Recipe.sections), or the copy a
    run directory or a bundle holds, read back unvalidated (every field None where it is not of
    its type), so no reader outside inputs/ reads a recipe by key."""

    model: str | None
    author: str | None
    status: str | None
    hardware: Hardware
    workload: Workload
    layout: Layout
    claim: Claim
    stack: Stack
    convergence: Convergence
    stated: bool = True  # False: the mapping was empty (no recipe.yaml, or not a mapping)
    # The informational fields it states, (path, text) in recipe_fields.FIELDS' order: what the
    # report page shows verbatim ("The recipe card as written").
    shown: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Sections:
        from launcher.inputs.recipe_fields import card_rows

        status = raw.get("status")
        model = raw.get("model")
        return cls(
            model=None if model is None else str(model),
            author=_word(_block(raw, "author").get("name")),
            status=None if status is None else str(status),
            hardware=Hardware.of(raw),
            workload=Workload.of(raw),
            layout=Layout.of(raw),
            claim=Claim.of(raw),
            stack=Stack.of(raw),
            convergence=Convergence.of(raw),
            stated=bool(raw),
            shown=tuple(card_rows(raw)),
        )

    @classmethod
    def of_copy(cls, document: object) -> Sections:
        """The sections of a recipe read back from a file (a run directory's recipe.yaml, a
        bundle's): whatever the file held, a mapping or not (not one: every section empty)."""
        return cls.of(document if isinstance(document, dict) else {})


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. `raw` is the mapping as written, kept for what is written back (the
    content hash, the run directory's copy) and for inputs/'s own checks; every reader outside
    inputs/ reads the typed sections (`hardware`, `workload`, `layout`, `claim`), built once."""

    path: Path
    raw: dict[str, Any]
    text: str

    # --- identity ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.stem

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 of the recipe's content (its fields, canonically ordered), not of its bytes."""
        return content_hash(self.raw)

    @cached_property
    def slug(self) -> str:
        """The recipe's identity: `<model>/<gpu>/<layout label>-<10 hex of its content>`.

        Derived from what the recipe says, never from where the file lies: two recipes with the
        same file name get two slugs, and one recipe copied anywhere keeps its slug. A comment or
        formatting change keeps it; any change of a field makes another recipe (another history).
        """
        return recipe_slug(self.raw)

    @property
    def model(self) -> str:
        return str(self.raw["model"])

    # --- hardware ---------------------------------------------------------------------------------
    @property
    def gpu_type(self) -> str:
        return str(self.raw["gpu"]["type"])

    @property
    def gpu_memory_gb(self) -> float | None:
        return self.hardware.memory_gb

    @property
    def gpu_count(self) -> int:
        return int(self.raw["gpu"]["count"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.raw["gpu"]["per_node"])

    @property
    def nodes(self) -> int:
        return self.gpu_count // self.gpus_per_node

    @property
    def provider(self) -> str | None:
        """ "aws" for "AWS p5en.48xlarge"; None when gpu.instance names no provider."""
        return catalog.split_instance(self.raw["gpu"].get("instance"))[0]

    @property
    def instance_type(self) -> str | None:
        """ "p5en.48xlarge" for "AWS p5en.48xlarge"."""
        return catalog.split_instance(self.raw["gpu"].get("instance"))[1]

    @property
    def gpu_spec(self) -> catalog.Gpu | None:
        """The catalog's entry for gpu.type (its peak is MFU's denominator); None when unknown."""
        return catalog.gpu(self.raw["gpu"].get("type"))

    # --- workload and claim ---------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return int(self.raw["workload"]["global_batch"])

    @property
    def row_tokens(self) -> int:
        return int(self.raw["workload"]["row_tokens"])

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.row_tokens

    @property
    def window(self) -> tuple[int, int]:
        first, last = self.raw["result"]["window"]
        return first, last

    @property
    def steps_per_run(self) -> int:
        return int(self.raw["result"]["steps_per_run"])

    @cached_property
    def patches(self) -> tuple[Patch, ...]:
        """The recipe's patches, their bytes read once (load_recipe checked them)."""
        return tuple(resolved_patches(self.raw, self.path))

    @cached_property
    def sections(self) -> Sections:
        """The typed sections, built once from the mapping."""
        return Sections.of(self.raw)

    @property
    def claim(self) -> Claim:
        return self.sections.claim

    @property
    def hardware(self) -> Hardware:
        return self.sections.hardware

    @property
    def workload(self) -> Workload:
        return self.sections.workload

    @property
    def layout(self) -> Layout:
        return self.sections.layout

    @property
    def stack_source(self) -> str:
        """stack.source as written: the prose that names the image and its stack."""
        return str(_block(self.raw, "stack").get("source") or "")

    @property
    def expected_versions(self) -> dict[str, str]:
        """The stack versions the recipe pins, as the stack probe compares them."""
        return expected_versions(self.raw["stack"])

    def expected_argument(self, arg: Arg) -> Any:
        """The value the recipe's field gives miles' argument ARG (None: not stated)."""
        return arg.expected(self.raw)

    def derived_argument(self, arg: Arg, printed: Callable[[str], Any]) -> tuple[Any, str]:
        """What miles derives for ARG after printing None, from the printed arguments."""
        assert arg.derived is not None
        return arg.derived(self.raw, printed)

    @property
    def claimed_gpu_hours(self) -> float | None:
        return self.claim.gpu_hours

    @property
    def active_params(self) -> int | None:
        """result.active_params.count: N in MFU = 6 x N x tokens/s per GPU / peak."""
        params = (self.raw.get("result") or {}).get("active_params")
        return params.get("count") if isinstance(params, dict) else None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.raw.get("env") or {})

    @property
    def run_script(self) -> str:
        return str(self.raw["run"])

    @property
    def cuda(self) -> str | None:
        """The CUDA version stack.cuda leads with ('13.0'), the one the node is given."""
        return stack_version(self.raw["stack"], "cuda")

    @cached_property
    def image(self) -> Image:
        image = extract_image(self.raw["stack"])
        assert image is not None  # validate() refuses recipes without one
        return image

    @property
    def hf_model(self) -> tuple[str, str | None] | None:
        """(repo id, revision) of the Hugging Face checkpoint, from result.active_params."""
        params = self.raw["result"].get("active_params") or {}
        source = params.get("source") or ""
        m = re.match(r"https?://huggingface\.co/([^/\s]+/[^/\s?#]+)", source)
        if not m:
            return None
        return m.group(1), params.get("revision")

    @property
    def dataset(self) -> Dataset:
        return self.workload.dataset


# ------------------------------------------------------------------------------------------------
# Identity

SLUG_HASH_CHARS = 10


def content_hash(raw: dict[str, Any]) -> str:
    blob = json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _slug_part(text: object, fallback: str) -> str:
    part = re.sub(r"[^a-z0-9.]+", "-", str(text or "").lower()).strip("-.")
    return part or fallback


def recipe_slug(raw: dict[str, Any]) -> str:
    """See Recipe.slug. The layout part is its label, else tp/pp/cp/ep/dp spelled out."""
    layout = raw.get("layout") or {}
    label = layout.get("label") or "-".join(
        f"{k}{layout.get(k) or 1}" for k in ("tp", "pp", "cp", "ep", "dp")
    )
    gpu = raw.get("gpu") or {}
    return "/".join(
        (
            _slug_part(raw.get("model"), "model"),
            _slug_part(gpu.get("type"), "gpu"),
            f"{_slug_part(label, 'layout')}-{content_hash(raw)[:SLUG_HASH_CHARS]}",
        )
    )


# ------------------------------------------------------------------------------------------------
# Loading


def load_recipe(path: str | Path) -> Recipe:
    """Read and fully validate a recipe; raise BadInput listing every problem found."""
    path = Path(path)
    raw, text = read_yaml_mapping(path, "recipe")
    problems = validate_raw(raw)
    if not problems:
        problems = patch_problems(raw, path.parent)  # the patches' files, beside the recipe
    if problems:
        raise BadInput(format_problems(path, "recipe", problems))
    return Recipe(path=path, raw=raw, text=text)


# ------------------------------------------------------------------------------------------------
# Validation


@cache
def recipe_schema() -> dict[str, Any]:
    path = data_dir("schema") / "recipe.schema.yaml"
    schema: dict[str, Any] = yaml.load(path.read_text(encoding="utf-8"), Loader=FastSafeLoader)  # noqa: S506
    return schema


def validate_raw(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """All problems of a recipe mapping as (field path, message); empty when valid."""
    version = raw.get("schema_version")
    if version is None:
        return [
            ("schema_version", f"missing; expected one of the supported versions {_versions()}")
        ]
    if isinstance(version, bool) or version not in SUPPORTED_SCHEMA_VERSIONS:
        return [
            (
                "schema_version",
                f"unsupported version {version!r}; this reproduce supports {_versions()}",
            )
        ]
    problems = schema_problems(raw, recipe_schema(), TEXT_BLOCKS)
    if problems:
        return problems
    return consistency_problems(raw)


def _versions() -> str:
    return ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)


def extract_image(stack: dict[str, Any]) -> Image | None:
    """The training image: stack.image when given, else repository and digest named in stack.source.

    The seed names its image only in prose ("radixark/miles v0.1.0 (amd64 digest sha256:...)"), so
    the repository is the last image-like name before the digest in that text.
    """
    image = stack.get("image")
    if isinstance(image, dict) and image.get("repository") and image.get("digest"):
        return Image(image["repository"], image["digest"], image.get("tag"), "stack.image")
    source = stack.get("source")
    if not isinstance(source, str):
        return None
    m = _DIGEST_RE.search(source)
    if not m or not re.fullmatch(r"[0-9a-f]{64}", m.group(1)):
        return None
    before = source[: m.start()]
    candidates = list(_REPO_BEFORE_DIGEST_RE.finditer(before))
    if not candidates:
        return None
    last = candidates[-1]
    return Image(last.group("repo"), f"sha256:{m.group(1)}", last.group("tag"), "stack.source")


def _image_problem(stack: dict[str, Any]) -> tuple[str, str] | None:
    if extract_image(stack) is not None:
        return None
    source = stack.get("source") or ""
    m = _DIGEST_RE.search(source) if isinstance(source, str) else None
    if m and not re.fullmatch(r"[0-9a-f]{64}", m.group(1)):
        return (
            "stack.source",
            f"names digest 'sha256:{m.group(1)}', which is not a full digest; "
            "expected sha256: followed by 64 lowercase hex characters",
        )
    if m:
        return (
            "stack.source",
            "names a digest but no image repository before it; expected "
            "'<repository> ... sha256:<64 hex>' or a structured stack.image",
        )
    return (
        "stack.image",
        "missing, and stack.source names no image digest; expected stack.image "
        "{repository, digest: sha256:<64 hex>} or '<repository> ... sha256:<64 hex>' "
        "in stack.source",
    )


def run_variables(run: str) -> tuple[set[str], set[str]]:
    """(variables the run block reads, variables it defines itself)."""
    used = set(_VAR_REF_RE.findall(run))
    defined = set(_VAR_DEF_RE.findall(run)) | set(_FOR_DEF_RE.findall(run))
    for names in _READ_DEF_RE.findall(run):
        defined.update(n for n in names.split() if n)
    return used, defined


def consistency_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Checks that relate fields to each other (run only on a recipe of the right shape)."""
    problems: list[tuple[str, str]] = []
    gpu, result, layout, workload = raw["gpu"], raw["result"], raw["layout"], raw["workload"]

    if gpu["count"] % gpu["per_node"]:
        problems.append(
            (
                "gpu.count",
                f"{gpu['count']} GPUs is not a whole number of nodes of "
                f"gpu.per_node={gpu['per_node']}; expected a multiple of per_node",
            )
        )

    problems += catalog.instance_problems(gpu)
    problems += claim_problems(raw)

    first, last = result["window"]
    steps = result["steps_per_run"]
    if first > last:
        problems.append(
            (
                "result.window",
                f"[{first}, {last}] starts after it ends; "
                "expected [first, last] with first <= last",
            )
        )
    elif last >= steps:
        problems.append(
            (
                "result.window",
                f"[{first}, {last}] ends outside the run; steps are 0..{steps - 1} "
                f"(result.steps_per_run={steps}), so expected last <= {steps - 1}",
            )
        )
    elif "window_tokens" in result:
        expected = (last - first + 1) * workload["global_batch"] * workload["row_tokens"]
        if result["window_tokens"] != expected:
            problems.append(
                (
                    "result.window_tokens",
                    f"{result['window_tokens']} does not match the window: "
                    f"{last - first + 1} steps x global_batch {workload['global_batch']} "
                    f"x row_tokens {workload['row_tokens']} = {expected}",
                )
            )

    product = layout["tp"] * layout["pp"] * layout["cp"] * layout["dp"]
    if product != gpu["count"]:
        problems.append(
            (
                "layout",
                f"tp x pp x cp x dp = {layout['tp']} x {layout['pp']} x {layout['cp']} x "
                f"{layout['dp']} = {product}, but gpu.count is {gpu['count']}; expected them equal",
            )
        )
    ep, etp = layout.get("ep") or 1, layout.get("etp") or 1
    per_stage = gpu["count"] // layout["pp"] if gpu["count"] % layout["pp"] == 0 else None
    if per_stage is None or per_stage % (ep * etp):
        problems.append(
            (
                "layout.ep",
                f"ep x etp = {ep * etp} does not divide the {gpu['count']} GPUs / pp "
                f"{layout['pp']}; expected a divisor",
            )
        )

    build_rows = ((workload.get("dataset") or {}).get("build") or {}).get("row_tokens")
    if build_rows is not None and build_rows != workload["row_tokens"]:
        problems.append(
            (
                "workload.dataset.build.row_tokens",
                f"{build_rows} differs from workload.row_tokens "
                f"{workload['row_tokens']}; expected the same",
            )
        )

    image_problem = _image_problem(raw["stack"])
    if image_problem:
        problems.append(image_problem)
    problems += stack_problems(raw["stack"])
    problems += _path_problems(raw)
    problems += launcher_env_problems(raw.get("env") or {})
    problems += run_block_problems(raw)
    problems += patch_problems(raw, None)  # inline diffs; load_recipe reads the files

    used, defined = run_variables(raw["run"])
    known = defined | set(raw.get("env") or {}) | set(BOUND_VARIABLES) | AMBIENT_VARIABLES
    for name in sorted(used - known):
        problems.append(
            (
                "run",
                f"uses ${name}, which neither the run block, the env block nor the launcher "
                "defines; expected one of the launcher's "
                f"{', '.join('$' + v for v in BOUND_VARIABLES)} or a variable set in env",
            )
        )
    return problems


_SAFE_PART = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HF_MODEL_URL = re.compile(r"https?://huggingface\.co/([^/\s]+)/([^/\s?#]+)")
_HF_DATASET_URL = re.compile(r"https?://huggingface\.co/(?:datasets/)?([^/\s]+)/([^/\s?#]+)")
_OWNER_NAME = re.compile(r"([^/\s]+)/([^/\s]+)")
PATH_MARK = "x-reaches-path"


def path_fields(
    schema: dict[str, Any], raw: object, where: tuple[str, ...] = ()
) -> list[tuple[str, str, Any]]:
    """(field, kind, value) for every field of RAW whose schema carries `x-reaches-path`: a
    walk of the schema's properties, so a field marked there is checked without a list here."""
    found: list[tuple[str, str, Any]] = []
    if PATH_MARK in schema and raw is not None:
        found.append((".".join(where), str(schema[PATH_MARK]), raw))
    if isinstance(raw, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in raw:
                found += path_fields(sub, raw[key], (*where, key))
    return found


def _repo_parts(kind: str, text: str) -> tuple[str, str] | None:
    """(OWNER, NAME) of the repository TEXT names, as the asset spec reads it, or None."""
    text = text.strip()
    m = (_HF_MODEL_URL if kind == "hf-url" else _HF_DATASET_URL).match(text)
    if m is None and kind == "dataset-repo":
        m = _OWNER_NAME.fullmatch(text)
    return (m.group(1), m.group(2)) if m else None


def _path_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Recipe text that names a directory of the node's cache or a key of the asset store must be
    safe path components (no '/', no '..'): every field the schema marks, checked here alone."""
    problems: list[tuple[str, str]] = []
    params = (raw.get("result") or {}).get("active_params") or {}
    has_hf_model = bool(_HF_MODEL_URL.match(str(params.get("source") or "")))
    for field, kind, value in path_fields(recipe_schema(), raw):
        text = str(value)
        if kind == "component":
            if not _SAFE_PART.fullmatch(text):
                problems.append(
                    (
                        field,
                        f"{text!r} names a directory of the node's cache and a key of the asset "
                        "store, so it must be one path component: letters, digits, '.', '_', "
                        "'-', not starting with '.', without '/' or '..'",
                    )
                )
        elif kind in ("hf-url", "dataset-repo"):
            parts = _repo_parts(kind, text)
            if parts is None:
                continue  # names no repository (prose, a model without a URL): no path
            bad = [part for part in parts if not _SAFE_PART.fullmatch(part)]
            if bad:
                problems.append(
                    (
                        field,
                        f"names the Hugging Face repository {parts[0]}/{parts[1]}, whose part "
                        f"{bad[0]!r} is not a repository name (letters, digits, '.', '_', '-'; "
                        "no '..'); it would name a cache directory and a store key",
                    )
                )
        elif kind == "model-dir":
            if not has_hf_model and not _SAFE_PART.fullmatch(text):
                problems.append(
                    (
                        field,
                        f"{text!r} names the checkpoint's cache directory (no Hugging Face model "
                        "in result.active_params.source), so it must be letters, digits, '.', "
                        "'_', '-', without '/' or '..'",
                    )
                )
        else:  # a mark this launcher does not know: refuse rather than let a path through
            problems.append((field, f"the schema marks it {PATH_MARK}: {kind}, an unknown kind"))
    return problems
