"""scripts/fetch_assets.py: skip a complete snapshot, never mix revisions, marker only after success.

No test contacts Hugging Face: downloads go through an injected downloader that writes files
locally (or fails), and the CLI is exercised on paths that never download.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.node_scripts import SCRIPTS, load_script

fa = load_script("fetch_assets")
REV = "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
OTHER = "b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"


class FakeHub:
    """Writes a small snapshot like snapshot_download would, and records every call."""

    def __init__(
        self, fail_with: BaseException | None = None, files: dict[str, bytes] | None = None
    ):
        self.calls: list[tuple] = []
        self.fail_with = fail_with
        self.files = (
            files
            if files is not None
            else {
                "config.json": b"{}",
                "model-00001.safetensors": b"x" * 100,
                "sub/tokenizer.json": b'{"v": 1}',
            }
        )

    def __call__(self, repo, revision, dest, token, repo_type, allow_patterns):
        self.calls.append((repo, revision, str(dest), token, repo_type, allow_patterns))
        # hf's own bookkeeping under .cache must not be listed
        (dest / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
        (dest / ".cache" / "huggingface" / "x.metadata").write_text("meta")
        for name, data in list(self.files.items())[: 1 if self.fail_with else None]:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(data)
        if self.fail_with:
            raise self.fail_with


def fetch(dest: Path, hub: FakeHub, revision: str = REV, **kw):
    return fa.fetch_snapshot(
        "Qwen/Qwen3-30B-A3B", revision, dest, downloader=hub, log=lambda m: None, **kw
    )


def test_first_fetch_downloads_and_writes_marker_with_files_and_sizes(tmp_path):
    hub = FakeHub()
    result = fetch(tmp_path / "ckpt", hub)
    assert result["status"] == "downloaded" and len(hub.calls) == 1
    assert hub.calls[0][:2] == ("Qwen/Qwen3-30B-A3B", REV) and hub.calls[0][4] == "model"
    marker = json.loads((tmp_path / "ckpt" / fa.MARKER).read_text())
    assert marker["repo"] == "Qwen/Qwen3-30B-A3B" and marker["revision"] == REV
    assert marker["files"] == [
        {"path": "config.json", "bytes": 2},
        {"path": "model-00001.safetensors", "bytes": 100},
        {"path": "sub/tokenizer.json", "bytes": 8},
    ]
    assert marker["total_bytes"] == 110
    assert not (tmp_path / "ckpt" / fa.PENDING).exists()


def test_second_fetch_of_same_revision_skips_without_calling_the_hub(tmp_path):
    fetch(tmp_path / "ckpt", FakeHub())
    hub = FakeHub()
    assert fetch(tmp_path / "ckpt", hub)["status"] == "skipped"
    assert hub.calls == []


def test_a_file_that_went_missing_or_shrank_forces_a_new_download(tmp_path):
    dest = tmp_path / "ckpt"
    fetch(dest, FakeHub())
    (dest / "model-00001.safetensors").write_bytes(b"x" * 10)  # truncated
    hub = FakeHub()
    assert fetch(dest, hub)["status"] == "downloaded" and len(hub.calls) == 1
    assert json.loads((dest / fa.MARKER).read_text())["files"][1]["bytes"] == 100


def test_failed_download_leaves_no_marker_and_a_retry_resumes(tmp_path):
    dest = tmp_path / "ckpt"
    with pytest.raises(
        fa.FetchError,
        match="download of model Qwen/Qwen3-30B-A3B@.* failed: ConnectionError: reset",
    ):
        fetch(dest, FakeHub(fail_with=ConnectionError("reset\nby peer")))
    assert not (dest / fa.MARKER).exists() and (dest / fa.PENDING).exists()
    hub = FakeHub()
    assert (
        fetch(dest, hub)["status"] == "downloaded"
    )  # same repo@revision: the pending download resumes
    assert (dest / fa.MARKER).exists() and not (dest / fa.PENDING).exists()


def test_another_revision_in_the_same_directory_is_refused(tmp_path):
    dest = tmp_path / "ckpt"
    fetch(dest, FakeHub())
    hub = FakeHub()
    with pytest.raises(fa.RefusedDest, match=f"holds model Qwen/Qwen3-30B-A3B@{REV}"):
        fetch(dest, hub, revision=OTHER)
    assert hub.calls == []


def test_an_unfinished_download_of_another_revision_is_refused(tmp_path):
    dest = tmp_path / "ckpt"
    with pytest.raises(fa.FetchError):
        fetch(dest, FakeHub(fail_with=OSError("disk full")))
    with pytest.raises(fa.RefusedDest, match="unfinished download"):
        fetch(dest, FakeHub(), revision=OTHER)


def test_a_partial_include_does_not_count_as_the_full_snapshot(tmp_path):
    dest = tmp_path / "ckpt"
    fetch(dest, FakeHub(), allow_patterns=["*.json"])
    with pytest.raises(fa.RefusedDest, match=r"only \*\.json"):
        fetch(dest, FakeHub())


def test_token_is_passed_to_the_hub_but_never_appears_in_messages(tmp_path, monkeypatch):
    secret = "hf_SECRETSECRETSECRET"
    monkeypatch.setenv("HF_TOKEN", secret)
    messages: list[str] = []
    hub = FakeHub(fail_with=RuntimeError(f"401 for token {secret}"))
    with pytest.raises(fa.FetchError) as err:
        fa.fetch_snapshot("a/b", REV, tmp_path / "d", downloader=hub, log=messages.append)
    assert hub.calls[0][3] == secret
    assert secret not in str(err.value) and "***" in str(err.value)
    assert all(secret not in m for m in messages)
    assert secret not in (tmp_path / "d" / fa.PENDING).read_text()


def test_an_empty_download_is_an_error_not_a_complete_snapshot(tmp_path):
    with pytest.raises(fa.FetchError, match="holds no files"):
        fetch(tmp_path / "d", FakeHub(files={}))
    assert not (tmp_path / "d" / fa.MARKER).exists()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "fetch_assets.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def without_hub(tmp_path: Path) -> dict[str, str]:
    """An environment where `import huggingface_hub` fails even if it is installed: no test may download."""
    import os

    shadow = tmp_path / "shadow" / "huggingface_hub"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    return {**os.environ, "PYTHONPATH": str(shadow.parent), "HF_HUB_OFFLINE": "1"}


def test_cli_skips_a_complete_directory_without_huggingface_hub(tmp_path):
    dest = tmp_path / "ckpt"
    fetch(dest, FakeHub())
    proc = run_cli(
        "hf-checkpoint",
        "--repo",
        "Qwen/Qwen3-30B-A3B",
        "--revision",
        REV,
        "--dest",
        str(dest),
        env=without_hub(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "skipped" and out["files"] == 3 and out["total_bytes"] == 110
    assert "download skipped" in proc.stderr


def test_cli_without_huggingface_hub_fails_clearly(tmp_path):
    proc = run_cli(
        "hf-checkpoint",
        "--repo",
        "a/b",
        "--revision",
        REV,
        "--dest",
        str(tmp_path / "d"),
        env=without_hub(tmp_path),
    )
    assert proc.returncode == 3
    assert "huggingface_hub is not installed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["hf-checkpoint", "--repo", "noslash", "--revision", REV, "--dest", "/tmp/x"],
            "expected OWNER/NAME",
        ),
        (["hf-checkpoint", "--repo", "a/b", "--dest", "/tmp/x"], "--revision"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_cli_bad_arguments_exit_2_without_traceback(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_refuses_a_directory_of_another_revision(tmp_path):
    dest = tmp_path / "ckpt"
    fetch(dest, FakeHub())
    proc = run_cli(
        "hf-checkpoint",
        "--repo",
        "Qwen/Qwen3-30B-A3B",
        "--revision",
        OTHER,
        "--dest",
        str(dest),
        env=without_hub(tmp_path),
    )
    assert proc.returncode == 2 and "choose another --dest" in proc.stderr
