#!/usr/bin/env python3
"""Build fixed-length pre-tokenized SFT rows (the parquet that pretokenized_sft_rollout.py reads).

Runs ON the node, inside the training image (standard library plus numpy and pyarrow; with a
real tokenizer also transformers and miles; never the `launcher` package). What it does is the
seed recipe's `workload.dataset.build`:

1. read the source conversations (a column of chat messages) in file order;
2. put them in a seeded global permutation: numpy.random.default_rng(SEED).permutation(N), the
   permutation `datasets.Dataset.shuffle(seed=SEED)` uses;
3. tokenize each with the tokenizer's chat template and a loss mask (`qwen3`: miles'
   MultiTurnLossMaskGenerator, the assistant turns supervised, their `<|im_start|>assistant\\n`
   header not);
4. concatenate them with one EOS token between consecutive conversations (not supervised);
5. cut the stream into consecutive ROW_TOKENS-token rows (a conversation may span two rows; no
   padding; the incomplete tail is dropped); a row without a supervised token is skipped; stop
   after --rows rows.

Output: a parquet with `messages` list<int64> (the row's token ids) and `metadata`
struct<loss_mask: list<int8>, supervised_tokens: int64>, and one JSON object on stdout with rows,
parquet_sha256, rows_sha256 (sha256 of every row's token ids, in order, as little-endian int32),
loss_mask_sha256 (the masks, one byte per token) and the counts. docs/node-scripts.md defines
them. --expect-* values make it exit 1 on a mismatch (the file is then renamed *.mismatch).

    build_sft_rows.py --source-repo allenai/tulu-3-sft-mixture --source-revision b14afda6... \\
        --source-cache /cache/datasets/tulu3 --tokenizer "$HF_CKPT" --loss-mask-type qwen3 \\
        --row-tokens 8192 --rows 6400 --seed 42 --out "$SFT_DATA"

`--tokenizer builtin:whitespace-test` is a toy tokenizer for tests ONLY: it splits on spaces,
never matches any real model, and must not be used for a training run.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import os
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path
from sft_encoders import (  # noqa: E402 (after the sys.path line above); re-exported: one API
    LOSS_MASK_TYPES,
    TEST_TOKENIZER,
    BuildError,
    ChatEncoder,
    MilesMaskEncoder,
    Mismatch,
    WhitespaceTestTokenizer,
    make_encoder,
)

# The encoders are part of this program's interface (tests build rows with the test tokenizer).
__all__ = ["BuildError", "Mismatch", "MilesMaskEncoder", "WhitespaceTestTokenizer", "make_encoder"]

WRITE_BATCH_ROWS = 256
MAX_INT32 = 2**31 - 1


class ConversationSource(Protocol):
    description: str

    def __len__(self) -> int: ...

    def get(self, index: int) -> list[dict[str, Any]]: ...


class ListSource:
    def __init__(
        self, conversations: Sequence[list[dict[str, Any]]], description: str = "in-memory"
    ):
        self.conversations = conversations
        self.description = description

    def __len__(self) -> int:
        return len(self.conversations)

    def get(self, index: int) -> list[dict[str, Any]]:
        return self.conversations[index]


def _jsonl_source(path: Path, column: str) -> ListSource:
    convs = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise BuildError(f"{path}:{n}: not JSON ({err.msg})") from None
            if not isinstance(obj, dict) or column not in obj:
                raise BuildError(f"{path}:{n}: no {column!r} field")
            convs.append(obj[column])
    return ListSource(convs, f"{path} ({len(convs)} conversations)")


class ParquetSource:
    """One column of one or more parquet files, concatenated in sorted path order, read lazily
    by index."""

    def __init__(self, files: list[Path], column: str):
        pq = _pyarrow_parquet()
        self.columns = []
        self.starts = [0]
        for f in files:
            try:
                table = pq.read_table(f, columns=[column])
            except (KeyError, ValueError) as err:
                raise BuildError(f"{f}: cannot read column {column!r} ({err})") from None
            self.columns.append(table.column(column))
            self.starts.append(self.starts[-1] + table.num_rows)
        self.description = f"{len(files)} parquet file(s), {self.starts[-1]} conversations"

    def __len__(self) -> int:
        return self.starts[-1]

    def get(self, index: int) -> list[dict[str, Any]]:
        f = bisect.bisect_right(self.starts, index) - 1
        return self.columns[f][index - self.starts[f]].as_py()


def open_source(path: Path, column: str) -> ConversationSource:
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*.parquet") if ".cache" not in p.relative_to(path).parts
        )
        if not files:
            raise BuildError(f"--source {path}: no .parquet files under it")
        return ParquetSource(files, column)
    if not path.is_file():
        raise BuildError(f"--source {path}: no such file or directory")
    if path.suffix == ".jsonl":
        return _jsonl_source(path, column)
    if path.suffix == ".parquet":
        return ParquetSource([path], column)
    raise BuildError(
        f"--source {path}: expected a .jsonl or .parquet file, or a directory of .parquet files"
    )


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BuildError("pyarrow is not installed (pip install pyarrow)") from None
    return pq


def permutation(n: int, seed: int) -> list[int]:
    """The seeded global permutation, as datasets.Dataset.shuffle(seed=seed) draws it."""
    try:
        import numpy as np
    except ImportError:
        raise BuildError("numpy is not installed (pip install numpy)") from None
    return np.random.default_rng(seed).permutation(n).tolist()


# --------------------------------------------------------------------------------------------
# Packing


@dataclass
class PackStats:
    conversations: int = 0
    rows: int = 0
    rows_skipped_unsupervised: int = 0
    tokens: int = 0
    supervised_tokens: int = 0


def pack_rows(
    encoded: Iterable[tuple[list[int], list[int]]],
    row_tokens: int,
    eos_id: int,
    stats: PackStats | None = None,
) -> Iterator[tuple[list[int], list[int]]]:
    """Every complete row of the stream conv0 EOS conv1 EOS conv2 ... (EOS never supervised).

    Rows without a supervised token are counted in stats and not yielded. The caller may stop
    early; the incomplete tail left when the input ends is never yielded (no padding).
    """
    if row_tokens <= 0:
        raise BuildError("--row-tokens must be positive")
    stats = stats if stats is not None else PackStats()
    ids: list[int] = []
    mask: list[int] = []
    start = 0  # consumed prefix of the buffers (compacted now and then)
    first = True
    for conv_ids, conv_mask in encoded:
        if len(conv_ids) != len(conv_mask):
            raise BuildError(
                f"conversation {stats.conversations}: {len(conv_ids)} tokens but "
                f"{len(conv_mask)} mask entries"
            )
        stats.conversations += 1
        if not first:
            ids.append(eos_id)
            mask.append(0)
        first = False
        ids.extend(conv_ids)
        mask.extend(conv_mask)
        while len(ids) - start >= row_tokens:
            row_ids, row_mask = ids[start : start + row_tokens], mask[start : start + row_tokens]
            start += row_tokens
            if 1 in row_mask:
                stats.rows += 1
                stats.tokens += row_tokens
                stats.supervised_tokens += sum(row_mask)
                yield row_ids, row_mask
            else:
                stats.rows_skipped_unsupervised += 1
        if start > 1_000_000:
            del ids[:start], mask[:start]
            start = 0


def _encode_in_order(
    source: ConversationSource, order: Sequence[int], encoder: ChatEncoder
) -> Iterator[tuple[list[int], list[int]]]:
    for i in order:
        messages = source.get(i)
        if not isinstance(messages, list):
            raise BuildError(
                f"source conversation {i}: expected a list of messages, "
                f"got {type(messages).__name__}"
            )
        try:
            yield encoder.encode(messages)
        except BuildError:
            raise
        except Exception as err:  # noqa: BLE001 (a tokenizer's error names neither the row nor the cause plainly)
            raise BuildError(
                f"source conversation {i}: tokenizing failed: {type(err).__name__}: {err}"
            ) from None


# --------------------------------------------------------------------------------------------
# Writing and hashing


@dataclass
class Digests:
    rows: Any = field(default_factory=hashlib.sha256)
    masks: Any = field(default_factory=hashlib.sha256)

    def add(self, ids: list[int], mask: list[int]) -> None:
        if min(ids) < 0 or max(ids) > MAX_INT32:
            raise BuildError(f"token id out of int32 range in a row: {min(ids)}..{max(ids)}")
        a = array("i", ids)
        if sys.byteorder != "little":
            a.byteswap()
        self.rows.update(a.tobytes())
        self.masks.update(bytes(mask))


def rows_sha256(rows: Iterable[Sequence[int]]) -> str:
    """The documented definition, for checking a parquet after the fact (see
    docs/node-scripts.md)."""
    d = Digests()
    for ids in rows:
        d.add(list(ids), [0] * len(ids))
    return d.rows.hexdigest()


def parquet_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("messages", pa.list_(pa.int64())),
            (
                "metadata",
                pa.struct([("loss_mask", pa.list_(pa.int8())), ("supervised_tokens", pa.int64())]),
            ),
        ]
    )


def write_rows(rows: Iterable[tuple[list[int], list[int]]], out: Path) -> tuple[int, Digests]:
    """Stream rows into OUT (via a temporary file renamed at the end); return the count and
    digests."""
    pq = _pyarrow_parquet()
    import pyarrow as pa

    schema = parquet_schema()
    digests = Digests()
    count = 0
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    batch_ids: list[list[int]] = []
    batch_meta: list[dict[str, Any]] = []

    def flush(writer: Any) -> None:
        if batch_ids:
            writer.write_table(
                pa.table({"messages": batch_ids, "metadata": batch_meta}, schema=schema)
            )
            batch_ids.clear()
            batch_meta.clear()

    try:
        with pq.ParquetWriter(tmp, schema, compression="snappy") as writer:
            for ids, mask in rows:
                digests.add(ids, mask)
                batch_ids.append(ids)
                batch_meta.append({"loss_mask": mask, "supervised_tokens": sum(mask)})
                count += 1
                if len(batch_ids) >= WRITE_BATCH_ROWS:
                    flush(writer)
            flush(writer)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return count, digests


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# The whole build


def build(
    source: ConversationSource,
    encoder: ChatEncoder,
    out: Path,
    *,
    row_tokens: int,
    rows: int | None,
    seed: int,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    started = time.monotonic()
    n = len(source)
    if n == 0:
        raise BuildError(f"the source has no conversations ({source.description})")
    order = permutation(n, seed)
    log(
        f"build_sft_rows: {source.description}; tokenizer {encoder.name}; seed {seed}; "
        f"{rows if rows is not None else 'all'} rows of {row_tokens} tokens"
    )
    stats = PackStats()
    packed = pack_rows(_encode_in_order(source, order, encoder), row_tokens, encoder.eos_id, stats)

    def limited() -> Iterator[tuple[list[int], list[int]]]:
        for i, r in enumerate(packed):
            yield r
            if rows is not None and i + 1 >= rows:
                return
            if (i + 1) % 500 == 0:
                log(f"build_sft_rows: {i + 1} rows ({stats.conversations} conversations)")

    count, digests = write_rows(limited(), out)
    if rows is not None and count < rows:
        out.unlink(missing_ok=True)
        raise BuildError(
            f"the source gave only {count} rows of {row_tokens} tokens with supervised targets; "
            f"--rows asks for {rows}"
        )
    if count == 0:
        out.unlink(missing_ok=True)
        raise BuildError(f"no complete row of {row_tokens} tokens with a supervised token")
    return {
        "rows": count,
        "row_tokens": row_tokens,
        "padding_tokens": 0,
        "seed": seed,
        "conversations_used": stats.conversations,
        "conversations_in_source": n,
        "rows_skipped_unsupervised": stats.rows_skipped_unsupervised,
        "tokens": stats.tokens,
        "supervised_tokens": stats.supervised_tokens,
        "supervised_token_ratio": round(stats.supervised_tokens / stats.tokens, 6)
        if stats.tokens
        else 0.0,
        "rows_sha256": digests.rows.hexdigest(),
        "loss_mask_sha256": digests.masks.hexdigest(),
        "parquet": str(out),
        "parquet_bytes": out.stat().st_size,
        "parquet_sha256": file_sha256(out),
        "tokenizer": encoder.name,
        "source": source.description,
        "seconds": round(time.monotonic() - started, 1),
    }


def check_expectations(summary: dict[str, Any], expect: dict[str, str]) -> list[str]:
    return [
        f"{key}: built {summary[key]}, expected {value}"
        for key, value in expect.items()
        if str(summary[key]) != str(value)
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    src = p.add_argument_group("source conversations (one of)")
    src.add_argument(
        "--source", type=Path, help="a .jsonl or .parquet file, or a directory of .parquet files"
    )
    src.add_argument(
        "--source-repo", help="a Hugging Face dataset, e.g. allenai/tulu-3-sft-mixture"
    )
    src.add_argument("--source-revision", help="the dataset commit (with --source-repo)")
    src.add_argument(
        "--source-cache", type=Path, help="where to download the dataset (with --source-repo)"
    )
    p.add_argument(
        "--messages-column", default="messages", help="the column holding the chat messages"
    )
    p.add_argument(
        "--tokenizer",
        required=True,
        help=f"a Hugging Face model directory (tokenizer files), or {TEST_TOKENIZER} (tests only)",
    )
    p.add_argument(
        "--loss-mask-type", default="qwen3", choices=LOSS_MASK_TYPES, help="miles' loss mask type"
    )
    p.add_argument(
        "--tokenizer-sha256",
        action="append",
        default=[],
        metavar="FILE=HEX",
        help="require this sha256 of a file in the tokenizer directory (repeatable)",
    )
    p.add_argument(
        "--row-tokens", type=int, required=True, help="tokens per row (8192 in the seed)"
    )
    p.add_argument(
        "--rows", type=int, help="stop after this many rows (default: every complete row)"
    )
    p.add_argument("--seed", type=int, default=42, help="permutation seed (default 42)")
    p.add_argument("--out", type=Path, required=True, help="the parquet to write")
    for key in ("parquet_sha256", "rows_sha256", "rows"):
        p.add_argument(
            f"--expect-{key.replace('_', '-')}",
            dest=f"expect_{key}",
            metavar="VALUE",
            help=f"exit 1 when the built {key} differs",
        )
    return p


def _resolve_source(args: argparse.Namespace) -> ConversationSource:
    if bool(args.source) == bool(args.source_repo):
        raise BuildError("give exactly one of --source PATH and --source-repo REPO")
    if args.source:
        return open_source(args.source, args.messages_column)
    if not args.source_revision or not args.source_cache:
        raise BuildError("--source-repo needs --source-revision and --source-cache")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fetch_assets

    try:
        fetch_assets.fetch_snapshot(
            args.source_repo,
            args.source_revision,
            args.source_cache,
            repo_type="dataset",
            allow_patterns=["*.parquet"],
        )
    except (fetch_assets.FetchError, fetch_assets.RefusedDest) as err:
        raise BuildError(str(err)) from None
    return open_source(args.source_cache, args.messages_column)


def _check_tokenizer_files(directory: str, items: list[str]) -> None:
    for item in items:
        name, sep, want = item.partition("=")
        if not sep or not name or len(want) != 64:
            raise BuildError(f"--tokenizer-sha256 {item!r}: expected FILE=<64 hex digits>")
        path = Path(directory, name)
        if not path.is_file():
            raise BuildError(f"--tokenizer-sha256: {path} does not exist")
        got = file_sha256(path)
        if got != want.lower():
            raise Mismatch(f"{path}: sha256 {got}, expected {want} (not the recipe's tokenizer)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.row_tokens <= 0 or (args.rows is not None and args.rows <= 0):
        parser.error("--row-tokens and --rows must be positive")
    try:
        if args.tokenizer_sha256:
            if args.tokenizer.startswith("builtin:"):
                raise BuildError("--tokenizer-sha256 needs a tokenizer directory")
            _check_tokenizer_files(args.tokenizer, args.tokenizer_sha256)
        encoder = make_encoder(args.tokenizer, args.loss_mask_type)
        source = _resolve_source(args)
        summary = build(
            source, encoder, args.out, row_tokens=args.row_tokens, rows=args.rows, seed=args.seed
        )
    except Mismatch as err:
        print(f"build_sft_rows: {err}", file=sys.stderr)
        return 1
    except BuildError as err:
        print(f"build_sft_rows: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(
            f"build_sft_rows: {getattr(err, 'filename', '') or ''}: {err.strerror or err}",
            file=sys.stderr,
        )
        return 2
    expect = {
        k: v
        for k, v in (
            ("parquet_sha256", args.expect_parquet_sha256),
            ("rows_sha256", args.expect_rows_sha256),
            ("rows", args.expect_rows),
        )
        if v is not None
    }
    problems = check_expectations(summary, expect)
    if problems:
        bad = args.out.with_name(args.out.name + ".mismatch")
        os.replace(args.out, bad)
        summary["parquet"] = str(bad)
        summary["mismatches"] = problems
    print(json.dumps(summary, sort_keys=True))
    for line in problems:
        print(
            f"build_sft_rows: MISMATCH {line}; the file was kept as {summary['parquet']}",
            file=sys.stderr,
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
