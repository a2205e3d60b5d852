"""The generative adversary of policy v6: a model of an honest miles run of the seed (its log with
the host's clock, tests/support/log_shapes.py; the host's GPU samples, tests/support/gpu_samples.py)
given, at random and together, another model (an argument of the architecture changed), another
layout (a parallelism or batch argument changed), a dead GPU sampler (its file cut at any moment,
or gone), a run that did or did not owe the host's evidence, and any capture's prefix on every
line (tests/support/frames.py). The verdict must change exactly when the evidence no longer
proves the claim: reproduced when the model, the layout and (where owed) the host's evidence are
the seed's and whole, whatever frames the lines; never a speed verdict otherwise, with the reason
naming what broke (docs/measurement.md, "Policy v6").
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from support.frames import FRAMES, NESTINGS, wrap
from support.gpu_samples import Load, render_samples
from support.log_shapes import NONCE, Run, render
from support.measure import seed_recipe
from support.properties import PASSING, examples

from launcher.judge.evidence import HostWatch
from launcher.judge.measure import measure
from launcher.judge.parse.gpu import parse_samples
from launcher.judge.verdict import judge
from launcher.results.evaluate import parse_log

SETTINGS = examples(60)
RUN = Run(clock=True)
LOG = render(RUN)
SAMPLES = render_samples(RUN, Load())
# Another model: each a value of an argument the parameter count reads, not the seed's.
MODELS = {
    "num_layers": ["5", "24", "47"],
    "moe_router_topk": ["4", "2"],
    "num_experts": ["64"],
    "hidden_size": ["4096"],
    "moe_ffn_hidden_size": ["1536"],
    "vocab_size": ["32000"],
}
# Another layout: each an argument the recipe's fields state, not the seed's value.
LAYOUTS = {
    "tensor_model_parallel_size": ["2", "4"],
    "expert_model_parallel_size": ["4", "1"],
    "max_tokens_per_gpu": ["32768"],
    "recompute_granularity": ["selective"],
    "actor_num_gpus_per_node": ["4"],
}


def _set(log: str, name: str, value: str) -> str:
    """The listing's line for `name` printed with `value` (as Megatron pads it)."""
    pattern = re.compile(rf"^(  {name} \.+ ).*$", re.M)
    assert pattern.search(log), name
    return pattern.sub(lambda m: m.group(1) + value, log, count=1)


@st.composite
def cases(draw: st.DrawFn) -> dict:
    model = draw(st.none() | st.sampled_from([(k, v) for k, vs in MODELS.items() for v in vs]))
    layout = draw(st.none() | st.sampled_from([(k, v) for k, vs in LAYOUTS.items() for v in vs]))
    lines = SAMPLES.splitlines(keepends=True)
    cut = draw(st.none() | st.integers(0, len(lines) - 1))  # the sampler dies after line `cut`
    gone = draw(st.booleans()) if cut is None else False
    frames = draw(st.sampled_from([(), *NESTINGS]))
    owed = draw(st.booleans())
    return {
        "model": model,
        "layout": layout,
        "samples": None if gone else "".join(lines[: cut + 1]) if cut is not None else SAMPLES,
        "frames": frames,
        "owed": owed,
    }


def proves(case: dict) -> bool:
    """What the model says: the evidence proves the claim."""
    whole = case["samples"] == SAMPLES
    return case["model"] is None and case["layout"] is None and (whole or not case["owed"])


def verdict_of(case: dict):
    log = LOG
    for change in (case["model"], case["layout"]):
        if change is not None:
            log = _set(log, *change)
    log = wrap(log, case["frames"]) if case["frames"] else log
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        path.write_text(log)
        records, stats = parse_log(path, NONCE)
    samples = parse_samples(case["samples"]) if case["samples"] is not None else None
    watch = HostWatch(clock=True, sampler=True) if case["owed"] else None
    result = measure(records, seed_recipe(), parse_stats=stats, gpu_samples=samples, host=watch)
    return result, judge(result, seed_recipe())


@SETTINGS
@given(cases())
def test_the_verdict_changes_exactly_when_the_evidence_no_longer_proves_the_claim(case):
    result, verdict = verdict_of(case)
    if proves(case):
        assert verdict.status == "reproduced", (case, verdict.reasons)
        return
    assert verdict.status not in PASSING, (case, verdict.reasons)
    assert verdict.difference_percent is None
    checks = {d.check for d in result.evidence.disagreements}
    if case["model"] is not None:
        assert "model" in checks, (case, verdict.reasons)
    if case["layout"] is not None:
        assert "arguments" in checks, (case, verdict.reasons)
    if case["owed"] and case["samples"] != SAMPLES:
        assert "gpus busy" in checks, (case, verdict.reasons)


def test_the_drawn_cases_fall_on_both_sides_and_reach_every_kind_of_change():
    seen: dict[str, set] = {"proves": set(), "frames": set(), "broke": set()}

    @examples(120)
    @given(cases())
    def draw(case: dict) -> None:
        seen["proves"].add(proves(case))
        seen["frames"].add(bool(case["frames"]))
        for key in ("model", "layout"):
            if case[key] is not None:
                seen["broke"].add(key)
        if case["samples"] != SAMPLES:
            seen["broke"].add("sampler")

    draw()
    assert seen["proves"] == {True, False} and seen["frames"] == {True, False}
    assert seen["broke"] == {"model", "layout", "sampler"}
    assert set(FRAMES) >= {f for n in NESTINGS for f in n}
