"""The cache is mounted (read-only) into every container, so it may hold only what runs make
there: a cache_dir that is a home or system directory would show the recipe's code the node's
SSH keys and cloud credentials. The check node.sh runs, as the seed's scripts render it, is run
here in bash against real directories: what runs make passes, anything else is refused, named,
before any stage starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.cli import SEED, reproduce_here

from launcher.plan.asset_spec import CACHE_ENTRIES, cache_entries_check


def check(cache: Path) -> subprocess.CompletedProcess:
    script = "set -euo pipefail\n" + "\n".join(cache_entries_check()) + "\necho passed\n"
    return subprocess.run(
        ["bash", "-c", script], env={"CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize("cluster", ["local", "ssh", "aws"])
def test_every_docker_node_script_runs_the_check_before_its_first_stage(cluster):
    res = reproduce_here(str(SEED), "--cluster", cluster, "--dry-run")
    assert res.code == 0, res.err
    check_at = res.out.index(cache_entries_check()[1])
    assert check_at < res.out.index("_stage_begin() {")  # before the stages are even defined


def test_what_runs_make_passes_and_an_empty_or_new_cache_too(tmp_path):
    for name in CACHE_ENTRIES:
        (tmp_path / "cache" / name).mkdir(parents=True)
    assert check(tmp_path / "cache").stdout == "passed\n"
    (tmp_path / "empty").mkdir()
    assert check(tmp_path / "empty").stdout == "passed\n"


@pytest.mark.parametrize(
    "planted", [".ssh", ".aws", ".bashrc", "id_ed25519", "hf.bak", "rows\nhf", "-rf", ".incoming2"]
)
def test_a_cache_that_holds_anything_else_is_refused_naming_it(tmp_path, planted):
    cache = tmp_path / "home"
    (cache / "hf").mkdir(parents=True)
    (cache / planted).write_text("secret")
    res = check(cache)
    assert res.returncode == 1 and "passed" not in res.stdout
    assert f"refusing cache_dir {cache}" in res.stderr
    assert planted.split("\n")[0] in res.stderr


def test_the_names_are_the_ones_the_plan_puts_in_the_cache():
    """Each fact once: the seed's cache paths (the plan's checkpoint, conversion and rows, the
    asset spec's tokenizer) start with exactly the entries CACHE_ENTRIES names (but the run's
    own .incoming): none missing from the list, none in it that the seed does not use."""
    res = reproduce_here(str(SEED), "--cluster", "local", "--dry-run")
    cache = "/var/tmp/reproduce-cache/"
    firsts = {
        line.split(cache, 1)[1].split("/")[0] for line in res.out.splitlines() if cache in line
    }
    firsts.discard("")
    assert firsts == set(CACHE_ENTRIES) - {".incoming"}, firsts
