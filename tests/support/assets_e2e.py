"""A reproduction with real assets over loopback sshd: the recipe, the profile of a fresh node, the run and what it left."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from support.assets import tiny_recipe_raw, write_recipe
from support.helpers import assert_log_collected, cli
from support.node_scripts import load_script
from support.plan_env import assert_run_stages
from support.ports import free_port
from support.sshd import SshServer

store_mod = load_script("asset_store")

CONVERTED = "standin-converted"  # what the stand-in converter leaves in the run's out/
BESIDE_RESOLVE = {"preflight", "image", "preflight-gpu", "stack"}  # what needs no asset plan


def recipe_file(tmp_path: Path, test_image, tiny, edit=None, run_prefix: str = "") -> Path:
    raw = tiny_recipe_raw(*tiny)
    raw["stack"]["image"] = {"repository": test_image.repo, "digest": test_image.digest}
    if run_prefix:
        raw["run"] = run_prefix.rstrip("\n") + "\n" + raw["run"]
    if edit:
        edit(raw)
    return write_recipe(
        tmp_path / "recipes" / f"tiny-{hashlib.sha1(repr(raw).encode()).hexdigest()[:8]}.yaml", raw
    )


def profile_file(
    tmp_path: Path,
    server: SshServer,
    container_run_args: list[str],
    name: str,
    *,
    store: str | None = None,
    assets: dict | None = None,
) -> Path:
    """An ssh profile for one node with an empty cache of its own (a fresh node)."""
    args = list(container_run_args)
    at = next(i for i, a in enumerate(args) if a.startswith("PATH="))
    args[at] = "PATH=/root/miles/bin:" + args[at][len("PATH=") :]  # the stand-in torchrun
    data = {
        **server.profile(),
        "work_dir": str(tmp_path / f"work-{name}"),
        "cache_dir": str(tmp_path / f"cache-{name}"),
        "price_per_hour": 63.296,
        "docker": {
            "gpus": None,
            "shm_size": "256m",
            "extra_args": args,
            "network_host": False,
            "memlock_unlimited": False,
            "host_clock": False,  # the stand-in's steps take no time (plan_env.write_profile)
        },
        "preflight": {"enabled": False},
        "stack_check": "skip",
        "assets": {"store": store, **(assets or {})},
        "ray": {"node_ip_address": "127.0.0.1", "port": free_port()},
        "env": {"STANDIN_NOISE_LINES": "1"},
    }
    path = tmp_path / f"profile-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Run:
    """One `reproduce RECIPE --cluster PROFILE` and what it left."""

    def __init__(self, recipe: Path, profile: Path, runs: Path) -> None:
        before = set(runs.glob("**/run.json"))
        self.result = cli(
            str(recipe),
            "--cluster",
            str(profile),
            "--runs-dir",
            str(runs),
            "--on-interrupt",
            "cancel",
            timeout=400,
        )
        (record,) = set(runs.glob("**/run.json")) - before
        self.rd = record.parent
        assert_log_collected(self.rd)
        self.node_dir = Path(json.loads(record.read_text())["node_run_dir"])
        self.timeline = json.loads((self.rd / "timeline.json").read_text())
        self.stages = [(s["name"], s["status"]) for s in self.timeline["stages"]]

    @property
    def node_log(self) -> str:
        return (self.rd / "logs" / "node.log").read_text()

    def why(self) -> str:
        return self.result.stderr + self.node_log[-5000:]

    def sources(self) -> dict[str, str | None]:
        plan = json.loads((self.rd / "assets-plan.json").read_text())  # collected from the node
        return {name: step["source"] for name, step in plan["assets"].items()}

    def converted(self) -> bool:
        return (self.node_dir / "out" / CONVERTED).exists()

    @property
    def status(self) -> dict[str, str]:
        return {s["name"]: s["status"] for s in self.timeline["stages"]}

    def stage_seconds(self, name: str) -> float:
        stage = next(s for s in self.timeline["stages"] if s["name"] == name)
        return stage["end"] - stage["start"]


def s3_manifests(url: str) -> dict[str, dict]:
    import boto3

    bucket, prefix = url[5:].split("/", 1)
    client = boto3.client("s3")
    out = {}
    for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        if obj["Key"].endswith(store_mod.MANIFEST):
            body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            out[obj["Key"][len(prefix) + 1 : -len(store_mod.MANIFEST) - 1]] = json.loads(body)
    return out


def ok(run: Run) -> None:
    assert run.result.returncode == 0, run.why()
    assert "verdict: reproduced" in run.result.stderr
    # with a store: stage push waits for the uploads started in stage convert
    assert_run_stages([name for name, _ in run.stages[:-1]])
    assert run.stages[-1] == ("push", "ok") and set(run.status.values()) == {"ok"}, run.stages


# ---- the store: a cold node fills it; after prepare, the second run downloads and converts nothing
