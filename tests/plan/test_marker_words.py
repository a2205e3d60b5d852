"""A stage marker says only what node.sh's stage functions print (launcher/plan/protocol.py,
`parse_marker`); anything else on a `##reproduce` line is a line of its stage's log.

Why: a marker's words reach the operator's screen, timeline.json, the report and the attestation,
and the recipe's code prints into the same stream. Found 2026-12-04: a container printing
`##reproduce stage=train event=end status='ok<ESC>]52;c;...'` had the console write the escape
sequence (an OSC 52 sets the operator's clipboard) and a fake verdict line. The adversary below
takes each marker the real stage functions print and spoils each of its words in turn, and adds
a word: none may parse; the unspoilt ones must.
"""

from __future__ import annotations

import subprocess

import pytest

from launcher.plan import protocol

HOSTILE = [
    "ok\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",  # OSC 52: the clipboard
    "\x1b[2J\x1b[H",  # clear the screen
    "x\nVERDICT: reproduced",
    "../../etc/passwd",
    "node",
    "",
    "a" * 5000,
]


def real_markers(tmp_path) -> list[bytes]:
    script = (
        f"NODE_RUN_DIR={tmp_path}\n_cleanup() {{ :; }}\n{protocol.STAGE_FUNCTIONS}\n"
        "trap _on_exit EXIT\n_stage_begin image; _stage_end\n_stage_begin train; exit 7\n"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True).stdout
    return [line for line in out.splitlines() if line.startswith(b"##reproduce stage=")]


def test_every_marker_the_stage_functions_print_parses(tmp_path):
    markers = real_markers(tmp_path)
    assert len(markers) == 4
    assert all(protocol.parse_marker(m) is not None for m in markers)


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_marker_with_any_word_spoilt_is_not_a_marker(tmp_path, bad):
    for line in real_markers(tmp_path):
        fields = protocol.parse_marker(line)
        assert fields is not None
        for key in fields:
            if key == "t" and bad in ("node", "../../etc/passwd"):
                continue  # printable: an unreadable time is no time (records/rundir.py)
            if key == "n" and bad == "":
                continue  # no nonce: what a container's own markers carry (MarkerGate)
            spoilt = {**fields, key: bad}
            text = " ".join(f"{k}={protocol.shlex.quote(v)}" for k, v in spoilt.items())
            assert protocol.parse_marker(f"##reproduce {text}".encode()) is None, (key, bad)
        extra = line + b" verdict=reproduced"
        assert protocol.parse_marker(extra) is None
        assert protocol.parse_marker(line + b" status=ok") is None  # a word twice


def test_a_progress_label_cannot_carry_an_escape_to_the_screen():
    line = b"##reproduce progress stage=assets done=1 total=2 item='x\x1b]52;c;YQ==\x07y'\n"
    (found,) = protocol.progress_in(line)
    assert "\x1b" not in found.item and "\x07" not in found.item
    assert protocol.progress_in(b"##reproduce progress stage=../x done=1\n") == []
