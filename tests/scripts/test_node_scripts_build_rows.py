"""scripts/build_sft_rows.py: permutation, EOS joins, exact row cuts, skipped rows, mask alignment.

Runs on a small synthetic conversation set with the built-in whitespace TEST tokenizer (the real
Qwen3 tokenizer and Tulu 3 cannot be reached here). The written parquet is read back and fed
through pretokenized_sft_rollout, the way miles would consume it.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.node_scripts import SCRIPTS, load_script

b = load_script("build_sft_rows")
ro = load_script("pretokenized_sft_rollout")
TOK = b.WhitespaceTestTokenizer()
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def conversations(n: int = 120, seed: int = 7) -> list[list[dict]]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        msgs = []
        if i % 5 == 0:
            msgs.append({"role": "system", "content": "be brief"})
        msgs.append(
            {"role": "user", "content": " ".join(r.choice(WORDS) for _ in range(r.randint(1, 25)))}
        )
        if i % 9:  # some conversations have no assistant turn at all
            msgs.append(
                {
                    "role": "assistant",
                    "content": " ".join(r.choice(WORDS) for _ in range(r.randint(1, 30))),
                }
            )
        out.append(msgs)
    return out


def write_jsonl(path: Path, convs: list[list[dict]]) -> Path:
    path.write_text(
        "".join(json.dumps({"messages": c, "id": i}) + "\n" for i, c in enumerate(convs))
    )
    return path


def expected_stream(convs, seed):
    order = np.random.default_rng(seed).permutation(len(convs)).tolist()
    ids, mask = [], []
    for k, i in enumerate(order):
        if k:
            ids.append(TOK.EOS)
            mask.append(0)
        ci, cm = TOK.encode(convs[i])
        ids += ci
        mask += cm
    return order, ids, mask


def le_int32_sha(rows) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(struct.pack(f"<{len(r)}i", *r))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# the packing, as a pure function


def test_rows_are_consecutive_cuts_of_the_eos_joined_stream():
    convs = [
        ([10, 11, 12], [0, 1, 1]),
        ([20, 21], [0, 1]),
        ([30, 31, 32, 33], [0, 0, 1, 1]),
        ([40], [1]),
    ]
    stats = b.PackStats()
    rows = list(b.pack_rows(iter(convs), 4, eos_id=0, stats=stats))
    # stream: 10 11 12 0 | 20 21 0 30 | 31 32 33 0 | (40) -> tail of 1 token dropped, no padding
    assert rows == [
        ([10, 11, 12, 0], [0, 1, 1, 0]),
        ([20, 21, 0, 30], [0, 1, 0, 0]),
        ([31, 32, 33, 0], [0, 1, 1, 0]),
    ]
    assert stats.conversations == 4 and stats.rows == 3 and stats.supervised_tokens == 5


def test_rows_without_supervised_tokens_are_skipped_and_counted():
    convs = [([1, 2], [1, 1]), ([3, 4, 5, 6, 7, 8, 9], [0] * 7), ([10, 11, 12], [0, 0, 1])]
    stats = b.PackStats()
    rows = list(b.pack_rows(iter(convs), 4, eos_id=0, stats=stats))
    # stream: 1 2 0 3 | 4 5 6 7 (no target: skipped) | 8 9 0 10 (no target: skipped) | 11 12 -> tail
    assert rows == [([1, 2, 0, 3], [1, 1, 0, 0])]
    assert stats.rows_skipped_unsupervised == 2 and stats.rows == 1


def test_a_conversation_longer_than_a_row_spans_several_rows():
    convs = [(list(range(100, 111)), [1] * 11), ([7], [1])]
    rows = list(b.pack_rows(iter(convs), 4, eos_id=0))
    assert [r[0] for r in rows] == [[100, 101, 102, 103], [104, 105, 106, 107], [108, 109, 110, 0]]


def test_token_and_mask_lengths_must_agree():
    with pytest.raises(b.BuildError, match="conversation 0: 2 tokens but 1 mask entries"):
        list(b.pack_rows(iter([([1, 2], [1])]), 4, eos_id=0))


def test_the_test_tokenizer_supervises_assistant_content_not_its_header():
    ids, mask = TOK.encode(
        [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}]
    )
    assert len(ids) == len(mask) == 7 + 6
    assert mask == [0] * 7 + [0, 0, 0, 1, 1, 1]
    assert ids[7] == TOK.IM_START and ids[-2:] == [TOK.IM_END, TOK.NL]


def test_permutation_is_seeded_and_global():
    a, again, other = b.permutation(1000, 42), b.permutation(1000, 42), b.permutation(1000, 43)
    assert a == again and a != other and sorted(a) == list(range(1000))
    assert (
        a == np.random.default_rng(42).permutation(1000).tolist()
    )  # datasets' shuffle(seed=42) draw


# ---------------------------------------------------------------------------------------------
# the whole build, through the CLI as the node runs it


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "build_sft_rows.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def build_cli(
    tmp_path: Path,
    convs,
    *,
    rows: int = 12,
    row_tokens: int = 48,
    seed: int = 42,
    name="rows.parquet",
    extra=(),
) -> tuple[subprocess.CompletedProcess[str], Path]:
    src = write_jsonl(tmp_path / "convs.jsonl", convs)
    out = tmp_path / name
    proc = run_build(
        "--source",
        str(src),
        "--tokenizer",
        b.TEST_TOKENIZER,
        "--row-tokens",
        str(row_tokens),
        "--rows",
        str(rows),
        "--seed",
        str(seed),
        "--out",
        str(out),
        *extra,
    )
    return proc, out


def test_parquet_rows_match_the_permuted_stream_and_the_printed_hashes(tmp_path):
    convs = conversations()
    proc, out = build_cli(tmp_path, convs)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    table = pq.read_table(out)
    assert table.schema.field("messages").type == pa.list_(pa.int64())
    assert table.schema.field("metadata").type == pa.struct(
        [("loss_mask", pa.list_(pa.int8())), ("supervised_tokens", pa.int64())]
    )
    got = table.to_pylist()
    assert summary["rows"] == len(got) == 12 and summary["padding_tokens"] == 0

    order, ids, mask = expected_stream(convs, 42)
    expected_rows = [(ids[i : i + 48], mask[i : i + 48]) for i in range(0, len(ids) - 47, 48)]
    expected_rows = [r for r in expected_rows if 1 in r[1]][:12]
    assert [r["messages"] for r in got] == [r[0] for r in expected_rows]
    assert [r["metadata"]["loss_mask"] for r in got] == [r[1] for r in expected_rows]
    assert all(r["metadata"]["supervised_tokens"] == sum(r["metadata"]["loss_mask"]) for r in got)
    # the first row starts with the first conversation of the permutation, not of the file
    first = TOK.encode(convs[order[0]])[0]
    assert got[0]["messages"][: len(first[:48])] == first[:48] and order[0] != 0

    assert summary["rows_sha256"] == le_int32_sha(r["messages"] for r in got)
    assert (
        b.rows_sha256(r["messages"] for r in got) == summary["rows_sha256"]
    )  # the helper docs name
    assert (
        summary["loss_mask_sha256"]
        == hashlib.sha256(b"".join(bytes(r["metadata"]["loss_mask"]) for r in got)).hexdigest()
    )
    assert summary["parquet_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert summary["parquet_bytes"] == out.stat().st_size
    assert summary["supervised_tokens"] == sum(sum(r["metadata"]["loss_mask"]) for r in got)
    assert summary["tokens"] == 12 * 48
    assert not Path(str(out) + ".partial").exists()


def test_same_inputs_give_byte_identical_parquet_and_another_seed_other_rows(tmp_path):
    convs = conversations()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    one = json.loads(build_cli(tmp_path / "a", convs)[0].stdout)
    two = json.loads(build_cli(tmp_path / "b", convs)[0].stdout)
    other = json.loads(build_cli(tmp_path / "c", convs, seed=43)[0].stdout)
    assert (
        one["parquet_sha256"] == two["parquet_sha256"] and one["rows_sha256"] == two["rows_sha256"]
    )
    assert other["rows_sha256"] != one["rows_sha256"]


def test_rows_feed_the_rollout_function_as_miles_would_read_them(tmp_path, monkeypatch):
    proc, out = build_cli(tmp_path, conversations(), rows=6, row_tokens=40)
    summary = json.loads(proc.stdout)
    records = pq.read_table(out).to_pylist()  # what miles' data source yields per row

    class Sample:
        def __init__(self, rec, index):
            self.prompt, self.metadata, self.index = rec["messages"], rec["metadata"], index

    class Source:
        def get_samples(self, n):
            return [[Sample(r, i)] for i, r in enumerate(records[:n])]

    monkeypatch.setenv(ro.ROW_TOKENS_ENV, "40")
    groups = ro.generate_rollout(type("Args", (), {"rollout_batch_size": 6}), 0, Source())
    assert ro.summarize(groups)["supervised"] == summary["supervised_tokens"]
    for (s,), rec in zip(groups, records, strict=True):
        mask = rec["metadata"]["loss_mask"]
        assert s.tokens == rec["messages"] and len(s.loss_mask) == s.response_length
        assert s.loss_mask == mask[len(mask) - s.response_length :] and s.loss_mask[0] == 1
        assert 1 not in mask[: len(mask) - s.response_length]


def test_a_parquet_directory_source_reads_files_in_sorted_order(tmp_path):
    convs = conversations(60)
    ref_proc, ref_out = build_cli(tmp_path, convs, rows=5, row_tokens=32, name="ref.parquet")
    d = tmp_path / "ds" / "data"
    d.mkdir(parents=True)
    msg_type = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    # written out of order on purpose: train-00001 must come after train-00000
    pq.write_table(
        pa.table({"messages": pa.array(convs[30:], type=msg_type)}),
        d / "train-00001-of-00002.parquet",
    )
    pq.write_table(
        pa.table({"messages": pa.array(convs[:30], type=msg_type)}),
        d / "train-00000-of-00002.parquet",
    )
    out = tmp_path / "dir.parquet"
    proc = run_build(
        "--source",
        str(tmp_path / "ds"),
        "--tokenizer",
        b.TEST_TOKENIZER,
        "--row-tokens",
        "32",
        "--rows",
        "5",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows_sha256"] == json.loads(ref_proc.stdout)["rows_sha256"]


def test_too_few_rows_fails_and_leaves_no_file(tmp_path):
    proc, out = build_cli(tmp_path, conversations(10), rows=500)
    assert (
        proc.returncode == 2
        and "--rows asks for 500" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    assert not out.exists()


def test_expectation_mismatch_exits_1_and_sets_the_file_aside(tmp_path):
    proc, out = build_cli(tmp_path, conversations(), extra=("--expect-rows-sha256", "0" * 64))
    assert proc.returncode == 1 and "MISMATCH rows_sha256" in proc.stderr
    assert not out.exists() and Path(str(out) + ".mismatch").exists()
    good = json.loads(proc.stdout)["rows_sha256"]
    proc2, out2 = build_cli(
        tmp_path,
        conversations(),
        name="again.parquet",
        extra=("--expect-rows-sha256", good, "--expect-rows", "12"),
    )
    assert proc2.returncode == 0 and out2.exists()


def test_tokenizer_file_hashes_are_checked_before_any_work(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    proc = run_build(
        "--source",
        str(write_jsonl(tmp_path / "c.jsonl", conversations(5))),
        "--tokenizer",
        str(tok),
        "--tokenizer-sha256",
        "tokenizer.json=" + "a" * 64,
        "--row-tokens",
        "8",
        "--out",
        str(tmp_path / "o.parquet"),
    )
    assert proc.returncode == 1 and "not the recipe's tokenizer" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [
                "--tokenizer",
                "builtin:whitespace-test",
                "--row-tokens",
                "8",
                "--out",
                "/tmp/x.parquet",
            ],
            "exactly one of --source",
        ),
        (
            [
                "--source",
                "/nonexistent.jsonl",
                "--tokenizer",
                "builtin:whitespace-test",
                "--row-tokens",
                "8",
                "--out",
                "/tmp/x.parquet",
            ],
            "no such file",
        ),
        (
            [
                "--source",
                "x.jsonl",
                "--tokenizer",
                "builtin:nope",
                "--row-tokens",
                "8",
                "--out",
                "/tmp/x.parquet",
            ],
            "the only built-in",
        ),
        (
            [
                "--source",
                "x.jsonl",
                "--tokenizer",
                "builtin:whitespace-test",
                "--row-tokens",
                "0",
                "--out",
                "/tmp/x.parquet",
            ],
            "must be positive",
        ),
        (
            [
                "--source-repo",
                "a/b",
                "--tokenizer",
                "builtin:whitespace-test",
                "--row-tokens",
                "8",
                "--out",
                "/tmp/x.parquet",
            ],
            "needs --source-revision and --source-cache",
        ),
        (
            [
                "--source",
                "x.jsonl",
                "--tokenizer",
                "/nonexistent-dir",
                "--row-tokens",
                "8",
                "--out",
                "/tmp/x.parquet",
            ],
            "inside the training image",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(args, message):
    proc = run_build(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_help_runs():
    proc = run_build("--help")
    assert proc.returncode == 0 and "whitespace-test" in proc.stdout
