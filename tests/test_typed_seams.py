"""Typed records at the seams (docs/architecture.md, "Module map"): outside launcher/inputs/ no
code reads the recipe's mapping by key. inputs/recipe.py keeps `Recipe.raw` for what is written
back (the content hash, the run directory's copy) and for its own checks; every other reader
reads the typed sections (`recipe.claim`, `.hardware`, `.workload`, `.layout`; `Sections.of` for
a copy read back from a run directory), so a field renamed or retyped is found by mypy, not by a
KeyError in a user's run.

The rule is checked on the code's syntax, so a module added later is covered unasked: any use of
an attribute `raw` (reading it, passing it on, taking its item) or `getattr(x, "raw")` outside
inputs/ fails, naming the file and line. A call `x.raw(key)` is jsonread.Fields' typed reader of
a JSON file, not the recipe's mapping, and a profile's mapping (`...profile.raw`) is the
profile's own record, typed apart (inputs/profile.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "launcher"
OWNER = PKG / "inputs"  # the one folder that reads the recipe's mapping


def _base_text(node: ast.expr) -> str:
    return ast.unparse(node)


def raw_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every read of a `raw` attribute in SOURCE that is not a call of
    jsonread.Fields.raw and not a profile's mapping."""
    tree = ast.parse(source)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "raw":
            if id(node) in called:
                continue  # Fields.raw(key): a typed JSON reader's method
            if _base_text(node.value).rsplit(".", 1)[-1] == "profile":
                continue  # the profile's own mapping
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value == "raw" for a in node.args)
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "raw"
            and (
                (isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "vars")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__")
            )
        ):
            found.append((node.lineno, ast.unparse(node)))  # vars(recipe)['raw']
    return found


def test_no_code_outside_inputs_reads_the_recipes_mapping():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if OWNER in path.parents:
            continue
        for line, text in raw_reads(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert not found, (
        "the recipe's mapping is read outside launcher/inputs/; read its typed sections "
        "(recipe.claim, .hardware, .workload, .layout; Sections.of for a copy read back):\n"
        + "\n".join(found)
    )


# Every way a reader could reach the mapping, each spelled through several holders of a Recipe:
# the check must find them all, whatever the variable is called.
HOLDERS = ("recipe", "r", "self.recipe", "plan.recipe", "ctx.loaded", "x")
READS = (
    "{h}.raw['result']",
    "{h}.raw.get('gpu')",
    "({h}.raw or {{}}).get('layout')",
    "raw = {h}.raw",
    "f({h}.raw)",
    "{{**{h}.raw}}",
    "getattr({h}, 'raw')",
    "vars({h})['raw']",
    "{h}.__dict__['raw']",
    "[v for v in {h}.raw.values()]",
)


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("holder", HOLDERS)
def test_the_check_finds_every_spelling_of_a_read(holder, read):
    source = read.format(h=holder)
    assert raw_reads(source), source


@pytest.mark.parametrize(
    "source",
    [
        "Fields(doc).raw('acquired_at')",
        "timeline.obj('cost').raw('price')",
        "plan.profile.raw",
        "profile.raw.get('image')",
        "recipe.claim.tokens_per_s_per_gpu",
        "raw = read_yaml(path)",
        "raw['result']",  # a local mapping named raw (a JSON file read back) is not an attribute
        "data['raw']",
    ],
)
def test_the_check_lets_typed_reads_pass(source):
    assert raw_reads(source) == []
