"""The budget guard (--max-usd, --max-hours) and always_release with any backend."""

from __future__ import annotations

import pytest

from launcher.budget import Budget
from launcher.errors import BadInput, InfraError, Interrupted
from launcher.teardown import always_release

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
    from aws_support import seed_recipe

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


class FakeCluster:
    """Counts releases; optionally fails them."""

    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.releases = 0
        self.failures = list(failures or [])

    def release(self) -> None:
        self.releases += 1
        if self.failures:
            raise self.failures.pop(0)

    def leftovers(self) -> list[str]:
        return ["instance i-123"] if self.failures else []

    def down_command(self) -> str:
        return "reproduce down runs/x"


def test_release_runs_on_success_and_on_error():
    ok = FakeCluster()
    with always_release(ok, log=lambda m: None):
        pass
    assert ok.releases == 1
    failing = FakeCluster()
    with pytest.raises(ValueError):
        with always_release(failing, log=lambda m: None):
            raise ValueError("training failed")
    assert failing.releases == 1


def test_interrupted_teardown_is_finished():
    cluster = FakeCluster([KeyboardInterrupt()])
    with always_release(cluster, log=lambda m: None):
        pass
    assert cluster.releases == 2


def test_teardown_that_keeps_failing_names_what_is_left_and_the_command():
    cluster = FakeCluster(
        [KeyboardInterrupt(), KeyboardInterrupt(), KeyboardInterrupt(), KeyboardInterrupt()]
    )
    with pytest.raises(InfraError) as err:
        with always_release(cluster, log=lambda m: None):
            pass
    assert "instance i-123" in str(err.value) and "reproduce down runs/x" in str(err.value)


def test_the_blocks_own_error_wins_and_the_teardown_error_is_printed():
    printed: list[str] = []
    cluster = FakeCluster([InfraError("could not delete sg-1")])
    with pytest.raises(Interrupted):
        with always_release(cluster, log=printed.append):
            raise KeyboardInterrupt
    assert any("sg-1" in line for line in printed)
