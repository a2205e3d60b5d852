"""`down` with a corrupt aws.json and no launch record never claims what it has not seen (issue 19).

The finding: `reproduce down` with a corrupt aws.json, no launch record of its own and the region
given wrong (or recorded nowhere trustworthy) printed "everything this run created is gone" while
the instance kept running: it had looked in one region, found nothing under the run's tags, and
called that nothing "gone". Now, when the identity came from that fallback, `down` looks for the
run's tag in every region, ends what it finds there, and says "gone" only of what it saw end.
"""

from __future__ import annotations

import json

import pytest
from support.aws import NOTHING, cluster, ec2_of, live_resources, quiet_down

from launcher.errors import InfraError

pytestmark = pytest.mark.aws


def _lose_every_record(tmp_path) -> None:
    for ledger in (tmp_path / "state").rglob("launch-*.json"):
        ledger.unlink()  # launched from another machine: no record of it here
    (tmp_path / "run" / "run.json").write_text("not json")
    (tmp_path / "run" / "aws.json").write_bytes(b"\x00\xff garbage")


def test_a_wrong_region_finds_the_run_by_its_tag_elsewhere_and_ends_it(aws, ami, tmp_path, banner):
    ec2 = ec2_of(aws)
    c = cluster(aws, ami, tmp_path, port=banner.port, keep=True)
    [node] = c.acquire()
    c.release()
    _lose_every_record(tmp_path)
    ended, lines = quiet_down(tmp_path / "run", aws, region="eu-west-1", run_id="o1")
    text = "\n".join(lines)
    assert "nothing carrying run o1's tags in eu-west-1" in text, text
    assert "us-east-1" in text and f"instance {node.meta['instance_id']}" in ended
    assert live_resources(ec2) == NOTHING  # really ended, not just said to be
    gone = [i for i, line in enumerate(lines) if "is gone" in line]
    assert gone and all("us-east-1" in lines[i] for i in gone)


def test_nothing_found_anywhere_is_said_as_such_never_as_gone(aws, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "aws.json").write_text("{")
    (run / "run.json").write_text(json.dumps({"run_id": "never-launched"}))
    with pytest.raises(InfraError) as err:
        quiet_down(run, aws, region="us-east-1")
    message = str(err.value)
    assert "found no resource tagged with run never-launched in any region" in message
    assert "gone" not in message.replace("not seen gone", "")
