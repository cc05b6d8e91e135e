"""Input factories for tests and checks: fresh random inputs on a device, with the seed
recorded so a failure can be replayed."""

from __future__ import annotations

import contextlib
import secrets
from typing import NamedTuple, Optional

import torch


def fresh_seed() -> int:
    seed = secrets.randbits(31)
    torch.manual_seed(seed)
    return seed


def make_qkv(device, B, H, Nq, Nk, D, *, Hkv=None, dtype=torch.float16, bnhd=False,
             scale_inputs=1.0):
    """q (B, H, Nq, D), k/v (B, Hkv, Nk, D). With ``bnhd`` the tensors are stored
    (B, N, H, D) and returned as ``.transpose(1, 2)`` views (non-contiguous)."""
    Hkv = Hkv or H
    dev = "cuda" if device == "cuda" else "cpu"

    def one(h, n):
        if bnhd:
            t = torch.randn(B, n, h, D, device=dev, dtype=torch.float32) * scale_inputs
            return t.to(dtype).transpose(1, 2)
        return (torch.randn(B, h, n, D, device=dev, dtype=torch.float32) * scale_inputs).to(dtype)

    return one(H, Nq), one(Hkv, Nk), one(Hkv, Nk)


@contextlib.contextmanager
def nan_allocations():
    """Every tensor ``torch.empty`` allocates inside the block is NaN until written
    (PyTorch's deterministic mode fills uninitialized memory, CPU and GPU; ``warn_only``
    so nothing refuses to run), so an output element a kernel leaves unwritten shows."""
    det = torch.utils.deterministic
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


class KVCacheInputs(NamedTuple):
    """The tensors of one :func:`flashscope.attention_with_kvcache` call."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: Optional[torch.Tensor]
    k: Optional[torch.Tensor]
    v: Optional[torch.Tensor]

    def kwargs(self) -> dict:
        """The keyword arguments after q, k_cache, v_cache."""
        return dict(cache_seqlens=self.cache_seqlens, block_table=self.block_table, k=self.k,
                    v=self.v)


def page_order(pages: int, order="shuffled", device="cpu") -> torch.Tensor:
    """The pool's ``pages`` indices in the order a block table hands them out: "shuffled"
    (a random permutation of the pool), "inorder" (0, 1, ...: sequence b's pages follow
    one another, the bytes of a dense cache), or G > 0 (shuffled within each aligned group
    of G pages, the groups in order)."""
    if order == "inorder":
        return torch.arange(pages, device=device)
    if order == "shuffled":
        return torch.randperm(pages, device=device)
    if not (isinstance(order, int) and order > 0):
        raise ValueError(f"order {order!r}: expected 'shuffled', 'inorder' or pages > 0")
    return torch.cat([torch.randperm(min(order, pages - s), device=device) + s
                      for s in range(0, pages, order)])


def make_kvcache(device, B, Nq, H, Hkv, D, capacity, *, lens=None, page: int = 0,
                 n_new: int = 0, dtype=torch.float16, spare_pages: int = 0,
                 order="shuffled") -> KVCacheInputs:
    """Unit-normal inputs of a decoding call: q (B, Nq, H, D); a cache of ``capacity``
    keys a sequence, dense (B, capacity, Hkv, D), or (``page`` > 0) in pages of ``page``
    keys, (B capacity / page + ``spare_pages``, page, Hkv, D), handed out to the
    sequences by the block table (B, capacity / page) int32 in random order (``order``:
    :func:`page_order`); ``cache_seqlens`` (B,) int32 (``lens``, default capacity - n_new
    each); and ``n_new`` new keys and values (B, n_new, Hkv, D), or None. Every cache entry
    past a sequence's length holds random values too, which a kernel must not read."""
    dev = "cuda" if device == "cuda" else "cpu"

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.float32).to(dtype)

    lens = [capacity - n_new] * B if lens is None else list(lens)
    table = None
    if page:
        per_seq = -(-capacity // page)
        pages = B * per_seq + spare_pages
        shape = (pages, page, Hkv, D)
        table = page_order(pages, order, dev)[:B * per_seq].view(B, per_seq)
        table = table.to(torch.int32)
    else:
        shape = (B, capacity, Hkv, D)
    new = [randn(B, n_new, Hkv, D) for _ in range(2)] if n_new else [None, None]
    return KVCacheInputs(randn(B, Nq, H, D), randn(*shape), randn(*shape),
                         torch.tensor(lens, dtype=torch.int32, device=dev), table, *new)
