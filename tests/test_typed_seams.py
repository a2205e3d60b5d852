"""Typed records at the seams (docs/architecture.md, "Module map"): outside launcher/inputs/ no
code reads the recipe's mapping by key, neither `Recipe.raw` nor a recipe file read back (the
second half of this file). inputs/recipe.py keeps `Recipe.raw` for what is written
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


# ---------------------------------------------------------------------------------------------
# A recipe read back from a file (a run directory's recipe.yaml, a bundle's) is a mapping too,
# and reading it by key outside inputs/ is the same fault as reading `Recipe.raw`. The rule:
# outside inputs/, what a recipe file's read gives is handed to inputs/ at once (Sections.of,
# Sections.of_copy, recipe_slug, ...), never read by key, kept in a record or passed elsewhere.
# A read of a recipe file is a YAML or JSON read (or a RunFiles lookup) whose argument names
# the recipe: `Files.RECIPE`, a variable such as `recipe_path`, or the kind "recipe".

READERS = {
    "read_yaml",
    "load_yaml",
    "read_yaml_mapping",
    "load_file",
    "read_json",
    "mapping",
    "get",
}


def _names_the_recipe(arg: ast.expr, reader: str) -> bool:
    if isinstance(arg, ast.Constant):  # `plan.get("recipe")` is plan.json's own block
        return reader == "read_yaml_mapping" and arg.value == "recipe"
    return any(
        (isinstance(n, ast.Name) and "recipe" in n.id.lower())
        or (isinstance(n, ast.Attribute) and n.attr in ("RECIPE", "RECIPE_FILE"))
        for n in ast.walk(arg)
    )


def _reads_a_recipe(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in READERS and any(_names_the_recipe(a, name) for a in node.args)


def _inputs_names(tree: ast.AST) -> set[str]:
    """Names the module imports from launcher.inputs (at the top or inside a function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher.inputs"):
            out.update(a.asname or a.name for a in node.names)
    return out


def _handed_to_inputs(node: ast.AST, parents: dict[int, ast.AST], owners: set[str]) -> bool:
    """Whether NODE's value goes straight into a call of inputs/ (through `x or {}`, `x if
    isinstance(x, dict) else {}`), or is only tested (`isinstance(x, dict)`)."""
    child, parent = node, parents.get(id(node))
    while isinstance(parent, ast.BoolOp | ast.IfExp):
        if isinstance(parent, ast.IfExp) and parent.test is child:
            return True
        child, parent = parent, parents.get(id(parent))
    if not isinstance(parent, ast.Call) or child is parent.func:
        return False
    root = parent.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id == "isinstance":
        return True
    return isinstance(root, ast.Name) and root.id in owners


def recipe_document_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every use of a recipe file's content that is not handed to
    inputs/ at once."""
    tree = ast.parse(source)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    owners = _inputs_names(tree)
    found: list[tuple[int, str]] = []
    scopes = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for scope in scopes:
        bound: set[str] = set()
        for node in ast.walk(scope):
            if not _reads_a_recipe(node):
                continue
            parent = parents.get(id(node))
            while isinstance(parent, ast.BoolOp):
                parent = parents.get(id(parent))
            if isinstance(parent, ast.Assign):  # kept in a name: each use is checked below
                for target in parent.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    if isinstance(elts[0], ast.Name):
                        bound.add(elts[0].id)
                        continue
                    found.append((node.lineno, ast.unparse(parent)))
            elif not _handed_to_inputs(node, parents, owners):
                found.append((node.lineno, ast.unparse(parents.get(id(node), node))))
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Name)
                and node.id in bound
                and isinstance(node.ctx, ast.Load)
                and not _handed_to_inputs(node, parents, owners)
            ):
                found.append((node.lineno, ast.unparse(parents.get(id(node), node))))
    return sorted(set(found))


def test_no_code_outside_inputs_reads_a_recipe_file_by_key():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if OWNER in path.parents:
            continue
        for line, text in recipe_document_reads(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert not found, (
        "a recipe file's content is used outside launcher/inputs/ other than by handing it to "
        "inputs/ (Sections.of_copy, recipe_slug, ...); read its typed sections:\n"
        + "\n".join(found)
    )


_HEADER = (
    "from launcher.inputs.recipe import Sections, recipe_slug\n"
    "from launcher.records.rundir import Files\n"
)


@pytest.mark.parametrize(
    "body",
    [
        "card = files.mapping(Files.RECIPE).get('stack')",
        "recipe = files.mapping(Files.RECIPE)\nstack = recipe.get('stack')",
        "recipe = files.mapping(Files.RECIPE)\nctx = Context(recipe=recipe)",
        "doc = read_yaml(rd / Files.RECIPE) or {}\nlayout = doc['layout']",
        "raw = read_yaml(recipe_path)\nfor k in raw: pass",
        "raw, _ = read_yaml_mapping(path, 'recipe')\nmodel = raw['model']",
        "data = read_json(root, Files.RECIPE)\nshow(data)",
        "x = files.get(Files.RECIPE)['correctness']['convergence']",
        "def f(files):\n    r = files.mapping(Files.RECIPE)\n    return r.get('stack', {})",
    ],
)
def test_the_check_finds_a_recipe_file_read_by_key(body):
    assert recipe_document_reads(_HEADER + body), body


@pytest.mark.parametrize(
    "body",
    [
        "card = Sections.of_copy(files.get(Files.RECIPE))",
        "card = Sections.of(files.mapping(Files.RECIPE))",
        "raw = read_yaml(recipe_path) or {}\n"
        "card = Sections.of(raw if isinstance(raw, dict) else {})\n"
        "slug = recipe_slug(raw) if isinstance(raw, dict) else None",
        "raw, _ = read_yaml_mapping(path, 'recipe')\nslug = recipe_slug(raw)",
        "block = plan.get('recipe') or {}\nslug = block.get('slug')",  # plan.json's own block
        "result = read_yaml(rd / Files.RESULT)\nx = result.get('runs')",
    ],
)
def test_the_check_lets_a_recipe_file_handed_to_inputs_pass(body):
    assert recipe_document_reads(_HEADER + body) == [], body
