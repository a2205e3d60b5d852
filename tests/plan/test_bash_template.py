"""templates/node.sh and its filler (launcher/plan/bash_template.py): the template and the
renderer cannot drift apart unseen, and nothing of the template's syntax reaches node.sh."""

from __future__ import annotations

import pytest
from support.cli import SEED

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.bash_template import BashTemplate, template
from launcher.plan.plan import build_plan

TEXT = """##@ a note, never rendered
##@ block main
head @@{value}
@@slot
tail $HOME ${HOME}

##@ block other: with a note
other
"""


def test_blocks_are_named_and_notes_dropped() -> None:
    tpl = BashTemplate(TEXT, "t")
    assert tpl.fill("other", {}, {}) == ["other"]
    lines = tpl.fill("main", {"value": "v"}, {"slot": ["a", "b"]})
    assert lines == ["head v", "a", "b", "tail $HOME ${HOME}"]  # bash's $ is left alone
    assert tpl.fill("main", {"value": "v"}, {"slot": []}) == ["head v", "tail $HOME ${HOME}"]


def test_a_value_is_never_scanned_again() -> None:
    tpl = BashTemplate(TEXT, "t")
    hostile = "@@{value} @@slot\n@@slot\n##@ block main"
    lines = tpl.fill("main", {"value": hostile}, {"slot": hostile})
    assert lines == [f"head {hostile}", hostile, "tail $HOME ${HOME}"]


@pytest.mark.parametrize(
    ("values", "slots"),
    [
        ({}, {"slot": []}),  # a value the block uses, not given
        ({"value": "v"}, {}),  # a slot not filled
        ({"value": "v", "typo": "x"}, {"slot": []}),  # given and used nowhere
        ({"value": "v"}, {"slot": [], "slot2": []}),
    ],
)
def test_template_and_filler_must_agree(
    values: dict[str, str], slots: dict[str, list[str]]
) -> None:
    with pytest.raises(KeyError):
        BashTemplate(TEXT, "t").fill("main", values, slots)


def test_a_block_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        BashTemplate(TEXT + "##@ block main\n", "t")


@pytest.mark.parametrize("cluster", ["local", "ssh", "aws", "ray"])
def test_no_template_syntax_reaches_node_sh(cluster: str) -> None:
    script = build_plan(load_recipe(SEED), load_profile(cluster), run_id="t").node_script
    assert "@@" not in script and "##@" not in script
    assert script.endswith("exit\n}\n")


def test_node_sh_template_is_the_shipped_file() -> None:
    tpl = template("node.sh")
    assert tpl.blocks["node.sh"][0] == "#!/usr/bin/env bash"
    assert {"container_script", "docker_setup", "host_setup", "ray_job"} <= set(tpl.blocks)
