#!/usr/bin/env python3
r"""Stack probe: does the training image hold the software the recipe says it measured with?

Runs ON the node, inside the training image (standard library only; PyTorch, Transformer Engine
and DeepEP are imported, each in its own try, only to read their versions; never the `launcher`
package). It reads the miles and Megatron-LM commits and whether their trees carry local changes,
the versions of Transformer Engine, PyTorch, CUDA (PyTorch's build), NCCL, DeepEP and Python, and
compares each with the expectation that the launcher derived from the recipe's `stack` block
(launcher/inputs/stack.py, `expected_versions`).

    python3 stack_probe.py --json --policy fail \
        --expect '{"torch": "2.11.0", "miles_commit": "78527b91"}'

Matching: a commit matches when the tree's HEAD starts with the expected prefix; a version matches
when it equals the expected text or continues it with "+" (local build tag) or "." (more
components): "2.11.0" matches "2.11.0+cu130" and "2.11.0.post1", but not "2.11.0rc1" or "2.11.1".
A source tree is "clean" when it has no changes to tracked files; untracked files (build output)
are counted in the note but do not fail it.

Output: one JSON object {schema, policy, ok, skipped, checks: [{name, expected, value, ok, note}]}
on stdout (`--json`), or a table; a one-line-per-check summary always goes to stderr. Anything the
imported packages print is sent to stderr, so stdout stays valid JSON. Exit 0 when every check
passed or the policy is warn/skip, 1 when the policy is fail and a check failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA_VERSION = 1
POLICIES = ("fail", "warn", "skip")
DEFAULT_MILES_DIR = "/root/miles"
DEFAULT_MEGATRON_DIR = "/root/Megatron-LM"

# probe key -> (import name, distribution names for importlib.metadata), for plain packages
PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "transformer_engine": (
        "transformer_engine",
        ("transformer_engine", "transformer-engine", "transformer_engine_torch"),
    ),
    "torch": ("torch", ("torch",)),
    "deepep": ("deep_ep", ("deep_ep", "deep-ep", "deepep")),
}
COMMIT_KEYS = ("miles_commit", "megatron_commit")
KNOWN_KEYS = (
    "miles_commit",
    "megatron_commit",
    "transformer_engine",
    "torch",
    "cuda",
    "nccl",
    "deepep",
    "python",
)


@dataclass
class Check:
    name: str
    expected: str | None
    value: str | None
    ok: bool
    note: str = ""


# --------------------------------------------------------------------------------------------
# Matching


def version_matches(value: str | None, expected: str) -> bool:
    """Expected "2.11.0" matches "2.11.0", "2.11.0+cu130", "2.11.0.post1"; not "2.11.0rc1",
    "2.11.1"."""
    if not value:
        return False
    value, expected = value.strip(), expected.strip()
    return value == expected or value.startswith(expected + "+") or value.startswith(expected + ".")


def commit_matches(value: str | None, expected: str) -> bool:
    if not value:
        return False
    return value.strip().lower().startswith(expected.strip().lower())


# --------------------------------------------------------------------------------------------
# Reading the real values


def _git(tree: str, *args: str) -> subprocess.CompletedProcess[str]:
    # safe.directory: the image's trees may belong to another uid than the probing one
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", tree, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0][:300] if text else ""


def read_tree(tree: str) -> tuple[str | None, str | None, str]:
    """(HEAD sha or None, "clean"/"modified" or None, note) of a git checkout. Never raises."""
    if not os.path.isdir(tree):
        return None, None, f"{tree}: no such directory"
    try:
        head = _git(tree, "rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None, f"{tree}: not a git checkout ({_first_line(head.stderr)})"
        status = _git(tree, "status", "--porcelain", "--untracked-files=all")
    except FileNotFoundError:
        return None, None, "git is not installed in the image"
    except subprocess.TimeoutExpired:
        return None, None, f"git in {tree} timed out"
    sha = head.stdout.strip()
    if status.returncode != 0:
        return sha, None, f"git status failed: {_first_line(status.stderr)}"
    lines = [ln for ln in status.stdout.splitlines() if ln.strip()]
    changed = [ln[3:] for ln in lines if not ln.startswith("??")]
    untracked = [ln for ln in lines if ln.startswith("??")]
    extra = f"; {len(untracked)} untracked file(s), not counted" if untracked else ""
    if changed:
        shown = ", ".join(changed[:5]) + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        return sha, "modified", f"{len(changed)} changed tracked file(s): {shown}{extra}"
    return sha, "clean", f"no changes to tracked files{extra}"


def probe_tree(key: str, tree: str, expected: str | None) -> list[Check]:
    """The commit check and the clean-tree check of one checkout.

    Both are enforced only when the recipe names a commit for it (it then also says "no local
    changes"); otherwise they are reported for the record and pass.
    """
    clean_name = key.replace("_commit", "_tree_clean")
    sha, state, note = read_tree(tree)
    if expected is None:
        info = "; ".join(x for x in (note, "no expectation in the recipe") if x)
        return [
            Check(key, None, sha, True, tree if sha else info),
            Check(clean_name, None, state, True, info),
        ]
    if sha is None:
        return [
            Check(key, expected, None, False, note),
            Check(clean_name, "clean", None, False, note),
        ]
    ok = commit_matches(sha, expected)
    commit = Check(key, expected, sha, ok, tree if ok else f"{tree}: HEAD is {sha}, not {expected}")
    return [commit, Check(clean_name, "clean", state, state == "clean", note)]


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {_first_line(str(err))}".rstrip(": ")


def _metadata_version(dists: Sequence[str]) -> str | None:
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001, S112 - a broken install: keep looking, never crash
            continue
    return None


def import_version(module: str, dists: Sequence[str]) -> tuple[Any, str | None, str]:
    """(module or None, version or None, note). Never raises."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name == module:
            return None, None, "not installed"
        meta = _metadata_version(dists)  # the package is there, something it needs is not
        return (
            None,
            meta,
            f"installed{' ' + meta if meta else ''} but import failed: {_error_text(err)}",
        )
    except BaseException as err:  # noqa: BLE001 (a package may raise anything, even SystemExit, on import)
        if isinstance(err, KeyboardInterrupt):
            raise
        meta = _metadata_version(dists)
        return (
            None,
            meta,
            f"installed{' ' + meta if meta else ''} but import failed: {_error_text(err)}",
        )
    version = getattr(mod, "__version__", None)
    if version is not None:
        return mod, str(version), ""
    meta = _metadata_version(dists)
    if meta:
        return mod, meta, "version from package metadata"
    return mod, None, "imported, but it reports no version"


def _judge(
    name: str, expected: str | None, value: str | None, note: str, importable: bool = True
) -> Check:
    if expected is None:
        return Check(
            name,
            None,
            value,
            True,
            "; ".join(x for x in (note, "no expectation in the recipe") if x),
        )
    if not importable:
        return Check(name, expected, value, False, note)
    if value is None:
        return Check(name, expected, None, False, note or "unknown")
    ok = version_matches(value, expected)
    if not ok:
        note = "; ".join(x for x in (note, f"expected {expected}") if x)
    return Check(name, expected, value, ok, note)


def _nccl_version(torch: Any) -> tuple[str | None, str]:
    try:
        raw = torch.cuda.nccl.version()
    except BaseException as err:  # noqa: BLE001
        if isinstance(err, KeyboardInterrupt):
            raise
        return None, f"torch.cuda.nccl.version() failed: {_error_text(err)}"
    if isinstance(raw, (tuple, list)):
        return ".".join(str(int(x)) for x in raw), ""
    if isinstance(raw, int):  # old PyTorch: 2.18.3 as 21803
        major, rest = divmod(raw, 10000) if raw >= 10000 else divmod(raw, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}", "decoded from an integer"
    return str(raw), ""


def probe_packages(expect: dict[str, str]) -> list[Check]:
    checks: list[Check] = []
    te_mod, te_ver, te_note = import_version(*PACKAGES["transformer_engine"])
    torch_mod, torch_ver, torch_note = import_version(*PACKAGES["torch"])
    checks.append(
        _judge(
            "transformer_engine",
            expect.get("transformer_engine"),
            te_ver,
            te_note,
            importable=te_mod is not None,
        )
    )
    checks.append(
        _judge(
            "torch", expect.get("torch"), torch_ver, torch_note, importable=torch_mod is not None
        )
    )
    if torch_mod is None:
        why = "PyTorch " + (
            "not installed" if torch_note == "not installed" else "could not be imported"
        )
        checks.append(_judge("cuda", expect.get("cuda"), None, why, importable=False))
        checks.append(_judge("nccl", expect.get("nccl"), None, why, importable=False))
    else:
        cuda = getattr(getattr(torch_mod, "version", None), "cuda", None)
        checks.append(
            _judge(
                "cuda",
                expect.get("cuda"),
                cuda,
                "" if cuda else "a CPU-only PyTorch build (torch.version.cuda is None)",
            )
        )
        nccl, note = _nccl_version(torch_mod)
        checks.append(_judge("nccl", expect.get("nccl"), nccl, note))
    dep_mod, dep_ver, dep_note = import_version(*PACKAGES["deepep"])
    checks.append(
        _judge("deepep", expect.get("deepep"), dep_ver, dep_note, importable=dep_mod is not None)
    )
    checks.append(_judge("python", expect.get("python"), platform.python_version(), ""))
    return checks


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Whatever imported packages print (Python or C level) goes to stderr, keeping stdout JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_probe(
    expect: dict[str, str],
    policy: str,
    miles_dir: str,
    megatron_dir: str,
    package_probe: Callable[[dict[str, str]], list[Check]] = probe_packages,
) -> dict[str, Any]:
    if policy == "skip":
        return {
            "schema": SCHEMA_VERSION,
            "policy": policy,
            "ok": True,
            "skipped": True,
            "checks": [],
            "note": "stack check skipped by policy; nothing was probed",
        }
    checks: list[Check] = []
    with stdout_to_stderr():
        checks += probe_tree("miles_commit", miles_dir, expect.get("miles_commit"))
        checks += probe_tree("megatron_commit", megatron_dir, expect.get("megatron_commit"))
        checks += package_probe(expect)
    return {
        "schema": SCHEMA_VERSION,
        "policy": policy,
        "ok": all(c.ok for c in checks),
        "skipped": False,
        "checks": [asdict(c) for c in checks],
    }


def exit_code(report: dict[str, Any]) -> int:
    return 1 if (report["policy"] == "fail" and not report["ok"]) else 0


# --------------------------------------------------------------------------------------------
# Output and arguments


def format_table(report: dict[str, Any]) -> str:
    if report.get("skipped"):
        return "stack check skipped (--policy skip)"
    rows = [("check", "value", "expected", "result")]
    for c in report["checks"]:
        rows.append(
            (
                c["name"],
                str(c["value"] or "-")[:40],
                str(c["expected"] or "-"),
                "pass" if c["ok"] else "FAIL",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for c in report["checks"]:
        if c["note"] and not c["ok"]:
            lines.append(f"FAIL {c['name']}: {c['note']}")
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    verdict = "PASSED" if not failed else "FAILED: " + ", ".join(failed)
    if failed and report["policy"] == "warn":
        verdict += " (policy warn: not fatal)"
    lines.append(f"stack check {verdict}")
    return "\n".join(lines)


def parse_expect(text: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--expect is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(data, dict):
        raise ValueError('--expect must be a JSON object such as {"torch": "2.11.0"}')
    unknown = sorted(set(data) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(
            f"--expect: unknown key(s) {', '.join(unknown)}; known: {', '.join(KNOWN_KEYS)}"
        )
    out: dict[str, str] = {}
    for key, value in data.items():
        if value is None:
            continue
        if not isinstance(value, (str, int, float)) or not str(value).strip():
            raise ValueError(f"--expect: {key} must be a non-empty string, got {value!r}")
        out[key] = str(value).strip()
    for key in COMMIT_KEYS:
        if key in out and not re.fullmatch(r"[0-9a-fA-F]{4,40}", out[key]):
            raise ValueError(
                f"--expect: {key} {out[key]!r} is not a commit prefix (4 to 40 hex digits)"
            )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout instead of a table"
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="fail",
        help="fail: exit 1 on a mismatch; warn: report it, exit 0; skip: probe nothing",
    )
    p.add_argument(
        "--expect",
        default="{}",
        metavar="JSON",
        help=f"expected values, a JSON object with keys among {', '.join(KNOWN_KEYS)}",
    )
    p.add_argument(
        "--miles-dir",
        default=DEFAULT_MILES_DIR,
        help=f"miles checkout (default {DEFAULT_MILES_DIR})",
    )
    p.add_argument(
        "--megatron-dir",
        default=DEFAULT_MEGATRON_DIR,
        help=f"Megatron-LM checkout (default {DEFAULT_MEGATRON_DIR})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        expect = parse_expect(args.expect)
    except ValueError as err:
        parser.error(str(err))
    report = run_probe(expect, args.policy, args.miles_dir, args.megatron_dir)
    for c in report["checks"] if args.json else []:  # the node log's copy; stdout is stack.json
        print(
            f"stack {c['name']}: {c['value'] or '-'} (expected {c['expected'] or '-'}) "
            f"{'ok' if c['ok'] else 'MISMATCH'}{': ' + c['note'] if c['note'] else ''}",
            file=sys.stderr,
        )
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_table(report))
    return exit_code(report)


if __name__ == "__main__":
    sys.exit(main())
