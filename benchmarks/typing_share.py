"""How much of launcher/'s typing says nothing: the share of parameters typed bare `Any`, and
`dict[str, Any]` in annotations per 1,000 lines (the figures issue-style reviews compare with
httpx, pip, torchx, dstack). Static: reads the source with `ast`, imports nothing.

    .venv/bin/python benchmarks/typing_share.py [DIR ...]     (default: launcher)

A parameter counts when it is annotated (self and cls, never annotated, are left out); `*args`
and `**kwargs` count as one each. Prints one line per directory and, with --list, every bare-Any
parameter as FILE:LINE function(name).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def _is_bare_any(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        return node.value.strip() in ("Any", "typing.Any")
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def _dict_str_any(node: ast.expr | None) -> int:
    if node is None:
        return 0
    text = ast.unparse(node).replace(" ", "")
    return text.count("dict[str,Any]") + text.count("Dict[str,Any]")


def measure(root: Path) -> tuple[int, int, int, int, list[str]]:
    """(annotated params, bare-Any params, dict[str, Any] annotations, lines, the bare ones)."""
    params = bare = dicts = lines = 0
    listed: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines += len(text.splitlines())
        tree = ast.parse(text, str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign):
                dicts += _dict_str_any(node.annotation)
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            dicts += _dict_str_any(node.returns)
            a = node.args
            every = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            every += [x for x in (a.vararg, a.kwarg) if x is not None]
            for arg in every:
                if arg.annotation is None:
                    continue
                params += 1
                dicts += _dict_str_any(arg.annotation)
                if _is_bare_any(arg.annotation):
                    bare += 1
                    listed.append(f"{path}:{arg.lineno} {node.name}({arg.arg})")
    return params, bare, dicts, lines, listed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", default=["launcher"])
    ap.add_argument("--list", action="store_true", help="every bare-Any parameter")
    args = ap.parse_args(argv)
    for d in args.dirs:
        params, bare, dicts, lines, listed = measure(Path(d))
        share = 100.0 * bare / params if params else 0.0
        per_k = 1000.0 * dicts / lines if lines else 0.0
        print(
            f"{d}: {bare} of {params} annotated parameters bare Any ({share:.1f}%); "
            f"dict[str, Any] {dicts} times in annotations, {per_k:.1f} per 1,000 lines ({lines})"
        )
        if args.list:
            print("\n".join(listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
