"""Sweep tests: tiny spaces and fake GPU records."""

#: Two NVIDIA points at head dim 16: each compiles in about a second.
TINY = {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [16], "causal": [False],
        "BLOCK_M": [16, 32], "BLOCK_N": [16], "num_warps": [1], "num_stages": [1]}
