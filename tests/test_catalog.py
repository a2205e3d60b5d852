"""The catalog of hardware facts: every reader gets the same figure, and an unknown one is None."""

from __future__ import annotations

import pytest
from support.measure import as_recipe, seed_raw, step_times_for_tps
from support.paths import REPO

from launcher import catalog
from launcher.errors import BadInput
from launcher.judge.measure import measure
from launcher.judge.parse.miles import StepRecord
from launcher.plan.preflight import expected_efa_devices


def test_every_instance_names_a_known_gpu_and_where_its_figures_come_from():
    assert set(catalog.INSTANCE_TYPES) >= {
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p6-b200.48xlarge",
    }
    for name, entry in catalog.INSTANCE_TYPES.items():
        assert entry.name == name and entry.provider == "aws"
        assert entry.gpu in catalog.GPUS, name
        assert entry.gpus == 8 and entry.max_efa <= entry.network_cards
        assert entry.source and entry.read_on
        if entry.on_demand_usd_per_hour:
            assert entry.price_source and entry.price_read_on
    for gpu in catalog.GPUS.values():
        assert gpu.source and gpu.read_on and gpu.peak_bf16_flops


def test_instance_string_parse_and_lookups():
    assert catalog.split_instance("AWS p5en.48xlarge") == ("aws", "p5en.48xlarge")
    assert catalog.split_instance("p5en.48xlarge") == (None, "p5en.48xlarge")
    assert catalog.split_instance("  ") == (None, None)
    assert catalog.instance("AWS P5EN.48XLARGE").max_efa == 16
    assert catalog.instance("g6.xlarge") is None
    assert catalog.gpu("NVIDIA H200").peak_bf16_flops == 989e12
    assert catalog.gpu("a100 80gb").name == "A100-80GB"
    assert catalog.gpu("MI300X") is None


def test_preflight_expects_the_catalogs_efa_count():
    for name, entry in catalog.INSTANCE_TYPES.items():
        assert expected_efa_devices(name) == entry.max_efa


def test_every_instance_has_a_sourced_price_or_says_why_it_has_none():
    for name, entry in catalog.INSTANCE_TYPES.items():
        assert entry.price_source and entry.price_read_on, name
        if entry.on_demand_usd_per_hour:
            # a citation a reader can follow: a repository path or a pull request
            assert "github.com" in entry.price_source or "pull" in entry.price_source, name
            assert all(0 < v < 1000 for v in entry.on_demand_usd_per_hour.values()), name
            assert catalog.DEFAULT_REGION in entry.on_demand_usd_per_hour, name
        else:
            assert name == "p5e.48xlarge", f"{name} has no price and no reason"
            assert "Capacity Blocks only" in entry.price_source


def test_price_known_only_where_sourced_never_guessed():
    seed = catalog.price_per_hour("AWS p5en.48xlarge")
    assert seed.value == 63.296 and seed.source == "catalog" and "default" in seed.detail
    p5 = catalog.price_per_hour("p5.48xlarge", "us-east-1")  # after AWS's mid-2025 cut
    assert p5.value == 55.04 and p5.region == "us-east-1" and p5.read_at == "2026-08-26"
    assert "p5_instances.js" in p5.describe()
    assert catalog.price_per_hour("p5e.48xlarge", "us-east-1") is None  # Capacity Blocks only
    assert "Capacity Blocks only" in catalog.no_price_reason("AWS p5e.48xlarge")
    assert catalog.price_per_hour("p4d.24xlarge", "us-east-1").value == 21.957642
    option = catalog.price_per_hour("p5.48xlarge", override=50.0)
    assert option.value == 50.0 and option.source == "option"
    profile = catalog.price_per_hour("p5.48xlarge", override=50.0, override_source="profile")
    assert profile.source == "profile" and "profile" in profile.describe()
    with pytest.raises(BadInput):
        catalog.price_per_hour("p5en.48xlarge", override=0.0)
    with pytest.raises(BadInput, match="af-south-1"):
        catalog.price_per_hour("p5.48xlarge", "af-south-1")  # another region's price is no answer


@pytest.mark.parametrize("source", catalog.PRICE_SOURCES)
def test_a_recorded_price_reads_back_as_it_was_written(source):
    price = catalog.Price(41.5, source, "p5en.48xlarge", "us-west-2", "2026-12-01T10:00:00Z", "x")
    assert catalog.Price.from_dict(price.to_dict()) == price
    assert price.to_dict()["unit"] == catalog.PRICE_UNIT


@pytest.mark.parametrize(
    "hostile",
    [
        None,
        "63.296",
        [],
        {"usd_per_hour": float("nan"), "source": "catalog"},
        {"usd_per_hour": float("inf"), "source": "catalog"},
        {"usd_per_hour": -1.0, "source": "catalog"},
        {"usd_per_hour": 0, "source": "catalog"},
        {"usd_per_hour": True, "source": "catalog"},
        {"usd_per_hour": "63.296", "source": "catalog"},
        {"usd_per_hour": 63.296, "source": "a guess"},
        {"usd_per_hour": 63.296},
    ],
)
def test_a_damaged_recorded_price_is_no_price_never_a_wrong_one(hostile):
    assert catalog.Price.from_dict(hostile) is None


def test_a_dense_recipe_on_p5_gets_the_h100_peak_and_its_own_price():
    raw = seed_raw()
    raw["gpu"].update(type="H100", memory_gb=80, instance="AWS p5.48xlarge")
    t = step_times_for_tps(6913.23)
    recs = [StepRecord(step=s, loss=1.0, step_time=t) for s in range(20)]
    result = measure(recs, as_recipe(raw))
    assert result.peak_flops == 989e12 and "H100" in result.peak_source
    assert result.price.value == 55.04 and result.price.source == "catalog"
    assert result.usd_per_million_tokens == pytest.approx(55.04 / (6913.23 * 8 * 3600 / 1e6))
    raw["gpu"]["instance"] = "AWS p5e.48xlarge"
    raw["gpu"]["type"] = "H200"
    p5e = measure(recs, as_recipe(raw))
    assert p5e.price is None and p5e.usd_per_million_tokens is None
    assert any("no price known" in n for n in p5e.notes)
    raw["gpu"].update(type="B200", memory_gb=180, instance="AWS p6-b200.48xlarge")
    b200 = measure(recs, as_recipe(raw))
    assert b200.peak_flops == 2250e12
    assert b200.mfu == pytest.approx(result.mfu * 989 / 2250)


NAMES = [
    "NVIDIA H200",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H20",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA B200",
]
TYPES = [
    "H200",
    "h200",
    "H20",
    "H100",
    "H200 NVL",
    "H200X",
    "A100",
    "A100-SXM4-80GB",
    "B200",
    "B20",
]


@pytest.mark.parametrize("gpu_type", TYPES)
def test_validate_and_the_preflight_match_a_gpu_name_by_one_rule(gpu_type):
    """What `validate` lets through the node's preflight must not refuse after it was paid for:
    the launcher's rule and the node program's, over names nvidia-smi prints."""
    import importlib
    import sys

    from launcher.catalog import gpu_name_matches

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        module = importlib.import_module("preflight_checks")
    finally:
        sys.path.remove(str(REPO / "scripts"))
    for name in NAMES:
        node = module.check_gpu_model([{"name": name, "index": "0"}], gpu_type)
        assert gpu_name_matches(gpu_type, name) == node.ok, (gpu_type, name)


@pytest.mark.parametrize("gpu_type", ["H20", "H200 NVL", "H200X"])
def test_a_gpu_type_the_instance_does_not_have_is_refused_at_validate(gpu_type):
    problems = catalog.instance_problems(
        {"type": gpu_type, "instance": "p5en.48xlarge", "per_node": 8}
    )
    assert [f for f, _ in problems][:1] == ["gpu.type"], problems
