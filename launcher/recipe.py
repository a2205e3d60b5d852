"""Load a recipe file, validate it, and expose the facts the launcher needs.

Validation has two layers: the shape (schema/recipe.schema.yaml, the single source of truth, checked
with jsonschema) and the recipe's consistency with itself (the window inside the run, the tokens of
the window, the layout fitting the GPUs, the variables the `run` block uses). Both report every
problem at once, each naming the file, the field path and what was expected, so a recipe author
fixes a file in one pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import yaml

from launcher import catalog
from launcher.errors import BadInput
from launcher.resources import data_dir

SUPPORTED_SCHEMA_VERSIONS = (1,)

# Variables the launcher binds for the `run` block (docs/miles-log.md).
BOUND_VARIABLES = ("HF_CKPT", "TORCH_DIST", "SFT_DATA")
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


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. `raw` is the mapping as written; the properties are derived facts."""

    path: Path
    raw: dict[str, Any]
    text: str

    # --- identity ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.stem

    @cached_property
    def slug(self) -> str:
        """<model>/<gpu>/<name> when the file lives under recipes/, else the file's stem."""
        parts = self.path.resolve().parts
        if "recipes" in parts:
            idx = len(parts) - 1 - parts[::-1].index("recipes")
            rel = parts[idx + 1 :]
            if rel:
                return (
                    "/".join(rel)[: -len(self.path.suffix)] if self.path.suffix else "/".join(rel)
                )
        return self.path.stem

    @property
    def model(self) -> str:
        return self.raw["model"]

    # --- hardware ---------------------------------------------------------------------------------
    @property
    def gpu_type(self) -> str:
        return self.raw["gpu"]["type"]

    @property
    def gpu_memory_gb(self) -> float | None:
        return self.raw["gpu"].get("memory_gb")

    @property
    def gpu_count(self) -> int:
        return self.raw["gpu"]["count"]

    @property
    def gpus_per_node(self) -> int:
        return self.raw["gpu"]["per_node"]

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

    # --- workload and claim -------------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return self.raw["workload"]["global_batch"]

    @property
    def row_tokens(self) -> int:
        return self.raw["workload"]["row_tokens"]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.row_tokens

    @property
    def window(self) -> tuple[int, int]:
        first, last = self.raw["result"]["window"]
        return first, last

    @property
    def steps_per_run(self) -> int:
        return self.raw["result"]["steps_per_run"]

    @property
    def claim(self) -> dict[str, Any]:
        return self.raw["result"]

    @property
    def claimed_gpu_hours(self) -> float | None:
        return self.raw["result"].get("gpu_hours")

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
        return self.raw["run"]

    @property
    def cuda(self) -> str | None:
        value = self.raw["stack"].get("cuda")
        return str(value) if value is not None else None

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
    def dataset(self) -> dict[str, Any]:
        return dict(self.raw["workload"].get("dataset") or {})


# ------------------------------------------------------------------------------------------------
# Loading


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: faster


class _TextDateLoader(_BaseLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that keeps dates as text: a recipe's `measured: 2026-10-21` is a string field."""


_TextDateLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def read_yaml_mapping(path: Path, what: str) -> tuple[dict[str, Any], str]:
    """Read a YAML file that must hold a mapping; every failure is a BadInput naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what} file.") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory; expected a {what} file (YAML).") from None
    except UnicodeDecodeError as err:
        raise BadInput(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); expected a {what} in YAML."
        ) from None
    except OSError as err:
        raise BadInput(f"{path}: cannot read the {what} file: {err.strerror}.") from None
    try:
        data = yaml.load(text, Loader=_TextDateLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise BadInput(
            f"{path}:{where} not valid YAML ({problem}); expected a {what} mapping."
        ) from None
    if data is None:
        raise BadInput(f"{path}: the file is empty; expected a {what}: a YAML mapping of fields.")
    if not isinstance(data, dict):
        raise BadInput(
            f"{path}: the document is a {_yaml_type(data)}; expected a {what}: a YAML mapping of fields."
        )
    return data, text


def load_recipe(path: str | Path) -> Recipe:
    """Read and fully validate a recipe; raise BadInput listing every problem found."""
    path = Path(path)
    raw, text = read_yaml_mapping(path, "recipe")
    problems = validate_raw(raw)
    if problems:
        raise BadInput(format_problems(path, "recipe", problems))
    return Recipe(path=path, raw=raw, text=text)


def format_problems(path: Path, what: str, problems: list[tuple[str, str]]) -> str:
    lines = [f"{path}: invalid {what}, {len(problems)} problem{'s' if len(problems) != 1 else ''}:"]
    lines += [f"  - {field or '(top level)'}: {message}" for field, message in problems]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Validation


@cache
def recipe_schema() -> dict[str, Any]:
    path = data_dir("schema") / "recipe.schema.yaml"
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_BaseLoader)  # noqa: S506


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
    problems = schema_problems(raw, recipe_schema())
    if problems:
        return problems
    return consistency_problems(raw)


def _versions() -> str:
    return ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)


def _cache_dir() -> Path | None:
    if os.environ.get("REPRODUCE_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reproduce" / "schema-valid"


def _validity_key(raw: dict[str, Any], schema: dict[str, Any]) -> str:
    from launcher import __version__

    blob = json.dumps([__version__, schema, raw], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def schema_problems(raw: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """jsonschema errors turned into (field path, what was expected) pairs.

    A document that once passed (same content, same schema, same launcher version) is remembered
    in the user's cache, so a repeated command skips importing jsonschema (~70 ms of a dry run's
    start). Only passes are cached: every failure is computed and reported afresh.
    """
    cache = _cache_dir()
    key = _validity_key(raw, schema) if cache else ""
    if cache and (cache / key).exists():
        return []
    problems = _jsonschema_problems(raw, schema)
    if cache and not problems:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / key).touch()
        except OSError:
            pass  # a read-only home only costs the speed-up
    return problems


def _jsonschema_problems(raw: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    out: list[tuple[str, str]] = []
    for err in sorted(
        validator.iter_errors(raw), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    ):
        out.extend(_explain(err))
    return out


def field_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _explain(err: Any) -> list[tuple[str, str]]:
    path = field_path(err.absolute_path)
    kind = err.validator
    if "propertyNames" in err.absolute_schema_path:
        return [
            (
                field_path([*err.absolute_path, str(err.instance)]),
                "not a shell variable name; expected letters, "
                "digits and _, not starting with a digit",
            )
        ]
    if kind == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted((err.schema.get("properties") or {}).keys())
        extra = [k for k in err.instance if k not in allowed]
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return [(field_path([*err.absolute_path, k]), f"unknown field{hint}") for k in extra]
    if kind == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        name = missing[0] if missing else "?"
        desc = ((err.schema.get("properties") or {}).get(name) or {}).get("description", "")
        return [
            (
                field_path([*err.absolute_path, name]),
                "missing required field" + (f" ({_short(desc)})" if desc else ""),
            )
        ]
    if kind == "type":
        return [
            (
                path,
                f"expected {_type_words(err.validator_value)}, got {_yaml_type(err.instance)} {_show(err.instance)}",
            )
        ]
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[
            kind
        ]
        return [(path, f"expected a number {op} {err.validator_value}, got {_show(err.instance)}")]
    if kind == "pattern":
        desc = err.schema.get("description") or f"text matching {err.validator_value}"
        return [(path, f"got {_show(err.instance)}; expected {_short(desc)}")]
    if kind == "enum":
        return [
            (
                path,
                f"got {_show(err.instance)}; expected one of {', '.join(map(str, err.validator_value))}",
            )
        ]
    if kind == "const":
        return [(path, f"got {_show(err.instance)}; expected {err.validator_value!r}")]
    if kind in ("minLength",):
        return [(path, "expected non-empty text")]
    if kind in ("minItems", "maxItems", "items", "prefixItems"):
        return [
            (
                path,
                f"got {_show(err.instance)}; expected {_short(err.schema.get('description', err.message))}",
            )
        ]
    if kind == "oneOf" and err.context:
        best = min(err.context, key=lambda e: len(list(e.absolute_path)))
        return [(path, best.message)]
    return [(path, err.message)]


def _type_words(value: Any) -> str:
    names = {
        "object": "a mapping",
        "array": "a list",
        "string": "text",
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
    }
    if isinstance(value, list):
        return " or ".join(names.get(v) or str(v) for v in value)
    return names.get(value, str(value))


def _yaml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    if value is None:
        return "null"
    return type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 160 else text[:157] + "..."


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
        "{repository, digest: sha256:<64 hex>} or '<repository> ... sha256:<64 hex>' in stack.source",
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

    first, last = result["window"]
    steps = result["steps_per_run"]
    if first > last:
        problems.append(
            (
                "result.window",
                f"[{first}, {last}] starts after it ends; expected [first, last] with first <= last",
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
                    f"{last - first + 1} steps x global_batch {workload['global_batch']} x row_tokens "
                    f"{workload['row_tokens']} = {expected}",
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
    ep, etp = layout.get("ep", 1), layout.get("etp", 1)
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

    used, defined = run_variables(raw["run"])
    known = defined | set(raw.get("env") or {}) | set(BOUND_VARIABLES) | AMBIENT_VARIABLES
    for name in sorted(used - known):
        problems.append(
            (
                "run",
                f"uses ${name}, which neither the run block, the env block nor the launcher "
                f"defines; expected one of the launcher's {', '.join('$' + v for v in BOUND_VARIABLES)} "
                "or a variable set in env",
            )
        )
    return problems
