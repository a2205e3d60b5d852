"""Where one run lives, and its stages: the facts the Plan, node.sh's renderer and the parts it
is rendered from (multinode.py, stage_graph.py) all work from.

Data only, importing no renderer, so that every part of node.sh reads the one class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.inputs.profile import Profile, SlurmProfile
from launcher.inputs.recipe import Recipe
from launcher.plan import ray_stage

CONTAINER_SCRIPTS = "/opt/reproduce/scripts"


@dataclass(frozen=True)
class Stage:
    """One step of a reproduction. `where`: launcher (this machine), node (host) or container."""

    name: str
    title: str
    where: str
    commands: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "where": self.where,
            "commands": list(self.commands),
        }


@dataclass(frozen=True)
class Assets:
    hf_ckpt: str
    torch_dist: str
    sft_data: str
    hf_repo: str | None
    hf_revision: str | None
    parquet_sha256: str | None

    def paths(self) -> tuple[str, ...]:
        return (self.hf_ckpt, self.torch_dist, self.sft_data)


@dataclass(frozen=True)
class Placement:
    """Where one run lives: the facts both the Plan and its renderer work from."""

    recipe: Recipe
    profile: Profile
    run_id: str
    node_run_dir: str
    cache_dir: str
    container: str
    assets: Assets

    @property
    def docker(self) -> bool:
        # a Ray cluster's nodes already are the image: its job runs no container
        return self.profile.runtime == "docker" and self.profile.kind != "ray"

    @property
    def pyxis(self) -> bool:
        """kind slurm with container_runtime pyxis: the image's commands run as steps of the job in
        containers pyxis makes (launcher/plan/enroot_image.py), not under docker."""
        p = self.profile
        return self.docker and isinstance(p, SlurmProfile) and p.container_runtime == "pyxis"

    @property
    def own_pid_namespace(self) -> bool:
        # an enroot container shares the host's PID namespace (pyxis unshares none by default)
        return ray_stage.own_pid_namespace(
            self.docker and not self.pyxis, list(self.profile.docker.extra_args)
        )

    @property
    def scripts(self) -> str:
        """Where scripts/ is, as text safe in double quotes on the side that runs the command."""
        if self.profile.kind == "ray":
            return "$REPRODUCE_SCRIPTS"
        return CONTAINER_SCRIPTS if self.docker else "$NODE_RUN_DIR/scripts"
