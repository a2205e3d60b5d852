"""`reproduce nightly` on AWS: the recipes of one node shape share ONE launched node.

AWS is moto (in this process, behind the recording session: every call's name is counted); the
launched instance is the sshd fixture, reached at connect_host 127.0.0.1 with its real host key.
The nightly is the real one (nightly -> run_recipe -> prepare -> Runner.run -> AwsCluster), the
only change a test needs being the node script: a hand-written one with the Plan's stage markers
whose train stage prints a stand-in miles log (or fails, or waits to be interrupted), because the
image path is tested elsewhere (tests/e2e/test_aws_e2e.py). What a paying user cares about: one
launch and one terminate for N recipes, a run directory with its own verdict and timeline for
each, and nothing left running on any way out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import yaml
from support.aws import NOTHING, OPERATOR_KEY, console, live_with_operator_key, write_profile
from support.measure import SEED, run_standin, seed_raw, step_times_for_tps
from support.nodescript import script
from support.page_read import parse

import launcher.clusters.aws as aws_backend
import launcher.runner.prelaunch as prelaunch
from launcher.runner.nightly import nightly, run_recipe
from launcher.runner.nightly_groups import split
from launcher.runner.reporter import QuietReporter

pytestmark = [pytest.mark.aws, pytest.mark.ssh]
CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]

# what the train stage of each recipe (by its layout label) does on the node
GOOD = "cat {log}"
FAILS = "echo 'CUDA error: an illegal memory access was encountered' >&2; exit 7"
WAITS = "touch {flag}; sleep 120"


@pytest.fixture(scope="module")
def good_log(tmp_path_factory) -> Path:
    log = tmp_path_factory.mktemp("log") / "train.log"
    assert run_standin(log, steps=20, step_time_s=step_times_for_tps(CLAIM)) == 0
    return log


def write_recipes(
    root: Path, labels: dict[str, str], gpu_hours: float | None | str = "seed's"
) -> list[Path]:
    """The seed once per label (a recipe's identity is its content); value: its gpu.instance."""
    out = []
    for label, instance in labels.items():
        raw = yaml.safe_load(SEED.read_text())
        raw["layout"]["label"] = label
        raw["gpu"]["instance"] = instance
        if gpu_hours != "seed's":  # what the budget's refusal before the launch compares
            raw["result"]["gpu_hours"] = gpu_hours
        path = root / "recipes" / "m" / "h200" / f"{label}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        out.append(path)
    return out


class Said(QuietReporter):
    """What the runs say, into the nightly's lines (the console's reporter prints them)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def say(self, text: str) -> None:
        self.lines.append(text)


class Night:
    """The moto account, the profile whose instance is the sshd, and the node scripts by label."""

    def __init__(self, aws, ami, sshd, tmp_path: Path, monkeypatch, good_log: Path) -> None:
        self.aws = aws
        self.ec2 = aws._real.client("ec2")
        self.tmp = tmp_path
        self.runs = tmp_path / "runs"
        self.flag = tmp_path / "second-started"
        self.ec2.import_key_pair(
            KeyName=OPERATOR_KEY, PublicKeyMaterial=Path(f"{sshd.identity_file}.pub").read_bytes()
        )
        aws.canned["get_console_output"] = console(sshd.host_fingerprint)  # the sshd's own key
        # a subnet of the profile's own: moto's zones offer no p5e (real ones do)
        vpc = self.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        subnet = self.ec2.create_subnet(
            VpcId=vpc, CidrBlock="10.9.0.0/24", AvailabilityZone="us-east-1a"
        )["Subnet"]["SubnetId"]
        self.profile = write_profile(
            tmp_path,
            ami=ami,
            subnet_id=subnet,
            key_name=OPERATOR_KEY,
            identity_file=str(sshd.identity_file),
            user=sshd.user,
            port=sshd.port,
            ready_timeout_s=20,
            price_per_hour=63.296,  # every shape priced (p5e has no on-demand price)
        )
        self.train: dict[str, str] = {}
        self.good_log = good_log
        real_from_plan = aws_backend.BACKEND.from_plan

        def from_plan(plan, options, run_dir, **kw):  # the recording session, fast polls
            cluster = real_from_plan(plan, options, run_dir, log=lambda _line: None)
            cluster._session, cluster.poll_s = aws, 0.01
            return cluster

        monkeypatch.setattr(aws_backend.BACKEND, "from_plan", from_plan)
        real_prepare = prelaunch.prepare

        def prepare(recipe_path, options):  # the Plan's own, with a hand-written node script
            prepared = real_prepare(recipe_path, options)
            plan = prepared.plan
            node_dir = str(tmp_path / "node" / plan.run_id)
            what = self.train[prepared.recipe.raw["layout"]["label"]]
            what = what.format(log=shlex.quote(str(good_log)), flag=shlex.quote(str(self.flag)))
            body = f"_mark preflight start\n_mark preflight end ok\n_mark train start\n{what}\n"
            body += "_mark train end ok\n"
            text = script(plan.run_id, node_dir, plan.container, body)
            plan = dataclasses.replace(plan, node_run_dir=node_dir, node_script=text)
            return dataclasses.replace(prepared, plan=plan)

        monkeypatch.setattr(prelaunch, "prepare", prepare)

    def nightly(self, recipes: list[Path], lines: list[str] | None = None, **kw):
        out = lines if lines is not None else []
        return nightly(
            recipes,
            str(self.profile),
            runs_dir=self.runs,
            history=self.tmp / "h.sqlite",
            runner=partial(run_recipe, reporter=Said(out)),
            yes=True,
            echo=out.append,
            **kw,
        )

    def count(self, call: str) -> int:
        return self.aws.calls.names().count(call)

    def instances(self) -> list[dict]:
        return [i for r in self.ec2.describe_instances()["Reservations"] for i in r["Instances"]]


@pytest.fixture
def night(aws, ami, sshd, tmp_path, monkeypatch, good_log) -> Night:
    return Night(aws, ami, sshd, tmp_path, monkeypatch, good_log)


def timeline(run_dir: Path) -> dict:
    return json.loads((run_dir / "timeline.json").read_text())


def verdict(run_dir: Path) -> str:
    return json.loads((run_dir / "verdict.json").read_text())["status"]


P5EN = "AWS p5en.48xlarge"
P5E = "AWS p5e.48xlarge"


def test_two_recipes_of_one_shape_share_one_launch_and_one_terminate(night, tmp_path):
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN})
    night.train = {"a": GOOD, "b": GOOD}
    lines: list[str] = []
    result = night.nightly(recipes, lines)
    out = "\n".join(lines)

    assert [e.outcome for e in result.entries] == ["reproduced", "reproduced"], out
    assert result.exit_code == 0
    assert night.count("run_instances") == 1  # one provisioning for the two recipes
    assert night.count("terminate_instances") == 1  # one release, after the last recipe
    [instance] = night.instances()
    assert instance["State"]["Name"] == "terminated"
    assert live_with_operator_key(night.ec2) == NOTHING

    first, second = (e.run.run_dir for e in result.entries)
    assert first is not None and second is not None and first != second
    assert verdict(first) == verdict(second) == "reproduced"  # a verdict each
    t1, t2 = timeline(first), timeline(second)
    assert [s["name"] for s in t1["stages"]] == [s["name"] for s in t2["stages"]]
    assert ["preflight", "train"] == [s["name"] for s in t2["stages"]]
    # each run's own clock: the second starts after the first ended, on the node already there
    assert t1["acquired_at"] < t1["released_at"] <= t2["acquired_at"] < t2["released_at"]
    # both ran on the one instance, and say so; the first run's directory holds its state
    r1, r2 = (json.loads((d / "run.json").read_text()) for d in (first, second))
    assert r1["node"]["meta"]["instance_id"] == r2["node"]["meta"]["instance_id"]
    assert r1["node"]["meta"]["instance_id"] == instance["InstanceId"]
    assert [r1["shared_node"]["turn"], r2["shared_node"]["turn"]] == [1, 2]
    assert r2["shared_node"]["holder"] == str(first) and r2["shared_node"]["recipes"] == 2
    assert not (second / "aws.json").exists()
    assert json.loads((first / "aws.json").read_text())["terminated"] == [instance["InstanceId"]]
    # the split: the node's hours are the recipes' own plus the shared, shown once
    [group] = result.groups
    assert group.node is not None and group.node.acquire_s is not None
    assert "acquired once" in out and "released once" in out and "GPU-hours: held" in out
    assert f"on the nightly group's node, acquired by {first}" in out  # the second run says so
    summary = result.summary_path.read_text() if result.summary_path else ""
    assert "## Node groups" in summary and "2 recipe(s) on one node" in summary
    # the page shows the node too: both runs on it, its hours split as the summary splits them
    page = parse(result.page_path.read_text())
    [node] = [d for _, d in page.attrs if "data-node-group" in d]
    assert node["data-node-group"] == group.label
    hours = split(group)
    assert float(node["data-held-gpu-hours"]) == pytest.approx(hours["held"], abs=1e-6)
    own = [float(d["data-own-gpu-hours"]) for _, d in page.attrs if "data-own-gpu-hours" in d]
    assert own == pytest.approx([hours[e.row.run_id] for e in result.entries], abs=1e-6)
    shared = float(node["data-shared-gpu-hours"])  # each shown to 6 places: 3 roundings at most
    assert sum(own) + shared == pytest.approx(hours["held"], abs=2e-6)
    assert "acquired once" in "".join(page.text)


def test_a_held_node_whose_ttl_has_no_room_for_the_next_recipe_hands_the_rest_a_new_node(
    night, tmp_path
):
    """The night ran longer than estimated: before the node is lent again, what its TTL has left
    (a clock 5.9 of the profile's 6 hours on) is less than the next recipe needs on it, so the
    node is released and the rest of the group get a node of their own, not a run the TTL cuts."""
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN})
    night.train = {"a": GOOD, "b": GOOD}
    lines: list[str] = []
    result = night.nightly(recipes, lines, clock=lambda: time.time() + 5.9 * 3600)
    out = "\n".join(lines)
    assert [e.outcome for e in result.entries] == ["reproduced", "reproduced"], out
    assert night.count("run_instances") == 2 and night.count("terminate_instances") == 2
    assert all(i["State"]["Name"] == "terminated" for i in night.instances())
    assert live_with_operator_key(night.ec2) == NOTHING
    assert "ends itself at its TTL" in out and "its next 1 recipe(s) go to a new node" in out
    assert [g.recipes for g in result.groups] == [recipes[:1], recipes[1:]]
    assert all(g.node is not None and g.node.released_at is not None for g in result.groups)
    first, second = (e.run.run_dir for e in result.entries)
    r1, r2 = (json.loads((d / "run.json").read_text()) for d in (first, second))
    assert r1["node"]["meta"]["instance_id"] != r2["node"]["meta"]["instance_id"]


def test_a_failure_in_the_first_recipe_still_runs_the_second_on_the_node_and_releases_once(
    night, tmp_path
):
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN})
    night.train = {"a": FAILS, "b": GOOD}
    result = night.nightly(recipes)

    assert [e.outcome for e in result.entries] == ["check failed", "reproduced"]
    assert result.exit_code == 1
    assert "illegal memory access" in (result.entries[0].run.error or "")
    assert night.count("run_instances") == 1 and night.count("terminate_instances") == 1
    assert verdict(result.entries[1].run.run_dir) == "reproduced"
    assert live_with_operator_key(night.ec2) == NOTHING


def test_ctrl_c_in_the_second_recipe_cancels_it_and_releases_the_node(night, tmp_path):
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN, "c": P5EN})
    night.train = {"a": GOOD, "b": WAITS, "c": GOOD}

    def press_ctrl_c() -> None:  # once the second recipe's training runs on the node
        deadline = time.monotonic() + 120
        while not night.flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    result = night.nightly(recipes)

    assert [e.outcome for e in result.entries] == ["reproduced", "interrupted"]  # c never began
    assert result.exit_code == 130
    second = result.entries[1].run.run_dir
    assert second is not None
    assert json.loads((second / "status.json").read_text())["state"] == "cancelled"
    assert night.count("run_instances") == 1 and night.count("terminate_instances") == 1
    assert night.instances()[0]["State"]["Name"] == "terminated"
    assert live_with_operator_key(night.ec2) == NOTHING


def test_recipes_of_two_shapes_get_a_node_each(night, tmp_path):
    # given in mixed order: each shape's recipes run on their shape's node
    recipes = write_recipes(tmp_path, {"a": P5EN, "e": P5E, "b": P5EN})
    night.train = {"a": GOOD, "b": GOOD, "e": GOOD}
    result = night.nightly(recipes)

    assert [e.recipe.stem for e in result.entries] == ["a", "b", "e"]  # by group, then order
    assert all(e.outcome == "reproduced" for e in result.entries), [
        (e.outcome, e.run.error) for e in result.entries
    ]
    assert night.count("run_instances") == 2 and night.count("terminate_instances") == 2
    types = sorted(i["InstanceType"] for i in night.instances())
    assert types == ["p5e.48xlarge", "p5en.48xlarge"]
    ids = [
        json.loads((e.run.run_dir / "run.json").read_text())["node"]["meta"]["instance_id"]
        for e in result.entries
    ]
    assert ids[0] == ids[1] != ids[2]
    assert len(result.groups) == 2
    assert live_with_operator_key(night.ec2) == NOTHING


def test_a_node_lost_in_a_run_ends_its_group_the_rest_recorded_as_not_run(night, tmp_path):
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN, "c": P5EN})
    night.train = {"a": GOOD, "b": GOOD, "c": GOOD}
    real = run_recipe
    ran: list[str] = []

    def runner(recipe, options, *, held=None):
        ran.append(recipe.stem)
        run = real(recipe, options, held=held)
        if recipe.stem == "a":  # the instance dies (a spot interruption) after the first run
            [instance] = night.instances()
            night.ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
        return run

    result = nightly(
        recipes,
        str(night.profile),
        runs_dir=night.runs,
        history=tmp_path / "h.sqlite",
        runner=partial(runner),
        yes=True,
    )

    assert ran == ["a"]  # b and c were not started on a dead node, nor on a new one
    assert [e.outcome for e in result.entries] == ["reproduced", "infra", "infra"]
    for entry in result.entries[1:]:
        assert entry.run.run_dir is None
        assert "not run" in (entry.run.error or "") and "terminated" in (entry.run.error or "")
        assert entry.row.state == "failed"  # in the history, with its reason
    assert result.exit_code == 3
    assert night.count("run_instances") == 1  # no fresh node was bought for the rest
    assert live_with_operator_key(night.ec2) == NOTHING  # and what was made is gone


def test_ctrl_c_between_two_recipes_still_releases_the_node(night, tmp_path):
    """Not in any run (the nightly's own moment between two): the group's release still runs."""
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN})
    night.train = {"a": GOOD, "b": GOOD}

    def echo(line: str) -> None:
        if line.startswith("[nightly 2/2]"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        nightly(
            recipes,
            str(night.profile),
            runs_dir=night.runs,
            history=tmp_path / "h.sqlite",
            runner=run_recipe,
            yes=True,
            echo=echo,
        )
    assert night.count("run_instances") == 1 and night.count("terminate_instances") == 1
    assert live_with_operator_key(night.ec2) == NOTHING


def test_a_budget_stop_is_the_runs_own_the_next_recipe_runs_on_the_node_on_its_own_clock(
    night, tmp_path
):
    """--max-hours is a limit of each run (docs/measurement.md): the first is stopped at it, the
    second runs whole on the same node although the node has been held longer than the limit."""
    limit_h = 0.008  # 28.8 s of the run's own clock
    # no GPU-hours claimed: nothing to refuse before the launch (a claim under the window's own
    # time, as 0.01 was, is refused by validate)
    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN}, gpu_hours=None)
    night.train = {"a": WAITS, "b": GOOD}
    result = night.nightly(recipes, max_hours=limit_h)

    a, b = result.entries
    assert a.outcome == "check failed" and "--max-hours" in (a.run.error or ""), a.run.error
    assert b.outcome == "reproduced", b.run.error
    [group] = result.groups
    node = group.node
    assert node is not None and node.acquire_started is not None and node.released_at
    assert node.released_at - node.acquire_started > limit_h * 3600  # held past one run's limit
    budget = json.loads((b.run.run_dir / "run.json").read_text())["budget"]
    assert budget["max_hours"] == limit_h
    assert night.count("run_instances") == 1 and night.count("terminate_instances") == 1
    assert live_with_operator_key(night.ec2) == NOTHING


def test_a_release_that_cannot_finish_is_said_with_what_is_left_and_exits_3(night, tmp_path):
    """Every run reproduced, but the node could not be ended: not a green night (exit 3), and
    the summary says what is left; `reproduce down` of the holder's directory ends it."""
    from support.aws import client_error

    recipes = write_recipes(tmp_path, {"a": P5EN, "b": P5EN})
    night.train = {"a": GOOD, "b": GOOD}
    night.aws.faults["terminate_instances"] = client_error("UnauthorizedOperation", "denied")
    lines: list[str] = []
    result = night.nightly(recipes, lines)
    out = "\n".join(lines)

    assert [e.outcome for e in result.entries] == ["reproduced", "reproduced"]
    assert result.exit_code == 3, out
    [group] = result.groups
    assert group.node is not None and group.node.release_error
    assert "the release did not finish" in out and "NOT released" in out
    [instance] = night.instances()
    assert instance["State"]["Name"] == "running"  # left, and said so
    assert night.count("run_instances") == 1

    del night.aws.faults["terminate_instances"]  # the operator's second try ends it
    assert group.node.release() is None
    assert live_with_operator_key(night.ec2) == NOTHING
