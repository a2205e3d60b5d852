"""miles rollout function for SFT on pre-tokenized, fixed-length rows (no re-tokenizing per step).

Used as `--rollout-function-path pretokenized_sft_rollout.generate_rollout` with
`--input-key messages --metadata-key metadata` and no chat template; this directory is on the
container's PYTHONPATH. Standard library only, never the `launcher` package.

The rows come from build_sft_rows.py (docs/node-scripts.md): each parquet row has
- `messages`: list<int64>, the row's token ids (miles hands it over unchanged as `sample.prompt`);
- `metadata`: struct {loss_mask: list<int8> (1 = supervised, one per token), supervised_tokens:
  int64} (miles hands it over as the dict `sample.metadata`).

For each sample this sets what miles' trainer reads: `tokens` (the whole row), `response_length`
(from the first supervised token to the end of the row), `loss_mask` (the row's mask over that
span, exactly `response_length` long; tokens inside it that are not supervised stay 0) and
`reward = 0`. A row whose length differs from REPRODUCE_ROW_TOKENS (when that is set), whose mask
has another length, other values than 0/1, no supervised token, or a supervised count that
disagrees with `supervised_tokens`, raises ValueError naming the sample: training on a silently
wrong row is worse than stopping.

Evaluation: SFT on these rows has no evaluation rollouts, so `evaluation=True` raises ValueError
(miles only asks for one when --eval-interval and eval data are given); this mirrors miles' own
sft_rollout, which asserts `not evaluation`.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Sequence
from typing import Any

__all__ = ["generate_rollout", "prepare_sample", "ROW_TOKENS_ENV"]

logger = logging.getLogger(__name__)

ROW_TOKENS_ENV = "REPRODUCE_ROW_TOKENS"
MASK_FIELD = "loss_mask"
COUNT_FIELD = "supervised_tokens"
_logged_example = False


def _as_int_list(value: Any, what: str, where: str) -> list[int]:
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):  # numpy / pyarrow arrays
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{where}: {what} must be a list of token ids, got {type(value).__name__}; "
            "the rows must be pre-tokenized (build_sft_rows.py), not conversations"
        )
    # fast path (C loop): 128 rows x 8,192 tokens per step must cost milliseconds, not a second
    try:
        return array("q", value).tolist()
    except (TypeError, OverflowError):
        pass
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, dict):
                raise ValueError(
                    f"{where}: {what}[{i}] is a message dict, not a token id; the rows must be "
                    "pre-tokenized (build_sft_rows.py)"
                )
            try:
                iv = int(v)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: {what}[{i}] is {v!r}, not an integer") from None
            if iv != v:
                raise ValueError(f"{where}: {what}[{i}] is {v!r}, not an integer")
            v = iv
        out.append(int(v))
    return out


def expected_row_tokens() -> int | None:
    """REPRODUCE_ROW_TOKENS (the recipe's workload.row_tokens) when the launcher exported it."""
    raw = os.environ.get(ROW_TOKENS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ROW_TOKENS_ENV}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{ROW_TOKENS_ENV}={raw!r} must be positive")
    return value


def prepare_sample(sample: Any, where: str, row_tokens: int | None = None) -> None:
    """Fill tokens, response_length, loss_mask and reward of one Sample from its pre-tokenized
    row."""
    tokens = _as_int_list(sample.prompt, "sample.prompt (the `messages` column)", where)
    if not tokens:
        raise ValueError(f"{where}: the row is empty")
    if row_tokens is not None and len(tokens) != row_tokens:
        raise ValueError(
            f"{where}: the row has {len(tokens)} tokens, expected {row_tokens} "
            "(the recipe's row_tokens)"
        )
    metadata = sample.metadata
    if not isinstance(metadata, dict):
        raise ValueError(
            f"{where}: sample.metadata is {type(metadata).__name__}, expected a dict "
            "from the struct column `metadata` (pass --metadata-key metadata)"
        )
    if MASK_FIELD not in metadata:
        raise ValueError(
            f"{where}: sample.metadata has no {MASK_FIELD!r} "
            f"(keys: {', '.join(map(str, metadata)) or 'none'})"
        )
    mask = _as_int_list(metadata[MASK_FIELD], f"metadata.{MASK_FIELD}", where)
    if len(mask) != len(tokens):
        raise ValueError(
            f"{where}: metadata.{MASK_FIELD} has {len(mask)} entries "
            f"for a row of {len(tokens)} tokens"
        )
    if not set(mask) <= {0, 1}:
        bad = sorted(set(mask) - {0, 1})[:3]
        raise ValueError(f"{where}: metadata.{MASK_FIELD} holds {bad}, expected only 0 and 1")
    supervised = sum(mask)
    if supervised == 0:
        raise ValueError(
            f"{where}: the row has no supervised token "
            "(rows without targets must not be in the data)"
        )
    declared = metadata.get(COUNT_FIELD)
    if declared is not None and int(declared) != supervised:
        raise ValueError(
            f"{where}: metadata.{COUNT_FIELD} is {declared} "
            f"but the mask supervises {supervised} tokens"
        )
    first = mask.index(1)
    sample.tokens = tokens
    sample.response_length = len(tokens) - first
    sample.loss_mask = mask[first:]
    sample.reward = 0


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Any]]:
    """miles' rollout entry point: the next `args.rollout_batch_size` rows, ready to train on."""
    global _logged_example
    if evaluation:
        raise ValueError(
            "pretokenized_sft_rollout: SFT on pre-tokenized rows has no evaluation rollouts; "
            "drop --eval-interval / --eval-prompt-data for this rollout function"
        )
    row_tokens = expected_row_tokens()
    groups = data_source.get_samples(args.rollout_batch_size)
    for g, group in enumerate(groups):
        for k, sample in enumerate(group):
            index = getattr(sample, "index", None)
            where = (
                f"rollout {rollout_id} sample {g}"
                + (f".{k}" if len(group) > 1 else "")
                + (f" (dataset index {index})" if index is not None else "")
            )
            prepare_sample(sample, where, row_tokens)
    if groups and groups[0] and not _logged_example:
        s = groups[0][0]
        logger.info(
            "pretokenized_sft_rollout: first row %d tokens, response_length %d, %d supervised",
            len(s.tokens),
            s.response_length,
            sum(s.loss_mask),
        )
        _logged_example = True
    return groups


def summarize(groups: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Token counts of a prepared batch (for logs and tests)."""
    samples = [s for g in groups for s in g]
    total = sum(len(s.tokens) for s in samples)
    supervised = sum(sum(s.loss_mask) for s in samples)
    return {
        "samples": len(samples),
        "tokens": total,
        "supervised": supervised,
        "supervised_ratio": supervised / total if total else 0.0,
    }


def check_parquet(path: str, row_tokens: int | None) -> dict[str, Any]:
    """Every row of a rows parquet through prepare_sample: the training's checks, before any GPU
    time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("pyarrow is not installed (pip install pyarrow)") from None

    class _Row:
        """A sample as miles hands it over; prepare_sample sets tokens and loss_mask on it."""

        tokens: list[int]
        loss_mask: list[int]

        def __init__(self, prompt: Any, metadata: Any):
            self.prompt, self.metadata = prompt, metadata

    try:
        pf = pq.ParquetFile(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    missing = {"messages", "metadata"} - set(pf.schema_arrow.names)
    if missing:
        raise ValueError(
            f"{path}: no column(s) {', '.join(sorted(missing))} "
            f"(columns: {', '.join(pf.schema_arrow.names)})"
        )
    rows = tokens = supervised = 0
    for batch in pf.iter_batches(columns=["messages", "metadata"], batch_size=256):
        for rec in batch.to_pylist():
            s = _Row(rec["messages"], rec["metadata"])
            prepare_sample(s, f"{path} row {rows}", row_tokens)
            rows += 1
            tokens += len(s.tokens)
            supervised += sum(s.loss_mask)
    if rows == 0:
        raise ValueError(f"{path}: no rows")
    return {
        "rows": rows,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "supervised_token_ratio": round(supervised / tokens, 6),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--check",
        metavar="PARQUET",
        required=True,
        help="run every row of a rows parquet through the rollout's checks and print a summary",
    )
    p.add_argument(
        "--row-tokens",
        type=int,
        help=f"the recipe's row_tokens (default: ${ROW_TOKENS_ENV} when set)",
    )
    args = p.parse_args(argv)
    try:
        row_tokens = args.row_tokens if args.row_tokens is not None else expected_row_tokens()
        summary = check_parquet(args.check, row_tokens)
    except ValueError as err:
        print(f"pretokenized_sft_rollout: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
