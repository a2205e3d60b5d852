"""Never leak a paid node, whichever AWS call goes wrong (docs/architecture.md, principle 6).

The fault tests beside this one each pick a moment (the launch refused, the instance never ready,
Ctrl-C while it boots). This one is their adversary: it records every call a run makes on moto,
then runs again once per call, failing exactly that call, once, in each way a call can end early:

- `aws-error`: AWS answers with an error (a 500, a throttle that outlasted botocore's retries);
- `answer-lost`: the call took effect and its answer never came (the read timed out): what it
  made exists and the launcher never learnt its name (walked over the calls that make something:
  a read that loses its answer is an AWS error to the launcher, walked already);
- `ctrl-c-after`: the same, cut by Ctrl-C.

Whatever the position, the run must end with nothing of it left in the account; where the failed
call was one of the teardown's own and something is left, the error must name `reproduce down`,
and that must end it. A call added to the launch or the teardown later is walked without a new
test. EC2's consistency window (how long a RunInstances that got no answer is looked for) is cut
to a second here: the wait is not what is tested, what is found is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.aws import (
    NOTHING,
    AnswerLost,
    client_error,
    ec2_of,
    live_resources,
    two_node_recipe,
)
from support.aws import cluster as aws_cluster

from launcher.clusters.aws import ownership
from launcher.clusters.aws.down import down
from launcher.errors import ReproduceError

pytestmark = pytest.mark.aws


def _read_timeout() -> BaseException:
    from botocore.exceptions import ReadTimeoutError

    return ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com/")


FAULTS: dict[str, Callable[[], Any]] = {
    "aws-error": lambda: client_error("InternalError", "injected: the call failed", "Op"),
    "answer-lost": lambda: AnswerLost(_read_timeout()),
    "ctrl-c-after": lambda: AnswerLost(KeyboardInterrupt()),
}


# The calls that make something (an instance, a group, a key, an address, a rule, a placement)
MAKERS = ("run_", "create_", "allocate_", "associate_", "authorize_", "import_")


class OneCall(dict):
    """The recording clients' fault table answering for every call name: the `at`-th call
    (counted over all names, from 0) gets the fault; every other call goes through."""

    def __init__(self, at: int, make: Callable[[], Any]) -> None:
        super().__init__()
        self.at, self.make, self.seen = at, make, 0

    def get(self, name: str, default: Any = None) -> Any:  # noqa: ARG002 - dict's signature
        self.seen += 1
        return self.make() if self.seen - 1 == self.at else None


def run(c: Any, tmp_path: Path) -> str:
    """`c` driven by the real run path (Runner.execute), as `reproduce RECIPE --cluster aws` is:
    the SSH banner answers but no sshd does, so every run ends in its teardown. Returns what the
    run said when it ended."""
    from support.nodescript import plan_running

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    plan = plan_running("w1", str(tmp_path / "node"), "echo never reached\n")
    try:
        Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c)
    except (ReproduceError, KeyboardInterrupt) as err:
        return str(err)
    raise AssertionError("the run succeeded without a node to run on")


def walk(aws, ami, tmp_path: Path, port: int, recipe: Any, kind: str) -> None:
    """Run once clean to learn the calls, then once per call with that call failing."""
    clean = tmp_path / "clean"
    clean.mkdir()
    run(aws_cluster(aws, ami, clean, run_id="w1", recipe=recipe, port=port), clean)
    assert live_resources(ec2_of(aws)) == NOTHING
    names = aws.calls.names()
    assert "run_instances" in names and "terminate_instances" in names
    for at, name in enumerate(names):
        if kind == "answer-lost" and not name.startswith(MAKERS):
            continue
        where = tmp_path / str(at)
        where.mkdir()
        aws.faults = OneCall(at, FAULTS[kind])
        said = run(aws_cluster(aws, ami, where, run_id="w1", recipe=recipe, port=port), where)
        aws.faults = {}
        left = live_resources(ec2_of(aws))
        if left == NOTHING:
            continue
        what = f"call {at} ({name}) failed ({kind}) and {left} was left"
        assert "reproduce down" in said, f"{what}, not named:\n{said}"
        down(where / "run", session=aws, poll_s=0.01, log=lambda m: None)
        assert live_resources(ec2_of(aws)) == NOTHING, f"{what}; `reproduce down` did not end it"


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ownership, "CONSISTENCY_WINDOW_S", 1.0)


@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_failure_at_any_call_of_a_two_node_run_leaves_nothing(
    aws, ami, tmp_path, banner, short_window, kind
):
    """Two nodes: every call a one-node run makes (the seed's), and the placement group besides.
    Ctrl-C before a call reaches AWS is not walked: it is `ctrl-c-after` with less made."""
    walk(aws, ami, tmp_path, banner.port, two_node_recipe(tmp_path), kind)
