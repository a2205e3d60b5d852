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


def test_no_option_name_has_two_meanings() -> None:
    """Wherever a name appears, it is the one declaration: the same help, short name and type."""
    for name, uses in option_uses().items():
        faces = {(p.help, tuple(sorted(p.opts + p.secondary_opts)), p.is_flag) for _, p in uses}
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
