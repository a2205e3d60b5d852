"""Text from the node reaches a page and the terminal printable: no control character, no bidi
control, only its escape (launcher/excerpt.py `printable`).

Why: the log and the node's reports are what the recipe's code printed. An ESC in them starts a
terminal's control sequence (retitle the window, clear the screen, hide the lines after), a NUL or
a C1 byte is one to some terminals, and a bidi override (U+202E) turns the rest of a line around
in a page or a terminal alike, so `reproduced` could be shown for what says otherwise. The
adversary: a run the real runner made, whose logs, every text of every node report, and the
status detail carry every C0 control, DEL, every C1 control and the bidi controls; its run page
is parsed as a browser would (every text node and attribute value), and every command of the
CLI's table is run on it (COMMANDS: each command's argument lines over the hostile run, its
logs, a log whose printed arguments are hostile, its history; or why it reads nothing a node
wrote; a command added to the CLI fails here until it is placed): none of those characters may
come out as itself. Line breaks are structure, not content: a newline is allowed where a page or
a terminal shows lines.
"""

from __future__ import annotations

import io
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from support.attest import cli, real_run

from launcher.excerpt import printable
from launcher.pages import write_run_page
from launcher.records.rundir import NODE_RESULT_FILES, RunDir

CONTROLS = (
    [chr(c) for c in range(0x00, 0x20)]
    + ["\x7f"]
    + [chr(c) for c in range(0x80, 0xA0)]
    + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
)
HOSTILE = "ok" + "".join(CONTROLS) + "done"


def _shown_badly(text: str, allowed: str = "\n") -> list[str]:
    """The hostile characters (as their names) that TEXT carries as themselves."""
    return sorted({f"U+{ord(c):04X}" for c in text if c in CONTROLS and c not in allowed})


def _poison(value: Any) -> Any:
    """Every text of a JSON document with the hostile characters in it."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, dict):
        return {k: _poison(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_poison(v) for v in value]
    return value


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("printable")
    (root / "runs").mkdir()
    d = real_run(root / "runs", root / "node")
    for name in NODE_RESULT_FILES:
        path = d / name
        if path.is_file():
            path.write_text(json.dumps(_poison(json.loads(path.read_text()))))
    # what the run was asked and judged, as a copied run directory can hold it: the profile's
    # name (shown by status, runs and history) and a reason of the verdict
    plan = json.loads((d / "plan.json").read_text())
    plan["profile"]["name"] += HOSTILE
    (d / "plan.json").write_text(json.dumps(plan))
    verdict = json.loads((d / "verdict.json").read_text())
    verdict["reasons"].append(f"note: {HOSTILE}")
    (d / "verdict.json").write_text(json.dumps(verdict))
    rd = RunDir(d)
    rd.set_status("failed", detail=f"the train stage failed: {HOSTILE}")
    lines = "".join(f"line {i} {HOSTILE}\n" for i in range(3))
    for log in (d / "logs").glob("*.log"):
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(lines)
    return d


class _Everything(HTMLParser):
    """Every text node and every attribute value of a page, as a browser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.seen: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen += [v for _, v in attrs if v]

    def handle_data(self, data: str) -> None:
        self.seen.append(data)


def test_the_rule_escapes_every_such_character_and_nothing_else():
    for c in CONTROLS:
        shown = printable(f"a{c}b")
        assert c not in shown and shown.startswith("a\\") and shown.endswith("b"), repr(c)
    text = "plain text, ünïcödé, 日本語, emoji 🙂, tokens/s 1,234.5"
    assert printable(text) == text
    assert printable("a\nb", keep="\n") == "a\nb"


def test_the_run_page_shows_no_control_character_as_itself(run):
    page = write_run_page(run, run / "page-test.html")
    parser = _Everything()
    parser.feed(page.read_text(encoding="utf-8"))
    bad = {_c for text in parser.seen for _c in _shown_badly(text)}
    assert not bad, f"shown as themselves in the page: {sorted(bad)}"
    assert "\\x1b" in page.read_text(encoding="utf-8")  # and shown as their escapes


# Every command of the CLI -> the argument lines it is run with over the hostile run (each on a
# copy of the runs root: measure and cancel write into the run), or why it reads nothing a node,
# a log or a copied run directory wrote. {run} the run, {root} its runs root, {log} its train.log,
# {args_log} a log whose arguments listing prints hostile values, {key} a signing key, {db} a
# history database, {slug} the run's recipe.
COMMANDS: dict[str, list[tuple[str, ...]] | str] = {
    "attach": [("attach", "{run}")],
    "attest": [("attest", "{run}", "--key", "{key}")],
    "bundle": [("bundle", "{run}")],
    "cancel": [("cancel", "{run}")],
    "capacity": "asks AWS about a recipe (the user's input, validated)",
    "compare": [
        ("compare", "{log}", "{args_log}"),
        ("compare", "{log}", "{args_log}", "--allow-different-recipes"),
        ("compare", "{args_log}", "{args_log}"),
        ("compare", "{run}", "{run}", "--json"),
    ],
    "down": [("down", "{run}")],
    "history": [
        ("history", "{slug}", "--import", "{root}", "--history", "{db}"),
        ("history", "{slug}", "--import", "{root}", "--history", "{db}", "--json"),
    ],
    "image bake": "builds from a recipe (the user's input, validated) on AWS",
    "image build": "builds from a recipe (the user's input, validated)",
    "image prune": "lists AWS images by tag",
    "keygen": "writes a key pair",
    "logs": "a pipe gets the log's bytes: test_logs_at_a_terminal_shows_the_log_printable_...",
    "measure": [
        ("measure", "{run}"),
        ("measure", "{run}", "--json"),
        ("measure", "{log}", "--recipe", "{run}/recipe.yaml"),
        ("measure", "{args_log}", "--recipe", "{run}/recipe.yaml"),
    ],
    "nightly": "starts runs: their console lines are the runner's (ConsoleReporter, printable)",
    "prepare": "fetches a recipe's assets (the user's input, validated)",
    "reap": "asks AWS",
    "run": "starts a run: its console lines are the runner's (ConsoleReporter, printable)",
    "runs": [
        ("runs", "--runs-dir", "{root}"),
        ("runs", "--runs-dir", "{root}", "--json"),
        ("runs", "--runs-dir", "{root}", "--cost"),
    ],
    "ssh": "hands the terminal to ssh on the run's node",
    "status": [("status", "{run}"), ("status", "{run}", "--json")],
    "validate": [("validate", "{run}/recipe.yaml")],
    "verify": [("verify", "{run}"), ("verify", "{run}", "--json")],
}


# The argument lines whose output quotes the hostile text (escaped): the adversary reaches them,
# so their passing is not for want of hostile input.
QUOTED = {
    ("cancel", "{run}"),
    ("compare", "{log}", "{args_log}"),
    ("compare", "{log}", "{args_log}", "--allow-different-recipes"),
    ("history", "{slug}", "--import", "{root}", "--history", "{db}"),
    ("history", "{slug}", "--import", "{root}", "--history", "{db}", "--json"),
    ("measure", "{args_log}", "--recipe", "{run}/recipe.yaml"),
    ("runs", "--runs-dir", "{root}"),
    ("runs", "--runs-dir", "{root}", "--json"),
    ("runs", "--runs-dir", "{root}", "--cost"),
    ("status", "{run}"),
    ("status", "{run}", "--json"),
}


def _cli_commands() -> set[str]:
    """Every command the CLI declares, sub-commands by their full name ("image build")."""
    import typer.main

    from launcher.commands.cli import app

    found: set[str] = set()

    def walk(group: Any, prefix: str) -> None:
        for name, sub in group.commands.items():
            if hasattr(sub, "commands"):
                walk(sub, f"{prefix}{name} ")
            else:
                found.add(prefix + name)

    walk(typer.main.get_command(app), "")
    return found


def test_the_table_places_every_command_of_the_cli():
    assert set(COMMANDS) == _cli_commands()


def _argvs() -> list[tuple[str, ...]]:
    return [argv for lines in COMMANDS.values() if not isinstance(lines, str) for argv in lines]


@pytest.fixture()
def copied(run: Path, tmp_path: Path) -> dict[str, str]:
    """A fresh copy of the hostile runs root, and the files the table names."""
    from support.attest import keypair

    slug = json.loads((run / "run.json").read_text())["slug"]
    runs_root = run.parents[len(slug.split("/"))]
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root, symlinks=True)
    rd = root / run.relative_to(runs_root)
    text = (rd / "logs" / "train.log").read_text(encoding="utf-8")
    one_line = "".join(c for c in HOSTILE if c not in "\n\r\x0b\x0c\x1c\x1d\x1e\x85")
    args_log = tmp_path / "args.log"
    printed = "global_batch_size ............................... 128\n"  # compared (judge/gate)
    assert printed in text
    args_log.write_text(text.replace(printed, printed[:-1] + one_line + "\n", 1), encoding="utf-8")
    key, _ = keypair(tmp_path)
    return {
        "run": str(rd),
        "root": str(root),
        "log": str(rd / "logs" / "train.log"),
        "args_log": str(args_log),
        "key": str(key),
        "db": str(tmp_path / "history.db"),
        "slug": slug,
    }


@pytest.mark.parametrize("argv", _argvs(), ids=" ".join)
def test_every_command_shows_no_control_character_as_itself(copied, argv):
    args = [a.format(**copied) for a in argv]
    proc = cli(*args)
    assert "Traceback" not in proc.stderr, proc.stderr
    bad = _shown_badly(proc.stdout) + _shown_badly(proc.stderr)
    assert not bad, f"{' '.join(argv)}: shown as themselves: {bad}\n{proc.stdout}{proc.stderr}"
    if argv in QUOTED:  # as its escape: \x1b in text, \u001b in JSON
        assert "\\x1b" in proc.stdout + proc.stderr or "\\u001b" in proc.stdout, proc.stdout


def test_logs_at_a_terminal_shows_the_log_printable_and_a_pipe_gets_its_bytes(run):
    from launcher.commands.logs import logs_command

    class Terminal(io.BytesIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.BytesIO()
    assert logs_command(str(run), None, out=tty) == 0
    assert logs_command(str(run), None, out=pipe) == 0
    shown = tty.getvalue().decode("utf-8")
    assert not _shown_badly(shown, allowed="\n\t") and "\\x1b" in shown
    assert HOSTILE.encode() in pipe.getvalue()  # a copy of the log is the log


def test_an_error_quoting_the_node_is_printable(run, tmp_path):
    """The CLI's one error printer (commands/output.fail): a message that quotes a file's
    name or a stranger's words is shown printable."""
    hostile_dir = tmp_path / f"x{HOSTILE.replace(chr(0), '')}"  # argv holds no NUL
    proc = cli("status", str(hostile_dir))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert not _shown_badly(proc.stderr), proc.stderr
