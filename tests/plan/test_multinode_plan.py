"""The network part of a multi-node plan, as the dry run prints it (docs/multinode.md): the EFA
environment exported in every container before Ray starts (on for aws with several nodes, asked
for elsewhere, overridable by the profile and the recipe), the GPU preflight's all-reduce across
all nodes, and the page that documents the variables listing exactly the code's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from support.cli import FOUR_NODES, REPO, SEED, reproduce_here
from support.multinode import ssh_hosts_profile

from launcher.plan.multinode import EFA_ENV

EFA_EXPORTS = [f"export {v.name}={v.value!r}" if " " in v.value else f"export {v.name}={v.value}"
               for v in EFA_ENV]  # fmt: skip


def dry_run(recipe: Path, cluster: str | Path) -> str:
    res = reproduce_here(recipe, "--cluster", cluster, "--dry-run")
    assert res.code == 0, res.err
    return res.out


def test_aws_with_several_nodes_exports_the_efa_environment_before_ray_and_the_recipes_env():
    out = dry_run(FOUR_NODES, "aws")
    at = [out.index(line) for line in EFA_EXPORTS]
    assert at == sorted(at)  # in the table's order
    assert at[-1] < out.index("export CUDA_DEVICE_MAX_CONNECTIONS=1")  # the recipe's env wins
    assert at[-1] < out.index("_ray_start --head")  # before Ray starts
    # every container gets it, the GPU preflight's too, and that preflight spans all nodes
    preflight = next(ln for ln in out.splitlines() if "preflight.py" in ln and "--nnodes" in ln)
    docker_args = next(ln for ln in out.splitlines() if ln.startswith("DOCKER_ARGS=("))
    assert "-e FI_PROVIDER=efa" in docker_args and "-e 'NCCL_NET=AWS Libfabric'" in docker_args
    assert '"${DOCKER_ARGS[@]}"' in preflight and "--nnodes 4" in preflight
    assert '--master-addr "$HEAD_ADDR"' in preflight


def test_one_node_gets_no_efa_environment():
    out = dry_run(SEED, "aws")
    assert "FI_PROVIDER" not in out and "--nnodes" not in out


def test_ssh_hosts_get_it_when_the_profile_asks_and_the_profile_env_wins(tmp_path):
    assert "FI_PROVIDER" not in dry_run(FOUR_NODES, ssh_hosts_profile(tmp_path))
    out = dry_run(FOUR_NODES, ssh_hosts_profile(tmp_path, efa_env=True, env={"NCCL_DEBUG": "WARN"}))
    assert out.index("export NCCL_DEBUG=INFO") < out.index("export NCCL_DEBUG=WARN")
    assert "export FI_PROVIDER=efa" in out


@pytest.mark.parametrize("cluster, says", [("local", "gives one node"), ("ssh", "gives 1")])
def test_a_multi_node_recipe_on_a_one_host_profile_is_refused(cluster, says):
    res = reproduce_here(FOUR_NODES, "--cluster", cluster, "--dry-run")
    assert res.code == 2 and says in res.err and "Traceback" not in res.err
    if cluster == "ssh":  # the section the message points at exists
        assert "README, 'Several nodes'" in res.err
        assert "\n## Several nodes\n" in (REPO / "README.md").read_text()


def test_the_page_lists_the_codes_efa_table():
    page = (REPO / "docs" / "multinode.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", page, re.M)
    assert rows == [(v.name, v.value) for v in EFA_ENV]


def _pushes(script: str) -> list[tuple[str, str]]:
    """(the line before, the line) of every upload to the asset store in node.sh."""
    lines = script.splitlines()
    return [(lines[i - 1], ln) for i, ln in enumerate(lines) if "node_assets.py\" push" in ln
            or ('$ASSETS_PY" push' in ln)]  # fmt: skip


def test_on_several_nodes_only_node_0_fills_the_asset_store(tmp_path):
    """Every node fetches or converts the same bytes; N writers of one store object would
    collide, so the uploads are node 0's. One node: unguarded, as before."""
    store = {"assets": {"store": "s3://bucket/prefix"}}
    pushes = _pushes(dry_run(FOUR_NODES, ssh_hosts_profile(tmp_path, **store)))
    assert len(pushes) == 3  # the rows built, the conversion, the checkpoint from the Hub
    node0 = '[ "${NODE_RANK:-0}" = 0 ]'
    assert all(node0 in line or node0 in before for before, line in pushes), pushes
    one = tmp_path / "one.yaml"
    one.write_text(
        yaml.safe_dump({**yaml.safe_load((REPO / "env/local.yaml").read_text()), **store})
    )
    single = _pushes(dry_run(SEED, one))
    assert len(single) == 3 and not any("NODE_RANK" in b + ln for b, ln in single)
