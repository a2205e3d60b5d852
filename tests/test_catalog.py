"""The catalog of hardware facts: every reader gets the same figure, and an unknown one is None."""

from __future__ import annotations

import pytest
from support.measure import as_recipe, seed_raw, step_times_for_tps

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


def test_price_known_only_where_sourced_never_guessed():
    seed = catalog.price_per_hour("AWS p5en.48xlarge")
    assert seed.value == 63.296 and "default" in seed.source
    assert catalog.price_per_hour("p5.48xlarge", "us-east-1") is None  # no sourced price
    assert catalog.price_per_hour("p5.48xlarge", override=50.0).value == 50.0
    with pytest.raises(BadInput):
        catalog.price_per_hour("p5en.48xlarge", override=0.0)


def test_a_dense_recipe_on_p5_gets_the_h100_peak_and_says_no_price_is_known():
    raw = seed_raw()
    raw["gpu"].update(type="H100", memory_gb=80, instance="AWS p5.48xlarge")
    t = step_times_for_tps(6913.23)
    recs = [StepRecord(step=s, loss=1.0, step_time=t) for s in range(20)]
    result = measure(recs, as_recipe(raw))
    assert result.peak_flops == 989e12 and "H100" in result.peak_source
    assert result.price is None and result.usd_per_million_tokens is None
    assert any("no price known" in n for n in result.notes)
    raw["gpu"].update(type="B200", memory_gb=180, instance="AWS p6-b200.48xlarge")
    b200 = measure(recs, as_recipe(raw))
    assert b200.peak_flops == 2250e12
    assert b200.mfu == pytest.approx(result.mfu * 989 / 2250)
