"""Every number option of every command refuses NaN and infinity, before the command runs.

The walk reads the command line's own declaration (typer's click commands), so an option added
tomorrow is covered without a new test. Why: click reads "nan" and "inf" as floats, and a NaN
limit or tolerance is never crossed (`--tolerance-slower nan` judged every run reproduced).
"""

from __future__ import annotations

from typing import Any

import pytest
import typer
from support.cli import SEED, reproduce_here

from launcher.commands.cli import app
from launcher.judge.verdict import Tolerance


def float_options(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command words, option) for every option whose type is a float, in every (sub)command;
    the group's own options come before its command's name ("" for the root's)."""
    found = [
        (prefix, param.opts[0])
        for param in group.params
        # by name: typer may vendor its own click, whose classes are not `click`'s
        if param.param_type_name == "option" and param.type.name == "float"
    ]
    for name, cmd in getattr(group, "commands", {}).items():
        found += float_options(cmd, (*prefix, name))
    return found


OPTIONS = float_options(typer.main.get_command(app))


def test_the_walk_finds_the_options_a_user_knows():
    names = {opt for _, opt in OPTIONS}
    assert {"--max-usd", "--max-hours", "--price-per-hour", "--tolerance-slower"} <= names
    assert len(OPTIONS) >= 8


@pytest.mark.parametrize("words, option", OPTIONS, ids=[" ".join((*w, o)) for w, o in OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_number_option_refuses_what_is_not_finite(words, option, value):
    # the root group's own options go before a recipe (`reproduce --max-usd X RECIPE ...`)
    argv = [option, value, str(SEED), "--dry-run"] if not words else [*words, option, value]
    res = reproduce_here(*argv)
    assert res.code == 2, (argv, res.out, res.err)
    assert option in res.err and "expected a finite number" in res.err, res.err
    assert "Traceback" not in res.err


@pytest.mark.parametrize("field", ["slower_percent", "faster_percent", "cv_factor"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_tolerance_that_is_not_a_finite_number_is_refused(field, value):
    from launcher.errors import BadInput

    with pytest.raises(BadInput, match=field):
        Tolerance(**{field: value})
