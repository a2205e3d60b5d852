"""A key written twice in one mapping of a recipe or a profile is refused, both lines named.

YAML loaders keep the later of two equal keys silently: a `result` block with two
`tokens_per_s_per_gpu` was judged against the hidden second value, a second `gpu:` block turned
an H200 recipe into a B200 plan. The refusal (launcher/inputs/yamlschema.py, the one reader of both
kinds of file) names the file, the key path and both line numbers, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import REPO, SEED, reproduce_here

from launcher.errors import BadInput
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe


def line_of(text: str, needle: str, start: int = 0) -> int:
    """1-based line of the first `needle` at or after line `start` (1-based)."""
    lines = text.splitlines()
    for i in range(max(start - 1, 0), len(lines)):
        if needle in lines[i]:
            return i + 1
    raise AssertionError(needle)


def test_two_throughput_claims_in_the_result_block_are_refused_naming_both_lines(tmp_path):
    text = SEED.read_text()
    first = "  tokens_per_s_per_gpu: 6913.23\n"
    assert first in text
    bad = text.replace(first, first + "  tokens_per_s_per_gpu: 9913.23\n", 1)
    path = tmp_path / "recipe.yaml"
    path.write_text(bad)
    a = line_of(bad, "tokens_per_s_per_gpu: 6913.23")
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert str(path) in res.err
    assert f"result.tokens_per_s_per_gpu at lines {a} and {a + 1}" in res.err, res.err
    # and the dry run refuses it the same way, before any plan
    run = reproduce_here(path, "--dry-run")
    assert run.code == 2 and "duplicate key" in run.err and run.out == ""


def test_a_second_gpu_block_is_refused(tmp_path):
    text = SEED.read_text()
    bad = text + "gpu:\n  type: B200\n  count: 8\n  per_node: 8\n  instance: AWS p6-b200.48xlarge\n"
    path = tmp_path / "recipe.yaml"
    path.write_text(bad)
    starts = [i + 1 for i, ln in enumerate(bad.splitlines()) if ln == "gpu:"]
    assert len(starts) == 2
    first, second = starts
    res = reproduce_here("validate", path)
    assert res.code == 2, res
    assert f"gpu at lines {first} and {second}" in res.err, res.err
    assert "B200" not in res.out


def _key_nodes(node: yaml.Node, path: tuple = ()):
    """Every (key path, key node, value node) of a composed document, in document order."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*path, key.value)
            yield here, key, value
            yield from _key_nodes(value, here)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _key_nodes(item, (*path, i))


def _dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _duplicated(text: str, key: yaml.Node, value: yaml.Node) -> str:
    """The text with the key and its value written once more just before the original."""
    span = text[key.start_mark.index : value.end_mark.index].rstrip()
    indent = " " * key.start_mark.column
    at = key.start_mark.index
    return text[:at] + span + "\n" + indent + text[at:]


SEED_KEYS = list(_key_nodes(yaml.compose(SEED.read_text())))


@pytest.mark.parametrize("index", range(len(SEED_KEYS)), ids=[_dotted(k[0]) for k in SEED_KEYS])
def test_every_key_of_the_seed_written_twice_is_refused(index, tmp_path):
    """Generated: each of the seed's keys in turn (nested, in lists, block scalars) duplicated
    with its value; the copy is the same value, so only the duplicate itself can be refused."""
    text = SEED.read_text()
    path_, key, value = SEED_KEYS[index]
    bad = _duplicated(text, key, value)
    added = text[key.start_mark.index : value.end_mark.index].rstrip().count("\n") + 1
    first = key.start_mark.line + 1
    path = tmp_path / "recipe.yaml"
    path.write_text(bad)
    with pytest.raises(BadInput) as err:
        load_recipe(path)
    message = str(err.value)
    assert message.startswith(f"{path}: 1 duplicate key"), message
    assert f"{_dotted(path_)} at lines {first} and {first + added}" in message, message


def test_a_profile_with_a_key_written_twice_is_refused(tmp_path):
    text = (REPO / "env" / "local.yaml").read_text()
    assert "\nkind: local\n" in text
    bad = text + "kind: aws\n"
    path = tmp_path / "local.yaml"
    path.write_text(bad)
    with pytest.raises(
        BadInput, match=r"duplicate key in the cluster profile: kind at lines 2 and"
    ):
        load_profile(path)
    res = reproduce_here(SEED, "--cluster", path, "--dry-run")
    assert res.code == 2 and "duplicate key" in res.err and "Traceback" not in res.err, res


def test_equal_keys_in_different_mappings_are_not_duplicates(tmp_path):
    # `source`, `name`, `result` and `note` each occur in several mappings of the seed
    assert load_recipe(SEED).raw["result"]["tokens_per_s_per_gpu"] == 6913.23
    assert Path(SEED).read_text().count("  source:") >= 2
