"""Every command that takes a run takes it the same way from any directory: by its run id (the
user's index) or by its directory's path, and `history` reads the user's one database
(docs/operator.md, "No record of a run depends on the directory"). One real run of the local
runner, made in a launch directory; every command then run from another directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.attest import keypair, real_run
from support.cli import completed_here


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("anywhere")
    home = base / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("REPRODUCE_HOME", str(home))  # the module's runs share one index
    mp.delenv("REPRODUCE_HISTORY", raising=False)
    mp.delenv("REPRODUCE_RUNS_DIR", raising=False)
    launch = base / "launch"
    launch.mkdir()
    mp.chdir(launch)
    run = real_run(Path("runs"), base / "node")  # a runs root relative to the launch directory
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    key, _pub = keypair(base)
    yield {"run": run, "home": home, "launch": launch, "elsewhere": elsewhere, "key": key}
    mp.undo()


def here(made: dict[str, Path], *args: str | Path) -> tuple[int, str]:
    got = completed_here(*args, cwd=made["elsewhere"], env={"REPRODUCE_HOME": str(made["home"])})
    return got.returncode, got.stdout + got.stderr


def test_the_run_directory_is_absolute_in_every_record(made):
    run = made["run"]
    assert run.is_absolute()
    entry = json.loads((made["home"] / "runs" / f"{run.name}.json").read_text())
    assert entry["run_dir"] == str(run.resolve())
    plan = json.loads((run / "plan.json").read_text())
    assert (
        Path(plan["recipe"]["path"]).is_absolute() and Path(plan["profile"]["path"]).is_absolute()
    )


@pytest.mark.parametrize("by", ["id", "path"])
def test_measure_compare_attest_verify_status_take_a_run_id_from_another_directory(made, by):
    ref = made["run"].name if by == "id" else str(made["run"])
    code, said = here(made, "measure", ref, "--json")
    assert code == 0, said
    assert json.loads(said.splitlines()[0] if said.startswith("{") else said)["verdict"]
    code, said = here(made, "compare", ref, ref)
    assert code == 0, said
    code, said = here(made, "attest", ref, "--key", made["key"])
    assert code == 0, said
    code, said = here(made, "verify", ref)
    assert code == 0 and "verified" in said, said
    code, said = here(made, "status", ref)
    assert code == 0 and str(made["run"]) in said, said


def test_an_unknown_run_is_refused_naming_it(made):
    for args in (["measure", "nosuchrun"], ["compare", "nosuchrun", "nosuchrun"], ["verify", "nosuchrun"]):  # fmt: skip
        code, said = here(made, *args)
        assert code == 2 and "no run 'nosuchrun'" in said and "Traceback" not in said, said


def test_history_is_the_users_own_from_any_directory_and_a_query_makes_no_file(made):
    slug = json.loads((made["run"] / "run.json").read_text())["slug"]
    for cwd in (made["launch"], made["elsewhere"]):
        got = completed_here(
            "history", slug, "--json", cwd=cwd, env={"REPRODUCE_HOME": str(made["home"])},
            unset=("REPRODUCE_HISTORY", "REPRODUCE_RUNS_DIR"),
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        data = json.loads(got.stdout)
        assert [r["run_id"] for r in data["runs"]] == [made["run"].name]
        assert data["history"] == str(made["home"] / "history.sqlite")
    # found through the user's index; no database made by a query, here or there
    assert not (made["home"] / "history.sqlite").exists()
    assert not (made["launch"] / "runs" / "history.sqlite").exists()
    assert not list(made["elsewhere"].iterdir())  # nothing was made where the commands ran


def test_a_history_query_with_no_database_yet_creates_none(tmp_path):
    got = completed_here(
        "history", "some/recipe", cwd=tmp_path, env={"REPRODUCE_HOME": str(tmp_path / "h")},
        unset=("REPRODUCE_HISTORY", "REPRODUCE_RUNS_DIR"),
    )  # fmt: skip
    assert got.returncode == 2 and "no runs of 'some/recipe'" in got.stderr
    assert not (tmp_path / "h").exists() and not (tmp_path / "runs").exists()
