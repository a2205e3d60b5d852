"""The cost gate: no paid launch starts without its cost on screen and a yes (a person at the
terminal, `--yes`) or a budget (`--max-usd`). AWS is an endpoint that records every request, so
"no cloud call was made" is checked on the wire, whatever the call would have been.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.operator_cli import (
    SEED,
    RecordingEndpoint,
    aws_env,
    no_runs,
    run_in_terminal,
    run_piped,
)

from launcher.cost.costgate import decide, launches, refuse_unattended
from launcher.cost.estimate import estimate
from launcher.errors import BadInput, InfraError
from launcher.inputs.recipe import load_recipe
from launcher.runner.prelaunch import RunOptions, prepare

WORST = "$379.78 until the TTL: 6 h x 1 node(s) x $63.296/h"  # the seed on p5en, env/aws.yaml
PRICE_READ = "AWSPriceListService.GetProducts"  # the one read before the cost is shown


@pytest.fixture
def endpoint():
    server = RecordingEndpoint().start()
    yield server
    server.stop()


def test_without_a_terminal_a_launch_needs_yes_or_a_budget_and_nothing_is_sent(endpoint, tmp_path):
    runs = tmp_path / "runs"
    result = run_piped(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs)], aws_env(endpoint, tmp_path)
    )
    assert result.returncode == 2, result.stderr
    assert WORST in result.stderr  # the cost is on screen, worst case included
    assert "expected  1.25 GPU-hours" in result.stderr and "$9.89" in result.stderr
    assert "--max-usd" in result.stderr and "--yes" in result.stderr
    assert "nothing was launched" in result.stderr
    assert endpoint.requests == []  # not one AWS call
    assert no_runs(runs)  # no run directory, no history row


@pytest.mark.parametrize("consent", [["--yes"], ["--max-usd", "50"]])
def test_yes_or_a_budget_lets_the_launch_start(endpoint, tmp_path, consent):
    runs = tmp_path / "runs"
    result = run_piped(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs), *consent],
        aws_env(endpoint, tmp_path),
    )
    assert WORST in result.stderr
    assert endpoint.requests, result.stderr  # it went on to AWS (which said no here)
    assert result.returncode in (2, 3), result.stderr


def test_a_person_at_the_terminal_is_asked_and_no_sends_nothing(endpoint, tmp_path):
    runs = tmp_path / "runs"
    seen: list[int] = []
    code, screen = run_in_terminal(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs)],
        aws_env(endpoint, tmp_path),
        answer="n\n",
        on_prompt=lambda _screen: seen.append(len(endpoint.requests)),
    )
    # asked before any call but the run's price (a read: pricing GetProducts; the endpoint
    # refuses it, so the catalog's price is shown, with a warning)
    assert seen == [len(endpoint.requests)], screen
    assert endpoint.requests and all(PRICE_READ in r for r in endpoint.requests), endpoint.requests
    assert "live price lookup failed" in screen and "catalog" in screen
    assert "LAUNCHES" in screen and WORST in screen and "Launch it and start paying?" in screen
    assert code == 2 and "not confirmed" in screen
    assert no_runs(runs)


def test_a_yes_at_the_terminal_starts_the_launch(endpoint, tmp_path):
    runs = tmp_path / "runs"
    seen: list[int] = []
    code, screen = run_in_terminal(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs)],
        aws_env(endpoint, tmp_path),
        answer="y\n",
        on_prompt=lambda _screen: seen.append(len(endpoint.requests)),
    )
    assert len(seen) == 1 and all(PRICE_READ in r for r in endpoint.requests[: seen[0]]), screen
    assert len(endpoint.requests) > seen[0], screen  # the launch began only after the yes
    assert code in (2, 3), screen


def test_yes_at_the_terminal_skips_the_question(endpoint, tmp_path):
    code, screen = run_in_terminal(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(tmp_path / "runs"), "--yes"],
        aws_env(endpoint, tmp_path),
    )
    assert "[y/N]" not in screen and WORST in screen
    assert endpoint.requests and code in (2, 3), screen


def test_no_credentials_is_exit_2_before_anything_and_leaves_nothing(endpoint, tmp_path):
    runs = tmp_path / "runs"
    result = run_piped(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs), "--yes"],
        aws_env(endpoint, tmp_path, credentials=False),
    )
    assert result.returncode == 2, result.stderr
    assert "no AWS credentials" in result.stderr and "Traceback" not in result.stderr
    assert endpoint.requests == []
    assert no_runs(runs)  # the run directory and the "failed" history row of old are gone


def test_a_nightly_on_aws_needs_a_budget_or_yes_before_its_first_recipe(endpoint, tmp_path):
    runs = tmp_path / "runs"
    env = aws_env(endpoint, tmp_path)
    refused = run_piped(["nightly", str(SEED), "--cluster", "aws", "--runs-dir", str(runs)], env)
    assert refused.returncode == 2, refused.stderr
    assert "a nightly on --cluster aws" in refused.stderr and "--max-usd" in refused.stderr
    assert endpoint.requests == [] and no_runs(runs)
    budgeted = run_piped(
        ["nightly", str(SEED), "--cluster", "aws", "--runs-dir", str(runs), "--max-usd", "40"],
        env,
    )
    assert endpoint.requests, budgeted.stdout + budgeted.stderr  # each run: its gate passed
    assert WORST in budgeted.stderr + budgeted.stdout


# --- the decision itself, per kind --------------------------------------------------------------


def _gate(cluster: str, *, attended: bool, **options):
    opts = RunOptions(cluster=cluster, **options)
    return decide(prepare(SEED, opts), opts, attended=attended)


@pytest.mark.parametrize("cluster", ["local", "ssh", "ray"])
def test_targeted_hosts_show_their_cost_per_hour_and_are_never_asked(cluster):
    for attended in (True, False):
        gate = _gate(cluster, attended=attended, price_per_hour=12.5)
        assert not gate.launches and not gate.ask and gate.refusal is None
        assert gate.worst_case_usd is None
        assert any(line.startswith("cost      $12.50/h") for line in gate.header), gate.header


def test_an_existing_instance_is_targeted_not_launched():
    gate = _gate("aws", attended=False, instance_id="i-0123456789abcdef0")
    assert not gate.launches and gate.refusal is None and not gate.ask


def test_the_worst_case_is_ttl_times_nodes_times_price():
    gate = _gate("aws", attended=True)
    assert gate.launches and gate.ask and gate.refusal is None
    assert gate.worst_case_usd == pytest.approx(6 * 63.296)
    assert gate.to_record()["worst_case_usd"] == pytest.approx(379.776)
    assert json.loads(json.dumps(gate.to_record()))["launches"] is True
    assert not _gate("aws", attended=True, yes=True).ask
    unattended = _gate("aws", attended=False)
    assert unattended.refusal and "--max-usd" in unattended.refusal
    assert _gate("aws", attended=False, max_usd=50.0).refusal is None


def test_nightly_rule_is_the_gate_rule():
    from launcher.inputs.profile import load_profile

    aws, local = load_profile("aws"), load_profile("local")
    assert launches(aws) and not launches(local)
    with pytest.raises(BadInput, match="nobody is at a terminal"):
        refuse_unattended(aws, yes=False, max_usd=None, who="a nightly")
    refuse_unattended(aws, yes=True, max_usd=None, who="a nightly")
    refuse_unattended(aws, yes=False, max_usd=10.0, who="a nightly")
    refuse_unattended(local, yes=False, max_usd=None, who="a nightly")


class _Recorder:
    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.events: list[tuple[str, object]] = []

    def cost(self, gate) -> None:
        self.events.append(("cost", gate))

    def confirm(self, question: str) -> bool:
        self.events.append(("confirm", question))
        return self.answer

    def say(self, text: str) -> None:
        self.events.append(("say", text))


def test_the_runner_shows_the_cost_before_the_run_directory_and_asks_only_launches(
    tmp_path, monkeypatch
):
    """Runner.run is the one door of `reproduce RECIPE` and `nightly`: the cost goes to the
    reporter before anything exists; a targeted host is not asked."""
    from launcher import clusters
    from launcher.runner.runner import Runner

    made: list[Path] = []

    class Stop(InfraError):
        pass

    def from_plan(plan, options, run_dir):
        made.append(Path(run_dir))
        raise Stop("stop before acquiring")

    monkeypatch.setattr(clusters, "from_plan", from_plan)
    reporter = _Recorder(answer=False)
    opts = RunOptions(cluster="local", runs_dir=tmp_path / "runs", price_per_hour=3.0)
    with pytest.raises(Stop):
        Runner(reporter).run(prepare(SEED, opts), opts)
    kinds = [kind for kind, _ in reporter.events]
    assert kinds[0] == "cost" and "confirm" not in kinds
    assert made and (made[0] / "run.json").is_file()
    assert json.loads((made[0] / "run.json").read_text())["cost"]["price_per_hour"] == 3.0


def test_the_gate_shows_the_likely_cost_and_a_budget_under_it():
    """The claim's $9.89 counts no provisioning and no downloads: the gate also shows what a new
    node will likely cost, and warns when --max-usd would stop the run before its window."""
    header = "\n".join(_gate("aws", attended=True, max_usd=20.0).header)
    cold = estimate(load_recipe(SEED), fresh_instance=True).total("cold node")
    usd = cold / 8 * 63.296  # the seed's one p5en at the catalog's price
    assert header.index("expected  1.25 GPU-hours") < header.index(
        f"likely    {cold:.2f} GPU-hours"
    )
    assert f"WARNING   --max-usd 20 is under this estimate (${usd:,.2f})" in header
    assert "WARNING" not in "\n".join(_gate("aws", attended=True, max_usd=60.0).header)
