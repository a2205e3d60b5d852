"""A run on an existing Ray cluster says that the cluster was trusted for its image and its checks
(launcher/clusters/trust.py; docs/architecture.md, "The trust boundary"): there, node.sh and every
check ran as the cluster's own job, with no container of the launcher's between them and the
recipe's code. Over every cluster kind, exactly the ray kind carries the mark: in the predicate
(`unverified`), in the verdict's notes, in report.md and in report.html; and an attested ray run
still verifies, its note re-made from the measurement's record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.measure import START
from support.pages import SLUG, make_run

from launcher.clusters import BACKENDS, trust
from launcher.pages import write_run_page
from launcher.pages.history_page import assess_each, render_history_page
from launcher.pages.nightly_page import render_nightly_page
from launcher.plan.stage_graph import NODE_STAGES
from launcher.records.history import Assessment, RunRow
from launcher.records.history_rows import row_from_run_dir
from launcher.results.attest_predicate import build_predicate

# kind -> whether the cluster vouches for its own checks (the launcher's boundary does not hold)
VOUCHED = {"local": False, "ssh": False, "aws": False, "ray": True, "slurm": False}
LINE = "cluster was trusted for its image and its checks"


def test_the_table_names_every_cluster_kind_the_launcher_has():
    """A kind added later is classified here first (trust.py fails closed: not HELD, vouched)."""
    assert set(VOUCHED) == set(BACKENDS)
    assert {k for k, v in VOUCHED.items() if not v} == trust.HELD


@pytest.mark.parametrize("kind", sorted(VOUCHED))
def test_exactly_a_ray_run_is_marked_as_vouched_for_by_its_cluster(tmp_path, kind):
    rd = make_run(tmp_path, kind=kind)
    write_run_page(rd)
    predicate = build_predicate(rd)
    verdict = json.loads((rd / "verdict.json").read_text())
    notes = [r for r in verdict["reasons"] if LINE in r]
    report_md = (rd / "report.md").read_text()
    report_html = (rd / "report.html").read_text()
    marked = {
        "predicate": bool(predicate["unverified"]),
        "verdict": bool(notes),
        "report.md": LINE in report_md,
        "report.html": LINE in report_html,
    }
    assert marked == dict.fromkeys(marked, VOUCHED[kind]), (kind, marked)
    assert predicate["instance"]["cluster"] == kind
    if VOUCHED[kind]:
        assert len(notes) == 1 and notes[0].startswith("note: ")
        assert report_md.count(LINE) == 1  # one line, with the verdict's other notes
        unverified = predicate["unverified"]
        assert {"image", "stack", "gpus"} <= set(unverified)
        assert "REPRODUCE_IMAGE_DIGEST" in unverified["image"]
        assert verdict["status"] == "reproduced"  # a note, never a status of its own
        assert predicate["image"]["checked_digest"]  # the cluster's word is kept, and marked
    else:
        assert predicate["unverified"] == {}


def test_a_bare_log_s_measurement_has_no_cluster_and_no_mark():
    assert trust.vouched(None) == {} and trust.note(None) is None


def test_a_kind_the_launcher_does_not_hold_is_vouched_for_by_its_cluster():
    assert trust.vouched("kubernetes") and "kubernetes" in (trust.note("kubernetes") or "")


def test_an_attested_ray_run_verifies_with_its_note(tmp_path):
    """verify re-judges the log in memory: the note comes from measure.json's `cluster`, so the
    re-made verdict is the signed one."""
    from support.attest import cli, keypair

    rd = make_run(tmp_path, kind="ray")
    assert json.loads((rd / "measure.json").read_text())["cluster"] == "ray"
    key, pub = keypair(tmp_path)
    proc = cli("attest", rd, "--key", key)
    assert proc.returncode == 0, proc.stderr
    proc = cli("verify", rd, "--key", pub)
    assert proc.returncode == 0, proc.stderr + proc.stdout


# --- every way a run ends x every surface that shows it -----------------------------------------
#
# The promise (launcher/clusters/trust.py): a run of a kind whose cluster vouched for itself says
# so wherever it is shown, however it ended, with a verdict or before one. Each ending below is a
# run directory as the runner leaves it (status.json's state and detail, the timeline up to the
# stage it stopped in, a verdict where it got one), made by support.pages.make_run; each surface
# is the real one (the page writer, the runner's last words, the CLI's status, runs, cancel and
# verify). A local run (the launcher held its boundary) is the control: never marked.

# ending -> (state, detail, the stage that failed or None, judged, run.json records the cluster)
ENDINGS: dict[str, tuple[str, str, str | None, bool, bool]] = {
    "done, judged": ("done", "the node script finished; logs collected", None, True, True),
    "done, not measured": ("done", "the node script finished; logs collected", None, False, True),
    "failed to acquire, before run.json named the cluster": (
        "failed",
        "could not acquire the cluster",
        None,
        False,
        False,
    ),
    **{
        f"failed in {stage}": (
            "failed",
            f"stage {stage} failed (exit 3)",
            stage,
            stage in ("train", "push"),  # a train stage that failed is judged ("failed")
            True,
        )
        for stage in NODE_STAGES
    },
    "failed after its verdict (teardown)": (
        "failed",
        "teardown did not finish",
        None,
        True,
        True,
    ),
    "cancelled before a node": (
        "cancelled",
        "cancelled before it reached a node",
        None,
        False,
        True,
    ),
    "cancelled mid-run": ("cancelled", "cancelled with `reproduce cancel`", "image", False, True),
    "lost, unattended": ("failed", "lost the connection to the node", "train", False, True),
    "lost, detached": ("detached", "lost the connection; the run goes on", "train", False, True),
    "budget stop": ("cancelled", "budget reached: --max-hours 0.004", "train", False, True),
    **{
        f"still {state}": (state, "", None, False, True)
        for state in ("created", "acquiring", "staging", "running", "collecting")
    },
}


def _timeline_to(stage: str | None, state: str) -> dict:
    """The node stages up to STAGE, ok, and STAGE itself failed (or cancelled/running/stopped
    as the state says); none when the run stopped before its node."""
    stages, t = [], START - 800.0
    for name in NODE_STAGES[: NODE_STAGES.index(stage) + 1] if stage else ():
        last = name == stage
        status = {"failed": "failed", "cancelled": "cancelled", "detached": "running"}
        stages.append(
            {
                "name": name,
                "start": t,
                "end": None if last and state == "detached" else t + 5.0,
                "status": status.get(state, "failed") if last else "ok",
            }
        )
        t += 6.0
    return {"acquired_at": START - 900.0, "released_at": t + 1.0, "stages": stages}


def _ended(root: Path, kind: str, ending: str) -> Path:
    state, detail, stage, judged, recorded = ENDINGS[ending]
    # a train stage that failed is judged from its log: a NaN loss, a verdict of "failed"
    standin = {"nan_at": 5} if judged and stage is not None else {}
    rd = make_run(root, kind=kind, measure=judged, state=state, **standin)
    if not judged or stage is not None:
        (rd / "timeline.json").write_text(json.dumps(_timeline_to(stage, state)))
    status = {"state": state, "detail": detail, "updated_at": START + 1000.0}
    if state in ("done", "failed", "cancelled"):
        status["exit_code"] = {"done": 0, "failed": 3, "cancelled": 130}[state]
    (rd / "status.json").write_text(json.dumps(status))
    if not recorded:
        run = json.loads((rd / "run.json").read_text())
        del run["cluster"]
        (rd / "run.json").write_text(json.dumps(run))
    return rd


@dataclass(frozen=True)
class _Ran:
    """A nightly entry's run as its page reads it (code, error)."""

    code: int = 0
    error: str | None = None


@dataclass(frozen=True)
class _Night:
    """One recipe's night as the nightly page reads it (records/night.py's NightlyEntry)."""

    recipe: Path
    run: _Ran
    row: RunRow
    assessment: Assessment
    outcome: str = "done"


class _Heard:
    """A Reporter that keeps what the runner says (its real last words, say_trust)."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)


def _surfaces(rd: Path, tmp_path: Path) -> dict[str, bool]:
    """Whether each surface that shows this run says the line (report.md and verify only where
    the run was judged; cancel only where the run ended)."""
    from support.attest import cli, keypair

    from launcher.runner.runner import say_trust

    state = json.loads((rd / "status.json").read_text())["state"]
    page = write_run_page(rd).read_text()
    shown: dict[str, bool] = {"page": LINE in page}
    assert page.count(LINE) <= 1, "said once on the page"
    if (rd / "report.md").is_file():
        shown["report.md"] = LINE in (rd / "report.md").read_text()
    heard = _Heard()
    say_trust(rd, heard)  # type: ignore[arg-type]  # the Reporter's one method it calls
    shown["runner's last words"] = any(LINE in s for s in heard.said)
    row = row_from_run_dir(rd)
    history = render_history_page(SLUG, [row])
    shown["history page"] = 'data-trust="unverified"' in history and LINE in history
    night = render_nightly_page(
        [_Night(recipe=rd / "recipe.yaml", run=_Ran(), row=row, assessment=assess_each([row])[0])],
        cluster=rd.name,
        stamp=START + 2000.0,
        exit_code=0,
    )
    shown["nightly page"] = night.count('data-trust="unverified"') == 2 and LINE in night
    status = cli("status", rd)
    assert status.returncode == 0, status.stderr
    shown["status"] = LINE in status.stdout
    shown["status --json"] = LINE in (
        json.loads(cli("status", rd, "--json").stdout)["unverified"] or ""
    )
    root = rd.parents[len(SLUG.split("/"))]
    table = cli("runs", "--runs-dir", root).stdout
    shown["runs"] = "(unverified)" in table and "vouched for its own image" in table
    (listed,) = json.loads(cli("runs", "--runs-dir", root, "--json").stdout)["runs"]
    shown["runs --json"] = LINE in (listed["unverified"] or "")
    if state in ("done", "failed", "cancelled"):
        cancel = cli("cancel", rd)
        assert cancel.returncode == 0, cancel.stderr
        shown["cancel, already ended"] = LINE in cancel.stdout + cancel.stderr
    if (rd / "verdict.json").is_file():
        key, pub = keypair(tmp_path)
        attested = cli("attest", rd, "--key", key)
        assert attested.returncode == 0, attested.stderr
        shown["attest"] = LINE in attested.stdout
        verified = cli("verify", rd, "--key", pub)
        assert verified.returncode == 0, verified.stderr + verified.stdout
        shown["verify"] = LINE in verified.stdout
        shown["verify --json"] = LINE in (
            json.loads(cli("verify", rd, "--key", pub, "--json").stdout)["unverified"] or ""
        )
    return shown


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("kind", ["ray", "local"])
def test_every_surface_of_every_ending_says_what_the_cluster_vouched_for(tmp_path, kind, ending):
    rd = _ended(tmp_path, kind, ending)
    shown = _surfaces(rd, tmp_path)
    assert shown == dict.fromkeys(shown, VOUCHED[kind]), (kind, ending, shown)
    judged = ENDINGS[ending][3]
    assert ("verify" in shown) == judged and ("report.md" in shown) == judged


def test_the_kind_is_read_from_the_plan_when_run_json_has_none_and_fails_closed():
    assert trust.kind_of({}, {"profile": {"kind": "ray"}}) == "ray"
    assert trust.kind_of({"cluster": {"kind": "local"}}, {"profile": {"kind": "ray"}}) == "ray"
    assert trust.kind_of({"cluster": {"kind": "ray"}}, {"profile": {"kind": "local"}}) == "ray"
    assert trust.kind_of({"cluster": {"kind": "ssh"}}, {}) == "ssh"
    assert trust.kind_of(None, [1, 2]) is None and trust.kind_of({"cluster": 5}, "x") is None
