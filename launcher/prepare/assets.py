"""`reproduce prepare`: a recipe's assets into a store, on any machine, never a GPU.

The node programs do the work (scripts/node_assets.py and its modules): this module decides the
order and reports. First everything is resolved (a revision that does not exist, a gated repo
without HF_TOKEN or an unreadable store fails before a byte is downloaded); then the cheapest
first: the tokenizer files and the dataset, the rows (built and checked against the recipe's
hashes), and only then the checkpoint, the biggest download. Each asset is uploaded with its
manifest as soon as it is complete and verified. A re-run skips what the store already lists,
keeps what the work directory already holds (re-checked by sha256), resumes partial downloads
and continues unfinished multipart uploads.

The rows build in the recipe's image (`--rows-builder docker`) sees the work directory read-only
and writes only into a fresh, empty directory of its own; the host checks what it left (no
links, regular files of ours, the recipe's parquet_sha256) before the rows take their name
(docs/architecture.md, "The trust boundary").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from launcher.errors import BadInput, CheckFailed, InfraError
from launcher.inputs.recipe import Recipe
from launcher.plan.asset_spec import CACHE_ENTRIES, build_spec
from launcher.plan.nodelib import node_module
from launcher.prepare import dockercli
from launcher.records import jsonread
from launcher.records.atomic import write_atomic

ROWS_BUILDERS = ("auto", "host", "docker", "skip")
# Tests only: more `docker run` options for the rows build (the test image lends the host's /usr
# and venv through read-only mounts: tests/infra/docker.py). A JSON list of strings.
TEST_DOCKER_ARGS_ENV = "REPRODUCE_TEST_DOCKER_ARGS"


class Events(Protocol):
    """What prepare reports; launcher/commands/prepare.py shows it (rich bars or plain lines)."""

    def say(self, text: str) -> None: ...

    def progress(self, asset: str, path: str, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class PrepareOptions:
    store: str
    work_dir: Path
    rows_file: Path | None = None
    rows_builder: str = "auto"
    encoder: str | None = None  # builtin:whitespace-test, for tests only
    threads: int = 8
    # asks the person at the terminal a yes/no question (None: nobody to ask)
    confirm: Callable[[str], bool] | None = None


def _slug(repo: str) -> str:
    return repo.replace("/", "--")


def work_spec(recipe: Recipe, options: PrepareOptions) -> dict[str, Any]:
    """The spec with the work directory as the cache (the same layout a node's cache has)."""
    work = str(options.work_dir.resolve())
    ckpt = recipe.hf_model
    tag = f"{_slug(ckpt[0])}@{(ckpt[1] or 'main')[:12]}" if ckpt else recipe.model
    build = recipe.dataset.build
    sha = build.parquet_sha256
    rows_name = f"{build.name or 'rows'}" + (f"-{sha[:12]}" if sha else "")
    return build_spec(
        recipe,
        cache_dir=work,
        hf_ckpt=f"{work}/hf/{tag}",
        sft_data=f"{work}/rows/{rows_name}.parquet",
        store=options.store,
    )


def check_store(url: str) -> None:
    """BadInput for a store URL no client can use; a directory store is created."""
    store_mod = node_module("asset_store")
    if not url.startswith("s3://") and "://" not in url:
        Path(url).expanduser().mkdir(parents=True, exist_ok=True)
    try:
        store_mod.open_store(url)
    except store_mod.StoreError as err:
        raise BadInput(f"--store: {err}") from None


def prepare(recipe: Recipe, options: PrepareOptions, events: Events) -> dict[str, str]:
    """Put RECIPE's assets into the store; returns what happened to each asset."""
    if options.rows_builder not in ROWS_BUILDERS:
        raise BadInput(
            f"--rows-builder {options.rows_builder!r}: one of {', '.join(ROWS_BUILDERS)}"
        )
    check_store(options.store)
    resolve_mod = node_module("asset_resolve")
    spec = work_spec(recipe, options)
    by_name = {a["name"]: a for a in spec["assets"]}
    if "hf_ckpt" not in by_name:
        raise BadInput(f"{recipe.path}: result.active_params names no Hugging Face checkpoint")
    work = options.work_dir.resolve()
    _own_work_dir(work)
    work.mkdir(parents=True, exist_ok=True)
    if options.rows_file is not None:
        _adopt_rows(Path(options.rows_file), by_name["rows"])
    if options.rows_builder == "skip":
        by_name["rows"]["build_problem"] = "--rows-builder skip"
    spec_path = work / "spec.json"
    write_atomic(spec_path, json.dumps(spec, indent=1, sort_keys=True) + "\n")

    events.say(f"resolving {recipe.slug}'s assets against {options.store} ...")
    plan = _run(lambda: resolve_mod.resolve(spec, full=True, threads=options.threads))
    write_atomic(work / "plan.json", json.dumps(plan, indent=1, sort_keys=True) + "\n")
    unreachable = hub_unreachable(plan)
    for name, step in plan["assets"].items():
        if step["source"]:
            events.say(f"  {name}: {step['source']}: {step.get('detail') or ''}")
        elif not unreachable:  # offline, the one cause is said once, below
            events.say(f"  {name}: NONE: {'; '.join(step['tried'])}")
    problems = [
        p for p in plan["problems"] if not (options.rows_builder == "skip" and "asset rows" in p)
    ]
    if problems and unreachable:
        missing = [n for n, st in plan["assets"].items() if not st["source"]]
        raise InfraError(
            f"the Hugging Face Hub cannot be reached from here ({unreachable}), and "
            f"{', '.join(missing)} are neither in the local copy ({work}) nor in the store "
            f"({options.store}). Nothing was downloaded.",
            hint="Run prepare where the Hub can be reached (HF_ENDPOINT names a mirror), or "
            f"fill the store from such a machine first; every place tried: {work / 'plan.json'}.",
        )
    if problems:
        error = InfraError if plan["infra"] else CheckFailed
        raise error("assets cannot be supplied:\n  " + "\n  ".join(problems))
    rows_step = plan["assets"].get("rows") or {}
    if rows_step.get("source") == "build":  # decided before anything is downloaded
        options = replace(options, rows_builder=choose_rows_builder(recipe, options))

    done: dict[str, str] = {}
    rows_source = plan["assets"]["rows"]["source"]
    order = ["tokenizer", "dataset", "rows", "hf_ckpt"]
    if options.rows_builder == "skip" and rows_source != "store":
        order = ["hf_ckpt"]
        done["rows"] = "skipped (--rows-builder skip)"
    job = _Job(spec, plan, spec_path, work, recipe, options, events)
    for name in order:
        step = plan["assets"].get(name) or {}
        if step.get("source") not in (None, "not-needed"):
            done[name] = job.one(name, step)
    return done


@dataclass
class _Job:
    spec: dict[str, Any]
    plan: dict[str, Any]
    spec_path: Path
    work: Path
    recipe: Recipe
    options: PrepareOptions
    events: Events

    def progress_of(self, name: str) -> Callable[[str, int, int], None]:
        return lambda path, done, total: self.events.progress(name, path, done, total)

    def fetch(self, name: str) -> None:
        na = node_module("node_assets")
        _run(
            lambda: na.fetch_asset(
                self.spec,
                self.plan,
                name,
                threads=self.options.threads,
                log=self.events.say,
                progress=self.progress_of(name),
            )
        )

    def push(self, name: str) -> str:
        na = node_module("node_assets")
        result = _run(
            lambda: na.push_asset(
                self.spec,
                name,
                threads=self.options.threads,
                log=self.events.say,
                progress=self.progress_of(name),
            )
        )
        return f"{result['uploaded']} file(s) uploaded, {result['skipped']} already there"

    def one(self, name: str, step: dict[str, Any]) -> str:
        """One asset into the store, by its planned source; returns what happened."""
        source = step["source"]
        if source == "store":
            if name in ("tokenizer", "dataset"):  # the rows are built here: get them back
                self.fetch(name)
            return f"already in the store ({step.get('detail')})"
        if name == "rows":
            if source == "build":
                _build_rows(self)
            return self.push(name)
        if source == "hub":
            self.events.say(f"{name}: downloading from the Hub: {step.get('detail')}")
        self.fetch(name)
        return self.push(name)


# What prepare makes at the top of its --work-dir: the cache's own entries, and its spec and plan
# (with their write_atomic temporaries, `.NAME.<pid>.<hex>.tmp`, which a crash can leave behind).
WORK_FILES = ("plan.json", "spec.json")


def _own_work_dir(work: Path) -> None:
    """Refuse a --work-dir that holds anything else, before anything is downloaded: the rows
    build's container mounts it whole (read-only), as a run's containers mount the cache
    (docs/architecture.md, "The trust boundary"), so `--work-dir ~` would show the recipe's code
    the user's keys."""
    own = set(CACHE_ENTRIES) | set(WORK_FILES)
    temporary = tuple(f".{name}." for name in WORK_FILES)
    try:
        names = sorted(os.listdir(work))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise BadInput(f"--work-dir {work}: not a directory") from None
    foreign = [n for n in names if n not in own and not n.startswith(temporary)]
    if foreign:
        raise BadInput(
            f"--work-dir {work}: it holds what prepare did not put there "
            f"({', '.join(map(repr, foreign[:3]))}{', ...' if len(foreign) > 3 else ''}), and the "
            "rows build's container mounts it whole; give --work-dir a directory of its own."
        )


def _adopt_rows(path: Path, rows: dict[str, Any]) -> None:
    """--rows FILE: rows built elsewhere (the recipe author's), accepted only with the pinned
    parquet_sha256."""
    store_mod = node_module("asset_store")
    if not path.is_file():
        raise BadInput(f"--rows {path}: no such file")
    want = rows.get("parquet_sha256")
    if not want:
        raise BadInput(
            "--rows: the recipe pins no workload.dataset.build.parquet_sha256 to check it by"
        )
    got = store_mod.file_sha256(path)
    if got != want:
        raise CheckFailed(
            f"--rows {path}: sha256 {got}, "
            f"the recipe's workload.dataset.build.parquet_sha256 is {want}"
        )
    target = Path(rows["path"])
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copyfile(path, target)


def _miles_here() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "miles"))


def hub_unreachable(plan: dict[str, Any]) -> str | None:
    """The Hub's own words once, when an asset could not be had because the Hub cannot be
    reached at all (a network failure, not a missing file): offline, that is the one cause."""
    for step in plan.get("assets", {}).values():
        if step.get("source"):
            continue
        for tried in step.get("tried") or []:
            if tried.startswith("Hub ") and tried.endswith("[network]"):
                return str(tried.removesuffix("[network]").rstrip().rsplit(": ", 1)[-1])
    return None


def _image_here(ref: str) -> bool:
    """Whether docker holds REF; InfraError when docker cannot say (dockercli's reading)."""
    return dockercli.inspect(ref, "{{json .Id}}") is not None


def choose_rows_builder(recipe: Recipe, options: PrepareOptions) -> str:
    """How the rows are built (auto: miles here, else the training image). Pulling the image
    (~20 GB) is never a silent side effect: it is asked at a terminal (`options.confirm`), or
    needs `--rows-builder docker`; BadInput otherwise, before anything is downloaded."""
    builder = options.rows_builder
    if builder != "auto":
        return builder
    if options.encoder or _miles_here():
        return "host"
    if not shutil.which("docker"):
        raise BadInput(
            "the rows need miles' loss-mask generator (transformers + miles): run prepare "
            "where they are installed (--rows-builder host), where docker can run the "
            "recipe's image (--rows-builder docker), or give rows built elsewhere with "
            "--rows FILE"
        )
    ref = recipe.image.ref
    if _image_here(ref):
        return "docker"
    from launcher.cost.figures import FIGURES

    size = FIGURES["image_bytes"]
    what = (
        f"miles is not installed here, so the rows would be built in the recipe's training "
        f"image {ref}, which is not on this machine: pulling it downloads about "
        f"{size.value / 1e9:.0f} GB ({size.source})"
    )
    if options.confirm is not None and options.confirm(f"{what}. Pull it? [y/N] "):
        return "docker"
    raise BadInput(
        f"{what}; not pulled.",
        hint="Pass --rows-builder docker to pull it, --rows FILE with rows built elsewhere, or "
        "run prepare where miles is installed (--rows-builder host).",
    )


def _build_rows(job: _Job) -> None:
    options, events, plan, work = job.options, job.events, job.plan, job.work
    builder = choose_rows_builder(job.recipe, options)
    events.say(f"rows: building ({builder}) ...")
    if builder == "host":
        na = node_module("node_assets")
        _run(lambda: na.build_rows(job.spec, plan, encoder=options.encoder, log=events.say))
        return
    scripts = node_module("node_assets").__file__
    assert scripts is not None
    scripts_dir = str(Path(scripts).parent)
    write_atomic(work / "plan.json", json.dumps(plan, indent=1, sort_keys=True) + "\n")
    safe_io = node_module("safe_io")
    incoming = safe_io.make_dirs(work / ".incoming", base=work, mode=0o700)
    out = Path(tempfile.mkdtemp(prefix="rows-", dir=incoming))  # fresh and empty, 0700, ours
    argv = docker_rows_argv(
        job.recipe.image.ref, work, scripts_dir, job.spec_path, options.encoder, out=out
    )
    events.say("rows: " + " ".join(argv))
    proc = subprocess.run(argv, check=False)
    if proc.returncode == 1:
        raise CheckFailed(
            f"rows: the build in the image failed its checks (see above; its output is kept in "
            f"{out})"
        )
    if proc.returncode != 0:
        raise InfraError(f"rows: docker run ended with {proc.returncode}")
    na = node_module("node_assets")
    _run(lambda: na.adopt(job.spec, "rows", out, log=events.say))
    shutil.rmtree(out, ignore_errors=True)


def docker_rows_argv(
    image: str,
    work: Path,
    scripts_dir: str,
    spec_path: Path,
    encoder: str | None = None,
    *,
    out: Path | None = None,
) -> list[str]:
    """The rows build inside the recipe's image: no network, no GPU, no token, our uid; the
    work directory read-only, OUT (fresh, empty) the one place it may write."""
    out = out or work / ".incoming" / "rows"
    extra = jsonread.loads(os.environ.get(TEST_DOCKER_ARGS_ENV) or "[]")  # tests' own words
    argv = [
        "docker", "run", "--rm", "--network", "none",
        "--user", f"{os.getuid()}:{os.getgid()}",
        "-e", "HOME=/tmp", "-e", "HF_HUB_OFFLINE=1",
        "-e", "PYTHONPATH=/root/miles:/root/Megatron-LM",
        "-v", f"{work}:{work}:ro", "-v", f"{out}:{out}",
        "-v", f"{scripts_dir}:/opt/reproduce/scripts:ro",
        *[str(a) for a in extra],
        image, "python3", "/opt/reproduce/scripts/node_assets.py", "build-rows",
        "--spec", str(spec_path), "--plan", str(work / "plan.json"), "--out", str(out),
    ]  # fmt: skip
    return argv + (["--encoder", encoder] if encoder else [])


def _run(call: Callable[[], Any]) -> Any:
    """A node-program call with its failures mapped to the CLI's exit codes."""
    na = node_module("node_assets")
    store_mod = node_module("asset_store")
    hub = node_module("hf_hub")
    try:
        return call()
    except na.Failed as err:
        raise (InfraError if err.infra else CheckFailed)(str(err)) from None
    except store_mod.StoreError as err:
        raise (CheckFailed if err.mismatch else InfraError)(str(err)) from None
    except hub.HubError as err:
        raise (InfraError if err.infra else CheckFailed)(str(err)) from None
    except OSError as err:
        raise InfraError(f"{getattr(err, 'filename', '') or ''}: {err.strerror or err}") from None
