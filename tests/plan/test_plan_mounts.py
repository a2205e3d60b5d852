"""Every container mount of every rendered node script (local, SSH, AWS, several nodes), as the
dry run prints it: read-only, except the run's own out/ and the fresh directory a container that
makes an asset writes into (docs/architecture.md, "The trust boundary"). The cache in particular
is never writable in a container: run A's container could otherwise plant links for run B's
downloads, or rewrite a checkpoint together with its manifest."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support.cli import FOUR_NODES, SEED, reproduce_here
from support.multinode import ssh_hosts_profile

WRITABLE = re.compile(r"^(\S*/out|\$NODE_RUN_DIR/out|\$REPRODUCE_NEW_DIR)$")


def mounts(script: str) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of every -v in the script's docker words."""
    out = []
    for line in script.splitlines():
        if "-v " not in line or "DOCKER_ARGS" not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line.replace("(", " ").replace(")", " "), posix=True)
        for i, w in enumerate(words[:-1]):
            if w == "-v":
                parts = words[i + 1].split(":")
                out.append((parts[0], parts[1], parts[2:] == ["ro"]))
    return out


@pytest.mark.parametrize(
    "recipe, cluster",
    [(SEED, "local"), (SEED, "ssh"), (SEED, "aws"), (FOUR_NODES, "aws"), (FOUR_NODES, "hosts")],
)
def test_no_container_mounts_the_cache_or_anything_the_host_trusts_writable(
    recipe: Path, cluster: str, tmp_path: Path
) -> None:
    profile = ssh_hosts_profile(tmp_path) if cluster == "hosts" else cluster
    res = reproduce_here(recipe, "--cluster", profile, "--dry-run")
    assert res.code == 0, res.err
    found = mounts(res.out)
    assert any("reproduce-cache" in src for src, _, _ in found)  # the cache is mounted...
    for src, dst, ro in found:
        assert ro or (WRITABLE.match(src) and src == dst), (src, dst)  # ...read-only, like the rest
    # a container that makes an asset writes a fresh directory, made just before it
    lines = res.out.splitlines()
    for i, line in enumerate(lines):
        if '-v "$REPRODUCE_NEW_DIR:$REPRODUCE_NEW_DIR"' in line:
            assert 'mkdir -m 700 "$REPRODUCE_NEW_DIR"' in lines[i - 1]
            assert "adopt --spec" in lines[i + 1]  # and the host checks it before the cache
