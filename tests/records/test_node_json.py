"""The one reader of node-written JSON (launcher/records/jsonread.py) keeps its limits.

The readers that use it are held against the same hostile documents in
tests/runner/test_outcome_node_json.py; here each limit of the reader itself: what is read, what
is refused, and that nothing but a NodeJSONError (or a NodeDoc that says why) comes out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.errors import InfraError, ReproduceError
from launcher.records import jsonread
from launcher.records.jsonread import MAX_BYTES, MAX_DEPTH, Fields, NodeJSONError

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_real_report_reads_as_it_is():
    path = DATA / "node" / "stack.json"
    doc = jsonread.read(path)
    assert doc.problem is None and doc.value == json.loads(path.read_text())
    assert [c.word("name") for c in doc.fields.records("checks")][:2] == [
        "miles_commit",
        "miles_tree_clean",
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), "nested deeper"),
        ('{"a": ' + "9" * 5_000 + "}", "5,000 digits"),
        ('{"a": -' + "9" * 31 + "}", "31 digits"),
        ("{", "not JSON"),
        ("", "not JSON"),
        ('{"a": 1} x', "more after"),
        ("\ufeff{}", "not JSON"),
    ],
)
def test_what_is_refused_is_a_node_json_error(text, why):
    with pytest.raises(NodeJSONError) as info:
        jsonread.loads(text)
    assert why in str(info.value)
    assert isinstance(info.value, InfraError)


def test_numbers_are_finite_and_texts_are_utf8():
    doc = jsonread.loads(
        '{"nan": NaN, "inf": Infinity, "minf": -Infinity, "big": 1e999, "ok": 1.5,'
        ' "int": '
        + "9" * 30
        + ', "lone": "\\ud800x", "\\udfffkey": ["\\ud83d"], "pair": "\\ud83d\\ude00"}'
    )
    assert doc["nan"] is None and doc["inf"] is None and doc["minf"] is None
    assert doc["big"] is None and doc["ok"] == 1.5 and doc["int"] == int("9" * 30)
    assert doc["lone"] == "?x" and doc["?key"] == ["?"] and doc["pair"] == "\U0001f600"
    json.dumps(doc, allow_nan=False).encode("utf-8")  # writes out again


def test_a_file_is_read_only_when_it_is_a_regular_file_within_the_cap(tmp_path):
    assert jsonread.read(tmp_path / "absent.json").missing
    (tmp_path / "file").write_text("x")
    assert jsonread.read(tmp_path / "file" / "below-a-file.json").missing
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BYTES + 1))
    assert "more than" in (jsonread.read(big).problem or "")
    link = tmp_path / "link.json"
    link.symlink_to(DATA / "node" / "image.json")
    assert "cannot be opened" in (jsonread.read(link).problem or "")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert jsonread.read(fifo).problem == "not a regular file"  # never blocks
    assert jsonread.read(tmp_path).problem == "not a regular file"
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"host": "\xff\xfe"}')
    assert jsonread.read(bad).fields.text("host") == "\ufffd\ufffd"


@pytest.mark.parametrize(
    "value",
    [None, 5, "x", [1, 2], {"k": {"k": [1]}}, True, 1.5, [{"a": 1}, 2, "b"], {"a": None}],
)
def test_every_getter_gives_its_type_whatever_the_key_holds(value):
    fields = Fields({"k": value})
    assert fields.text("k") is None or isinstance(fields.text("k"), str)
    assert isinstance(fields.word("k"), str)
    assert fields.scalar("k") is None or isinstance(fields.scalar("k"), (str, int, float, bool))
    number = fields.number("k")
    assert number is None or (isinstance(number, (int, float)) and not isinstance(number, bool))
    assert fields.flag("k") in (None, True, False)
    assert isinstance(fields.obj("k"), Fields)
    assert all(isinstance(r, Fields) for r in fields.records("k"))
    assert all(isinstance(w, str) for w in fields.words("k"))
    assert not Fields(value).has("anything") or isinstance(value, dict)


def test_the_error_is_a_reproduce_error_with_an_exit_code():
    assert issubclass(NodeJSONError, ReproduceError) and NodeJSONError.exit_code == 3
