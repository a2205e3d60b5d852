"""The node script the Plan renders, executed by bash with stand-in `docker`, `python3`, `ray` and
`torchrun` on PATH (as in test_plan_quoting): HF_TOKEN reaches the host's asset commands (resolve,
fetch) and no container; text written into node.sh while it runs never runs; directories others could write to
are refused; a profile cannot point the token at another credential or put the run inside the
cache that containers may write."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here
from support.paths import REPO

from launcher.errors import BadInput
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.plan import Plan, build_plan

# Each call: the program, whether it was given `-e HF_TOKEN`, the HF_TOKEN in its environment,
# and the command a `docker run` runs. A `docker run` then runs that command here, in bash.
STUB_DOCKER = r"""#!/bin/bash
case "$1" in
  pull|rm) exit 0 ;;
  image) if [[ "$*" == *RepoDigests* ]]; then printf "%s\n" "${@: -1}"; else echo sha256:0; fi; exit 0 ;;
  run)
    args=("$@"); flag=no; cmd=""
    for ((i = 1; i < ${#args[@]}; i++)); do
      [ "${args[i]}" = "-e" ] && [ "${args[i+1]}" = "HF_TOKEN" ] && flag=yes
      if [ "${args[i]}" = "-c" ] && [ "${args[i-1]}" = "bash" ]; then cmd=${args[i+1]}; fi
    done
    nonce=$(env | grep -c NONCE)   # node.sh's nonce: in no container's environment
    printf 'docker-run flag=%s env=%s nonce=%s cmd=%s\x1e' "$flag" "${HF_TOKEN-unset}" "$nonce" \
      "${cmd:0:60}" >> "$STUB_LOG"
    [ -n "${APPEND_TO_NODE_SH:-}" ] && [[ "$cmd" == *"recipe run block"* ]] \
      && printf '\ntouch %q\n' "$APPEND_TO_NODE_SH" >> "$NODE_RUN_DIR/node.sh"
    [ "$flag" = yes ] && export HF_TOKEN || unset HF_TOKEN   # what docker passes in
    exec bash -c "${cmd//\/root\/miles/$FAKE_MILES}" ;;
esac
exit 0
"""
STUB_LOGGER = r"""#!/bin/bash
printf '%s %s %s env=%s\x1e' "$(basename "$0")" "$(basename "${1:-}")" "${2:-}" "${HF_TOKEN-unset}" >> "$STUB_LOG"
# the host's clock on the training container's output: the real program (scripts/host_clock.py)
[ "$(basename "${1:-}")" = host_clock.py ] && exec "$REAL_PYTHON" "$REPO_SCRIPTS/host_clock.py" "${@:2}"
# `node_assets.py source`: every asset is to be built here (so the rows build's container runs)
[ "$(basename "$0")" = python3 ] && [ "${2:-}" = source ] && { echo build; exit 0; }
[ "$(basename "$0")" = python3 ] && echo '{"ok": true, "checks": []}'
exit 0
"""


def _plan(tmp_path: Path, **profile_fields) -> Plan:
    profile = {
        "kind": "local",
        "work_dir": str(tmp_path / "work"),
        "cache_dir": str(tmp_path / "cache"),
        "docker": {"gpus": None, "shm_size": "1g"},
        "assets": {"verify_sha256": False},
        **profile_fields,
    }
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return build_plan(load_recipe(SEED), load_profile(str(path)), run_id="hardening-test")


def _execute(tmp_path: Path, plan: Plan, secrets: str = "", **env: str):
    """node.sh as the wrapper runs it, with the stand-ins; the calls they saw."""
    node_dir = Path(plan.node_run_dir)
    for d in (node_dir, node_dir / "scripts", node_dir / "state", node_dir / "out"):
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    if secrets:
        (node_dir / ".secrets.env").write_text(secrets)
        (node_dir / ".secrets.env").chmod(0o600)
    (node_dir / "node.sh").write_text(plan.node_script)
    torch_dist = Path(plan.assets.torch_dist)
    torch_dist.mkdir(parents=True)
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("release\n")
    Path(plan.assets.sft_data).parent.mkdir(parents=True, exist_ok=True)
    Path(plan.assets.sft_data).write_bytes(b"rows")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STUB_DOCKER)
    for name in ("python3", "ray", "torchrun"):
        (bin_dir / name).write_text(STUB_LOGGER)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    (tmp_path / "miles").mkdir()
    log = tmp_path / "calls.log"
    proc = subprocess.run(
        ["bash", "node.sh"],
        cwd=node_dir,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "STUB_LOG": str(log),
            "REAL_PYTHON": sys.executable,
            "REPO_SCRIPTS": str(REPO / "scripts"),
            "FAKE_MILES": str(tmp_path / "miles"),
            "HOME": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [c for c in (log.read_text() if log.exists() else "").split("\x1e") if c]
    return proc, calls


def test_hf_token_reaches_the_hosts_asset_commands_and_no_container(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    proc, calls = _execute(tmp_path, plan, secrets="HF_TOKEN=hf_canary\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with_token = [c for c in calls if "hf_canary" in c]
    # exactly the host's commands that may talk to the Hub: resolve, then fetch (rows, checkpoint)
    assert with_token == [
        "python3 node_assets.py resolve env=hf_canary",
        "python3 node_assets.py fetch env=hf_canary",
        "python3 node_assets.py fetch env=hf_canary",
    ], calls
    runs = [c for c in calls if c.startswith("docker-run")]
    assert runs and all("flag=no env=unset" in c for c in runs), runs  # no container gets it
    assert all(" nonce=0 " in c for c in runs), runs  # nor node.sh's nonce, in any form
    (clock,) = [c for c in calls if c.startswith("python3 host_clock.py")]
    assert clock.endswith("env=unset"), clock  # the host's clock: no token either
    training = [c for c in runs if "recipe run block" in c or "set -euo pipefail" in c]
    assert training, runs  # the training container is among those that did not get it
    build = [c for c in runs if "HF_HUB_OFFLINE=1" in c]
    assert build, runs  # nor the rows build
    assert not Path(plan.node_run_dir, ".secrets.env").exists()  # read, then deleted


def _cmd(call: str) -> str:
    return call.split(" cmd=", 1)[1]


def test_text_appended_to_node_sh_while_it_runs_never_runs(tmp_path: Path) -> None:
    """bash reads node.sh's whole body before running any of it."""
    plan = _plan(tmp_path)
    canary = tmp_path / "appended-and-run"
    proc, _ = _execute(tmp_path, plan, APPEND_TO_NODE_SH=str(canary))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"touch {canary}" in Path(plan.node_run_dir, "node.sh").read_text()  # it was appended
    assert not canary.exists(), "text appended to node.sh while it ran was executed"


@pytest.mark.parametrize("how", ["group-writable", "someone-else's"])
def test_a_cache_dir_that_is_not_only_ours_is_refused(tmp_path: Path, how: str) -> None:
    plan = _plan(tmp_path)
    cache = Path(plan.cache_dir)
    cache.mkdir()
    if how == "group-writable":
        cache.chmod(0o775)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        nobody = pwd.getpwnam("nobody")
        os.chown(cache, nobody.pw_uid, nobody.pw_gid)
    proc, calls = _execute(tmp_path, plan)
    assert proc.returncode != 0
    assert f"reproduce: refusing {cache}" in proc.stderr
    assert not [c for c in calls if c.startswith("docker-run")]  # nothing ran


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "MY_PASSWORD", "HF_SSH_KEY_TOKEN"]
)
def test_hf_token_env_must_name_a_hugging_face_token(tmp_path: Path, name: str) -> None:
    with pytest.raises(BadInput, match=f"secrets.hf_token_env is '{name}'"):
        _plan(tmp_path, secrets={"hf_token_env": name})
    profile = tmp_path / "profile.yaml"
    result = reproduce_here(SEED, "--cluster", profile, "--dry-run")  # the dry run refuses it too
    assert result.code == 2 and "secrets.hf_token_env" in result.err, result.err


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MY_HF_TOKEN", None])
def test_hugging_face_token_names_are_accepted(tmp_path: Path, name: str | None) -> None:
    _plan(tmp_path, secrets={"hf_token_env": name})


def test_a_work_dir_inside_the_cache_is_refused(tmp_path: Path) -> None:
    """The cache is mounted writable into every container: node.sh must not live in it."""
    with pytest.raises(BadInput, match="inside cache_dir"):
        _plan(tmp_path, work_dir=str(tmp_path / "cache" / "work"))
    with pytest.raises(BadInput, match="inside cache_dir"):
        _plan(tmp_path, cache_dir=str(tmp_path))


@pytest.mark.parametrize("where", ["env", "run"])
def test_a_container_script_over_one_arguments_limit_is_refused_before_anything(tmp_path, where):
    """`bash -c "$CONTAINER_SCRIPT"` is one argument: past Linux's 128 KiB it cannot start, at
    the train stage, after every paid stage (found 2026-12-04). Refused at the plan, exit 2; a
    script just under the limit still renders, and bash runs it as one argument."""
    import subprocess

    import yaml
    from support.cli import SEED, reproduce_here

    def recipe(big: int) -> str:
        raw = yaml.safe_load(SEED.read_text())
        if where == "env":
            raw["env"]["BIG_VALUE"] = "x" * big
        else:
            raw["run"] = raw["run"] + "\n: " + "x" * big + "\n"
        path = tmp_path / f"{where}-{big}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return str(path)

    res = reproduce_here(recipe(140_000), "--cluster", "local", "--dry-run")
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert "over the 131,072 bytes Linux passes as one argument" in res.err
    ok = reproduce_here(recipe(100_000), "--cluster", "local", "--dry-run")
    assert ok.code == 0, ok.err
    proc = subprocess.run(["bash", "-c", 'bash -c "$0" x', "echo " + "y" * 125_000])
    assert proc.returncode == 0  # this machine's limit is the one the check assumes


def test_a_run_block_bash_cannot_parse_is_refused_at_validate(tmp_path):
    """node.sh's own `bash -n` cannot see inside the container script's heredoc: the run block
    is checked by itself (found 2026-12-04: `if then ((( fi` validated)."""
    import yaml
    from support.cli import SEED, reproduce_here

    for broken in ("if then ((( fi", "echo 'oops", ")"):
        raw = yaml.safe_load(SEED.read_text())
        raw["run"] = raw["run"] + "\n" + broken + "\n"
        path = tmp_path / "broken.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        res = reproduce_here("validate", str(path))
        assert res.code == 2 and "  - run: is not valid bash:" in res.err, (broken, res.err)
