"""A stack field is read once, by the launcher, and the node is given what was read, never the
field's prose (launcher/inputs/stack.py).

Why: recipes state versions in prose. `stack.cuda: "13.0 (driver 580)"` reached the preflight as
its text, and the preflight read every number of it as the version 13.0.580, so a node whose
driver runs CUDA 13.0 was refused after it was paid for; a field stating no version at all
("latest") was passed over by the stack probe without a word (found 2026-12-04). Walked over every
version field the probe reads (stack.READERS), so a field added there is covered here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from support.paths import SEED

from launcher.inputs.recipe import validate_raw
from launcher.inputs.stack import READERS
from launcher.inputs.yamlschema import read_yaml_mapping
from launcher.runner.prelaunch import RunOptions, dry_run_text, prepare

SEED_RAW = read_yaml_mapping(SEED, "recipe")[0]
FIELDS = sorted({field for field, _, _ in READERS.values()})
VERSION_FIELDS = [f for f in FIELDS if f not in ("framework", "megatron_lm")]


def dressed(value: str) -> list[str]:
    """Prose around a version as recipes write it: a name first, a note after, a v."""
    return [
        f"{value} (driver 580; built 2026-10-21)",
        f"v{value}",
        f"Thing {value}, from the 9.9.9 series",
        f"{value}+cu130 (pip, 1.2.3.4 wheel)",
    ]


def script_for(tmp_path: Path, raw: dict) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dry_run_text(prepare(path, RunOptions(cluster="local", run_id="stack")))


def expected_in(script: str) -> dict[str, str]:
    """The expectations node.sh hands the stack probe (its --expect JSON)."""
    found = re.search(r"--expect [^{]*(\{[^}]*\})", script)  # inside the image's bash -c '...'
    assert found, "the stack probe's --expect is not in the script"
    return json.loads(found.group(1))


@pytest.mark.parametrize("field", VERSION_FIELDS)
def test_a_version_in_prose_reaches_the_node_as_the_version_alone(tmp_path, field):
    key = next(k for k, (f, _, _) in READERS.items() if f == field)
    for text in dressed("13.0" if field == "cuda" else "2.4.1"):
        raw = copy.deepcopy(SEED_RAW)
        raw["stack"][field] = text
        assert validate_raw(raw) == [], (field, text)
        script = script_for(tmp_path, raw)
        want = "13.0" if field == "cuda" else "2.4.1"
        assert expected_in(script)[key] == want, (field, text)
        if field == "cuda":  # the preflight's --cuda is the version, not the prose
            assert (
                re.findall(r"--cuda (\S+)", script)
                == [want] * len(re.findall(r"--cuda ", script))
                != []
            ), (text, re.findall(r"--cuda \S+", script))


@pytest.mark.parametrize("field", VERSION_FIELDS)
@pytest.mark.parametrize("text", ["latest", "see the image", "unknown (not printed)", "—"])
def test_a_stated_field_with_nothing_to_check_is_refused_naming_it(field, text):
    raw = copy.deepcopy(SEED_RAW)
    raw["stack"][field] = text
    problems = validate_raw(raw)
    assert [w for w, _ in problems] == [f"stack.{field}"], problems
    assert "expected" in problems[0][1] and "null" in problems[0][1]


@pytest.mark.parametrize("field", VERSION_FIELDS)
def test_null_says_not_stated_and_is_not_checked(tmp_path, field):
    raw = copy.deepcopy(SEED_RAW)
    raw["stack"][field] = None
    assert validate_raw(raw) == []
    key = next(k for k, (f, _, _) in READERS.items() if f == field)
    assert key not in expected_in(script_for(tmp_path, raw))
