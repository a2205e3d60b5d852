"""A real local run whose cache_dir is someone's home (an SSH key beside the cache's own
entries) is refused on the node before any stage starts: every container mounts the whole
cache, so the recipe's code would have read the key (launcher/plan/asset_spec.py,
`cache_entries_check`; the rendered check against real directories: tests/plan/
test_cache_entries.py)."""

from __future__ import annotations

import json

import pytest
from support.helpers import cli
from support.plan_env import write_profile, write_recipe

pytestmark = pytest.mark.docker


def test_a_cache_dir_that_holds_a_key_is_refused_before_any_stage(
    test_image, container_run_args, tmp_path
):
    profile = write_profile(tmp_path, {"kind": "local"}, container_run_args)
    key = tmp_path / "cache" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    runs = tmp_path / "runs"
    res = cli(str(write_recipe(tmp_path, test_image)), "--cluster", str(profile), "--runs-dir",
              str(runs), timeout=300)  # fmt: skip
    assert res.returncode in (1, 3), res.stderr
    assert "refusing cache_dir" in res.stderr and ".ssh" in res.stderr, res.stderr
    (timeline,) = runs.glob("**/timeline.json")
    assert json.loads(timeline.read_text())["stages"] == []  # no stage began
    assert key.read_text().startswith("-----BEGIN")  # left as it was
