"""Property test: random per-run figures and faults -> the verdict on the mean of K measured
runs (launcher/judge/aggregate.py) matches an independent computation of the policy
(docs/measurement.md, "A mean of several runs"):

- a run failed or incomplete (or a run that never ran) makes the whole failed (any failed) or
  incomplete, names each such run, states no difference and no figure;
- otherwise the figure is the arithmetic mean of the runs' tokens/s per GPU, computed here from
  the step times alone; the whole is unstable when a run is, or when the runs' mean CV is above
  the limit; else slower / faster / reproduced by the -3% / +3% tolerance;
- the verdict always says how many runs were measured.

Each run is measured and judged alone by the real measure() and judge() on step records built
here; only the aggregation is under test, against the model.
"""

from __future__ import annotations

import math
import statistics

from hypothesis import assume, example, given
from hypothesis import strategies as st
from support.measure import seed_raw, seed_recipe
from support.properties import examples

from launcher.judge.aggregate import Run, judge_mean
from launcher.judge.measure import measure
from launcher.judge.parse.records import StepRecord
from launcher.judge.verdict import judge

SETTINGS = examples(60)
RAW = seed_raw()
RECIPE = seed_recipe()
CLAIM = RAW["result"]["tokens_per_s_per_gpu"]
CV_LIMIT = max(2.0, 2.0 * RAW["result"]["step_time_cv_percent"])
FIRST, LAST = RAW["result"]["window"]
STEPS = RAW["result"]["steps_per_run"]
TOKENS = RAW["workload"]["global_batch"] * RAW["workload"]["row_tokens"]
GPUS = RAW["gpu"]["count"]


@st.composite
def a_run(draw: st.DrawFn) -> dict:
    """One measured run's model: its base step time, how much it wobbles, and a fault or none."""
    return {
        "base": draw(st.floats(17.6, 20.4)),  # about -7% .. +8% around the claim
        "wobble": draw(st.sampled_from([0.0, 0.003, 0.01, 0.05])),  # 0.05: CV 5%, unstable
        "fault": draw(st.sampled_from([None, None, None, "nan", "missing", "short"])),
        "at": draw(st.integers(FIRST, LAST)),
    }


def records(model: dict) -> list[StepRecord]:
    out = []
    clock = 1.7e9
    for step in range(STEPS if model["fault"] != "short" else model["at"]):
        sign = 1 if step % 2 else -1
        step_time = model["base"] * (1 + sign * model["wobble"])
        clock += step_time  # the step line's stamp agrees with its step time (the gate checks)
        if model["fault"] == "missing" and step == model["at"]:
            continue
        loss = math.nan if model["fault"] == "nan" and step == model["at"] else 2.0 - 0.05 * step
        out.append(StepRecord(step, loss, 1.0, step_time=step_time, timestamp=clock))
    return out


def window_times(model: dict) -> list[float]:
    return [r.step_time for r in records(model) if FIRST <= r.step <= LAST]


def cv(times: list[float]) -> float:
    return 100.0 * statistics.pstdev(times) / statistics.fmean(times)


def expected_run_status(model: dict) -> str:
    if model["fault"] == "nan":
        return "failed"
    if model["fault"] in ("missing", "short"):
        return "incomplete"
    times = window_times(model)
    tps = len(times) * TOKENS / sum(times) / GPUS
    diff = 100.0 * (tps - CLAIM) / CLAIM
    if cv(times) > CV_LIMIT:
        return "unstable"
    return "slower" if diff < -3 else "faster" if diff > 3 else "reproduced"


def _ok(base: float, wobble: float = 0.0) -> dict:
    return {"base": base, "wobble": wobble, "fault": None, "at": FIRST}


@SETTINGS
@given(st.lists(a_run(), min_size=1, max_size=5), st.integers(0, 2))
@example([_ok(18.96, 0.05), _ok(18.96), _ok(18.96)], 0)  # one unstable run, the mean CV not
@example([_ok(18.0), _ok(20.0), _ok(19.0)], 0)  # runs outside the band, their mean inside
def test_the_verdict_on_the_mean_matches_an_independent_computation(models, never_ran):
    expected_k = len(models) + never_ran
    runs = []
    for k, model in enumerate(models, start=1):
        result = measure(records(model), RECIPE)
        runs.append(Run(k, result, judge(result, RECIPE), f"measured/{k}"))
    statuses = [expected_run_status(m) for m in models]
    assert [r.verdict.status for r in runs] == statuses  # the model of one run holds
    mean, verdict = judge_mean(runs, RECIPE, expected=expected_k, claimed=expected_k)

    assert verdict.runs is not None and verdict.runs["measured"] == expected_k
    assert verdict.reasons[0] == f"judged on the mean of {expected_k} measured runs " + (
        f"(result.runs {expected_k})"
    )
    bad = [k for k, s in enumerate(statuses, start=1) if s in ("failed", "incomplete")]
    if bad or never_ran:
        want = "failed" if "failed" in statuses else "incomplete"
        assert verdict.status == want
        assert verdict.difference_percent is None and mean.tokens_per_s_per_gpu is None
        for k in bad:
            assert any(r.startswith(f"measured run {k} of {expected_k} ") for r in verdict.reasons)
        assert not any(", within -" in r for r in verdict.reasons)
        return
    per_run = [
        len(window_times(m)) * TOKENS / sum(window_times(m)) / GPUS for m in models
    ]  # computed from the step times alone
    mean_tps = statistics.fmean(per_run)
    diff = 100.0 * (mean_tps - CLAIM) / CLAIM
    mean_cv = statistics.fmean(cv(window_times(m)) for m in models)
    assume(abs(abs(diff) - 3.0) > 1e-6 and abs(mean_cv - CV_LIMIT) > 1e-6)
    if "unstable" in statuses or mean_cv > CV_LIMIT:
        want = "unstable"
    else:
        want = "slower" if diff < -3 else "faster" if diff > 3 else "reproduced"
    assert verdict.status == want, verdict.reasons
    assert mean.tokens_per_s_per_gpu is not None
    assert math.isclose(mean.tokens_per_s_per_gpu, mean_tps, rel_tol=1e-12)
    assert verdict.difference_percent is not None
    assert math.isclose(verdict.difference_percent, diff, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(mean.step_time_cv_percent or 0.0, mean_cv, rel_tol=1e-9, abs_tol=1e-12)
    spread = verdict.runs["spread"]
    assert math.isclose(spread["min"], min(per_run)) and math.isclose(spread["max"], max(per_run))
    assert math.isclose(spread["stdev"], statistics.pstdev(per_run), abs_tol=1e-9)
    assert (", within -3% / +3%" in " ".join(verdict.reasons)) == (abs(diff) <= 3.0)
