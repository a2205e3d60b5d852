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


# --- every command that takes a run, found by its declaration -----------------------------------

# Every positional argument of every command that is not a run, and what it is. An argument whose
# help says it takes a "run id" is a run; any other must be named here, so a command added later
# with an argument that takes a run (or might) is held to the walk below or named as not one.
NOT_A_RUN = {
    ("run", "recipe"): "a recipe file",
    ("validate", "recipes"): "recipe files",
    ("nightly", "recipes"): "recipe files or directories",
    ("history", "recipe"): "a recipe file, name or slug",
    ("ssh", "command"): "the command to run on the node",
    ("keygen", "path"): "the key file to write",
    ("capacity", "recipe"): "a recipe file",
    ("prepare", "recipe"): "a recipe file",
    ("image build", "recipe"): "a recipe file",
    ("image bake", "recipe"): "a recipe file",
    ("image prune", "recipe"): "a recipe file",
}


def run_arguments() -> dict[str, list[str]]:
    """Command words -> the names of its arguments that take a run, from the CLI's own table."""
    import re

    from test_cli_face import commands

    found: dict[str, list[str]] = {}
    unclassified = []
    for words, cmd in commands().items():
        for param in cmd.params:
            if param.param_type_name != "argument":
                continue
            if re.search(r"\brun id\b", param.help or ""):
                found.setdefault(words, []).append(param.name)
            elif (words, param.name) not in NOT_A_RUN:
                unclassified.append(f"{words} {param.name.upper()}: {param.help!r}")
    assert not unclassified, (
        "say in its help whether it takes a run id (then it is walked below), or name it in "
        f"NOT_A_RUN: {unclassified}"
    )
    return found


def test_the_walk_finds_every_command_that_takes_a_run():
    found = run_arguments()
    want = {"status", "logs", "attach", "cancel", "ssh", "measure", "compare", "attest",
            "verify", "bundle", "down"}  # fmt: skip
    assert set(found) == want, sorted(found)
    assert found["compare"] == ["candidate", "reference"]


def test_a_new_argument_that_may_take_a_run_is_caught(monkeypatch):
    """The walk fails for an argument it cannot place: a new command's RUN whose help says only
    'a run directory' is neither walked nor silently passed."""
    import click
    from test_cli_face import ROOT

    stray = click.Command("stray", params=[click.Argument(["run"])])
    stray.params[0].help = "A run directory."
    monkeypatch.setitem(ROOT.commands, "stray", stray)
    with pytest.raises(AssertionError, match="stray RUN"):
        run_arguments()


def _argv(words: str, names: list[str], ref: str) -> list[str]:
    return [*words.split(), *[ref] * len(names)]


def _one_paragraph(err: str) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def test_every_command_that_takes_a_run_takes_its_id_and_its_path_and_refuses_none(
    made, monkeypatch
):
    """Each command the walk finds, given the run by id and by its directory's path from another
    directory: the run found, through the one resolver of a run reference (RunDir.find, or
    RunDir.target which asks it), never "no run", and the same exit code both ways; given a run
    that does not exist, by id or by a path: exit 2 and one paragraph naming it, never 0."""
    from launcher.records.rundir import RunDir

    resolved: list[Path] = []
    find, target = RunDir.find, RunDir.target

    def spy_find(cls, ref, root=None):
        found = find(ref, root)
        resolved.append(found.path)
        return found

    def spy_target(cls, ref, root=None):
        found = target(ref, root)
        resolved.append(found)
        return found

    monkeypatch.setattr(RunDir, "find", classmethod(spy_find))
    monkeypatch.setattr(RunDir, "target", classmethod(spy_target))
    run = made["run"]
    env = {"REPRODUCE_HOME": str(made["home"]), "REPRODUCE_ATTEST_KEY": str(made["key"])}
    missing = ("nosuchrun", str(made["elsewhere"] / "runs" / "nosuchrun"))
    answers = {}
    for words, names in run_arguments().items():
        codes = []
        beside = set(run.parent.iterdir())
        for ref in (run.name, str(run)):
            resolved.clear()
            got = completed_here(*_argv(words, names, ref), cwd=made["elsewhere"], env=env)
            said = got.stdout + got.stderr
            assert "Traceback" not in said and "no run " not in said, (words, ref, said)
            found = {p.resolve() for p in resolved}
            assert run.resolve() in found, f"{words} {ref}: the run was not found ({found}): {said}"
            codes.append(got.returncode)
            for made_beside in set(run.parent.iterdir()) - beside:  # bundle's .tar.gz: once
                made_beside.unlink()
        assert codes[0] == codes[1], (words, codes)
        answers[words] = codes[0]
        for ref in missing:
            got = completed_here(*_argv(words, names, ref), cwd=made["elsewhere"], env=env)
            assert got.returncode == 2, (words, ref, got.returncode, got.stdout, got.stderr)
            assert _one_paragraph(got.stderr) and ref in got.stderr, (words, got.stderr)
    # a finished local run: read, measured, compared, attested and verified; what acts on a
    # node says why it cannot, each the same way by id and by path
    assert all(answers[w] == 0 for w in ("status", "logs", "measure", "compare", "attest")), answers
    assert not list(made["elsewhere"].glob("*")), "a command made something where it ran"
