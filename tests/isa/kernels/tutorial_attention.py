"""A FlashAttention forward in the style of Triton's fused-attention tutorial, written for
the tests of ``flashscope inspect FILE.py:KERNEL --lines``: one program per (row block,
batch x head), Q loaded once, K/V tiles folded in with an online softmax in base 2 by an
inner ``@triton.jit`` helper (which Triton inlines, so its lines appear both as their own
and at the call site)."""

import triton
import triton.language as tl


@triton.jit
def _fold_tiles(acc, m_i, l_i, q, K, V, stride_kn, stride_vn, N_CTX, qk_scale,
                BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(0, N_CTX, BLOCK_N):
        k = tl.load(K + (start + offs_n)[None, :] * stride_kn + offs_d[:, None])
        s = tl.dot(q, k) * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (start + offs_n)[:, None] * stride_vn + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def attention(Q, K, V, Out, stride_h, stride_n, N_CTX, qk_scale,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1) * stride_h
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * stride_n + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, m_i, l_i = _fold_tiles(acc, m_i, l_i, q, K + base, V + base, stride_n, stride_n,
                                N_CTX, qk_scale, BLOCK_N, HEAD_DIM)
    out = acc / l_i[:, None]
    tl.store(Out + base + offs_m[:, None] * stride_n + offs_d[None, :],
             out.to(Out.dtype.element_ty))
