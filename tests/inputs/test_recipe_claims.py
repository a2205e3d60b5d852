"""`validate` holds the recipe's figures to each other by its own formulas (docs/measurement.md):
MFU = 6 x N x tokens/s per GPU / peak; $/1M = price x nodes / (tokens/s per GPU x GPUs x 3600 /
1e6), the price one the catalog has for the instance; GPU-hours at least the window's own time.

The adversary scales each figure of the seed by factors around 1 and asserts the refusal comes
exactly when the figure leaves its formula's value by more than the figures' rounding, with the
numbers in the message.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here

from launcher import catalog
from launcher.inputs.claims import (
    HOURS_ROUNDING,
    MFU_ROUNDING,
    RELATIVE,
    USD_ROUNDING,
    claim_problems,
)

SEED_RAW = yaml.safe_load(SEED.read_text())
FACTORS = (0.5, 0.9, 0.97, 0.995, 1.0, 1.005, 1.03, 1.1, 2.0)
TPS = SEED_RAW["result"]["tokens_per_s_per_gpu"]
N = SEED_RAW["result"]["active_params"]["count"]
PEAK = 989e12
MFU = 6 * N * TPS / PEAK
PRICES = catalog.INSTANCE_TYPES["p5en.48xlarge"].on_demand_usd_per_hour.values()
MILLIONS_AN_HOUR = TPS * 8 * 3600 / 1e6
WINDOW_HOURS = 15 * 128 * 8192 / TPS / 3600


def with_result(**figures) -> dict:
    raw = copy.deepcopy(SEED_RAW)
    raw["result"].update(figures)
    return raw


def fields(raw: dict) -> list[str]:
    return [f for f, _ in claim_problems(raw)]


@pytest.mark.parametrize("factor", FACTORS)
def test_mfu_is_refused_exactly_when_it_leaves_the_formula(factor):
    claimed = round(MFU * factor, 4)
    wrong = abs(claimed - MFU) > MFU_ROUNDING + RELATIVE * MFU
    assert ("result.mfu" in fields(with_result(mfu=claimed))) == wrong
    # a note saying how it was computed instead: not held to the formula
    assert fields(with_result(mfu=claimed, mfu_note="Megatron's count")) == []


@pytest.mark.parametrize("factor", FACTORS)
def test_usd_per_million_is_refused_exactly_when_no_catalog_price_gives_it(factor):
    claimed = round(0.32 * factor, 2)
    implied = claimed * MILLIONS_AN_HOUR
    slack = USD_ROUNDING * MILLIONS_AN_HOUR
    wrong = not (
        min(PRICES) * (1 - RELATIVE) - slack <= implied <= max(PRICES) * (1 + RELATIVE) + slack
    )
    assert (
        "result.usd_per_million_tokens" in fields(with_result(usd_per_million_tokens=claimed))
    ) == wrong


@pytest.mark.parametrize("factor", FACTORS)
def test_gpu_hours_below_the_windows_own_time_are_refused(factor):
    claimed = round(WINDOW_HOURS * factor, 3)
    wrong = claimed < WINDOW_HOURS * (1 - RELATIVE) - HOURS_ROUNDING
    assert ("result.gpu_hours" in fields(with_result(gpu_hours=claimed))) == wrong


def test_a_throughput_above_the_gpus_peak_is_refused_without_an_mfu_claim():
    tps = PEAK / (6 * N) * 1.2
    problems = claim_problems(with_result(tokens_per_s_per_gpu=tps, mfu=None, gpu_hours=None,
                                          usd_per_million_tokens=None))  # fmt: skip
    ((field, message),) = problems
    assert field == "result.tokens_per_s_per_gpu" and "MFU above 1" in message


def test_every_fixture_and_the_seed_hold_together():
    for path in [SEED, *sorted((Path(__file__).parents[1] / "data" / "recipes").glob("*.yaml"))]:
        assert claim_problems(yaml.safe_load(path.read_text())) == [], path


def test_contradicting_claims_through_the_cli_name_the_numbers(tmp_path):
    raw = with_result(mfu=0.2, usd_per_million_tokens=0.9, gpu_hours=0.5)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    for args in (("validate", path), (path, "--dry-run")):
        res = reproduce_here(*args)
        assert res.code == 2 and "Traceback" not in res.err, res
        assert "- result.mfu: 0.2, but the recipe's formula gives 6 x 3,041,656,832" in res.err
        assert "= 0.1276" in res.err
        assert "- result.usd_per_million_tokens: 0.9, which at 6913.23 tokens/s" in res.err
        assert "$179.19 per p5en.48xlarge hour" in res.err and "$63.296 to $79.12" in res.err
        assert "0.32 to 0.40" in res.err
        assert "- result.gpu_hours: 0.5, but the window alone took 0.632 GPU-hours" in res.err
