"""The tokenizers build_sft_rows.py encodes conversations with: messages -> (token ids, loss mask).

Runs ON the node with build_sft_rows.py (standard library; a real tokenizer needs transformers and
miles, present in the training image). Kept apart from the row packing so each file has one job.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Protocol

TEST_TOKENIZER = "builtin:whitespace-test"
LOSS_MASK_TYPES = ("qwen3", "qwen", "distill_qwen")


class BuildError(Exception):
    """A clear, user-facing failure (exit 2 for bad input, or 1 for a hash mismatch via
    Mismatch)."""


class Mismatch(BuildError):
    pass


class ChatEncoder(Protocol):
    name: str
    eos_id: int

    def encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]: ...


class WhitespaceTestTokenizer:
    """FOR TESTS ONLY. ChatML-shaped like Qwen's template, words hashed to ids; no real model's ids.

    Per message: <|im_start|> ROLE \\n WORDS... <|im_end|> \\n ; an assistant message's first three
    tokens (the header) are not supervised, the rest (content, <|im_end|>, \\n) are, as in `qwen3`.
    """

    name = TEST_TOKENIZER
    EOS, IM_START, IM_END, NL = 0, 1, 2, 3
    eos_id = EOS

    @staticmethod
    def word_id(word: str) -> int:
        return 16 + zlib.crc32(word.encode()) % 100_000

    def encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for m in messages:
            body = [self.word_id(w) for w in str(m.get("content") or "").split()] + [
                self.IM_END,
                self.NL,
            ]
            ids += [self.IM_START, self.word_id(str(m["role"])), self.NL] + body
            mask += [0, 0, 0] + [1 if m["role"] == "assistant" else 0] * len(body)
        return ids, mask


class MilesMaskEncoder:
    """A real tokenizer directory with miles' own loss-mask generator (what --loss-mask-type
    means)."""

    def __init__(self, path: str, loss_mask_type: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise BuildError(
                "transformers is not installed; run it inside the training image"
            ) from None
        try:
            from miles.utils.mask_utils import MultiTurnLossMaskGenerator
        except ImportError as err:
            raise BuildError(
                f"miles is not importable ({err}); run inside the training image with "
                "PYTHONPATH=/root/miles:/root/Megatron-LM"
            ) from None
        if not Path(path, "tokenizer_config.json").is_file():
            raise BuildError(
                f"--tokenizer {path}: no tokenizer_config.json there "
                "(give a Hugging Face model directory)"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.generator = MultiTurnLossMaskGenerator(self.tokenizer, tokenizer_type=loss_mask_type)
        if self.tokenizer.eos_token_id is None:
            raise BuildError(f"--tokenizer {path}: the tokenizer defines no EOS token")
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.name = (
            f"{path} ({type(self.tokenizer).__name__}, loss mask {loss_mask_type}, "
            f"eos {self.eos_id})"
        )

    def encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        ids, mask = self.generator.get_loss_mask(messages)
        return [int(x) for x in ids], [int(x) for x in mask]


def make_encoder(spec: str, loss_mask_type: str) -> ChatEncoder:
    if spec == TEST_TOKENIZER:
        if loss_mask_type != "qwen3":
            raise BuildError(f"{TEST_TOKENIZER} implements only the qwen3-shaped mask")
        return WhitespaceTestTokenizer()
    if spec.startswith("builtin:"):
        raise BuildError(f"--tokenizer {spec}: the only built-in is {TEST_TOKENIZER} (tests only)")
    return MilesMaskEncoder(spec, loss_mask_type)


# --------------------------------------------------------------------------------------------
# Sources: index -> messages, in file order
