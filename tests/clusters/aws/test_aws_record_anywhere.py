"""A recorded aws run is ended from any directory, and a release that cannot find what it must
end says so (docs/operator.md, "No record of a run depends on the directory" and "A node bills
only while a run needs it"). AwsCluster on moto, its run.json written as each launcher wrote it:
an absolute aws.json path (now), or one relative to the launch directory (before)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from support.aws import NOTHING, live_resources
from support.aws import cluster as aws_cluster

from launcher import clusters
from launcher.clusters.aws.down import down
from launcher.errors import BadInput, InfraError
from launcher.records.rundir import RunDir

pytestmark = pytest.mark.aws

NAME = "20261207T100000Z-abc123"


def launched_run(aws, ami, tmp_path: Path, banner, *, legacy: bool) -> tuple[Path, dict]:
    """A run launched from tmp_path/launch: its run directory and run.json's record."""
    launch = tmp_path / "launch"
    launch.mkdir()
    where = f"runs/m/h200/{NAME}"
    c = aws_cluster(aws, ami, launch, where=where, run_id=NAME, port=banner.port)
    [node] = c.acquire()
    record = c.to_record()
    if legacy:  # what run.json held before: relative to the directory the run was launched from
        record["state_path"] = f"{where}/aws.json"
    run_dir = launch / where
    (run_dir / "run.json").write_text(
        json.dumps({"run_id": NAME, "cluster": record, "node": asdict(node)})
    )
    return run_dir, record


@pytest.mark.parametrize("legacy", [False, True], ids=["absolute", "launch-dir-relative"])
def test_a_recorded_run_is_released_from_another_directory(
    aws, ami, tmp_path, banner, monkeypatch, legacy
):
    run_dir, record = launched_run(aws, ami, tmp_path, banner, legacy=legacy)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = clusters.from_record(record, run_dir)
    again._session = aws  # type: ignore[attr-defined]
    again.poll_s = 0.01  # type: ignore[attr-defined]
    again.release()
    assert live_resources(aws._real.client("ec2")) == NOTHING


def test_a_release_that_cannot_find_its_record_is_an_error_naming_the_instance(
    aws, ami, tmp_path, banner
):
    run_dir, record = launched_run(aws, ami, tmp_path, banner, legacy=False)
    (run_dir / "aws.json").rename(tmp_path / "moved-away.json")
    again = clusters.from_record(record, run_dir)
    again._session = aws  # type: ignore[attr-defined]
    [iid] = RunDir(run_dir).instance_ids()
    with pytest.raises(InfraError) as err:
        again.release()
    said = str(err.value)
    assert iid in said and f"reproduce down {run_dir}" in said and "--region us-east-1" in said
    assert "nothing was ended" in said
    # and it was not pretending: the instance is there, and the command it names ends it
    live = live_resources(aws._real.client("ec2"))
    assert live["instances"] == [iid]
    ended = down(run_dir, session=aws, poll_s=0.01, region="us-east-1")
    assert f"instance {iid}" in ended
    assert live_resources(aws._real.client("ec2")) == NOTHING


def test_recorded_paths_mean_the_same_from_any_directory(tmp_path):
    rd = RunDir(tmp_path / "runs" / "m" / "h200" / NAME)
    rd.path.mkdir(parents=True)
    (rd.path / "aws.json").write_text("{}")
    assert rd.recorded_path(str(rd.path / "aws.json"), "f") == rd.path / "aws.json"
    assert rd.recorded_path("aws.json", "f") == rd.path / "aws.json"
    assert rd.recorded_path(f"runs/m/h200/{NAME}/aws.json", "f") == rd.path / "aws.json"
    moved = f"/old/place/runs/m/h200/{NAME}/aws.json"  # absolute, the directory since moved
    assert rd.recorded_path(moved, "f") == rd.path / "aws.json"
    assert rd.recorded_path("/etc/hostname", "f") == Path("/etc/hostname")
    with pytest.raises(BadInput, match="neither absolute nor inside the run directory"):
        rd.recorded_path("../other/aws.json", "cluster.state_path")
