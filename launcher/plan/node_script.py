"""The node script: a Plan's stages rendered as one plain bash program (node.sh).

The renderer's inputs are a Placement (where the run lives) and the Stages; its output is the text
the dry run prints and the node runs, byte for byte (golden files under tests/golden/). Every value
that came from a recipe or a profile reaches the shell through `shlex.quote`, except the recipe's
`run` block, which is code by definition and runs verbatim inside a quoted heredoc. The stage
markers come from launcher/plan/protocol.py, where the runner's parser for them lives too.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.inputs.patches import apply_lines as patch_lines
from launcher.inputs.profile import AwsProfile, Profile, RayProfile
from launcher.inputs.recipe import Image, Recipe
from launcher.plan import enroot_image, leftovers, multinode, ray_stage, stage_graph
from launcher.plan.asset_spec import cache_entries_check
from launcher.plan.background import BACKGROUND_FUNCTIONS
from launcher.plan.bash_template import BashTemplate, Lines, template
from launcher.plan.host_clock import training_run
from launcher.plan.image_record import BuiltImage, base_label_check, present_or_pull
from launcher.plan.measured import train_lines
from launcher.plan.placement import CONTAINER_SCRIPTS, Placement, Stage
from launcher.plan.protocol import (
    DONE_LINE,
    MARKER_HELP,
    NONCE_LINE,
    OUT_DIR,
    SECRETS_FILE,
    STAGE_FUNCTIONS,
    STATE_DIR,
    TRUSTED_DIR_FN,
    collect_command,
    results_block,
)

MILES_DIR = "/root/miles"
MILES_PYTHONPATH = "/root/miles:/root/Megatron-LM"
NVLS_OFF = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
)

q = shlex.quote


# ------------------------------------------------------------------------------------------------
# Rendering the node script


@dataclass(frozen=True)
class ScriptContext(Placement):
    """The renderer: a Placement plus the shell text each stage needs."""

    built: BuiltImage | None = None  # the profile's image built FROM the recipe's (images/)
    measured_runs: int = 1  # K: the train stage runs the run block K times (plan/measured.py)

    @property
    def image(self) -> Image:
        """What every container of the run uses: the profile's built image, else the recipe's."""
        return self.built.as_image() if self.built else self.recipe.image

    @property
    def _ray_profile(self) -> RayProfile:
        """The `kind: ray` profile, for the parts rendered only for a Ray job."""
        assert isinstance(self.profile, RayProfile), "a Ray job's part rendered for another kind"
        return self.profile

    def in_image(
        self,
        command: str,
        *,
        stage: str,
        gpus: bool = True,
        host_user: bool = False,
        makes: bool = False,
        offline: bool = False,
    ) -> str:
        """A one-off command in the training image: docker run, a Ray job, or the host itself.

        No container gets HF_TOKEN: the commands that talk to the Hub run on the host
        (launcher/plan/asset_stages.py). `host_user`: the container runs as the host's uid, so what
        it writes (the rows) the host can later hash and move. `makes`: the container may
        write one directory, $REPRODUCE_NEW_DIR (fresh, empty, this run's), which the host
        checks before anything in it reaches the cache (docs/architecture.md, "The trust
        boundary"); every other mount it gets is read-only, the cache included. The container is
        named $CONTAINER-<stage>, so a stage that is stopped (launcher/plan/stage_graph.py) or a
        cancel removes it. `offline`: no network at all (`--network none` for the profile's).
        """
        if not self.docker:  # the node (a Ray job's too: the cluster is the image) runs it itself
            return command
        if self.pyxis:
            return enroot_image.in_image(
                f"$CONTAINER-{stage}", command, gpus=gpus, makes=makes, host_user=host_user
            )
        gpu = '"${GPU_ARGS[@]}" ' if gpus else ""
        user = '--user "$(id -u):$(id -g)" ' if host_user else ""
        new = (
            '-v "$REPRODUCE_NEW_DIR:$REPRODUCE_NEW_DIR" -e REPRODUCE_NEW_DIR -e REPRODUCE_HOST_IDS '
            if makes
            else ""
        )
        net = "--network none " if offline else '"${NET_ARGS[@]}" '
        name = f'--name "$CONTAINER-{stage}"'
        return (
            f'docker run --rm {name} {gpu}{user}{new}{net}"${{DOCKER_ARGS[@]}}" "${{EFA_ARGS[@]}}" '
            f'"$IMAGE" bash -c {q(command)}'
        )

    def net_args(self) -> list[str]:
        """The profile's network (NET_ARGS), apart: a stage with no use for one gets none."""
        p = self.profile
        return ["--network", p.docker.network or ("host" if p.docker.network_host else "none")]

    def gpu_args(self) -> list[str]:
        gpus = self.profile.docker.gpus
        return ["--gpus", str(gpus)] if gpus else []

    def docker_args(self) -> list[str]:
        """Every `docker run` of the run shares these (GPU and EFA flags are added where needed)."""
        p = self.profile
        args: list[str] = []
        if p.docker.ipc_host:
            args += ["--ipc", "host"]
        if p.docker.memlock_unlimited:
            args += ["--ulimit", "memlock=-1"]
        args += [
            "--ulimit",
            f"stack={int(p.docker.stack_bytes)}",
            "--shm-size",
            str(p.docker.shm_size),
        ]
        # The node run dir holds what the host runs and trusts (node.sh, pid, exit_code, the
        # results): never mounted. A container gets its own output dir, and read-only the cache
        # (what a later run trusts), scripts/ and the cancel mark's dir (docs/architecture.md,
        # "The trust boundary").
        out, state = f"{self.node_run_dir}/{OUT_DIR}", f"{self.node_run_dir}/{STATE_DIR}"
        if multinode.spans_nodes(self.recipe, p):  # the others follow $NODE_RUN_DIR
            args += ["-v", f"{self.cache_dir}:{self.cache_dir}:ro"]
        else:
            args += [
                "-v",
                f"{out}:{out}",
                "-v",
                f"{state}:{state}:ro",
                "-v",
                f"{self.cache_dir}:{self.cache_dir}:ro",
                "-v",
                f"{self.node_run_dir}/scripts:{CONTAINER_SCRIPTS}:ro",
            ]
        # names only: docker copies the values from the node script's environment (secrets never
        # on a command line; HF_TOKEN to no container)
        names = ["RUN_ID", "NODE_RUN_DIR", "REPRODUCE_OUT_DIR", "HF_CKPT", "TORCH_DIST", "SFT_DATA"]
        for name in names + multinode.env_names(self):
            args += ["-e", name]
        args += multinode.env_args(self)  # the EFA environment, when the profile asks for it
        args += [str(a) for a in p.docker.extra_args]
        return args

    def _preflight_args(self, *, bench: bool) -> str:
        from launcher.plan.preflight import (
            driver_min_for_cuda,
            expected_efa_devices,
            preflight_argv,
        )

        r, p = self.recipe, self.profile
        argv = preflight_argv(
            gpu_type=r.gpu_type,
            gpus_per_node=r.gpus_per_node,
            gpu_memory_gb=r.gpu_memory_gb,
            driver_min=driver_min_for_cuda(r.cuda),
            cuda=r.cuda,
            efa_expected=expected_efa_devices(p.instance_type or r.instance_type)
            if p.kind == "aws"
            else None,
            disk_path=self.cache_dir,
            disk_min_gb=float(p.preflight.disk_min_gb),
            thresholds=dict(p.preflight.thresholds),
        )
        if not bench:
            argv.append("--no-bench")
        return shlex.join(argv)

    def host_preflight(self) -> str:
        cmd = f'python3 "$NODE_RUN_DIR/scripts/preflight.py" {self._preflight_args(bench=False)}'
        if self.profile.kind == "ray":
            cmd = self._on_ray_nodes(f"preflight.py {self._preflight_args(bench=False)}")
        return f'{cmd} > "$NODE_RUN_DIR/preflight.json"'

    def gpu_preflight(self) -> str:
        if self.profile.kind == "ray":
            nvls_off = " ".join(f"--env {k}={v}" for k, v in NVLS_OFF)
            each = self._on_ray_nodes(f"preflight.py {self._preflight_args(bench=True)}", nvls_off)
            return f'{each} > "$NODE_RUN_DIR/preflight-gpu.json"'
        inner = (
            f'python3 "{self.scripts}/preflight.py" {self._preflight_args(bench=True)}'
            f"{multinode.preflight_args(self)}"
        )
        return (
            f"{self.in_image(_with_nvls_off(inner), stage='preflight-gpu')} "
            '> "$NODE_RUN_DIR/preflight-gpu.json"'
        )

    def _ray_nodes_args(self) -> str:
        """What the recipe needs of a Ray cluster (scripts/ray_cluster.py): nodes, GPUs each."""
        r = self.recipe
        wait = float(self._ray_profile.nodes_wait_s)
        return (
            f"--nodes {r.nodes} --gpus-per-node {r.gpus_per_node} --gpu-type {q(r.gpu_type)} "
            f"--wait-s {wait:g}"
        )

    def _on_ray_nodes(self, program_and_args: str, options: str = "") -> str:
        """A node program on every GPU node the recipe uses, each holding that node's GPUs."""
        extra = f" {options}" if options else ""
        return (
            f'python3 "{self.scripts}/ray_cluster.py" each {self._ray_nodes_args()}{extra} '
            f"-- {program_and_args}"
        )

    def ray_cluster_check(self) -> list[str]:
        """The cluster the job runs on must be the recipe's: its nodes and GPUs, and the image
        every GPU node says it runs (the digest from `image_digest_env`)."""
        env = self._ray_profile.image_digest_env
        digest = f' --digest "$IMAGE_DIGEST" --digest-env {q(env)}' if env else ""
        return [
            _comment(
                f"# the Ray cluster at {self._ray_profile.address} is the image: every GPU node "
                f"must say it runs $IMAGE_DIGEST (in ${env})"
                if env
                else "# image_digest_env: null - the digest is not checked; the stack check is"
            ),
            f'python3 "{self.scripts}/ray_cluster.py" check {self._ray_nodes_args()} '
            f'--image "$IMAGE"{digest} > "$NODE_RUN_DIR/image.json"',
        ]

    @property
    def baked_ami(self) -> bool:
        """`ami: baked`: the node boots from an AMI `reproduce image bake` made with the image."""
        return isinstance(self.profile, AwsProfile) and self.profile.ami == "baked"

    def image_lines(self) -> list[str]:
        image = self.image
        if self.profile.kind == "ray":
            return self.ray_cluster_check()
        if not self.docker:
            return [
                "# runtime: host - the node is the image; the stack check below verifies its "
                "versions"
            ]
        if self.pyxis:
            return template("node.sh").fill("pyxis_image", enroot_image.image_values(image), {})
        lines = [
            "command -v docker >/dev/null || { echo 'docker is not installed on this node (profile "
            "runtime: docker)' >&2; "
            "exit 1; }"
        ]
        pull = [
            "# docker pull under a pseudo-terminal, its bytes printed as progress lines "
            "(scripts/pull_progress.py)",
            'if command -v python3 >/dev/null; then python3 "$NODE_RUN_DIR/scripts/'
            'pull_progress.py" "$IMAGE"; else docker pull "$IMAGE"; fi',
        ]
        baked = self.baked_ami
        if baked:
            lines += present_or_pull(pull if self.profile.docker.pull else [])
        elif self.profile.docker.pull:
            lines += pull
        lines += [
            f"# the pulled image must carry the recipe's digest (from {image.source_field}); a tag "
            "alone is never trusted",
            "docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' \"$IMAGE\" "
            '> "$NODE_RUN_DIR/image.digests"',
            'if ! grep -qxF "$IMAGE" "$NODE_RUN_DIR/image.digests"; then',
            '  echo "image $IMAGE: the local image does not carry digest $IMAGE_DIGEST '
            "(RepoDigests: "
            "$(tr '\\n' ' ' < \"$NODE_RUN_DIR/image.digests\"))\" >&2",
            "  exit 1",
            "fi",
            *(base_label_check(self.built) if self.built else []),
            "# image.json: what ran, as docker has it (an attestation records its RepoDigests);",
            "# renamed into place whole, so a stage stopped midway leaves none"
            + ("; source: ami (on the node from its AMI) or pulled" if baked else ""),
            'printf \'{"image": "%s", "digest": "%s", "id": "%s", "repo_digests": %s'
            + (', "source": "%s"' if baked else "")
            + "}\\n' "
            '"$IMAGE" "$IMAGE_DIGEST" "$(docker image inspect --format \'{{.Id}}\' "$IMAGE")" '
            '"$(docker image inspect --format \'{{json .RepoDigests}}\' "$IMAGE")" '
            + ('"$IMAGE_SOURCE" ' if baked else "")
            + '> "$NODE_RUN_DIR/image.json.tmp"',
            'mv -f "$NODE_RUN_DIR/image.json.tmp" "$NODE_RUN_DIR/image.json"',
        ]
        return lines

    def stack_check(self) -> str:
        expect = self.recipe.expected_versions
        import json

        policy = self.profile.stack_check
        args = f"--json --policy {q(policy)} --expect {q(json.dumps(expect, sort_keys=True))}"
        if self.profile.kind == "ray":
            return f'{self._on_ray_nodes(f"stack_probe.py {args}")} > "$NODE_RUN_DIR/stack.json"'
        probe = f'python3 "{self.scripts}/stack_probe.py" {args}'
        return f'{self.in_image(probe, stage="stack", offline=True)} > "$NODE_RUN_DIR/stack.json"'

    def ray_lines(self) -> list[str]:
        """The ray stage: none on a Ray cluster, several nodes' (multinode), or one head."""
        if self.profile.kind == "ray":
            return [
                _comment(
                    f"# the existing cluster at {self._ray_profile.address}: the job joins it, "
                    "no ray start"
                )
            ]
        if multinode.spans_nodes(self.recipe, self.profile):
            return multinode.ray_lines(self)
        return ray_stage.head_lines(
            self.recipe, self.profile, own_namespace=self.own_pid_namespace, job_step=self.pyxis
        )

    def exports(self) -> list[str]:
        """Container environment: miles' PYTHONPATH, the profile's env, the recipe's env in
        order, the assets."""
        lines = [
            f'export PYTHONPATH={MILES_PYTHONPATH}:"{self.scripts}"',
            "# every step line reaches the log: Ray's dedup would fold lines that differ only in "
            "numbers",
            "export RAY_DEDUP_LOGS=0",
            "# each line leaves when printed: through a pipe Python holds stdout in 8 KiB blocks, "
            "and the host's clock (check 6) stamps lines as they arrive",
            "export PYTHONUNBUFFERED=1",
        ]
        lines += [f"export {k}={q(v)}" for k, v in container_env(self.recipe, self.profile)]
        lines += [
            f"export HF_CKPT={q(self.assets.hf_ckpt)}",
            f"export TORCH_DIST={q(self.assets.torch_dist)}",
            f"export SFT_DATA={q(self.assets.sft_data)}",
            f"export REPRODUCE_ROW_TOKENS={self.recipe.row_tokens}  # checked by "
            "pretokenized_sft_rollout",
        ]
        return lines


def container_env(recipe: Recipe, profile: Profile) -> list[tuple[str, str]]:
    """The training environment the recipe and the profile set, in order (a later value wins): the
    EFA environment when asked for, the profile's env, the recipe's env, then NVLink multicast off
    when the profile says so. node.sh exports it in the container; a Ray job's runtime env carries
    it to every worker of the job, on every node."""
    pairs = multinode.efa_env(recipe, profile)  # first: the profile's and the recipe's win
    pairs += [(str(k), str(v)) for k, v in (profile.env or {}).items()]
    pairs += [(str(k), str(v)) for k, v in recipe.env.items()]
    if profile.disable_nvlink_multicast:
        pairs += list(NVLS_OFF)
    return pairs


def _comment(text: object) -> str:
    """Text safe inside a `# ...` line: a newline in a recipe value would end the comment."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", str(text))


def _with_nvls_off(command: str) -> str:
    """Launcher-side helpers (preflight, conversion) never use NVLink multicast, whatever the
    profile says."""
    return "export " + " ".join(f"{k}={v}" for k, v in NVLS_OFF) + "; " + command


def _heredoc_tag(body: str, base: str) -> str:
    tag, n = base, 0
    lines = set(body.splitlines())
    while tag in lines:
        n += 1
        tag = f"{base}_{n}"
    return tag


def render_node_script(
    ctx: ScriptContext,
    stages: list[Stage],
    after_training: Sequence[str] = (),
    asset_header: Sequence[str] = (),
) -> str:
    """node.sh: templates/node.sh filled for this run. The template holds the script's text and
    order; this function only supplies its values (every one from a recipe or a profile quoted)
    and picks its optional blocks. `after_training` runs once the container ended (the asset
    uploads finish: asset_stages), `asset_header` sets the asset stages' names before any stage."""
    r, p = ctx.recipe, ctx.profile
    by = {s.name: s for s in stages}
    tpl = template("node.sh")
    background = stage_graph.at_once(p.kind)
    stop = "_bg_stop; " if background else ""

    if ctx.pyxis:
        setup = tpl.fill("pyxis_setup", _pyxis_values(ctx, stop), {})
    elif ctx.docker:
        mode = p.docker.efa_devices
        efa = (
            tpl.fill("efa_devices", {}, {"efa_required": _block(tpl, "efa_required", mode)})
            if mode != "never"
            else []
        )
        flags = {
            "bg_stop": stop,
            "gpu_args": shlex.join(ctx.gpu_args()),
            "docker_args": shlex.join(ctx.docker_args()),
            "net_args": shlex.join(ctx.net_args()),
        }
        mounts = multinode.mount_words(ctx, CONTAINER_SCRIPTS)
        setup = tpl.fill("docker_setup", flags, {"mount_words": mounts, "efa_devices": efa})
    else:
        setup = tpl.fill("host_setup", {"cleanup_body": stop or ":; "}, {})
    ray_job = (  # the launcher reads only the job's log: the result files end it
        tpl.fill("ray_job", {}, {"results_block": results_block(collect_command(ctx.node_run_dir))})
        if p.kind == "ray"
        else []
    )

    node_stages: list[str] = []
    if not background:  # one by one (stage_graph.at_once says why)
        for name in (*stage_graph.PARALLEL, "convert"):
            node_stages += stage_graph.inline(by[name])
    else:
        node_stages += stage_graph.at_once_lines(by)
        node_stages += stage_graph.inline(by["convert"])

    container_script = tpl.fill(
        "container_script",
        {"ray_title": by["ray"].title},
        {
            "stage_functions": STAGE_FUNCTIONS,
            "leftovers_container": (
                leftovers.container_lines(CONTAINER_SCRIPTS, exclusive=leftovers.exclusive(p))
                if ctx.docker
                else []
            ),
            "exports": ctx.exports(),
            "patches": patch_lines(r.patches),
            "ray_commands": by["ray"].commands,
            "train": train_lines(
                by["train"].title, MILES_DIR, by["train"].commands[0], ctx.measured_runs
            ),
        },
    )
    values = {
        "slug": _comment(r.slug),
        "recipe_sha256": hashlib.sha256(r.text.encode()).hexdigest(),
        "run_id_comment": _comment(ctx.run_id),
        "profile_name": _comment(p.name),
        "kind": _comment(p.kind),
        "nodes": _comment(r.nodes),
        "gpus_per_node": _comment(r.gpus_per_node),
        "gpu_type": _comment(r.gpu_type),
        "run_id": q(ctx.run_id),
        "cache_dir": q(ctx.cache_dir),
        "image": q(ctx.image.ref),
        "image_digest": q(ctx.image.digest),
        "hf_ckpt": q(ctx.assets.hf_ckpt),
        "torch_dist": q(ctx.assets.torch_dist),
        "sft_data": q(ctx.assets.sft_data),
        "out_dir": OUT_DIR,
        "secrets_file": SECRETS_FILE,
        "state_dir": STATE_DIR,
        "heredoc_tag": _heredoc_tag("\n".join(container_script), "REPRODUCE_CONTAINER_SCRIPT"),
    }
    slots: dict[str, Lines] = {
        "marker_help": MARKER_HELP,
        "nonce_line": NONCE_LINE,
        "run_dir_line": multinode.run_dir_line(ctx),
        "container_line": multinode.container_line(ctx),
        "multinode_header": multinode.header_lines(ctx),
        "trusted_dir_fn": TRUSTED_DIR_FN.rstrip("\n"),
        "cache_entries_check": (
            cache_entries_check(ctx.cache_dir, ctx.assets.paths()) if ctx.docker else []
        ),
        "leftovers_between": leftovers.host_lines() if ctx.docker else [],
        "asset_header": asset_header,
        "stage_functions": STAGE_FUNCTIONS,
        "background_functions": [BACKGROUND_FUNCTIONS] if background else [],
        "setup": setup,
        "ray_job": ray_job,
        "node_stages": node_stages,
        "container_script": container_script,
        "training_run": (
            training_run(
                host_clock=p.docker.host_clock,
                run=_PYXIS_TRAINING_RUN if ctx.pyxis else None,
            )
            if ctx.docker
            else ['bash -c "$CONTAINER_SCRIPT"']
        ),
        "after_training": after_training,
        "done_line": DONE_LINE,
    }
    return "\n".join(tpl.fill("node.sh", values, slots)) + "\n"


# the training container on pyxis: a step of the job on this node, as every in-image command
_PYXIS_TRAINING_RUN = '_in_image "$CONTAINER" --gpus -- bash -c "$CONTAINER_SCRIPT"'


def _pyxis_values(ctx: ScriptContext, bg_stop: str) -> dict[str, str]:
    """The values of the template's `pyxis_setup` block: the environment a container gets (the
    names docker's -e gives, those a rows build or a conversion needs) and its mounts."""
    names = ["RUN_ID", "NODE_RUN_DIR", "REPRODUCE_OUT_DIR", "HF_CKPT", "TORCH_DIST", "SFT_DATA"]
    names += ["REPRODUCE_NEW_DIR", "REPRODUCE_HOST_IDS", *multinode.env_names(ctx)]
    source = str(ctx.profile.path)
    cache = enroot_image.mountable(ctx.cache_dir, "cache_dir", source)
    return {
        "bg_stop": bg_stop,
        "sqsh": enroot_image.SQSH,
        "env_names": q(",".join(names)),
        "out_dir": OUT_DIR,
        "state_dir": STATE_DIR,
        "cache_mount": q(f"{cache}:{cache}:ro"),
        "scripts_at": CONTAINER_SCRIPTS,
    }


def _block(tpl: BashTemplate, name: str, mode: str) -> list[str]:
    """Block NAME (it has no values) where the profile's efa_devices is `always`, else none."""
    return tpl.fill(name, {}, {}) if mode == "always" else []
