"""Installed as a wheel (not from this checkout), `reproduce` still finds its profiles, schemas,
node scripts and the seed recipe: they ship inside the package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.cli import REPO, SEED


def test_wheel_carries_profiles_schemas_and_node_scripts(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    target = tmp_path / "site"
    (wheel,) = wheels.glob("reproduce-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "launcher" / "_data" / "scripts" / "preflight.py").is_file()
    # node.sh's template: the dry runs below render it from the installed copy
    assert (target / "launcher" / "_data" / "templates" / "node.sh").is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}  # the installed copy wins over the checkout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", "import launcher, sys; print(launcher.__file__)"],
        env=env,
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith(str(target))
    for cluster in ("aws", "ssh", "local", "ray"):
        res = subprocess.run(
            [sys.executable, "-m", "launcher", str(SEED), "--cluster", cluster, "--dry-run"],
            env=env,
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert f"{target}/launcher/_data/env/{cluster}.yaml" in res.stdout
