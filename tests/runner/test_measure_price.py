"""The price a run used reaches every $ figure: one price, decided once per run.

Before this, a run with `--price-per-hour 40` (or a profile's price_per_hour) showed $40/h in
`status` while result.yaml and report.html priced its $/1M tokens at the catalog's $63.296. Here
a real run (the runner on this host, the node script streaming a stand-in miles log) is made with
each way of giving a price, and each $ figure a user reads is checked against it: run.json, the
cost gate's record, result.yaml's $/1M tokens and provenance, report.html, `reproduce status`,
and a re-measure of the saved run directory offline.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import yaml
from support.measure import SEED, run_standin, seed_raw, step_times_for_tps
from support.nodescript import plan_running, script

from launcher import catalog
from launcher.catalog import Price
from launcher.records.runs import summarize
from launcher.results.evaluate import measure_run_dir
from launcher.runner.prelaunch import RunOptions, prepare
from launcher.runner.runner import Runner

CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]


@pytest.fixture(scope="module")
def good_log(tmp_path_factory) -> Path:
    log = tmp_path_factory.mktemp("log") / "train.log"
    assert run_standin(log, steps=20, step_time_s=step_times_for_tps(CLAIM)) == 0
    return log


def _usd_per_million(hourly: float, tps: float) -> float:
    return hourly / (tps * 8 * 3600 / 1e6)


def _run(tmp_path: Path, log: Path, options: RunOptions) -> Path:
    """A real run of the seed on this host whose train stage prints `log` (the stand-in's)."""
    prepared = prepare(SEED, options)
    node_dir = str(tmp_path / "node" / prepared.plan.run_id)
    body = f"_mark train start\ncat {shlex.quote(str(log))}\n_mark train end ok\n"
    text = script(prepared.plan.run_id, node_dir, prepared.plan.container, body)
    plan = plan_running(prepared.plan.run_id, node_dir, text)
    prepared = dataclasses.replace(prepared, plan=plan)
    scripts = tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    outcome = Runner(scripts_dir=scripts, poll_s=0.05).run(prepared, options)
    assert outcome.state == "done", outcome
    (found,) = list((options.runs_dir or tmp_path).glob("**/run.json"))
    return found.parent


def _local_profile(tmp_path: Path, price: float | None) -> Path:
    data = yaml.safe_load((Path(SEED).parents[3] / "env" / "local.yaml").read_text())
    data["price_per_hour"] = price
    path = tmp_path / "local-priced.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


CASES = {
    # name: (profile price, --price-per-hour, the price every figure must use, its source)
    "option": (None, 40.0, 40.0, "option"),
    "option over profile": (33.0, 40.0, 40.0, "option"),
    "profile": (33.0, None, 33.0, "profile"),
    "catalog": (None, None, 63.296, "catalog"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_price_a_run_used_reaches_every_dollar_figure(tmp_path, good_log, case):
    profile_price, option, hourly, source = CASES[case]
    runs = tmp_path / "runs"
    options = RunOptions(
        cluster=str(_local_profile(tmp_path, profile_price)),
        price_per_hour=option,
        runs_dir=runs,
    )
    rd = _run(tmp_path, good_log, options)

    record = json.loads((rd / "run.json").read_text())
    assert record["price"]["usd_per_hour"] == hourly and record["price"]["source"] == source
    assert record["price"]["unit"] == catalog.PRICE_UNIT
    assert record["cost"]["price_per_hour"] == hourly  # what the gate showed and status counts

    result = yaml.safe_load((rd / "result.yaml").read_text())
    prov = result["provenance"]
    assert prov["price"]["usd_per_hour"] == hourly and prov["price"]["source"] == source
    tps = prov["unrounded"]["tokens_per_s_per_gpu"]
    assert prov["unrounded"]["usd_per_million_tokens"] == pytest.approx(
        _usd_per_million(hourly, tps)
    )
    if hourly != 63.296:  # the list price is not used behind the user's back
        assert prov["unrounded"]["usd_per_million_tokens"] != pytest.approx(
            _usd_per_million(63.296, tps)
        )

    page = (rd / "report.html").read_text()
    assert f'data-price="{hourly}"' in page and f'data-price-source="{source}"' in page
    assert f"${hourly:.3f} per node-hour" in page
    assert f"${hourly}/h" in (rd / "report.md").read_text()

    summary = summarize(rd)
    assert summary.price_per_hour == hourly and source in (summary.price_source or "")
    assert summary.cost_usd == pytest.approx(summary.elapsed_s / 3600 * hourly)

    # offline, the saved run directory is measured at the price it used, not the catalog's
    again, _ = measure_run_dir(rd, write_plots=False)
    assert again.price is not None and again.price.value == hourly
    assert again.price.source == source


@pytest.mark.parametrize("source", catalog.PRICE_SOURCES)
def test_every_recorded_source_reaches_result_yaml_report_and_status(tmp_path, good_log, source):
    """Whatever decided the price (a live lookup included), the run directory's record is what
    the measurement, the page and `status` use."""
    runs = tmp_path / "runs"
    rd = _run(tmp_path, good_log, RunOptions(cluster="local", runs_dir=runs))
    price = Price(27.1988, source, "p5en.48xlarge", "us-east-2", "2026-12-01T10:00:00Z", "as read")
    record = json.loads((rd / "run.json").read_text())
    record["price"] = price.to_dict()
    record["cost"]["price_per_hour"] = price.value
    (rd / "run.json").write_text(json.dumps(record))

    result, _ = measure_run_dir(rd, write_plots=False)
    assert result.price == price
    written = yaml.safe_load((rd / "result.yaml").read_text())["provenance"]["price"]
    assert written == price.to_dict()
    page = (rd / "report.html").read_text()
    assert 'data-price="27.1988"' in page and f'data-price-source="{source}"' in page
    summary = summarize(rd)
    assert summary.price_per_hour == 27.1988 and summary.price_source == price.describe()
    # --price-per-hour given to `measure` prices it anew, and says so
    over, _ = measure_run_dir(rd, price_per_hour=12.0, write_plots=False)
    assert over.price is not None and over.price.value == 12.0 and over.price.source == "option"


def test_a_damaged_recorded_price_falls_back_to_the_catalog_never_to_garbage(tmp_path, good_log):
    rd = _run(tmp_path, good_log, RunOptions(cluster="local", runs_dir=tmp_path / "runs"))
    record = json.loads((rd / "run.json").read_text())
    record["price"] = {"usd_per_hour": float("nan"), "source": "option"}
    (rd / "run.json").write_text(json.dumps(record))
    result, _ = measure_run_dir(rd, write_plots=False)
    assert result.price is not None and result.price.source == "catalog"
    assert result.price.value == 63.296
