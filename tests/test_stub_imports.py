"""Typing imports nothing at run time: a package that exists only for the type checker (a stub
package of the test extra: types_boto3_ec2, types_boto3_sts, ...; typeshed's `_typeshed`) is
imported by launcher/ only inside `if TYPE_CHECKING:`.

Why: the stubs are installed with the test extra, never with `pip install reproduce`, so an
import of one outside TYPE_CHECKING passes every test here and fails for every user with
ModuleNotFoundError. The stub packages are read from what is installed (every `types-*` and
`*-stubs` distribution), so a stub added to the extra later is covered unasked; the finder
itself is checked against every placement of every import form.
"""

from __future__ import annotations

import ast
import itertools
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "launcher"


def stub_only_packages() -> set[str]:
    """The importable top-level names of the installed stub distributions, and `_typeshed`."""
    found = {"_typeshed"}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not (name.startswith("types-") or name.endswith("-stubs")):
            continue
        for file in dist.files or []:
            top = str(file).split("/")[0].removesuffix(".py").removesuffix(".pyi")
            if top.isidentifier():  # `boto3-stubs/` only serves boto3 itself: not importable
                found.add(top)
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of a NAMES package that runs when its module runs (at the
    top, in a function, a class, a try, the else of `if TYPE_CHECKING`): all but those in the
    body of `if TYPE_CHECKING:`."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            out.extend((node.lineno, m) for m in modules if m.split(".")[0] in names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in names:
                out.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def test_the_stub_packages_are_found():
    """The test extra's boto3 stubs are among them (else the walk below would check nothing)."""
    names = stub_only_packages()
    assert {"types_boto3_ec2", "types_boto3_sts", "_typeshed"} <= names


def test_launcher_imports_stubs_only_for_the_type_checker():
    names = stub_only_packages()
    wrong = [
        f"{path.relative_to(REPO)}:{line}: imports {module} outside `if TYPE_CHECKING:`"
        for path in sorted(PKG.rglob("*.py"))
        for line, module in runtime_imports(ast.parse(path.read_text(encoding="utf-8")), names)
    ]
    assert not wrong, "stub packages imported at run time:\n" + "\n".join(wrong)


FORMS = [
    "import {m}",
    "import {m}.type_defs",
    "import {m} as alias",
    "from {m} import Thing",
    "from {m}.type_defs import Thing",
]
PLACES = {  # where the import sits -> does it run when the module runs?
    "{imp}\n": True,
    "def f():\n    {imp}\n": True,
    "class C:\n    {imp}\n": True,
    "try:\n    {imp}\nexcept ImportError:\n    pass\n": True,
    "if TYPE_CHECKING:\n    pass\nelse:\n    {imp}\n": True,
    "if sys.version_info >= (3, 11):\n    {imp}\n": True,
    "if TYPE_CHECKING:\n    {imp}\n": False,
    "if typing.TYPE_CHECKING:\n    {imp}\n": False,
    "if TYPE_CHECKING:\n    if True:\n        {imp}\n": False,
}


@pytest.mark.parametrize(
    ("form", "place"), list(itertools.product(FORMS, PLACES)), ids=lambda v: v.split("\n")[0]
)
def test_the_finder_finds_every_runtime_placement(form, place):
    imp = form.format(m="types_boto3_ec2")
    text = place.format(imp=imp)
    found = runtime_imports(ast.parse(text), {"types_boto3_ec2"})
    assert bool(found) is PLACES[place], text
    # a package that is not a stub is never reported, wherever it is imported
    assert runtime_imports(ast.parse(text.replace("types_boto3_ec2", "boto3")), {"x"}) == []
