"""The CLI's one face (launcher/commands/options.py, cli.py's COMMANDS): every command in a group
of `reproduce --help`, every option name with one meaning, every concept with one name.

The walk reads typer's own click commands, so a command or an option added later is held to the
same rules without a new test: a new command outside a group, an option re-declared with its own
help, or an old synonym brought back fails here, naming the command.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import typer
from support.cli import REPO, reproduce_here

from launcher.commands import options
from launcher.commands.cli import app

ROOT = typer.main.get_command(app)

# concept -> its one option name; and names that once meant the same thing, never to return
CONCEPTS = {
    "the cluster profile": "--cluster",
    "the attestation key": "--key",
    "go ahead without asking": "--yes",
    "the runs root": "--runs-dir",
    "an AWS region": "--region",
    "show, change nothing": "--dry-run",
    "one JSON object on stdout": "--json",
    "the measured runs": "--runs",
    "what Ctrl-C does": "--on-interrupt",
    "the newest baked AMIs kept": "--keep-newest",
    "leave the instance running": "--keep",
}
RETIRED = {
    "--profile": "--cluster",
    "--attest-key": "--key",
    "--signing-key": "--key",
    "--assume-yes": "--yes",
    "--runs-root": "--runs-dir",
}
CHOICES = {  # options with a fixed set of words: a click Choice, the domain's own words
    "--on-interrupt": ("launcher.runner.reporter", "INTERRUPT_CHOICES"),
    "--rows-builder": ("launcher.prepare.assets", "ROWS_BUILDERS"),
    "--network": ("launcher.prepare.image", "NETWORKS"),
}


def commands(group: Any = ROOT, prefix: str = "") -> dict[str, Any]:
    """Every command, `image build` included, by its words."""
    found: dict[str, Any] = {}
    for name, cmd in getattr(group, "commands", {}).items():
        words = f"{prefix} {name}".strip()
        if getattr(cmd, "commands", None):
            found |= commands(cmd, words)
        else:
            found[words] = cmd
    return found


def option_uses() -> dict[str, list[tuple[str, Any]]]:
    """Long option name -> every (command, click option) that takes it."""
    uses: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for words, cmd in commands().items():
        for param in cmd.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            longs = [o for o in param.opts if o.startswith("--")]
            assert len(longs) == 1, f"{words}: {param.opts}: one long name per option"
            uses[longs[0]].append((words, param))
    return uses


def test_the_walk_sees_every_command() -> None:
    names = set(commands())
    assert {"run", "status", "measure", "attest", "reap", "prepare", "image prune"} <= names
    assert len(names) >= 23


def test_every_command_sits_in_a_group_in_the_groups_order() -> None:
    loose = [n for n, c in ROOT.commands.items() if c.rich_help_panel not in options.PANELS]
    assert not loose, f"commands in no group of `reproduce --help`: {loose}"
    res = reproduce_here("--help", env={"COLUMNS": "200"})
    assert res.code == 0, res.err
    where = [res.out.find(f"─ {panel} ") for panel in options.PANELS]
    assert -1 not in where and where == sorted(where), (where, res.out)
    listed = re.findall(r"^│ (\w+) ", res.out, re.M)
    assert sorted(listed) == sorted(ROOT.commands), listed


def _face(p: Any) -> tuple[Any, ...]:
    """What an option is, wherever it appears: its help, its names, flag or value, its type (a
    choice with its words), one value or many, and its check (the finite-number callback)."""
    words = tuple(getattr(p.type, "choices", ()) or ())
    check = getattr(p.callback, "__qualname__", None)
    names = tuple(sorted(p.opts + p.secondary_opts))
    return (p.help, names, p.is_flag, p.type.name, words, p.multiple, p.count, check)


def test_no_option_name_has_two_meanings() -> None:
    """Wherever a name appears, it is the one declaration: the same help, names, type, choices
    and check."""
    for name, uses in option_uses().items():
        faces = {_face(p) for _, p in uses}
        assert len(faces) == 1, f"{name} means different things: " + "; ".join(
            f"{words}: {p.help!r}" for words, p in uses
        )


def test_a_shared_option_is_declared_once() -> None:
    """An option two commands take is spelled only in options.py, never beside a command."""
    shared = [n for n, uses in option_uses().items() if len({w for w, _ in uses}) > 1]
    assert "--cluster" in shared and "--key" in shared
    for path in sorted((REPO / "launcher" / "commands").glob("*.py")):
        if path.name == "options.py":
            continue
        text = path.read_text()
        again = [n for n in shared if re.search(rf'Option\([^()]*"{n}"', text)]
        assert not again, f"{path.name} declares shared options itself: {again}"


def test_no_concept_has_two_names() -> None:
    uses = option_uses()
    for concept, name in CONCEPTS.items():
        assert name in uses, f"{concept}: no command takes {name}"
    for old, new in RETIRED.items():
        assert old not in uses, f"{old} is back; {new} is its one name"
    # two names with one help text, or one parameter reached by two names, are one concept twice
    by_help: dict[str, set[str]] = defaultdict(set)
    by_dest: dict[str, set[str]] = defaultdict(set)
    for name, found in uses.items():
        for _, param in found:
            by_help[param.help or ""].add(name)
            by_dest[param.name].add(name)
    assert all(len(v) == 1 for h, v in by_help.items() if h), by_help
    twice = {d: v for d, v in by_dest.items() if len(v) > 1}
    assert not twice, f"one parameter under several option names: {twice}"


# Every option name the command line has, and the one concept it names. A new option is added
# here with its concept: if the concept is already here under another name, use that name.
OPTION_NAMES = {
    "--all-images": "every image's baked AMIs, not one recipe's",
    "--all-owners": "other owners' expired launches too",
    "--allow-different-recipes": "compare runs of two recipes anyway",
    "--buy": "the Capacity Block offering to buy",
    "--check": "send the launch's calls with DryRun=True",
    "--cluster": "the cluster profile",
    "--cost": "what the runs cost, summed",
    "--dockerfile": "the Dockerfile to build",
    "--dry-run": "show, change nothing",
    "--efa-installer": "the EFA installer tarball",
    "--efa-sha256": "the EFA installer's pinned hash",
    "--efa-version": "the EFA installer's version",
    "--end-before": "the latest end of a Capacity Block",
    "--follow": "go on until the run ends",
    "--history": "the history database",
    "--hours": "a Capacity Block's length",
    "--html": "an HTML page written too",
    "--import": "a runs tree entered in the index first",
    "--instance-id": "an existing instance targeted",
    "--json": "one JSON object on stdout",
    "--keep": "leave the instance running",
    "--keep-newest": "the newest baked AMIs kept",
    "--key": "the attestation key",
    "--limit": "how many past runs are shown",
    "--live": "the launched instances that still exist",
    "--max-hours": "a run's wall-clock limit",
    "--max-usd": "a spending limit",
    "--network": "docker build's network",
    "--node": "which node of a multi-node run",
    "--nodes": "how many instances a Capacity Block holds",
    "--on-interrupt": "what Ctrl-C does",
    "--out": "where the output goes",
    "--price-per-hour": "the node's price",
    "--push": "the registry pushed to",
    "--recipe": "the recipe whose claim is judged",
    "--record": "the image's record file",
    "--refresh": "ask AWS afresh",
    "--region": "an AWS region",
    "--rows": "rows built elsewhere",
    "--rows-builder": "who builds the rows",
    "--run-id": "a new run's id",
    "--runs": "the measured runs",
    "--runs-dir": "the runs root",
    "--script-out": "the node script written to a file",
    "--skip-preflight": "no GPU preflight",
    "--stage": "one stage's lines",
    "--start-after": "the earliest start of a Capacity Block",
    "--store": "the asset store",
    "--tag": "the tag pushed",
    "--test-encoder": "a stand-in tokenizer for tests",
    "--threads": "transfers in parallel",
    "--timeline": "a timeline.json for GPU-hours",
    "--tolerance-faster": "how far above the claim is still reproduced",
    "--tolerance-slower": "how far below the claim is still reproduced",
    "--work-dir": "the assets' local copy",
    "--yes": "go ahead without asking",
}
# Options that take any text, and why it is not a fixed set of words (which would be an enum in
# options.py, checked by the command line: CHOICES above).
FREE_TEXT = {
    "--buy": "an offering id AWS gives",
    "--cluster": "a profile name from env/ or a path",
    "--efa-sha256": "a hash",
    "--efa-version": "a version",
    "--end-before": "an ISO time",
    "--instance-id": "an instance id",
    "--push": "a registry",
    "--region": "an AWS region (AWS adds regions)",
    "--run-id": "an id the user picks",
    "--stage": "a stage of that run: its plan's stages, checked against its logs",
    "--start-after": "an ISO time",
    "--store": "a URL or a directory",
    "--tag": "an image tag",
    "--test-encoder": "a tokenizer spec, checked by the rows builder",
}


def test_every_option_name_is_one_concept_of_the_table() -> None:
    """A new option name must be added to OPTION_NAMES with its concept, so a second name for a
    concept the command line already has is seen where it is added; a name gone from the
    command line is gone from the table."""
    names = set(option_uses())
    assert names - set(OPTION_NAMES) == set(), "new option names: add each with its concept"
    assert set(OPTION_NAMES) - names == set(), "option names no command takes any more"
    concepts = [c.lower() for c in OPTION_NAMES.values()]
    twice = {c for c in concepts if concepts.count(c) > 1}
    assert not twice, f"one concept under two names: {twice}"
    for concept, name in CONCEPTS.items():
        assert name in OPTION_NAMES, (concept, name)


def test_a_text_option_is_free_text_or_an_enum() -> None:
    """An option that takes text either takes any text (FREE_TEXT says why) or is a choice: a
    free-string option whose words are a fixed set is caught when it is added."""
    text = {n for n, uses in option_uses().items() if uses[0][1].type.name in ("str", "text")}
    assert text - set(FREE_TEXT) == set(), "a text option: a fixed set of words (an enum)?"
    assert set(FREE_TEXT) - text == set(), "FREE_TEXT names an option that takes no text"
    for name in CHOICES:
        assert name not in FREE_TEXT


def test_the_cluster_help_names_every_shipped_profile() -> None:
    from launcher.inputs.profile import available_profiles

    [(_, param), *_] = option_uses()["--cluster"]
    for name in available_profiles():
        assert name in param.help, f"--cluster's help does not name env/{name}.yaml"


def test_yes_is_y_everywhere() -> None:
    for words, param in option_uses()["--yes"]:
        assert "-y" in param.opts, f"{words}: --yes without -y"


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_choices_are_enums_of_the_domains_words(name: str) -> None:
    import importlib

    module, attr = CHOICES[name]
    words = tuple(getattr(importlib.import_module(module), attr))
    for cmd_words, param in option_uses()[name]:
        assert param.type.name == "choice", f"{cmd_words} {name}: a free string"
        assert tuple(param.type.choices) == words, (cmd_words, name, param.type.choices)


def test_a_retired_name_is_a_usage_error(tmp_path: Path) -> None:
    res = reproduce_here("image", "prune", "--all-images", "--profile", "aws")
    assert res.code == 2 and "--profile" in res.err


def test_prepare_yes_answers_its_question_and_still_shows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`prepare` asks before it pulls the training image; -y answers, the question still shown.
    Without it and without a terminal nothing answers (tests/prepare/test_assets_prepare.py)."""
    from support.cli import SEED

    import launcher.prepare.assets as assets

    seen: dict[str, Any] = {}

    def fake_prepare(recipe: Any, options: Any, events: Any) -> dict[str, str]:
        seen["no terminal"] = options.confirm
        return {}

    monkeypatch.setattr(assets, "prepare", fake_prepare)
    res = reproduce_here("prepare", SEED, "--store", tmp_path / "s", "-y")
    assert res.code == 0, res.err
    confirm = seen["no terminal"]
    capsys.readouterr()
    assert confirm is not None and confirm("Pull it? [y/N] ") is True
    assert capsys.readouterr().err == "Pull it? [y/N] y (--yes)\n"
    res = reproduce_here("prepare", SEED, "--store", tmp_path / "s")
    assert res.code == 0 and seen["no terminal"] is None, res.err


# A command's declaration and body live in launcher/commands/<its name>.py, or in the module of
# the family it shares its body with.
FAMILIES = {"status": "runs", "verify": "attest", "bundle": "attest", "keygen": "attest"}


def test_each_command_is_declared_in_the_module_named_after_it() -> None:
    from launcher.commands.cli import COMMANDS

    assert [name for name, _, _ in COMMANDS] == list(ROOT.commands), "COMMANDS is --help's order"
    for words, cmd in commands().items():
        home = FAMILIES.get(words, words.split()[0])
        module = cmd.callback.__module__
        assert module == f"launcher.commands.{home}", f"{words} is declared in {module}"
        assert (REPO / "launcher" / "commands" / f"{home}.py").is_file()
