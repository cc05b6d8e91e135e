"""The short program ncu profiles: one attention forward, run twice (the first launch
warms caches and compiles; ncu skips it with ``--launch-skip 1``); or, given a backward
family, one forward and that family's backward twice.

Usage: python -m flashscope.profile.child PROVIDER B,H,N,D DTYPE CAUSAL [CONFIG [FAMILY]]
PROVIDER is flashscope, cudnn, flash or efficient (SDPA backends); CAUSAL is 0/1; CONFIG
is ``"BLOCK_M=128,BLOCK_N=64,..."`` for flashscope; FAMILY (flashscope only) a backward
family, ``sm90-bwd`` or ``triton-bwd``, whose backward runs with CONFIG on top of its
default for the shape, whatever the library's rule would pick.
"""

from __future__ import annotations

import sys


def main(argv) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    provider, shape, dtype, causal = argv[:4]
    B, H, N, D = (int(x) for x in shape.split(","))
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    _NAMES = {"bf16": "bfloat16", "fp16": "float16"}
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
    is_causal = causal == "1"
    if provider == "flashscope" and len(argv) > 5 and argv[5]:
        fn = _backward(q, k, v, is_causal, argv[4], argv[5], _NAMES[dtype])
    elif provider == "flashscope":
        import flashscope

        from flashscope.api import device_target
        from flashscope.families import Problem, config_from_text

        cfg = None
        if len(argv) > 4 and argv[4]:
            problem = Problem(device_target(q.device) or "sm90", _NAMES[dtype], D,
                              is_causal, N, N, B * H)
            cfg = config_from_text(argv[4], problem)
        fn = (lambda: flashscope.attention(q, k, v, is_causal=is_causal, config=cfg))
    else:
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[provider]

        def fn():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                        is_causal=is_causal)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    return 0


def _backward(q, k, v, is_causal: bool, config: str, family: str, dtype: str):
    """A call running ``family``'s backward of one forward's output (default forward)."""
    import torch

    import flashscope
    from flashscope import launch
    from flashscope.api import device_target
    from flashscope.families import Problem, config_from_text
    from flashscope.masks import Mask

    B, H, N, D = q.shape
    problem = Problem(device_target(q.device) or "sm90", dtype, D, is_causal, N, N, B * H)
    cfg = config_from_text(config, problem, family)
    out, lse = flashscope.attention(q, k, v, is_causal=is_causal, return_lse=True)
    dout = torch.randn_like(q)
    return lambda: launch.backward(dout, q, k, v, out, lse, mask=Mask.of(is_causal),
                                   scale=D ** -0.5, cfg=cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
