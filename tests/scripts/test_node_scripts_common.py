"""What every node script owes the node: no `launcher` import, a working --help, no traceback."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.node_scripts import SCRIPTS

OWNED = ("stack_probe.py", "fetch_assets.py", "pretokenized_sft_rollout.py", "build_sft_rows.py")
HEAVY = {
    "torch",
    "transformers",
    "huggingface_hub",
    "pyarrow",
    "numpy",
    "pandas",
    "datasets",
    "miles",
    "transformer_engine",
    "deep_ep",
    "tokenizers",
}


@pytest.mark.parametrize("name", OWNED)
def test_no_launcher_import_and_heavy_packages_only_inside_functions(name):
    tree = ast.parse((SCRIPTS / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            assert not any(m.split(".")[0] == "launcher" for m in mods), f"{name} imports launcher"
    for (
        node
    ) in tree.body:  # module level: standard library only, so a missing package is a clear error
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            assert not {m.split(".")[0] for m in mods} & HEAVY, (
                f"{name} imports {mods} at module level"
            )


@pytest.mark.parametrize("name", OWNED)
def test_help_works_with_the_standard_library_alone(name, tmp_path):
    # -I: isolated mode, no site-packages: the node's python may lack every optional package
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPTS / name), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_rollout_check_mode_validates_a_rows_parquet(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(
        pa.table(
            {
                "messages": [[5, 6, 7, 8], [1, 2, 3, 4]],
                "metadata": [
                    {"loss_mask": [0, 1, 1, 0], "supervised_tokens": 2},
                    {"loss_mask": [1, 1, 1, 1], "supervised_tokens": 4},
                ],
            }
        ),
        good,
    )
    script = str(SCRIPTS / "pretokenized_sft_rollout.py")
    proc = subprocess.run(
        [sys.executable, script, "--check", str(good), "--row-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "rows": 2,
        "tokens": 8,
        "supervised_tokens": 6,
        "supervised_token_ratio": 0.75,
    }
    proc = subprocess.run(
        [sys.executable, script, "--check", str(good), "--row-tokens", "8192"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "row 0: the row has 4 tokens, expected 8192" in proc.stderr
    bad = tmp_path / "conversations.parquet"
    pq.write_table(
        pa.table(
            {"messages": [[{"role": "user", "content": "hi"}]], "metadata": [{"loss_mask": [1]}]}
        ),
        bad,
    )
    proc = subprocess.run(
        [sys.executable, script, "--check", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert (
        proc.returncode == 1 and "not a token id" in proc.stderr and "Traceback" not in proc.stderr
    )
    proc = subprocess.run(
        [sys.executable, script, "--check", str(tmp_path / "none.parquet")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "not a readable parquet file" in proc.stderr
