"""Recipe + Profile -> Plan: every stage of a reproduction with its exact commands.

The Plan is built once. `--dry-run` prints it; the real run executes the very same object
(`Plan.node_script` is what lands on the node as node.sh, byte for byte;
launcher/plan/node_script.py
renders it).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.inputs import patches
from launcher.inputs.envnames import launcher_env_problems
from launcher.inputs.profile import AwsProfile, Profile, RayProfile, SshProfile
from launcher.inputs.recipe import Recipe
from launcher.inputs.yamlschema import format_problems
from launcher.plan import asset_stages, claimruns
from launcher.plan.image_record import BuiltImage, profile_image
from launcher.plan.node_script import ScriptContext, render_node_script
from launcher.plan.placement import Assets, Placement, Stage
from launcher.plan.protocol import RESULT_FILES
from launcher.records.rundir import new_run_id

# secrets.hf_token_env names the launcher-side variable whose value the asset download gets as
# HF_TOKEN: it must look like a Hugging Face token's name, and nothing like another credential's
# (a typo there would ship, say, the AWS secret key to the node).
_HF_TOKEN_NAME = re.compile(r"(?=.*(HF|HUGGING_?FACE))(?=.*TOKEN)[A-Z_][A-Z0-9_]*", re.IGNORECASE)
_RESULT_STEMS = ",".join(n.removesuffix(".json") for n in RESULT_FILES if n.endswith(".json"))
_RESULT_OTHERS = "".join(f", {n}" for n in RESULT_FILES if not n.endswith(".json"))
_NOT_HF = ("AWS", "SECRET", "PASSWORD", "PASSWD", "PRIVATE", "CREDENTIAL", "SSH", "KEY")


@dataclass(frozen=True)
class Plan(Placement):
    stages: tuple[Stage, ...]
    node_script: str
    provisioning: tuple[Any, ...] = field(
        default_factory=tuple
    )  # ApiCall objects (aws), printed by the dry run
    built_image: BuiltImage | None = None  # the profile's image, built FROM the recipe's
    asset_spec: dict[str, Any] | None = (
        None  # what the node resolves (launcher/plan/asset_stages.py)
    )
    runs: dict[str, Any] = field(default_factory=dict)  # launcher/plan/claimruns.py runs_for_plan()

    @property
    def image_ref(self) -> str:
        return self.built_image.ref if self.built_image else self.recipe.image.ref

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def to_dict(self) -> dict[str, Any]:
        """plan.json: what ran, in a form a person or a script can audit later."""
        return {
            "run_id": self.run_id,
            "recipe": {
                "path": str(Path(self.recipe.path).absolute()),  # the same from any directory
                "slug": self.recipe.slug,
                "sha256": hashlib.sha256(self.recipe.text.encode()).hexdigest(),
            },
            "profile": {
                "name": self.profile.name,
                "kind": self.profile.kind,
                "path": str(Path(self.profile.path).absolute()),
            },
            "image": self.image_ref,
            **({"built_image": self.built_image.to_dict(self.recipe)} if self.built_image else {}),
            "nodes": self.recipe.nodes,
            "gpus_per_node": self.recipe.gpus_per_node,
            "node_run_dir": self.node_run_dir,
            "cache_dir": self.cache_dir,
            "container": self.container,
            "assets": self.assets.__dict__,
            "asset_spec": self.asset_spec,
            "stages": [s.to_dict() for s in self.stages],
            "provisioning": [asdict(call) for call in self.provisioning],  # aws ApiCalls
            "runs": self.runs,  # result.runs, the run's one, what --runs accepted
            # what the node applies before training
            "patches": patches.patches_for_plan(self.recipe.patches),
        }


# ------------------------------------------------------------------------------------------------
# Building


def build_plan(
    recipe: Recipe,
    profile: Profile,
    *,
    run_id: str | None = None,
    skip_preflight: bool = False,
    provisioning: tuple[Any, ...] = (),
    runs: int | None = None,
) -> Plan:
    """The one place that decides what a reproduction does. `runs`: the --runs accepted
    (launcher/plan/claimruns.py), recorded in plan.json for the verdict."""
    run_id = run_id or new_run_id()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", run_id):
        raise BadInput(
            f"--run-id {run_id!r}: expected letters, digits, '.', '_' or '-' (at most 64)."
        )
    _check_profile_fits(recipe, profile)
    _check_secrets(profile)
    _check_recipe_env(recipe, profile)
    patches.refuse_unappliable(recipe.patches, recipe.path, profile)
    work_dir = profile.work_dir.rstrip("/") or "/"
    node_run_dir = f"{work_dir}/runs/{run_id}"
    cache_dir = profile.cache_dir.rstrip("/") or "/"
    _check_dirs(profile, node_run_dir, cache_dir)
    container = f"reproduce-{run_id}"
    assets = _assets(recipe, profile, cache_dir)
    preflight_on = profile.preflight.enabled and not skip_preflight
    built = profile_image(recipe, profile)  # BadInput when it is not built FROM the recipe's

    ctx = ScriptContext(
        recipe,
        profile,
        run_id,
        node_run_dir,
        cache_dir,
        container,
        assets,
        built,
        measured_runs=claimruns.measured_runs(recipe, runs),
    )
    on_assets = asset_stages.render(ctx)
    stages = [
        Stage("acquire", "acquire the node(s)", "launcher", tuple(_acquire_lines(profile, recipe))),
        Stage(
            "preflight",
            "node health before any download: GPUs, driver, ECC, Xid, NVLink, EFA, disk",
            "node",
            (ctx.host_preflight(),)
            if preflight_on
            else ("# skipped (--skip-preflight or preflight.enabled: false)",),
        ),
        on_assets.resolve,
        Stage(
            "image",
            "pull the training image by digest and verify the digest",
            "node",
            tuple(ctx.image_lines()),
        ),
        Stage(
            "preflight-gpu",
            "GPU benchmarks in the image: bf16 matmul, memory bandwidth, NCCL all-reduce",
            "container",
            (ctx.gpu_preflight(),)
            if preflight_on
            else ("# skipped (--skip-preflight or preflight.enabled: false)",),
        ),
        Stage(
            "stack",
            "check the image's software versions against the recipe's stack",
            "container",
            (ctx.stack_check(),),
        ),
        on_assets.rows,
        on_assets.assets,
        on_assets.convert,
        Stage("ray", "start Ray in the training container", "container", tuple(ctx.ray_lines())),
        Stage(
            "train",
            "the recipe's run block, verbatim, from the miles checkout",
            "container",
            (recipe.run_script.rstrip("\n"),),
        ),
        *([on_assets.push] if on_assets.push else []),
        Stage(
            "collect",
            "stream the node log by byte offset; fetch result files; measure and judge",
            "launcher",
            (
                f"stream {node_run_dir}/node.log -> logs/ (by byte offset)",
                f"fetch {node_run_dir}/{{{_RESULT_STEMS}}}.json{_RESULT_OTHERS}",
                "parse logs/train.log -> steps.jsonl, result.yaml, verdict.json, report.md",
            ),
        ),
        Stage(
            "release", "release what this run acquired", "launcher", tuple(_release_lines(profile))
        ),
    ]
    script = render_node_script(ctx, stages, on_assets.after_training, on_assets.header)
    _check_container_script(recipe, script)
    return Plan(
        recipe,
        profile,
        run_id,
        node_run_dir,
        cache_dir,
        container,
        assets,
        tuple(stages),
        script,
        tuple(provisioning),
        built,
        on_assets.spec,
        claimruns.runs_for_plan(recipe, runs),
    )


def _check_profile_fits(recipe: Recipe, profile: Profile) -> None:
    """A profile that names its nodes (local, ssh) must name as many as the recipe needs."""
    if profile.kind not in ("local", "ssh"):
        return
    hosts = (profile.hosts if isinstance(profile, SshProfile) else None) or []
    given = len(hosts) if hosts else 1
    if given == recipe.nodes:
        return
    need = (
        f"{recipe.path}: gpu.count {recipe.gpu_count} / per_node {recipe.gpus_per_node} = "
        f"{recipe.nodes} node{'s' if recipe.nodes != 1 else ''}"
    )
    if profile.kind == "ssh":
        raise BadInput(
            f"{need}, but the ssh profile {profile.path} gives {given}.",
            hint="List one host per node under `hosts:`, node 0 (the Ray head) first "
            "(README, 'Several nodes').",
        )
    raise BadInput(
        f"{need}, but a profile of kind local ({profile.path}) gives one node; use an ssh profile "
        "with a host per node (`hosts:`), --cluster aws or a ray cluster."
    )


def _check_secrets(profile: Profile) -> None:
    name = profile.secrets.hf_token_env
    if name is None:
        return
    text = str(name)
    upper = text.upper()
    if text.lower().startswith("hf_") and any(c.islower() for c in text[3:]):
        raise BadInput(  # never echoed: it is the secret
            f"{profile.path}: secrets.hf_token_env holds what looks like a Hugging Face token "
            "itself (hf_..., not shown here); expected the NAME of the variable that holds it.",
            hint="Put the token in an environment variable (HF_TOKEN) and write its name here; "
            "and revoke that token if this file was shared.",
        )
    if not _HF_TOKEN_NAME.fullmatch(text) or any(word in upper for word in _NOT_HF):
        raise BadInput(
            f"{profile.path}: secrets.hf_token_env is {text!r}, which is not the name of a Hugging "
            "Face token variable; its value would be sent to the node as HF_TOKEN.",
            hint="Name the variable holding your Hugging Face token (HF_TOKEN, "
            "HUGGING_FACE_HUB_TOKEN, ...), or null to send none.",
        )


def _check_recipe_env(recipe: Recipe, profile: Profile) -> None:
    """The recipe's env and the profile's may not set the launcher's own names (recipe.py's one
    list; the recipe's were already refused when it was loaded), nor the variable the profile's
    `image_digest_env` names (the nodes' own word on their image); on a Ray cluster, where both
    reach node.sh and its checks, nor a variable that changes how a program starts."""
    ray = isinstance(profile, RayProfile)
    name = profile.image_digest_env if isinstance(profile, RayProfile) else None
    also = {str(name): f"the profile's image_digest_env ({profile.path})"} if name else {}
    for path, what, env in (
        (recipe.path, "recipe", recipe.env),
        (profile.path, "cluster profile", profile.env or {}),
    ):
        problems = launcher_env_problems(env, also, reaches_checks=ray)
        if problems:
            raise BadInput(format_problems(path, what, problems))


# Linux's limit on one argument (MAX_ARG_STRLEN, 32 pages): `bash -c "$CONTAINER_SCRIPT"` passes
# the training container's whole script as one, and execve refuses a longer one ("Argument list
# too long") at the train stage, after every paid stage before it.
MAX_ARG_BYTES = 128 * 1024
_CONTAINER_SCRIPT = re.compile(r"CONTAINER_SCRIPT <<'(\w+)' \|\| true\n(.*?)\n\1\n", re.S)


def _check_container_script(recipe: Recipe, script: str) -> None:
    """The container's script fits in one argument, or the run is refused before anything."""
    found = _CONTAINER_SCRIPT.search(script)
    size = len(found.group(2).encode()) + 1 if found else 0
    if size > MAX_ARG_BYTES:
        raise BadInput(
            f"{recipe.path}: the training container's script would be {size:,} bytes (the run "
            f"block, env and patches with node.sh's own lines), over the {MAX_ARG_BYTES:,} bytes "
            "Linux passes as one argument: `docker run ... bash -c` could not start it. Expected "
            "a smaller run block, env and patches (keep large text in the image or a file)."
        )


def _check_dirs(profile: Profile, node_run_dir: str, cache_dir: str) -> None:
    """The cache is mounted writable into every container; the node run dir (what the host runs
    and trusts) must not be inside it."""
    run_dir, cache = posixpath.normpath(node_run_dir), posixpath.normpath(cache_dir)
    if run_dir == cache or run_dir.startswith(cache.rstrip("/") + "/"):
        raise BadInput(
            f"{profile.path}: work_dir ({profile.work_dir}) is inside cache_dir "
            f"({cache_dir}), which the containers can write to: they could then change what the "
            "node runs. Put them side by side (the defaults: /var/tmp/reproduce and "
            "/var/tmp/reproduce-cache)."
        )


def _assets(recipe: Recipe, profile: Profile, cache_dir: str) -> Assets:
    hf = recipe.hf_model
    repo, rev = hf if hf else (None, None)
    tag = f"{repo.replace('/', '--')}@{(rev or 'main')[:12]}" if repo else recipe.model
    build = recipe.dataset.build
    parquet_sha = build.parquet_sha256
    rows_name = build.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", recipe.dataset.name or "rows")
    rows_file = f"{rows_name}-{parquet_sha[:12]}.parquet" if parquet_sha else f"{rows_name}.parquet"
    return Assets(
        hf_ckpt=profile.assets.hf_ckpt or f"{cache_dir}/hf/{tag}",
        torch_dist=profile.assets.torch_dist or f"{cache_dir}/torch_dist/{tag}",
        sft_data=profile.assets.sft_data or f"{cache_dir}/rows/{rows_file}",
        hf_repo=repo,
        hf_revision=rev,
        parquet_sha256=parquet_sha if profile.assets.verify_sha256 else None,
    )


def _acquire_lines(profile: Profile, recipe: Recipe) -> list[str]:
    kind = profile.kind
    if kind == "local":
        return ["# this host: nothing to provision"]
    if isinstance(profile, SshProfile):
        hosts = profile.hosts
        if not hosts:
            return [_ssh_line(dict(profile.raw), profile)]
        return [
            _ssh_line({"host": h} if isinstance(h, str) else dict(h), profile, f"node {i}: ")
            for i, h in enumerate(hosts)
        ]
    if isinstance(profile, AwsProfile):
        if profile.instance_id:
            return [
                f"# target existing instance {profile.instance_id} (never terminated by reproduce)"
            ]
        return [
            f"# provision {recipe.nodes} x {profile.instance_type or recipe.instance_type} "
            "in "
            f"{profile.region}: the API calls are printed above"
        ]
    address = profile.address if isinstance(profile, RayProfile) else None
    return [f"# submit to the existing Ray cluster at {address}"]


def _ssh_line(host: dict[str, Any], profile: SshProfile, prefix: str = "") -> str:
    """One host of an ssh profile as the dry run shows it (its own fields over the profile's)."""

    def get(key: str) -> Any:
        return host[key] if host.get(key) is not None else getattr(profile, key)

    dial = get("connect_host") or get("host")
    key = get("host_key_fingerprint") or get("known_hosts") or "~/.ssh/known_hosts"
    return _comment_safe(
        f"# {prefix}ssh {get('user') or '$USER'}@{get('host')} (dialled at "
        f"{dial}:{get('port')}), host key checked against {key}"
    )


def _comment_safe(text: str) -> str:
    """A value from the profile inside a `# ...` line: a newline would end the comment."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


def _release_lines(profile: Profile) -> list[str]:
    if isinstance(profile, AwsProfile) and not profile.instance_id:
        return [
            "# terminate the instance(s) launched for this run, then delete their Elastic IPs, "
            "security group, "
            "placement group and key pair (also on error, Ctrl-C and SIGTERM; --keep keeps them)"
        ]
    return ["# stop this run's container and Ray; nothing else on the node is touched"]
