"""Every option or argument naming a file a command writes refuses what is not a file to replace,
before the command runs (launcher/commands/options.py, `output_file`).

The walk reads the command line's own declaration, like tests/commands/test_cli_numbers.py: an
output added tomorrow with the callback is covered, and a Path parameter whose help says it is
written to but has no callback fails the first test. Why: the write is a rename over the path,
so a FIFO or a device there was replaced (as root, `--script-out /dev/full` replaced the device
node), a symbolic link rather than the file it names, and `--script-out ""` raised a ValueError
(found 2026-12-04).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import typer
from support.cli import SEED, reproduce_here

from launcher.commands.cli import app
from launcher.commands.options import output_file


def path_params(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(prefix, p) for p in group.params if getattr(p.type, "name", "") == "path"]
    for name, cmd in getattr(group, "commands", {}).items():
        found += path_params(cmd, (*prefix, name))
    return found


def _writes(param: Any) -> bool:
    text = (getattr(param, "help", "") or "").lower()
    return any(word in text for word in ("write", "record file"))


PARAMS = path_params(typer.main.get_command(app))
OUTPUTS = [(w, p) for w, p in PARAMS if getattr(p.callback, "__name__", "") == output_file.__name__]


def test_every_path_a_command_writes_has_the_callback():
    undeclared = [
        (" ".join(w), p.name)
        for w, p in PARAMS
        if _writes(p) and (w, p) not in OUTPUTS and p.name not in ("out",)  # --out: a directory
    ]
    assert undeclared == []
    names = {p.name for _, p in OUTPUTS}
    assert {"script_out", "html", "record", "path"} <= names


def argv_for(words: tuple[str, ...], param: Any, value: str) -> list[str]:
    if not words:  # the root's own options go before a recipe
        return [param.opts[0], value, str(SEED), "--dry-run"]
    if param.param_type_name == "argument":
        return [*words, value]
    needs_recipe = words[0] in ("history", "image")
    return [*words, *([str(SEED)] if needs_recipe else []), param.opts[0], value]


@pytest.mark.parametrize("words, param", OUTPUTS, ids=[" ".join((*w, p.name)) for w, p in OUTPUTS])
def test_an_output_path_that_is_not_a_file_to_replace_is_refused(tmp_path, words, param):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "real"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    for value in ("", str(fifo), str(link), str(tmp_path), str(tmp_path / "no" / "such" / "f")):
        res = reproduce_here(*argv_for(words, param, value))
        assert res.code == 2, (words, param.name, value, res.out, res.err)
        assert "Traceback" not in res.err
        shown = param.opts[0] if param.param_type_name == "option" else ""
        assert f"Invalid value for '{shown}" in res.err, res.err  # refused for this, not else
    assert target.read_text() == "keep me" and link.is_symlink() and fifo.exists()
