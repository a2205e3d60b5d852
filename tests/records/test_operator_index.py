"""The user's run index ($REPRODUCE_HOME/runs/, launcher/records/state.py): every run found by id from
any directory, whatever runs root it was made under; ./runs trees made before the index are found
or imported; concurrent launches never corrupt it; a damaged or stale entry costs only itself."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from support.cli import completed_here

from launcher.errors import BadInput, InfraError
from launcher.records import state
from launcher.records.rundir import RunDir

SLUG = "qwen3-30b-a3b/h200/x-0123456789"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return completed_here(*args, cwd=cwd)


def _make(root: Path, run_id: str, state_name: str = "done") -> RunDir:
    rd = RunDir.create(root, SLUG, run_id)
    rd.write_json("plan.json", {"profile": {"name": "local", "kind": "local"}})
    rd.set_status(state_name)
    return rd


def test_every_run_is_found_by_id_from_any_directory(tmp_path, reproduce_home):
    a = _make(tmp_path / "project-a" / "runs", "20261201T090000Z-aaa001")
    b = _make(tmp_path / "project-b" / "elsewhere", "20261201T100000Z-bbb002", "running")
    assert (reproduce_home / "runs" / "20261201T090000Z-aaa001.json").is_file()
    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    listing = _cli("runs", "--json", cwd=elsewhere)
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert [r["run_id"] for r in data["runs"]] == ["20261201T090000Z-aaa001", b.run_id]
    assert data["index"] == str(reproduce_home / "runs") and data["skipped"] == []
    table = _cli("runs", cwd=elsewhere)
    assert "aaa001" in table.stdout and "bbb002" in table.stdout and "2 run(s)" in table.stdout
    status = _cli("status", "20261201T100000Z-bbb002", cwd=elsewhere)
    assert status.returncode == 0, status.stderr
    assert f"run dir   {b.path.resolve()}" in status.stdout
    cancel = _cli("cancel", "20261201T090000Z-aaa001", cwd=elsewhere)
    assert cancel.returncode == 0, cancel.stderr
    assert "had already ended" in cancel.stderr + cancel.stdout
    assert str(a.path.resolve()) in cancel.stderr + cancel.stdout


def test_down_finds_a_run_by_id_from_another_directory(tmp_path):
    rd = _make(tmp_path / "proj" / "runs", "20261201T090000Z-down01")
    elsewhere = tmp_path / "x"
    elsewhere.mkdir()
    result = _cli("down", "20261201T090000Z-down01", cwd=elsewhere)
    # found (its directory is named), not "no run": a local run has no aws.json to end
    assert "no run '20261201T090000Z-down01'" not in result.stderr
    assert str(rd.path.resolve()) in result.stderr + result.stdout, result.stderr


def test_an_old_runs_tree_is_found_under_cwd_and_imported_with_one_command(tmp_path):
    old = tmp_path / "old"
    rd = _make(old / "runs", "20261130T000000Z-old001")
    for entry in (Path(os.environ["REPRODUCE_HOME"]) / "runs").iterdir():
        entry.unlink()  # as a tree made before the index existed
    assert "old001" in _cli("runs", cwd=old).stdout  # ./runs is still read
    elsewhere = tmp_path / "y"
    elsewhere.mkdir()
    missing = _cli("status", "20261130T000000Z-old001", cwd=elsewhere)
    assert missing.returncode == 2 and "reproduce runs --import DIR" in missing.stderr
    assert "Traceback" not in missing.stderr
    imported = _cli("runs", "--import", str(old / "runs"), cwd=elsewhere)
    assert imported.returncode == 0, imported.stderr
    assert "imported 1 run(s)" in imported.stdout and "old001" in imported.stdout
    status = _cli("status", "20261130T000000Z-old001", cwd=elsewhere)
    assert status.returncode == 0 and str(rd.path.resolve()) in status.stdout
    again = _cli("runs", "--import", str(old / "runs"), "--json", cwd=elsewhere)
    assert len(json.loads(again.stdout)["runs"]) == 1  # importing twice: still one run


def test_damaged_and_stale_entries_cost_only_themselves(tmp_path, reproduce_home):
    keep = _make(tmp_path / "r1", "20261201T090000Z-keep01")
    gone = _make(tmp_path / "r2", "20261201T090000Z-gone01")
    import shutil

    shutil.rmtree(gone.path)
    folder = reproduce_home / "runs"
    (folder / "cut.json").write_text('{"run_id": "x", "run_d')  # cut short
    (folder / "list.json").write_text("[1, 2]")
    (folder / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (folder / "nodir.json").write_text(json.dumps({"run_id": "nodir", "run_dir": ""}))
    result = _cli("runs", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["run_id"] for r in data["runs"]] == [keep.run_id]
    skipped = "\n".join(data["skipped"])
    for name in ("cut.json", "list.json", "binary.json", "nodir.json"):
        assert name in skipped
    assert "gone01: its run directory" in skipped and "is gone" in skipped
    status = _cli("status", "20261201T090000Z-gone01", cwd=tmp_path)
    assert status.returncode == 2 and "Traceback" not in status.stderr


def test_a_run_id_used_under_another_root_is_refused(tmp_path):
    _make(tmp_path / "a", "20261201T090000Z-same01")
    with pytest.raises(BadInput, match="was used before"):
        RunDir.create(tmp_path / "b", SLUG, "20261201T090000Z-same01")
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("run.json"))


def test_an_unwritable_state_directory_stops_the_run_and_leaves_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("REPRODUCE_HOME", str(blocker))
    with pytest.raises(InfraError, match="REPRODUCE_HOME"):
        RunDir.create(tmp_path / "runs", SLUG, "20261201T090000Z-nohome")
    assert list((tmp_path / "runs").rglob("run.json")) == []


def _create_many(args: tuple[str, int]) -> list[str]:
    root, worker = args
    return [
        RunDir.create(Path(root), SLUG, f"20261201T0{worker}000{i}Z-w{worker}i{i}").run_id
        for i in range(6)
    ]


def test_concurrent_launches_never_corrupt_the_index(tmp_path):
    roots = [str(tmp_path / f"root{k}") for k in range(6)]
    with ProcessPoolExecutor(max_workers=6) as pool:
        made = [rid for ids in pool.map(_create_many, [(r, k) for k, r in enumerate(roots)])
                for rid in ids]  # fmt: skip
    entries, bad = state.entries()
    assert bad == [] and sorted(e.run_id for e in entries) == sorted(made) and len(made) == 36
    assert all(e.present for e in entries)
    assert not [p for p in (Path(os.environ["REPRODUCE_HOME"]) / "runs").iterdir()
                if p.name.endswith(".tmp")]  # fmt: skip


def test_the_aws_state_lives_in_the_same_home(tmp_path, reproduce_home):
    from launcher.clusters.aws.state import state_root

    assert state_root() == reproduce_home
