"""At a terminal, every line about money stays on screen above the live line, and a finished
transfer leaves no bar behind: read back from a real terminal (tmux, tests/support/screen.py)
at the end of an aws run (moto, the sshd fixture as its instance, the real image pull) and of a
launch that failed at its first AWS call."""

from __future__ import annotations

import pytest
from support.aws import aws_profile
from support.operator_cli import REPO, SEED, RecordingEndpoint, aws_env
from support.plan_env import write_recipe
from support.screen import Screen

BAR = "━"  # rich's progress bar


def _lines(screen: str) -> list[str]:
    return [line.rstrip() for line in screen.splitlines()]


def _line_with(lines: list[str], text: str) -> str:
    found = [line for line in lines if text in line]
    assert found, f"{text!r} is not on the screen:\n" + "\n".join(lines[-60:])
    return found[-1]


@pytest.mark.aws
@pytest.mark.docker
@pytest.mark.ssh
def test_the_end_of_an_aws_run_stays_on_screen(
    moto_aws,
    sshd,
    test_image,
    container_run_args,
    tmp_path,
):
    recipe = write_recipe(tmp_path, test_image)
    profile = aws_profile(moto_aws, sshd, tmp_path, container_run_args)
    argv = moto_aws.command(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(tmp_path / "runs"), "--yes"
    )
    screen = Screen(tmp_path / "term").start(argv, moto_aws.env, REPO)
    try:
        code = screen.exit_code(timeout=400)
        shown = screen.screen()
    finally:
        screen.stop()
    lines = _lines(shown)
    # The run's own outcome is test_aws_e2e's subject; here it is what stays on the screen at
    # its end, which holds whether the run was judged or failed in a stage (a loaded machine can
    # time Ray out): the release and its lines come either way.
    assert code in (0, 1, 3), "\n".join(lines[-60:])
    # each money line whole, on a line of its own (not drawn onto a stale progress row)
    terminating = _line_with(lines, "aws: terminating i-")
    assert terminating.lstrip("[ 0123456789.s]").startswith("aws: terminating i-"), terminating
    gone = _line_with(lines, "aws: everything this run created is gone")
    assert gone.lstrip("[ 0123456789.s]").startswith("aws: everything"), gone
    assert lines.index(gone) > lines.index(terminating)
    if code == 0:
        _line_with(lines, "verdict: reproduced")
    assert not [line for line in lines if BAR in line], "a progress bar was left on screen"
    assert not [line for line in lines if "·" in line and "so far at $" in line.split("·")[-1]]


def test_a_failed_launch_says_what_happened_on_screen(tmp_path):
    endpoint = RecordingEndpoint().start()
    try:
        env = aws_env(endpoint, tmp_path)
        argv = [
            "python3", "-m", "launcher", str(SEED), "--cluster", "aws",
            "--runs-dir", str(tmp_path / "runs"), "--yes",
        ]  # fmt: skip
        import sys

        argv[0] = sys.executable
        screen = Screen(tmp_path / "term").start(argv, env, REPO)
        try:
            code = screen.exit_code(timeout=120)
            shown = screen.screen()
        finally:
            screen.stop()
    finally:
        endpoint.stop()
    lines = _lines(shown)
    assert code == 3
    said = _line_with(lines, "aws: nothing was created")
    assert said.lstrip("[ 0123456789.s]").startswith("aws: nothing was created"), said
    _line_with(lines, "error: finding the account of these credentials")
    assert "teardown did not finish" not in shown
