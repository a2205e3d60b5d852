"""Hostile recipe and profile values reach the node script as data, never as code.

The script is rendered from values full of `$(...)`, backticks, quotes, newlines and `;`, then
actually executed by bash with stand-in `docker`, `python3`, `ray` and `torchrun` on PATH that
record their arguments. Nothing may create the canary file, and every value must arrive
byte for byte where it was meant to go.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import yaml
from support.cli import SEED
from support.paths import REPO

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.plan import build_plan

CANARY = "pwned"
EVIL = [
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"'; touch {CANARY}; '",
    f'"; touch {CANARY}; "',
    f"line one\nline two $(touch {CANARY})",
    f"a;touch {CANARY}&&b|c>d<e",
    f"${{IFS}}$(touch${{IFS}}{CANARY})",
    # templates/node.sh's own syntax: a value is inserted once, never read as a slot or a block
    f"@@{{heredoc_tag}}\n@@stage_functions\n##@ block node.sh\n@@{{run_id}} $(touch {CANARY})",
]

STUB_DOCKER = r"""#!/bin/bash
printf '%s\x1f' docker "$@" >> "$STUB_LOG"; printf '\x1e' >> "$STUB_LOG"
case "$1" in
  pull|rm) exit 0 ;;
  image) if [[ "$*" == *RepoDigests* ]]; then printf "%s\n" "${@: -1}"; else echo sha256:0; fi; exit 0 ;;
  run)
    args=("$@")
    for ((i = 1; i < ${#args[@]}; i++)); do
      if [ "${args[i]}" = "-c" ] && [ "${args[i-1]}" = "bash" ]; then
        cmd=${args[i+1]}
        exec bash -c "${cmd//\/root\/miles/$FAKE_MILES}"   # the image's /root/miles, faked here
      fi
    done
    exit 0 ;;
esac
exit 0
"""
STUB_LOGGER = r"""#!/bin/bash
printf '%s\x1f' "$(basename "$0")" "$@" >> "$STUB_LOG"; printf '\x1e' >> "$STUB_LOG"
# the host's clock on the training container's output: the real program (scripts/host_clock.py)
[ "$(basename "${1:-}")" = host_clock.py ] && exec "$REAL_PYTHON" "$REPO_SCRIPTS/host_clock.py" "${@:2}"
[ "$(basename "$0")" = python3 ] && echo '{"ok": true, "checks": []}'
exit 0
"""


def hostile_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    data = yaml.safe_load(SEED.read_text())
    data["env"] = {f"EVIL_{i}": value for i, value in enumerate(EVIL)}
    data["gpu"]["type"] = EVIL[0]
    data["gpu"]["instance"] = None  # no catalog instance: its GPU model would refuse the type
    data["stack"]["cuda"] = "13.0 " + EVIL[1]
    # the revision and the rows' name name cache paths: the recipe schema keeps them path-safe
    data["result"]["active_params"]["revision"] = "v1.0-evil"
    data["result"]["active_params"]["source"] = "https://huggingface.co/evil/repo.v1"
    data["workload"]["dataset"]["build"]["builder"] = EVIL[3]
    data["run"] = (  # then the seed's train call, which validate requires (a stub here)
        'printenv > "$NODE_RUN_DIR/container-env.txt"\nprintf "%s" "$SFT_DATA" > "$NODE_RUN_DIR/sft.txt"\n'
        + data["run"]
    )
    weird = tmp_path / ("dir " + EVIL[3].replace("\n", " "))
    rows = weird / "rows.parquet"
    rows.parent.mkdir(parents=True)
    rows.write_bytes(b"rows")
    data["workload"]["dataset"]["build"]["parquet_sha256"] = hashlib.sha256(b"rows").hexdigest()
    recipe_path = tmp_path / "evil.yaml"
    recipe_path.write_text(yaml.safe_dump(data))
    profile = {
        "kind": "local",
        "work_dir": str(tmp_path / f"work {EVIL[0]} {EVIL[1]}"),
        "cache_dir": str(tmp_path / f"cache {EVIL[2]}"),
        "env": {"PROFILE_EVIL": EVIL[5]},
        "docker": {"gpus": None, "shm_size": "1g", "extra_args": ["--label", EVIL[6]]},
        "assets": {"sft_data": str(rows), "torch_dist": str(weird / "torch dist")},
        "preflight": {"thresholds": {}},
        "disable_nvlink_multicast": True,
    }
    profile_path = tmp_path / f"evil {EVIL[4]}.yaml"  # its name is printed in a comment
    profile_path.write_text(yaml.safe_dump(profile))
    return recipe_path, profile_path, rows


def read_calls(log: Path) -> list[list[str]]:
    text = log.read_text() if log.exists() else ""
    return [rec.split("\x1f")[:-1] for rec in text.split("\x1e") if rec]


def test_hostile_values_are_never_executed(tmp_path: Path) -> None:
    recipe_path, profile_path, rows = hostile_inputs(tmp_path)
    plan = build_plan(
        load_recipe(recipe_path), load_profile(str(profile_path)), run_id="quoting-test"
    )
    script = tmp_path / "node.sh"
    script.write_text(plan.node_script)
    subprocess.run(["bash", "-n", str(script)], check=True)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STUB_DOCKER)
    for name in ("python3", "ray", "torchrun"):
        (bin_dir / name).write_text(STUB_LOGGER)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    fake_miles = tmp_path / "miles"
    fake_miles.mkdir()
    torch_dist = Path(plan.assets.torch_dist)
    torch_dist.mkdir(parents=True)
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("release\n")
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "REAL_PYTHON": sys.executable,
        "REPO_SCRIPTS": str(REPO / "scripts"),
        "FAKE_MILES": str(fake_miles),
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    assert not list(tmp_path.rglob(CANARY)), "a recipe or profile value was executed"
    assert not Path(CANARY).exists()

    node_run_dir = Path(plan.node_run_dir)
    assert node_run_dir.is_dir() and "$(touch" in str(node_run_dir)
    env_lines = (node_run_dir / "container-env.txt").read_text()
    for i, value in enumerate(EVIL):
        assert f"EVIL_{i}={value}\n" in env_lines, value
    assert f"PROFILE_EVIL={EVIL[5]}\n" in env_lines
    assert (node_run_dir / "sft.txt").read_text() == str(rows)

    calls = read_calls(log)
    preflight = next(c for c in calls if c[0] == "python3" and c[1].endswith("preflight.py"))
    assert preflight[preflight.index("--gpu-type") + 1] == EVIL[0]
    # the node is given the version stack.cuda leads with, never its prose (inputs/stack.py)
    assert preflight[preflight.index("--cuda") + 1] == "13.0"
    docker_runs = [c for c in calls if c[:2] == ["docker", "run"]]
    assert docker_runs and all(EVIL[6] in c for c in docker_runs)
    # the recipe's asset values reach the node programs as the spec, byte for byte (a heredoc)
    resolve = next(c for c in calls if c[0] == "python3" and c[1:3][-1] == "resolve")
    spec = json.loads(Path(resolve[resolve.index("--spec") + 1]).read_text())
    assert spec == plan.asset_spec
    ckpt = next(a for a in spec["assets"] if a["name"] == "hf_ckpt")
    assert ckpt["revision"] == "v1.0-evil" and ckpt["repo"] == "evil/repo.v1"
    for marker in ("preflight", "image", "stack", "assets", "ray", "train"):
        assert f"##reproduce stage={marker} event=end status=ok" in proc.stdout


def test_comments_cannot_be_ended_by_a_newline_in_a_value(tmp_path: Path) -> None:
    recipe_path, profile_path, _ = hostile_inputs(tmp_path)
    plan = build_plan(
        load_recipe(recipe_path), load_profile(str(profile_path)), run_id="quoting-test"
    )
    comment = [ln for ln in plan.node_script.splitlines() if "on cluster profile" in ln]
    assert len(comment) == 1 and f"line one line two $(touch {CANARY})" in comment[0]
    # the executed test above shows the value also arrives intact where it is data
