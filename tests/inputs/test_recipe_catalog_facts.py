"""`validate` checks the recipe's `gpu` block against the catalog's facts of its gpu.instance: the
GPU model, the GPUs per node and the memory per GPU (launcher/catalog.py, instance_problems).

Before, only the AWS dry run refused an H200 recipe on p5.48xlarge (an H100 instance) or 16 GPUs
per node on p5en (8); `validate` accepted both and the local dry run priced the 16-GPU node at
one instance's $63.296/h. Now every target refuses them before any plan, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here

from launcher import catalog
from launcher.errors import BadInput
from launcher.inputs.recipe import load_recipe


def write(tmp_path: Path, **gpu) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    raw["gpu"].update(gpu)
    if {"type", "instance"} & set(gpu):  # the seed's MFU and $ are its H200s' on p5en
        raw["result"].update(mfu=None, usd_per_million_tokens=None)
    layout = raw["layout"]
    layout["dp"] = raw["gpu"]["count"] // (layout["tp"] * layout["pp"] * layout["cp"])
    per_node, nodes = raw["gpu"]["per_node"], raw["gpu"]["count"] // raw["gpu"]["per_node"]
    for option in ("--actor-num-gpus-per-node", "--num-gpus-per-node"):  # the run block agrees
        raw["run"] = raw["run"].replace(f"{option} 8", f"{option} {per_node}")
    raw["run"] = raw["run"].replace("--actor-num-nodes 1", f"--actor-num-nodes {nodes}")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


CASES = {
    "an H200 recipe on p5.48xlarge (H100)": (
        {"instance": "AWS p5.48xlarge"}, "gpu.type", "8 x H100"),
    "16 GPUs per node on p5en (8)": (
        {"per_node": 16, "count": 16}, "gpu.per_node", "16, but gpu.instance"),
    "4 GPUs per node of an 8-GPU instance": (
        {"per_node": 4, "count": 8}, "gpu.per_node", "expected 8"),
    "80 GB per GPU on p5en (141)": ({"memory_gb": 80}, "gpu.memory_gb", "have 141 GB"),
    "A100 40 GB on p4de (A100 80 GB)": (
        {"type": "A100", "memory_gb": 40, "instance": "AWS p4de.24xlarge"}, "gpu.memory_gb",
        "expected 80"),
    "B200 on p5en": ({"type": "B200", "memory_gb": 180}, "gpu.type", "expected H200"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["validate", "local dry run", "aws dry run"])
def test_a_gpu_block_the_instance_contradicts_is_refused_on_every_target(case, command, tmp_path):
    gpu, field, words = CASES[case]
    path = write(tmp_path, **gpu)
    args = {
        "validate": ("validate", path),
        "local dry run": (path, "--cluster", "local", "--dry-run"),
        "aws dry run": (path, "--cluster", "aws", "--dry-run"),
    }[command]
    res = reproduce_here(*args)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert f"- {field}:" in res.err and words in res.err, res.err
    assert "$" not in res.out  # nothing priced


@pytest.mark.parametrize("name", sorted(catalog.INSTANCE_TYPES))
def test_every_catalog_instance_with_its_own_gpus_validates(name, tmp_path):
    entry = catalog.INSTANCE_TYPES[name]
    part = catalog.GPUS[entry.gpu]
    path = write(
        tmp_path,
        type=entry.gpu,
        memory_gb=part.memory_gb,
        per_node=entry.gpus,
        count=entry.gpus,
        instance=f"AWS {name}",
    )
    assert load_recipe(path).gpus_per_node == entry.gpus


@pytest.mark.parametrize("name", sorted(catalog.INSTANCE_TYPES))
def test_every_catalog_instance_refuses_one_gpu_more_per_node(name, tmp_path):
    entry = catalog.INSTANCE_TYPES[name]
    path = write(
        tmp_path, type=entry.gpu, memory_gb=None, per_node=entry.gpus + 1,
        count=entry.gpus + 1, instance=f"AWS {name}",
    )  # fmt: skip
    with pytest.raises(BadInput, match=r"gpu\.per_node: .* expected " + str(entry.gpus)):
        load_recipe(path)


@pytest.mark.parametrize(
    "named", ["AWS p5en.48xlarg", "AWS p9.96xlarge", "p5en.48xlarge.", "GCP p5en.48xlarge"]
)
def test_an_instance_the_catalog_does_not_know_is_refused_naming_the_known_ones(tmp_path, named):
    """A typo got no facts, no price and an AWS plan that said NO PRICE; now exit 2 before any
    plan, naming the field and every type the catalog knows."""
    path = write(tmp_path, instance=named)
    for args in (("validate", path), (path, "--dry-run"), (path, "--dry-run", "--cluster", "aws")):
        res = reproduce_here(*args)
        assert res.code == 2 and "Traceback" not in res.err, res
        assert f"- gpu.instance: {named!r} is not an instance type the catalog knows" in res.err
        assert all(f"AWS {t}" in res.err for t in catalog.INSTANCE_TYPES), res.err
        assert "NO PRICE" not in res.out + res.err


def test_a_cluster_that_is_no_cloud_instance_states_null(tmp_path):
    none = write(tmp_path, instance=None, per_node=16, count=16)
    assert load_recipe(none).gpus_per_node == 16
