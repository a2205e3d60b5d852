"""The model's identity, proven from what the run printed: its architecture read from Megatron's
arguments listing, its parameter counts computed from it, and both held to the recipe.

Why: a figure is a figure of the recipe's model only when the log shows that model. Throughput
depends on every GEMM a token passes through, so a run of fewer layers (miles' 5-layer CI slice
of Qwen3-30B-A3B), another top-k or smaller experts gives another tokens/s and says nothing about
the claim; none of them is a field of the layout. The recipe states the model by its active
parameter count (`result.active_params.count`, N of its MFU) and its name. So the architecture the
listing prints (layers, hidden and FFN sizes, experts and top-k, vocabulary, heads, query groups,
KV channels) gives the active and total counts by the same reading of Megatron's arguments that
launcher/judge/flops.py uses for Megatron's FLOP count, and:

- the active count must be the recipe's within ACTIVE_TOLERANCE, counted either of the two ways
  recipes count it: every weight matrix a token is multiplied by (attention's projections, the
  router, the top-k routed experts and any shared expert, the dense MLPs, the output layer), or
  that plus the input embedding (a lookup, not a GEMM). Norms are left out (under 0.01%);
- the total count (every expert) must be within a factor NAME_FACTOR of the figure the model's
  name states (`Qwen3-30B-A3B`: 30e9), where it states one: a name is a rounded figure, and a
  loose one (Llama-3.2-1B holds 1.24e9), so this bound catches half the experts, not one fewer.

Pure; docs/measurement.md ("The model's identity") states the rule and what it cannot tell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.inputs.recipe import Sections
from launcher.judge.flops import arg_int, arg_value

# The recipe's active count against the listing's, relative: Qwen3-30B-A3B's one layer more or
# less is 2.1% of it, top-k 4 instead of 8 is 30%.
ACTIVE_TOLERANCE = 0.005
NAME_FACTOR = 1.5
# What the count needs from the listing (Megatron fills ffn_hidden_size and kv_channels in
# validate_args when they are not given, so the listing always has them).
NEEDED = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")
# Every argument the count reads: what says two logs ran one model (`compare`'s identity too).
MODEL_ARGS = (
    *NEEDED,
    "group_query_attention",
    "num_query_groups",
    "kv_channels",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "swiglu",
    "attention_output_gate",
    "untie_embeddings_and_output_weights",
)
# A figure of parameters in a model's name: `30B`, `0.6B`, `235B`, `600M`; not `A3B` (active).
_NAME_FIGURE = re.compile(r"(?<![A-Za-z0-9.])([0-9]{1,4}(?:\.[0-9]{1,3})?)([BbMm])(?![A-Za-z0-9])")


@dataclass(frozen=True)
class Architecture:
    """The model as the listing prints it (only what the parameter count reads)."""

    layers: int
    hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    ffn: int
    vocab: int
    experts: int | None
    topk: int
    moe_ffn: int
    shared: int
    moe_layers: int
    swiglu: bool
    gate: bool

    def to_dict(self) -> dict[str, int | bool | None]:
        return dict(vars(self))


@dataclass(frozen=True)
class Counts:
    active: int  # every weight matrix a token is multiplied by, the output layer once
    active_with_embedding: int  # the same and the input embedding
    total: int  # every expert, both vocabulary matrices (one when tied)


def architecture(args: Mapping[str, str]) -> Architecture | str:
    """The architecture of the printed arguments, or why it cannot be read (a reason)."""
    missing = [n for n in NEEDED if arg_int(args, n) is None]
    if missing:
        return f"the arguments listing lacks {', '.join(missing)}"
    for flag in ("multi_latent_attention", "hybrid_override_pattern", "hybrid_layer_pattern"):
        if arg_value(args, flag) not in (None, False, ""):
            return f"{flag} is set: a model whose parameters this count does not cover"
    if arg_value(args, "experimental_attention_variant") not in (None, ""):
        return "experimental_attention_variant is set: a model this count does not cover"
    layers = arg_int(args, "num_layers") or 0
    hidden = arg_int(args, "hidden_size") or 0
    heads = arg_int(args, "num_attention_heads") or 0
    if min(layers, hidden, heads) <= 0:
        return "the arguments listing gives no positive num_layers, hidden_size, heads"
    gqa = arg_value(args, "group_query_attention") is True
    groups = (arg_int(args, "num_query_groups") if gqa else heads) or heads
    experts = arg_int(args, "num_experts")
    moe_layers = 0
    if experts is not None:
        freq = arg_value(args, "moe_layer_freq")
        if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0:
            moe_layers = sum(1 for i in range(layers) if i % freq == 0)
        elif isinstance(freq, list):
            if len(freq) != layers:
                return f"moe_layer_freq {freq!r} does not give {layers} layers"
            moe_layers = sum(1 for p in freq if p)
        else:
            moe_layers = layers
    ffn = arg_int(args, "ffn_hidden_size") or 0
    return Architecture(
        layers=layers,
        hidden=hidden,
        heads=heads,
        query_groups=groups,
        kv_channels=arg_int(args, "kv_channels", hidden // heads) or hidden // heads,
        ffn=ffn,
        vocab=arg_int(args, "vocab_size") or 0,
        experts=experts,
        topk=(arg_int(args, "moe_router_topk", 2) or 0) if experts is not None else 0,
        moe_ffn=arg_int(args, "moe_ffn_hidden_size", ffn) or ffn,
        shared=arg_int(args, "moe_shared_expert_intermediate_size", 0) or 0,
        moe_layers=moe_layers,
        swiglu=arg_value(args, "swiglu") is True,
        gate=arg_value(args, "attention_output_gate") is True,
    )


def counts(arch: Architecture, *, tied: bool) -> Counts:
    """The model's parameter counts (weight matrices only: the convention of 6 x N)."""
    h = arch.hidden
    q = arch.heads * arch.kv_channels
    kv = arch.query_groups * arch.kv_channels
    attention = h * (q + 2 * kv + (q if arch.gate else 0)) + q * h
    mlp = (3 if arch.swiglu else 2) * h  # one FFN column: up (and gate), down
    dense = (arch.layers - arch.moe_layers) * mlp * arch.ffn
    experts = arch.experts or 0
    router = arch.moe_layers * h * experts
    shared = arch.moe_layers * mlp * arch.shared
    routed = arch.moe_layers * mlp * arch.moe_ffn
    body = arch.layers * attention + dense + router + shared
    vocab = arch.vocab * h
    active = body + routed * arch.topk + vocab
    total = body + routed * experts + vocab * (1 if tied else 2)
    return Counts(active=active, active_with_embedding=active + vocab, total=total)


def name_figure(model: object) -> float | None:
    """The parameter count a model's name states (`Qwen3-30B-A3B`: 30e9), or None."""
    if not isinstance(model, str):
        return None
    found = _NAME_FIGURE.search(model)
    if found is None:
        return None
    return float(found[1]) * (1e9 if found[2] in "Bb" else 1e6)


@dataclass(frozen=True)
class Identity:
    """What the identity check found: the figures, and each disagreement as a sentence."""

    architecture: Architecture | None
    counts: Counts | None
    problems: tuple[str, ...]  # each a disagreement with the recipe
    unreadable: str | None  # why the architecture could not be read (fails closed)
    not_covered: str | None  # a model family the count does not cover (named, not passed)


def identity(card: Sections, args: Mapping[str, str]) -> Identity:
    """The printed arguments' model held to the recipe's (module docstring)."""
    arch = architecture(args)
    if isinstance(arch, str):
        covered = "does not cover" not in arch
        return Identity(None, None, (), arch if covered else None, None if covered else arch)
    tied = arg_value(args, "untie_embeddings_and_output_weights") is not True
    found = counts(arch, tied=tied)
    problems: list[str] = []
    claimed = card.claim.active_params
    shape = (
        f"{arch.layers} layers, hidden {arch.hidden}, FFN {arch.ffn}, {arch.heads} heads "
        f"({arch.query_groups} query groups of {arch.kv_channels}), vocabulary {arch.vocab}"
        + (
            f", {arch.experts} experts of {arch.moe_ffn} with top-{arch.topk}"
            if arch.experts is not None
            else ""
        )
    )
    if isinstance(claimed, int) and claimed > 0:
        ways = (found.active, found.active_with_embedding)
        if all(abs(n - claimed) > ACTIVE_TOLERANCE * claimed for n in ways):
            problems.append(
                f"the model: result.active_params.count is {claimed:,}, but the printed "
                f"arguments ({shape}) give {found.active:,} active parameters "
                f"({found.active_with_embedding:,} with the input embedding), "
                f"{100 * (found.active - claimed) / claimed:+.1f}%: another model"
            )
    else:
        problems.append("the model: the recipe states no result.active_params.count to hold it to")
    stated = name_figure(card.model)
    if stated is not None and not stated / NAME_FACTOR <= found.total <= stated * NAME_FACTOR:
        problems.append(
            f"the model: its name {card.model!r} states about {stated:,.0f} parameters, but "
            f"the printed arguments ({shape}) give {found.total:,} in all"
        )
    return Identity(arch, found, tuple(problems), None, None)
