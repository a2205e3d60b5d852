"""The node protocol as text: each command the launcher sends a node is a golden file, and the
stage markers the node script prints are read back by the one parser (both in
launcher/plan/protocol.py). Regenerate the golden files with the command in tests/support/golden.py.
"""

from __future__ import annotations

import subprocess

import pytest
from support.golden import assert_golden

from launcher.plan import protocol
from launcher.plan.background import BACKGROUND_FUNCTIONS

NODE_RUN_DIR = "/var/tmp/reproduce/runs/20260101T000000Z-abcdef"
CONTAINER = "reproduce-20260101T000000Z-abcdef"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("wrapper.sh", protocol.WRAPPER),
        ("launch.sh", protocol.launch_command(NODE_RUN_DIR)),
        ("poll.sh", protocol.poll_command(NODE_RUN_DIR)),
        ("cancel.sh", protocol.cancel_command(NODE_RUN_DIR, CONTAINER)),
        ("cleanup.sh", protocol.cleanup_command(CONTAINER)),
        ("stage-functions.sh", protocol.STAGE_FUNCTIONS),
        ("background-functions.sh", BACKGROUND_FUNCTIONS),
        ("prepare.sh", protocol.prepare_dir_command(NODE_RUN_DIR)),
        ("collect.sh", protocol.collect_command(NODE_RUN_DIR)),
    ],
)
def test_node_protocol_text_is_the_golden_one(name: str, text: str) -> None:
    assert_golden(f"protocol/{name}", text if text.endswith("\n") else text + "\n")


@pytest.mark.parametrize(
    "name", ["wrapper", "launch", "poll", "cancel", "cleanup", "stages", "prepare", "collect"]
)
def test_every_protocol_text_is_valid_bash(name: str) -> None:
    texts = {
        "wrapper": protocol.WRAPPER,
        "launch": protocol.launch_command("/tmp/a dir/with 'quotes'"),
        "poll": protocol.poll_command("/tmp/a dir/with 'quotes'"),
        "cancel": protocol.cancel_command("/tmp/a dir/with 'quotes'", CONTAINER),
        "cleanup": protocol.cleanup_command(CONTAINER),
        "stages": protocol.STAGE_FUNCTIONS,
        "prepare": protocol.prepare_dir_command("/tmp/a dir/with 'quotes'/runs/x"),
        "collect": protocol.collect_command("/tmp/a dir/with 'quotes'"),
    }
    proc = subprocess.run(["bash", "-n"], input=texts[name], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_markers_the_node_script_prints_are_the_ones_the_runner_reads(tmp_path) -> None:
    """The stage functions (rendered into every node script) against the runner's parser."""
    script = (
        f"NODE_RUN_DIR={tmp_path}\n_cleanup() {{ :; }}\n{protocol.STAGE_FUNCTIONS}\n"
        "trap _on_exit EXIT\n"
        "_stage_begin image; echo pulling; _stage_end\n"
        "_stage_begin train; echo step; exit 7\n"
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True)
    assert proc.returncode == 7
    markers = [protocol.parse_marker(line) for line in proc.stdout.splitlines()]
    seen = [(m["stage"], m["event"], m.get("status"), m.get("rc")) for m in markers if m]
    assert seen == [
        ("image", "start", None, None),
        ("image", "end", "ok", None),
        ("train", "start", None, None),
        ("train", "end", "failed", "7"),
    ]
    assert all(float(m["t"]) > 0 for m in markers if m)
    assert protocol.parse_marker(b"step 3: {'loss': 1.0}") is None
    assert protocol.parse_marker(b"##reproduce done") is None  # the end line is no stage event


@pytest.mark.parametrize(
    ("stdout", "code", "answer"),
    [
        ("exit 0\n", 0, ("exit", 0)),
        ("exit 137\n", 0, ("exit", 137)),
        ("exit ?\n", 0, ("exit", None)),  # an unreadable exit_code file
        ("alive\n", 0, ("alive", None)),
        ("gone\n", 0, ("gone", None)),
        ("alive\n", 255, None),  # a broken exchange, not news about the run
        ("Connection reset\n", 0, None),
    ],
)
def test_poll_answers(stdout: str, code: int, answer) -> None:
    assert protocol.parse_poll(stdout, code) == answer


def test_cancel_reports_what_it_could_not_stop() -> None:
    assert protocol.parse_cancel("left:\n") == ""
    assert protocol.parse_cancel("noise\nleft: container reproduce-x\n") == "container reproduce-x"
    assert protocol.parse_cancel("") == ""
