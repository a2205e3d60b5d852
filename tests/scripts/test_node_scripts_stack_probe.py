"""scripts/stack_probe.py as the node runs it: a subprocess, JSON on stdout, exit code by policy.

This machine has no PyTorch, TE or DeepEP: their checks must come back as clean "not installed"
results (never a traceback). The commit and clean-tree checks run against temporary git repos.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.node_scripts import load_script
from support.paths import REPO

SCRIPT = REPO / "scripts" / "stack_probe.py"
probe = load_script("stack_probe")


def git_repo(path: Path) -> str:
    path.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    for cmd in (["init", "-q"], ["add", "f.txt"], ["commit", "-q", "-m", "x"]):
        if cmd[0] == "add":
            (path / "f.txt").write_text("one\n")
        subprocess.run(["git", "-C", str(path), *cmd], check=True, env=env)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture()
def trees(tmp_path: Path) -> dict[str, str]:
    miles, megatron = tmp_path / "miles", tmp_path / "Megatron-LM"
    return {
        "miles": str(miles),
        "miles_sha": git_repo(miles),
        "megatron": str(megatron),
        "megatron_sha": git_repo(megatron),
    }


def checks_by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_matching_commits_and_clean_trees_pass_but_missing_torch_fails(trees):
    expect = {
        "miles_commit": trees["miles_sha"][:8],
        "megatron_commit": trees["megatron_sha"][:8],
        "torch": "2.11.0",
        "cuda": "13.0",
        "nccl": "2.28.9",
        "python": "3",
    }
    proc = run_probe(
        "--json",
        "--policy",
        "fail",
        "--expect",
        json.dumps(expect),
        "--miles-dir",
        trees["miles"],
        "--megatron-dir",
        trees["megatron"],
    )
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    by = checks_by_name(report)
    assert by["miles_commit"]["ok"] and by["miles_commit"]["value"] == trees["miles_sha"]
    assert by["megatron_commit"]["ok"]
    assert by["miles_tree_clean"]["ok"] and by["megatron_tree_clean"]["value"] == "clean"
    assert by["torch"] == {
        "name": "torch",
        "expected": "2.11.0",
        "value": None,
        "ok": False,
        "note": "not installed",
    }
    assert not by["cuda"]["ok"] and "PyTorch not installed" in by["cuda"]["note"]
    assert not by["nccl"]["ok"]
    assert by["python"][
        "ok"
    ]  # "3" is a prefix of this interpreter's version at a component boundary
    assert report["ok"] is False and report["policy"] == "fail"
    assert proc.returncode == 1


def test_policy_warn_reports_the_same_mismatch_but_exits_zero(trees):
    proc = run_probe(
        "--json",
        "--policy",
        "warn",
        "--expect",
        json.dumps({"torch": "2.11.0"}),
        "--miles-dir",
        trees["miles"],
        "--megatron-dir",
        trees["megatron"],
    )
    report = json.loads(proc.stdout)
    assert report["ok"] is False and proc.returncode == 0
    assert "stack torch: - (expected 2.11.0) MISMATCH: not installed" in proc.stderr


def test_policy_skip_probes_nothing_and_exits_zero(tmp_path):
    proc = run_probe(
        "--json",
        "--policy",
        "skip",
        "--expect",
        json.dumps({"torch": "9.9"}),
        "--miles-dir",
        str(tmp_path / "absent"),
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["skipped"] is True and report["checks"] == []


def test_wrong_commit_and_modified_tree_fail_with_names(trees):
    Path(trees["miles"], "f.txt").write_text("changed\n")
    Path(trees["miles"], "build.log").write_text("untracked\n")
    proc = run_probe(
        "--json",
        "--expect",
        json.dumps({"miles_commit": "0000000", "megatron_commit": trees["megatron_sha"]}),
        "--miles-dir",
        trees["miles"],
        "--megatron-dir",
        trees["megatron"],
    )
    by = checks_by_name(json.loads(proc.stdout))
    assert not by["miles_commit"]["ok"] and "not 0000000" in by["miles_commit"]["note"]
    assert by["miles_tree_clean"]["value"] == "modified" and not by["miles_tree_clean"]["ok"]
    assert (
        "f.txt" in by["miles_tree_clean"]["note"]
        and "1 untracked" in by["miles_tree_clean"]["note"]
    )
    assert by["megatron_commit"]["ok"]
    assert proc.returncode == 1


def test_untracked_files_alone_keep_a_tree_clean(trees):
    Path(trees["miles"], "miles.egg-info").mkdir()
    Path(trees["miles"], "miles.egg-info", "PKG-INFO").write_text("x\n")
    proc = run_probe(
        "--json",
        "--expect",
        json.dumps({"miles_commit": trees["miles_sha"][:7]}),
        "--miles-dir",
        trees["miles"],
        "--megatron-dir",
        trees["megatron"],
    )
    by = checks_by_name(json.loads(proc.stdout))
    assert by["miles_tree_clean"]["ok"] and "1 untracked" in by["miles_tree_clean"]["note"]


def test_missing_tree_fails_only_when_the_recipe_names_a_commit(tmp_path):
    proc = run_probe(
        "--json",
        "--expect",
        json.dumps({"miles_commit": "78527b91"}),
        "--miles-dir",
        str(tmp_path / "nope"),
        "--megatron-dir",
        str(tmp_path / "nope2"),
    )
    by = checks_by_name(json.loads(proc.stdout))
    assert not by["miles_commit"]["ok"] and "no such directory" in by["miles_commit"]["note"]
    assert by["megatron_commit"]["ok"] and "no expectation" in by["megatron_tree_clean"]["note"]


def test_a_directory_that_is_not_a_checkout_is_reported(tmp_path):
    (tmp_path / "plain").mkdir()
    proc = run_probe(
        "--json",
        "--expect",
        json.dumps({"miles_commit": "78527b91"}),
        "--miles-dir",
        str(tmp_path / "plain"),
        "--megatron-dir",
        str(tmp_path / "plain"),
    )
    by = checks_by_name(json.loads(proc.stdout))
    assert "not a git checkout" in by["miles_commit"]["note"]


@pytest.mark.parametrize(
    "expect, message",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"pytorch": "2.11"}', "unknown key(s) pytorch"),
        ('{"miles_commit": "v0.1.0"}', "is not a commit prefix"),
    ],
)
def test_bad_expectations_are_usage_errors_without_traceback(expect, message):
    proc = run_probe("--json", "--expect", expect)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_help_runs():
    proc = run_probe("--help")
    assert proc.returncode == 0 and "--policy" in proc.stdout


@pytest.mark.parametrize(
    "value, expected, ok",
    [
        ("2.11.0+cu130", "2.11.0", True),
        ("2.11.0", "2.11.0", True),
        ("13.0", "13.0", True),
        ("2.28.9", "2.28", True),
        ("2.11.0rc1", "2.11.0", False),
        ("2.11.1", "2.11.0", False),
        ("2.110.0", "2.11", False),
        (None, "2.11.0", False),
    ],
)
def test_version_prefix_matching(value, expected, ok):
    assert probe.version_matches(value, expected) is ok


def test_package_values_come_from_the_imported_modules(monkeypatch):
    """With stand-in modules, versions are read the way the real image's are (incl. NCCL's tuple)."""
    import types

    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 28, 9)))
    te = types.ModuleType("transformer_engine")
    te.__version__ = "2.17.0+abc"

    def broken_import():
        raise RuntimeError("libcudart.so.13: cannot open shared object file\nmore")

    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    real_import = probe.importlib.import_module

    def fake_import(name):
        if name == "deep_ep":
            broken_import()
        return real_import(name)

    monkeypatch.setattr(probe.importlib, "import_module", fake_import)
    checks = {
        c.name: c
        for c in probe.probe_packages(
            {
                "torch": "2.11.0",
                "cuda": "13.0",
                "nccl": "2.28.9",
                "transformer_engine": "2.17.0",
                "deepep": "1.2.1",
            }
        )
    }
    assert checks["torch"].ok and checks["torch"].value == "2.11.0+cu130"
    assert checks["cuda"].ok and checks["nccl"].value == "2.28.9" and checks["nccl"].ok
    assert checks["transformer_engine"].ok
    assert not checks["deepep"].ok
    assert (
        checks["deepep"].note
        == "installed but import failed: RuntimeError: libcudart.so.13: cannot open shared object file"
    )
