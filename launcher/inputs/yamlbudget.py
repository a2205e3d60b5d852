"""YAML anchors and aliases, read within a budget.

Why: authors use anchors (`&base`) and aliases (`*base`) to write a value once, and a recipe is
refused for none of them; but a few lines of them can stand for billions of nodes (an "alias
bomb"), which whatever walks the document (the checks, a JSON dump, a comparison) then expands.
So the composed graph, where an alias shares its anchor's node, is measured before anything
walks it: past the budget, or an alias that contains itself, the file is refused naming the line.
Read in one place for every reader: a recipe and a profile (yamlschema.py), and a run
directory's YAML (records/rundir.py: its recipe.yaml is the author's bytes).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from launcher.errors import BadInput

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Anchors and aliases are read, within a budget: a few lines of them can stand for billions of
# nodes (an "alias bomb"), which whatever walks the document (the checks, a JSON dump, a
# comparison) would then expand. A recipe is a page of text; expanded, it stays near one.
MAX_EXPANDED_NODES = 100_000
MAX_EXPANDED_CHARS = 4 << 20  # four times the largest recipe or profile file


def has_aliases(text: str) -> bool:
    return "&" in text or "*" in text


def within_budget(node: yaml.Node, path: Path, what: str) -> None:
    """BadInput when NODE, its aliases expanded, passes the budget or refers to itself: a walk of
    the composed graph, each node measured once (aliases share their node), so it is quick
    however much the aliases stand for."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def refuse(at: yaml.Node, why: str) -> BadInput:
        mark = at.start_mark
        return BadInput(
            f"{path}: line {mark.line + 1}, column {mark.column + 1}: the YAML anchors and "
            f"aliases {why}; expected a {what} whose aliases stand for at most "
            f"{MAX_EXPANDED_NODES:,} nodes and {MAX_EXPANDED_CHARS:,} characters of text "
            "(write less through them)"
        )

    def walk(n: yaml.Node) -> tuple[int, int]:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise refuse(n, "make a value that contains itself")
        if isinstance(n, yaml.ScalarNode):
            size = (1, len(n.value))
        else:
            open_.add(key)
            kids = (
                [part for pair in n.value for part in pair]
                if isinstance(n, yaml.MappingNode)
                else list(n.value)
            )
            nodes, chars = 1, 0
            for kid in kids:
                k_nodes, k_chars = walk(kid)
                nodes, chars = nodes + k_nodes, chars + k_chars
                if nodes > MAX_EXPANDED_NODES or chars > MAX_EXPANDED_CHARS:
                    raise refuse(
                        n, f"expand here to {nodes:,} nodes and {chars:,} characters of text so far"
                    )
            open_.discard(key)
            size = (nodes, chars)
        sizes[key] = size
        return size

    try:
        walk(node)
    except RecursionError:
        raise BadInput(f"{path}: the {what} is nested too deeply to read.") from None


def bound_aliases(path: Path, text: str, what: str) -> None:
    """Anchors and aliases within the budget (MAX_EXPANDED_NODES, MAX_EXPANDED_CHARS), checked on
    the composed graph before anything walks the document; BadInput naming the line past it.
    For readers that then load TEXT themselves (a run directory's YAML)."""
    if not has_aliases(text):
        return
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:
        return  # the reader's own load reports the syntax error, with its position
    finally:
        loader.dispose()
    if node is not None:
        within_budget(node, path, what)


def unshared(value: object) -> object:
    """The document with every alias written out: each place its own value (an alias builds one
    object for all its places, and a change made through one would show in all)."""
    if isinstance(value, dict):
        return {k: unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unshared(v) for v in value]
    return value
