"""Every kind's recorded cluster (run.json's `cluster`) is read positively: each field its
`to_record` writes is declared in the kind's `record_fields`, and a record that lacks a required
field, or holds one of the wrong JSON type, is refused (BadInput, exit 2) naming the field before
the backend reads it. The space is generated: every kind x every field x (absent, and every JSON
value of another type), so a field added to a record later is covered, or fails the declaration
check until it is declared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from launcher import clusters
from launcher.clusters.contract import RecordField
from launcher.errors import BadInput

# One JSON value of each type a record field can hold.
JSON_VALUES: tuple[Any, ...] = (None, True, 0, 1.5, "", "x", [], ["x"], {}, {"x": 1})


def records(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """A real record of every kind, as its cluster's own to_record() writes it."""
    from launcher.clusters.local import LocalCluster
    from launcher.clusters.ray.cluster import RayCluster
    from launcher.clusters.slurm.cluster import SlurmCluster
    from launcher.clusters.ssh import SSHCluster, SSHSettings

    one = SSHSettings.from_mapping({"host": "127.0.0.1", "user": "u", "port": 2222})
    two = SSHSettings.from_mapping({"host": "127.0.0.2", "user": "u", "port": 2222})
    aws_json = tmp_path / "aws.json"
    aws_json.write_text("{}")
    aws = {
        "kind": "aws", "state_path": str(aws_json), "region": "us-east-1", "run_id": "r1",
        "launch_id": "l1", "keep": False, "run_end_grace_s": 600.0, "target": None,
        "ssh": {"user": "ubuntu"},
    }  # fmt: skip
    made = {
        "local": LocalCluster().to_record(),
        "ssh": SSHCluster([one, two]).to_record(),
        "ray": RayCluster("http://127.0.0.1:8265").to_record(),
        "slurm": SlurmCluster(
            None,
            job_id="12",
            user="u",
            nodes=2,
            job_nodes=["n1", "n2"],
            started_at=1.0,
            job_name="reproduce-r1",
        ).to_record(),  # fmt: skip
        "aws": aws,
    }
    assert set(made) == set(clusters.BACKENDS), "a kind without a record here is not walked"
    return made


def variants(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every record a kind writes: its run's own, and where a kind writes more than one shape
    (slurm: a run inside a nightly group's allocation, a job step of it), each of them."""
    from launcher.clusters.slurm.step import SlurmStep

    step = SlurmStep(
        None, job_id="12", user="u", nodes=1, job_nodes=["n1"], started_at=2.0,
        job_name="reproduce-r2", allocation_name="reproduce-group-r1", step_id="12.1",
        body_pid=4242,
    ).to_record()  # fmt: skip
    return [*records(tmp_path).items(), ("slurm", step)]


def cases(tmp_path: Path) -> Iterator[tuple[str, str, RecordField, dict[str, Any]]]:
    for kind, record in records(tmp_path).items():
        for key, field in clusters.backend(kind).record_fields.items():
            yield kind, key, field, record


def test_every_field_a_kind_records_is_declared(tmp_path):
    """A field added to to_record() fails here until its kind says what it holds."""
    written: dict[str, set[str]] = {}
    for kind, record in variants(tmp_path):
        declared = clusters.backend(kind).record_fields
        assert set(record) - {"kind"} <= set(declared), kind
        written.setdefault(kind, set()).update(set(record) - {"kind"})
        for key, value in record.items():
            if key != "kind":
                assert declared[key].holds(value), (kind, key, value)
    for kind, keys in written.items():
        assert keys == set(clusters.backend(kind).record_fields), kind  # none declared unwritten


def test_the_real_records_are_read_back(tmp_path):
    for _kind, record in variants(tmp_path):
        clusters.from_record(json.loads(json.dumps(record)), tmp_path)


def _refused(record: Mapping[str, Any], key: str, tmp_path: Path) -> str:
    with pytest.raises(BadInput) as err:
        clusters.from_record(record, tmp_path)
    text = str(err.value)
    assert f"cluster.{key}" in text and str(tmp_path / "run.json") in text, text
    assert "Traceback" not in text
    return text


def test_a_required_field_absent_is_refused_and_an_optional_one_is_not(tmp_path):
    walked = 0
    for _kind, key, field, record in cases(tmp_path):
        without = {k: v for k, v in record.items() if k != key}
        if field.optional:
            clusters.from_record(without, tmp_path)
        else:
            assert "lacks it" in _refused(without, key, tmp_path)
        walked += 1
    assert walked >= 17  # every field of every kind that records one


def test_every_field_of_another_json_type_is_refused(tmp_path):
    walked = 0
    for _kind, key, field, record in cases(tmp_path):
        for value in JSON_VALUES:
            if field.holds(value):
                continue
            _refused({**record, key: value}, key, tmp_path)
            walked += 1
    assert walked > 100


def test_a_count_is_not_a_boolean():
    assert not RecordField((int,)).holds(True)
    assert RecordField((bool,)).holds(False)
