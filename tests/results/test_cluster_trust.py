"""A run on an existing Ray cluster says that the cluster was trusted for its image and its checks
(launcher/clusters/trust.py; docs/architecture.md, "The trust boundary"): there, node.sh and every
check ran as the cluster's own job, with no container of the launcher's between them and the
recipe's code. Over every cluster kind, exactly the ray kind carries the mark: in the predicate
(`unverified`), in the verdict's notes, in report.md and in report.html; and an attested ray run
still verifies, its note re-made from the measurement's record."""

from __future__ import annotations

import json

import pytest
from support.pages import make_run

from launcher.clusters import BACKENDS, trust
from launcher.pages import write_run_page
from launcher.results.attest_predicate import build_predicate

# kind -> whether the cluster vouches for its own checks (the launcher's boundary does not hold)
VOUCHED = {"local": False, "ssh": False, "aws": False, "ray": True}
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
