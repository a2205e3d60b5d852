"""Megatron-LM's FLOP count of a training step, beside the recipe's own 6 x N_active x tokens.

Why both: a recipe card's MFU is 6 x active parameters x tokens/s / peak, which leaves out
attention's quadratic term and counts the embedding; Megatron, the framework miles trains with,
counts every GEMM of the layers, attention's score and value products and the logits. The two
figures answer the same question two ways, and a reader comparing with another published MFU
must know which one it is; so the result records both, each named (docs/measurement.md, "MFU").

The count is `num_floating_point_operations(args, batch_size)` of Megatron-LM
(megatron/training/training.py, its `transformer_flops`, read at NVIDIA/Megatron-LM 001b00c2),
for the standard transformer it covers with GQA or MHA, dense and MoE MLPs, shared experts, MTP
layers and the logits: 3 (forward, two backward GEMMs) x 2 (multiply-add) x the GEMM sizes. The
architecture is what the run printed (Megatron's arguments listing); `seq_length` is the recipe's
row length (`workload.row_tokens`: fixed-length rows, so every sequence is that long) and the
batch the global batch. Multi-latent attention, hybrid (Mamba) and linear-attention models are
not covered: for them the figure is not given, and the reason says so. Pure.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

MEGATRON_SOURCE = (
    "Megatron-LM num_floating_point_operations (megatron/training/training.py, transformer_flops; "
    "read at NVIDIA/Megatron-LM 001b00c2), seq_length = workload.row_tokens"
)
_NEEDED = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")


@dataclass(frozen=True)
class MegatronFlops:
    flops_per_token: float | None
    reason: str | None = None  # why there is no figure


def arg_value(args: Mapping[str, str], name: str) -> object:
    text = args.get(name)
    if text is None or text == "None":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def arg_int(args: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = arg_value(args, name)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def per_token(args: Mapping[str, str], seq_length: int) -> MegatronFlops:
    """Megatron's training FLOPs per token of a step, from the printed arguments."""
    missing = [n for n in _NEEDED if arg_int(args, n) is None]
    if missing:
        return MegatronFlops(None, f"the log's arguments listing lacks {', '.join(missing)}")
    for flag in ("multi_latent_attention", "hybrid_override_pattern", "hybrid_layer_pattern"):
        if arg_value(args, flag) not in (None, False, ""):
            return MegatronFlops(None, f"{flag} is set: a model this count does not cover")
    if arg_value(args, "experimental_attention_variant") not in (None, ""):
        return MegatronFlops(None, "experimental_attention_variant is set: not covered")
    layers = arg_int(args, "num_layers") or 0
    hidden = arg_int(args, "hidden_size") or 0
    heads = arg_int(args, "num_attention_heads") or 0
    ffn = arg_int(args, "ffn_hidden_size") or 0
    groups = (
        arg_int(args, "num_query_groups") if arg_value(args, "group_query_attention") else heads
    )
    kv = arg_int(args, "kv_channels", hidden // heads if heads else 0) or 0
    swiglu = arg_value(args, "swiglu") is True
    experts = arg_int(args, "num_experts")
    mtp = arg_int(args, "mtp_num_layers", 0) or 0
    if experts is None:
        dense, moe, routed, last_moe = layers, 0, 0, 0
    else:
        freq = arg_value(args, "moe_layer_freq")
        pattern = (
            [1 if i % freq == 0 else 0 for i in range(layers)]
            if isinstance(freq, int) and freq > 0
            else freq
            if isinstance(freq, list)
            else [1] * layers
        )
        if len(pattern) != layers:
            return MegatronFlops(None, f"moe_layer_freq {freq!r} does not give {layers} layers")
        moe = sum(1 for p in pattern if p)
        dense, routed, last_moe = (
            layers - moe,
            arg_int(args, "moe_router_topk", 2) or 0,
            pattern[-1],
        )
    moe += last_moe * mtp
    dense += (1 - last_moe) * mtp
    moe_ffn = arg_int(args, "moe_ffn_hidden_size", ffn) or ffn
    shared = arg_int(args, "moe_shared_expert_intermediate_size", 0) or 0
    ffn_factor = 3 if swiglu else 2
    q = kv * heads
    k = v = kv * (groups or heads)
    gate = q if arg_value(args, "attention_output_gate") is True else 0
    attn = 3 * 2 * (hidden * (q + k + v + gate) + q * seq_length / 2 * 2 + q * hidden)
    mlp = (
        3
        * 2
        * hidden
        * (
            ffn * ffn_factor * dense
            + moe_ffn * routed * ffn_factor * moe
            + shared * ffn_factor * moe
        )
    )
    mtp_norms = 3 * 2 * mtp * (3 * hidden + 2 * hidden * hidden)
    logits = 3 * 2 * hidden * _padded_vocab(args) * (mtp + 1)
    return MegatronFlops(float(mlp + attn * (layers + mtp) + mtp_norms + logits))


def _padded_vocab(args: Mapping[str, str]) -> int:
    """Megatron's padded_vocab_size: vocab_size up to a multiple of make_vocab_size_divisible_by
    x tensor parallel (megatron/training/tokenizer, _vocab_size_with_padding)."""
    vocab = arg_int(args, "vocab_size") or 0
    multiple = (arg_int(args, "make_vocab_size_divisible_by", 128) or 128) * (
        arg_int(args, "tensor_model_parallel_size", 1) or 1
    )
    return -(-vocab // multiple) * multiple
