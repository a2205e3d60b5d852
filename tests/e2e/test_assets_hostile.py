"""The trust boundary held against a hostile image (docs/architecture.md, "The trust boundary"):
no byte a container could have written is followed, executed or trusted by the host or by a
later run unless it was checked against a pin the container could not reach.

The image is tests/infra/hostile.py's: every container it starts (the GPU preflight, the stack
probe, the rows build, the rollout check, the conversion, the training) first plants symlinks to
a canary file named like everything the host writes next, poisons every asset directory it can
write together with its manifest, and appends to every other file it can write; then it runs
its command as the recipe's image would. Shown, with a real dockerd, sshd and registry, the
loopback Hub and the tiny assets of tests/assets_support.py:

- a full local run, then a second run on the same cache: both reproduce; the canary is
  untouched; the second run takes every asset from the cache, and the cache (every byte of it)
  is what the host put there, the Hub's bytes and the recipe's pins;
- `reproduce prepare --rows-builder docker` and then an SSH run from that store: the same.

Made to fail: with the cache mounted read-write again (node_script.py's `:ro` removed) the
first test fails (the hostile run poisons the cache and its manifest, and the second run
trains on it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from support.assets_e2e import Run, profile_file, recipe_file
from support.helpers import cli
from support.hostile import push_hostile_image

from launcher.plan.asset_stages import TEST_ENCODER_ENV
from launcher.prepare.assets import TEST_DOCKER_ARGS_ENV

pytestmark = [pytest.mark.docker, pytest.mark.ssh, pytest.mark.timeout(900)]
CANARY_TEXT = "ssh-ed25519 AAAAC3Nza canary@outside\n"
ENCODER = "builtin:whitespace-test"


class _Local:
    """profile_file's server: this host itself (kind local)."""

    def profile(self) -> dict:
        return {"kind": "local"}


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ROOT: a file's sha256, a link's target, a directory's mark."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link -> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def links_in(root: Path) -> list[str]:
    return [k for k, v in snapshot(root).items() if v.startswith("link")]


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "home" / ".ssh" / "authorized_keys"
    path.parent.mkdir(parents=True)
    path.write_text(CANARY_TEXT)
    return path


@pytest.fixture
def hostile(registry, tmp_path: Path, canary: Path):
    return push_hostile_image(registry, tmp_path, canary)


def attacked(text: str) -> list[dict]:
    """The hostile entrypoint's own reports: proof that the attack ran in each container."""
    return [
        json.loads(line.split("hostile: ", 1)[1])
        for line in text.splitlines()
        if "hostile: {" in line
    ]


def assert_cache_is_the_hosts(cache: Path, tiny) -> None:
    """No link anywhere, the checkpoint byte for byte the Hub's, the rows the recipe's pin, and
    every manifest true to its files."""
    assets, expected = tiny
    assert links_in(cache) == []
    (ckpt,) = (cache / "hf").glob("test-org--tiny-model@*")
    for name, data in assets.checkpoint.items():
        assert (ckpt / name).read_bytes() == data, name
    (rows,) = (cache / "rows").glob("*.parquet")
    assert hashlib.sha256(rows.read_bytes()).hexdigest() == expected["parquet_sha256"]
    for manifest in cache.rglob(".reproduce-manifest.json"):
        for e in json.loads(manifest.read_text())["files"]:
            got = hashlib.sha256((manifest.parent / e["path"]).read_bytes()).hexdigest()
            assert got == e["sha256"], (manifest, e["path"])


def test_a_hostile_image_changes_nothing_the_host_or_a_later_run_trusts(
    hub, tiny, hostile, canary, container_run_args, tmp_path, monkeypatch
):
    monkeypatch.setenv(TEST_ENCODER_ENV, ENCODER)
    recipe = recipe_file(tmp_path, hostile, tiny)
    profile = profile_file(tmp_path, _Local(), container_run_args, "local")  # type: ignore[arg-type]
    cache = tmp_path / "cache-local"
    outside = [tmp_path / "outside", tmp_path / "recipes"]
    before_outside = {str(p): snapshot(p) for p in outside}

    first = Run(recipe, profile, tmp_path / "runs")
    assert first.result.returncode == 0, first.why()
    assert "verdict: reproduced" in first.result.stderr
    reports = attacked(first.node_log)
    assert len(reports) >= 5, first.node_log[-3000:]  # every container attacked...
    assert sum(r["links"] for r in reports) > 0  # ...and planted links where it could write
    assert first.sources()["rows"] == "build" and first.sources()["torch_dist"] == "convert"
    assert canary.read_text() == CANARY_TEXT
    assert_cache_is_the_hosts(cache, tiny)
    cached = snapshot(cache)

    second = Run(recipe, profile, tmp_path / "runs")
    assert second.result.returncode == 0, second.why()
    assert set(second.sources().values()) <= {"cache", "not-needed"}, second.sources()
    assert attacked(second.node_log)
    assert "cache " in second.node_log and "(verified)" in second.node_log
    # the second run used the cache as the host left it: not one byte of it changed, no link
    assert snapshot(cache) == cached
    assert canary.read_text() == CANARY_TEXT
    assert {str(p): snapshot(p) for p in outside} == before_outside


def test_prepare_and_an_ssh_run_with_a_hostile_image_leave_the_operator_and_the_node_alone(
    node, hub, tiny, hostile, canary, container_run_args, tmp_path, monkeypatch
):
    monkeypatch.setenv(TEST_DOCKER_ARGS_ENV, json.dumps(container_run_args))
    recipe = recipe_file(tmp_path, hostile, tiny)
    store, work = tmp_path / "store", tmp_path / "prepare"
    prepared = cli(
        "prepare", str(recipe), "--store", str(store), "--work-dir", str(work),
        "--rows-builder", "docker", "--test-encoder", ENCODER, timeout=400,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    assert attacked(prepared.stderr), prepared.stderr  # the build ran in the hostile image
    assert canary.read_text() == CANARY_TEXT
    assert links_in(work) == [] and links_in(store) == []
    stored = snapshot(store)

    run = Run(recipe, profile_file(tmp_path, node, container_run_args, "ssh", store=str(store)),
              tmp_path / "runs")  # fmt: skip
    assert run.result.returncode == 0, run.why()
    assert attacked(run.node_log)
    assert run.sources()["rows"] == "store" and run.sources()["hf_ckpt"] == "store"
    assert canary.read_text() == CANARY_TEXT
    assert_cache_is_the_hosts(tmp_path / "cache-ssh", tiny)
    # the store: what prepare put there is unchanged; the host added the converted checkpoint
    after = snapshot(store)
    assert {k: v for k, v in after.items() if k in stored} == stored
    assert all(k.startswith("torch_dist") for k in set(after) - set(stored))
    assert links_in(store) == []
