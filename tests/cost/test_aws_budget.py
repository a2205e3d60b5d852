"""The budget guard (--max-usd, --max-hours). Its enforcement during a run, and the release on
every way out, are tested on the real run path: tests/clusters/aws/test_aws_runner_release.py."""

from __future__ import annotations

import pytest

from launcher.cost.budget import Budget
from launcher.errors import BadInput

pytestmark = pytest.mark.aws


def test_check_stops_at_the_dollar_limit_for_all_nodes():
    budget = Budget(max_usd=100.0, max_hours=None, price_per_hour=63.296, nodes=2)
    assert budget.check(0) is None
    assert budget.check(2843) is None  # 0.79 h x $126.59/h = $99.97
    reason = budget.check(2844)
    assert reason and "--max-usd 100" in reason and "2 nodes" in reason


def test_check_stops_at_the_hour_limit():
    budget = Budget(max_usd=None, max_hours=0.5, price_per_hour=63.296, nodes=1)
    assert budget.check(1799) is None
    assert "--max-hours 0.5" in budget.check(1800)


def test_a_run_expected_to_cost_more_than_the_budget_is_refused_before_launch():
    budget = Budget(max_usd=5.0, max_hours=None, price_per_hour=63.296, nodes=1)
    with pytest.raises(BadInput) as err:
        budget.refuse_if_over(1.25 / 8)  # the seed: 1.25 GPU-hours on 8 GPUs = $9.89
    assert (
        err.value.exit_code == 2
        and "$9.89" in str(err.value)
        and "nothing was launched" in str(err.value)
    )
    Budget(max_usd=10.0, max_hours=None, price_per_hour=63.296, nodes=1).refuse_if_over(1.25 / 8)
    with pytest.raises(BadInput, match="--max-hours"):
        Budget(max_usd=None, max_hours=0.1, price_per_hour=63.296, nodes=1).refuse_if_over(0.2)


def test_the_seed_recipes_budget_uses_its_nodes_and_claimed_gpu_hours():
    from support.aws import seed_recipe

    recipe = seed_recipe()
    budget = Budget.for_recipe(recipe, 63.296, max_usd=9.0, max_hours=None)
    assert budget.nodes == 1 and Budget.expected_hours(recipe) == pytest.approx(1.25 / 8)
    with pytest.raises(BadInput, match=r"\$9.89"):
        budget.refuse_if_over(Budget.expected_hours(recipe))


def test_a_dollar_limit_without_a_price_is_bad_input():
    with pytest.raises(BadInput, match="price"):
        Budget(max_usd=10.0, max_hours=None, price_per_hour=None, nodes=1)
    with pytest.raises(BadInput, match="positive"):
        Budget(max_usd=-1.0, max_hours=None, price_per_hour=1.0, nodes=1)
