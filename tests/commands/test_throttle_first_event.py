"""Every throttle shows its first event, whatever the clock reads (issue 22).

`time.monotonic()` counts from the boot on Linux: a throttle that compared it with a start of 0.0
hid the first event on a machine up for less than its interval (a fresh CI runner, a node just
booted). Each throttle of the launcher and of the node programs is driven here by a clock that
starts near zero, as on such a machine, and must show its first event, then hold the next ones
back for its interval, then show one again.
"""

from __future__ import annotations

import io
import itertools

import pytest
from support.node_scripts import load_script

from launcher.commands.prepare import PlainEvents
from launcher.commands.throttle import Throttle


class Clock:
    """A monotonic clock under the test's control, starting where a fresh machine's does."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("start", [0.0, 0.001, 0.5, 14.9, 3599.0])
def test_a_throttle_shows_the_first_event_of_each_key_at_any_clock_reading(start: float):
    clock = Clock(start)
    throttle = Throttle(every_s=3600, clock=clock)
    assert throttle.due("a") and throttle.due("b")  # each key's first
    assert not throttle.due("a")
    clock.now += 3599.9
    assert not throttle.due("a")
    assert throttle.due("a", force=True)  # the last of a transfer is always shown
    clock.now += 3601
    assert throttle.due("a")


@pytest.mark.parametrize("start", [0.0, 1.0, 14.0])
def test_prepare_shows_each_files_first_line_on_a_freshly_booted_machine(start: float):
    clock = Clock(start)
    out = io.StringIO()
    events = PlainEvents(every_s=15.0, stream=out, clock=clock)
    events.progress("hf_ckpt", "a.safetensors", 0, 1_000_000)
    events.progress("hf_ckpt", "a.safetensors", 1, 1_000_000)  # held back
    clock.now += 15.0
    events.progress("hf_ckpt", "a.safetensors", 500_000, 1_000_000)
    assert out.getvalue().splitlines() == [
        "hf_ckpt: a.safetensors: 0.0 of 1.0 MB (0%)",
        "hf_ckpt: a.safetensors: 0.5 of 1.0 MB (50%)",
    ]


@pytest.mark.parametrize("start", [0.0, 0.2, 14.0])
def test_the_node_transfer_lines_show_each_files_first_line_on_a_fresh_node(start, monkeypatch):
    resolve = load_script("asset_resolve")
    clock = Clock(start)
    monkeypatch.setattr(resolve.time, "monotonic", clock)
    lines: list[str] = []
    progress = resolve.Throttled("hf_ckpt", lines.append, every_s=15.0, stage="")
    progress("a.safetensors", 0, 1_000_000)
    progress("a.safetensors", 10, 1_000_000)  # held back
    assert lines == ["hf_ckpt: a.safetensors: 0.0 of 1.0 MB (0%)"]


def test_the_node_progress_line_is_printed_first_on_a_fresh_node(monkeypatch, capsys):
    resolve = load_script("asset_resolve")
    clock = Clock(0.1)
    monkeypatch.setattr(resolve.time, "monotonic", clock)
    progress = resolve.Throttled("hf_ckpt", lambda _line: None, every_s=15.0, stage="assets")
    progress("a.safetensors", 5, 1_000_000)
    out = capsys.readouterr().err
    assert "##reproduce progress stage=assets done=5 total=1000000" in out


def test_the_image_pull_shows_its_first_progress_line_on_a_fresh_node(
    tmp_path, monkeypatch, capsys
):
    pull = load_script("pull_progress")
    docker = tmp_path / "docker"  # says one layer is a quarter in, then that the pull is done
    docker.write_text(
        "#!/bin/bash\n"
        '[ "$1" = pull ] || exit 1\n'
        "printf '4ddc566b57ff: Downloading [==>   ]  10.00MB/40.00MB\\r\\n'\n"
        "sleep 0.2\n"
        "printf '4ddc566b57ff: Pull complete\\r\\n'\n"
    )
    docker.chmod(0o755)
    ticks = itertools.count()
    monkeypatch.setattr(pull.time, "monotonic", lambda: 0.001 * next(ticks))  # booted just now
    assert pull.pull("registry.test/img@sha256:" + "0" * 64, docker=str(docker)) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("##reproduce")]
    assert lines[0] == (
        "##reproduce progress stage=image done=10000000 total=40000000 unit=bytes item='0/1 layers'"
    )
