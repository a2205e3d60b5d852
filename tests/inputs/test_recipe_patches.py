"""`patches`: applied in the container before training, each checked by its hash, recorded in
the run; or the recipe refused before anything is paid for (launcher/inputs/patches.py).

Before, nothing read `patches`: an unpatched run was judged against the patched claim. The node's
part is plain bash (node.sh); it is run here for real, with git, against a real checkout.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here
from support.paths import TESTS

from launcher.errors import BadInput, InfraError
from launcher.inputs.patches import Patch, apply_lines
from launcher.inputs.recipe import load_recipe

DIFF = """--- a/train.py
+++ b/train.py
@@ -1,2 +1,3 @@
 print("hello")
+print("patched")
 print("bye")
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recipe_with(tmp_path: Path, patches: list) -> Path:
    raw = yaml.safe_load(SEED.read_text())
    raw["result"]["measured"] = str(raw["result"]["measured"])
    raw["correctness"]["component_tests"][0]["date"] = str(
        raw["correctness"]["component_tests"][0]["date"]
    )
    raw["patches"] = patches
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "miles"
    repo.mkdir()
    (repo / "train.py").write_text('print("hello")\nprint("bye")\n')
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def run_lines(lines: list[str], cwd: Path) -> subprocess.CompletedProcess:
    script = "set -euo pipefail\n" + "\n".join(lines) + "\necho after\n"
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    return subprocess.run(["bash"], input=script, text=True, capture_output=True, cwd=cwd)


def test_the_node_applies_a_patch_checked_by_its_hash(tmp_path):
    repo = checkout(tmp_path)
    done = run_lines(apply_lines([Patch(0, "hello", str(repo), DIFF, sha(DIFF))]), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (repo / "train.py").read_text() == 'print("hello")\nprint("patched")\nprint("bye")\n'
    assert f"reproduce: patch hello applied to {repo} (sha256 {sha(DIFF)})" in done.stdout


@pytest.mark.parametrize(
    "case, patch, words",
    [
        ("hash", lambda r: Patch(0, "p", str(r), DIFF, "0" * 64), "its bytes hash to"),
        ("no checkout", lambda r: Patch(0, "p", str(r) + "-gone", DIFF, sha(DIFF)), "not a checkout"),
        ("does not apply", lambda r: Patch(0, "p", str(r), DIFF.replace("bye", "ciao"),
                                           sha(DIFF.replace("bye", "ciao"))), "does not apply"),
    ],
)  # fmt: skip
def test_a_patch_that_cannot_be_applied_stops_the_node_before_training(
    tmp_path, case, patch, words
):
    repo = checkout(tmp_path)
    before = (repo / "train.py").read_text()
    done = run_lines(apply_lines([patch(repo)]), tmp_path)
    assert done.returncode == 1 and words in done.stderr, (done.stdout, done.stderr)
    assert "after" not in done.stdout  # nothing after it runs (training included)
    assert (repo / "train.py").read_text() == before


def test_hostile_patch_text_reaches_the_node_byte_for_byte(tmp_path):
    repo = checkout(tmp_path)
    evil = DIFF.replace('print("patched")', "print('$(touch pwned)' \"`id`\" '\\'')")
    done = run_lines(apply_lines([Patch(0, "p", str(repo), evil, sha(evil))]), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "$(touch pwned)" in (repo / "train.py").read_text()
    assert not (tmp_path / "pwned").exists()


def test_a_patched_recipe_is_planned_applied_and_recorded(tmp_path):
    path = recipe_with(tmp_path, [{"name": "hello", "checkout": "/root/miles", "diff": DIFF,
                                   "sha256": sha(DIFF)}])  # fmt: skip
    script = tmp_path / "node.sh"
    res = reproduce_here(path, "--dry-run", "--script-out", script)
    assert res.code == 0, res.err
    assert "# patches   1 applied in the container before training: hello -> /root/miles" in res.out
    text = script.read_text()
    container = text[text.index("CONTAINER_SCRIPT <<") :]
    apply_at = container.index("| _apply_patch /root/miles")
    assert apply_at < container.index("_stage_begin ray") < container.index("_stage_begin train")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    from launcher.inputs.profile import load_profile
    from launcher.plan.plan import build_plan

    plan = build_plan(load_recipe(path), load_profile("local"), run_id="r1")
    assert plan.to_dict()["patches"] == [
        {"name": "hello", "checkout": "/root/miles", "sha256": sha(DIFF)}
    ]
    json.dumps(plan.to_dict())


def test_a_patch_file_beside_the_recipe_is_read_and_checked(tmp_path):
    (tmp_path / "fix.diff").write_text(DIFF)
    path = recipe_with(tmp_path, [{"checkout": "/root/Megatron-LM", "file": "fix.diff",
                                   "sha256": sha(DIFF)}])  # fmt: skip
    res = reproduce_here(path, "--dry-run")
    assert res.code == 0, res.err
    assert "patch-0 -> /root/Megatron-LM" in res.out and 'print("patched")' in res.out


REFUSED = {
    "bytes missing": ({"checkout": "/root/miles", "file": "gone.diff", "sha256": "0" * 64},
                      "patches[0]", "not available"),
    "hash differs": ({"checkout": "/root/miles", "diff": DIFF, "sha256": "0" * 64},
                     "patches[0].sha256", "hash to"),
    "checkout not in the image": ({"checkout": "/opt/other", "diff": DIFF, "sha256": sha(DIFF)},
                                  "patches[0].checkout", "not a checkout the training image"),
    "no diff": ({"checkout": "/root/miles", "sha256": sha(DIFF)}, "patches[0]", "neither diff"),
    "not a diff": ({"checkout": "/root/miles", "diff": "hello\n", "sha256": sha("hello\n")},
                   "patches[0]", "not a unified diff"),
    "climbs out": ({"checkout": "/root/miles", "file": "../x.diff", "sha256": sha(DIFF)},
                   "patches[0]", "no '..'"),
    "a bare string": ("https://example.com/fix.diff", "patches[0]", "expected a mapping"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_patch_that_cannot_be_applied_refuses_the_recipe_before_anything_is_paid(case, tmp_path):
    item, field, words = REFUSED[case]
    path = recipe_with(tmp_path, [item])
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert f"- {field}:" in res.err and words in res.err, res.err
    with pytest.raises(BadInput):
        load_recipe(path)


@pytest.mark.parametrize("profile", ["ray"])
def test_a_target_that_cannot_patch_its_checkout_refuses_a_patched_recipe(profile, tmp_path):
    path = recipe_with(tmp_path, [{"checkout": "/root/miles", "diff": DIFF, "sha256": sha(DIFF)}])
    res = reproduce_here(path, "--cluster", profile, "--dry-run")
    assert res.code == 2 and "cannot apply them" in res.err and res.out == "", res
    host = (SEED.parent.parent.parent.parent / "env" / "local.yaml").read_text()
    host_profile = tmp_path / "host.yaml"
    host_profile.write_text(host.replace("runtime: docker", "runtime: host"))
    assert "runtime: host" in host_profile.read_text()
    res = reproduce_here(path, "--cluster", host_profile, "--dry-run")
    assert res.code == 2 and "runtime: host" in res.err, res


def test_a_recipe_without_patches_renders_no_patch_lines():
    res = reproduce_here(SEED, "--dry-run")
    assert res.code == 0 and "_apply_patch" not in res.out
    assert "# patches   none" in res.out


def _standin_patch(old: str, new: str) -> str:
    """A unified diff of the stand-in's train.py (the image's /root/miles/train.py)."""
    import difflib

    text = (TESTS / "standin_miles" / "train.py").read_text()
    assert old in text
    after = text.replace(old, new, 1)
    return "".join(
        difflib.unified_diff(
            text.splitlines(True), after.splitlines(True), "a/train.py", "b/train.py"
        )
    )


@pytest.mark.docker
@pytest.mark.parametrize("applies", [True, False])
def test_the_real_node_script_patches_the_containers_checkout_before_training(
    test_image, container_run_args, tmp_path, runs_root, applies
):
    """The Plan's node.sh on this host's dockerd: the patch reaches the container's /root/miles
    before the ray stage and training runs the patched code; a patch that does not apply fails
    the run before any training step, and the host's own copy is never touched."""
    from support.plan_env import plan_for, seed_raw, write_profile, write_recipe

    from launcher.clusters.local import LocalCluster
    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    anchor = "TRAIN_PID, ROLLOUT_PID = 5123, 5101\n"
    diff = _standin_patch(anchor, anchor + 'print("STANDIN-PATCHED", file=sys.stderr)\n')
    if not applies:
        diff = diff.replace(" TRAIN_PID, ROLLOUT_PID", " TRAIN_PID, ROLLOUT_PID_GONE")
    raw = seed_raw()
    raw["patches"] = [{"name": "mark", "checkout": "/root/miles", "diff": diff,
                       "sha256": sha(diff)}]  # fmt: skip
    host_copy = (TESTS / "standin_miles" / "train.py").read_text()
    recipe = write_recipe(tmp_path, test_image, raw=raw)
    plan = plan_for(recipe, write_profile(tmp_path, {"kind": "local"}, container_run_args))
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    if applies:
        outcome = Runner(poll_s=0.2).execute(plan, rd, LocalCluster())
    else:
        with pytest.raises(InfraError, match="the node script failed"):
            Runner(poll_s=0.2).execute(plan, rd, LocalCluster())
    node_log = (rd.logs / "node.log").read_text()
    train_log = (rd.logs / "train.log").read_text()
    assert (TESTS / "standin_miles" / "train.py").read_text() == host_copy
    if applies:
        assert outcome.state == "done", node_log[-3000:]
        assert "reproduce: patch mark applied to /root/miles" in node_log
        assert "STANDIN-PATCHED" in train_log and " - step 19: " in train_log
        assert plan.to_dict()["patches"] == [  # plan.json, as the run directory records it
            {"name": "mark", "checkout": "/root/miles", "sha256": sha(diff)}
        ]
    else:
        assert rd.timeline().stages[-1].name == "convert"  # stopped before ray and train
        assert "patch mark does not apply to /root/miles" in node_log
        assert " - step " not in train_log and "STANDIN-PATCHED" not in node_log
