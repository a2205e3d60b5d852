"""Stand-in for miles' model_args_utils.py (tests only, not miles).

`python3 miles/utils/external_utils/model_args_utils.py MODEL` prints the model's Megatron flags
on ONE line (the recipe reads them with `read -ra`). Only qwen3-30B-A3B is known.
"""

import sys

# Qwen3-30B-A3B's architecture, as Megatron flags (values from the model's config.json).
MODELS = {
    "qwen3-30B-A3B": [
        "--disable-bias-linear",
        "--qk-layernorm",
        "--group-query-attention",
        "--num-attention-heads",
        "32",
        "--num-query-groups",
        "4",
        "--kv-channels",
        "128",
        "--num-layers",
        "48",
        "--hidden-size",
        "2048",
        "--ffn-hidden-size",
        "6144",
        "--normalization",
        "RMSNorm",
        "--position-embedding-type",
        "rope",
        "--norm-epsilon",
        "1e-6",
        "--rotary-percent",
        "1.0",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "151936",
        "--rotary-base",
        "1000000",
        "--moe-ffn-hidden-size",
        "768",
        "--moe-router-score-function",
        "softmax",
        "--moe-token-dispatcher-type",
        "alltoall",
        "--moe-router-topk",
        "8",
        "--moe-layer-freq",
        "[1]*48",
        "--num-experts",
        "128",
        "--moe-grouped-gemm",
        "--moe-router-dtype",
        "fp32",
        "--moe-permute-fusion",
        "--moe-aux-loss-coeff",
        "0",
    ],
}


def main(argv):
    if len(argv) != 1:
        print("usage: model_args_utils.py MODEL_TYPE", file=sys.stderr)
        return 2
    flags = MODELS.get(argv[0])
    if flags is None:
        print(f"AssertionError: no model args script for {argv[0]!r}", file=sys.stderr)
        return 1
    print(" ".join(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
