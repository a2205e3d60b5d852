"""The layout's promises (docs/architecture.md, "Module map"), checked on the code as it is.

- Folders are layers, in the order a recipe becomes a verdict and a page; no import runs back up:
  a module never imports from a folder above its own, function-level and TYPE_CHECKING imports
  included (a lazy import is still a dependency), and two folders of one layer never import each
  other.
- No import cycle between modules.
- At most 6 modules at the top of launcher/. A module over 600 lines is a warning, not a failure:
  module boundaries follow concepts, and a size rule kept as a target only reshapes code to fit.
- No comment or docstring in launcher/, scripts/ or templates/ tells history (an issue number, a
  dated incident): that belongs in the commit's body; the why stays.
Each failure names the file and line, so the fix is found without reading this test.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "launcher"

# Bottom to top. A module may import its own folder and any folder of a LOWER layer, never one of
# its own layer's other folders or a higher one. "" is the ground: launcher/*.py at the top.
LAYERS: list[tuple[str, ...]] = [
    ("",),  # errors, resources, catalog: what everything stands on
    ("inputs",),  # recipe, profile, run block, stack, YAML/schema loading
    ("judge",),  # pure: parse, evidence, measure, verdict, convergence
    ("records",),  # the run directory, runs read back, the history database
    ("plan",),  # Recipe + Profile -> Plan, the node script, the node protocol's text
    ("cost",),  # estimate, cost gate, budget
    ("clusters",),  # local, ssh, aws, ray: acquire, reach, release; the Execution seam
    ("pages",),  # everything people read: report.md/png, report.html, history pages
    ("results",),  # a finished run measured and written, attested, verified
    ("prepare", "runner"),  # work before a run (assets, image); driving a Plan to its verdict
    ("commands",),  # the CLI and the command bodies: printing and exit codes
]
ENTRY_POINTS = {"launcher/__main__.py"}  # `python -m launcher` is the CLI: it sits above all


def _rank() -> dict[str, int]:
    return {folder: i for i, layer in enumerate(LAYERS) for folder in layer}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(path: Path, name: str, mods: dict[str, Path]) -> list[tuple[int, str]]:
    """Every launcher module `path` imports, wherever the import statement stands."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("launcher")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("launcher"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if sub in mods else target))
    return found


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else ""


def test_no_import_runs_back_up_the_layers():
    rank, mods = _rank(), _modules()
    unknown = sorted({_folder(m) for m in mods} - set(rank))
    assert not unknown, f"folders of launcher/ in no layer of this test's LAYERS: {unknown}"
    wrong = []
    for name, path in sorted(mods.items()):
        rel = str(path.relative_to(REPO))
        if rel in ENTRY_POINTS:
            continue
        here = _folder(name)
        for line, target in _imports(path, name, mods):
            there = _folder(target)
            if there == here:
                continue
            if rank[there] >= rank[here]:
                wrong.append(f"{rel}:{line}: {here or 'launcher/'} imports {target} ({there})")
    assert not wrong, "imports that run up or across the layers:\n" + "\n".join(wrong)


def test_no_import_cycle():
    """No circle through any import: function-level and TYPE_CHECKING ones included (a type-only
    circle is still two modules that cannot be read one before the other; a Protocol breaks it)."""
    mods = _modules()
    graph = {
        name: {t for _, t in _imports(path, name, mods) if t in mods and t != name}
        for name, path in mods.items()
    }
    cycles = [scc for scc in _sccs(graph) if len(scc) > 1]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(sorted(c)) for c in cycles)


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iterative (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(comp)
    return out


LONG_MODULE_LINES = 600


@pytest.mark.parametrize("tree", ["launcher", "scripts"])
def test_long_modules_are_named_not_failed(tree):
    """A module over LONG_MODULE_LINES is worth a look (does it hold one concept?), never a failure:
    the warning is printed in pytest's summary."""
    for p in sorted((REPO / tree).rglob("*.py")):
        if (n := len(p.read_text().splitlines())) > LONG_MODULE_LINES:
            warnings.warn(
                f"{p.relative_to(REPO)}: {n} lines (over {LONG_MODULE_LINES}: one concept?)",
                stacklevel=1,
            )


# --- no history in comments: issue numbers and dated incidents go into commit bodies ---

_ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)
_DATE = r"\b20\d\d-[01]\d-[0-3]\d\b"
_INCIDENT = re.compile(
    r"\b(found|fixed|seen|broke|hit|reported|incident)\b\W{0,3}(?:on\s+|in\s+)?" + _DATE, re.I
)
# A date stays where it is a source's (a price list read, a figure measured, a commit) or an
# example of input (in backticks).
_SOURCE = re.compile(
    r"\b(measured|read|updated|list price|pull|commit|benchmarks?|released|as of)\b", re.I
)


def _comment_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every comment block and docstring, whitespace folded, so a phrase
    broken over two lines is still one phrase."""
    text = path.read_text()
    blocks: list[tuple[int, str]] = []
    run: list[str] = []
    start = prev = -2

    def comment(line_no: int, body: str) -> None:
        nonlocal start, prev
        if line_no != prev + 1 and run:
            blocks.append((start, " ".join(run)))
            run.clear()
        if not run:
            start = line_no
        run.append(body)
        prev = line_no

    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                comment(tok.start[0], tok.string.lstrip("#").strip())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    blocks.append((node.body[0].lineno, " ".join(doc.split())))
    else:  # bash: the node script's template, shell programs
        for i, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("#") and not line.startswith("#!"):
                comment(i, line.strip().lstrip("#@").strip())
    if run:
        blocks.append((start, " ".join(run)))
    return blocks


def history_in(text: str) -> list[str]:
    """What in one comment block tells history rather than why."""
    found = []
    if m := _ISSUE.search(text):
        found.append(f"cites {m.group(0)!r}")
    if m := _INCIDENT.search(text):
        found.append(f"dates an incident: {m.group(0)!r}")
    bare = re.sub(r"`[^`]*`", "", text)
    if not found and (m := re.search(_DATE, bare)) and not _SOURCE.search(bare):
        found.append(f"a date, and no source it is the date of: {m.group(0)!r}")
    return found


def test_no_history_in_comments():
    bad = []
    for tree in ("launcher", "scripts", "templates"):
        for p in sorted((REPO / tree).rglob("*")):
            if p.is_file() and (p.suffix in (".py", ".sh") or tree == "templates"):
                for line, text in _comment_blocks(p):
                    bad += [f"{p.relative_to(REPO)}:{line}: {why}" for why in history_in(text)]
    assert not bad, (
        "comments that tell history (keep the why; the story goes into the commit body):\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("text", "history"),
    [
        ("the run stayed open (issue 20)", True),
        ("see Issue #7 for why", True),
        ("refused on a shared host (found 2026-12-04: a key leaked)", True),
        ("the traceback landed mid-hint (found\n 2026-12-05)", True),
        ("fixed on 2026-11-30 after a crash", True),
        ("a marker flood (2026-12-04)", True),
        ("the list price, updated 2026-08-26", False),
        ("measured on an H200 (2026-11-29)", False),
        ("a prefix such as `[2026-10-21 10:00:00]`", False),
        ("at most 4 MiB: a report is read bounded", False),
        ("the issue is that ssh reads it as an option", False),
    ],
)
def test_the_history_rule_tells_history_from_why(text, history):
    assert bool(history_in(" ".join(text.split()))) is history


def test_the_top_of_launcher_holds_at_most_six_modules():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 6, f"launcher/ has {len(top)} modules at its top: {top}"


def test_the_tiny_cycle_finder_finds_a_cycle():
    """The cycle check can fail: a two-module circle is found, a chain is not."""
    assert [sorted(c) for c in _sccs({"a": {"b"}, "b": {"a"}}) if len(c) > 1] == [["a", "b"]]
    assert not [c for c in _sccs({"a": {"b"}, "b": set()}) if len(c) > 1]
