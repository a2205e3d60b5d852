"""report.md and plots: the claim and the reproduction side by side, figure by figure."""

from __future__ import annotations

from support.measure import as_recipe, seed_raw, step_times_for_tps

from launcher.judge.convergence import check
from launcher.judge.measure import measure
from launcher.judge.parse.miles import StepRecord
from launcher.judge.verdict import judge
from launcher.results.evaluate import write_report

PNG = b"\x89PNG\r\n\x1a\n"


def _run(tps: float, nan_at=None):
    raw = seed_raw()
    t = step_times_for_tps(tps)
    recs = [
        StepRecord(
            step=s,
            loss=(float("nan") if nan_at is not None and s >= nan_at else 1.5 - 0.03 * s),
            grad_norm=2.0,
            lr=1e-5,
            step_time=t,
            tokens=1048576,
        )
        for s in range(20)
    ]
    result = measure(recs, as_recipe(raw))
    return raw, recs, result, judge(result, as_recipe(raw))


def test_report_puts_claim_and_reproduction_side_by_side(tmp_path):
    raw, recs, result, verdict = _run(6913.23 * 0.9)
    conv = check({r.step: r.loss for r in recs}, {r.step: r.loss for r in recs})
    path = write_report(tmp_path, result, verdict, as_recipe(raw), recs, convergence=conv)
    text = path.read_text()
    assert "**Verdict: slower** (-10.00% tokens/s per GPU against the claim)" in text
    row = next(line for line in text.splitlines() if line.startswith("| tokens/s per GPU |"))
    assert "6,913.23" in row and "6,221.91" in row and "-10.00%" in row
    mfu_row = next(line for line in text.splitlines() if line.startswith("| MFU |"))
    assert "0.1276" in mfu_row
    assert "6 x N_active" in text and "989e+14" not in text and "population" in text
    assert "$63.296/h" in text
    assert "Convergence" in text and "pass" in text
    assert "![loss](plots/loss.png)" in text and "![step_time](plots/step_time.png)" in text
    for name in ("loss.png", "step_time.png"):
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_report_of_a_nan_run_shows_failure_and_still_plots(tmp_path):
    raw, recs, result, verdict = _run(6913.23, nan_at=8)
    text = write_report(tmp_path, result, verdict, as_recipe(raw), recs).read_text()
    assert "**Verdict: failed**" in text and "NaN" in text
    assert "| 8 * | nan |" in text
    assert (tmp_path / "plots" / "loss.png").read_bytes().startswith(PNG)
