"""The portable forward (``triton-fwd``): one Triton body for every NVIDIA and AMD target and
Triton's CPU interpreter (:mod:`flashscope.kernels.attention_fwd`).

Its record (:class:`TritonFwdConfig`), its rules (:data:`RULES`), its defaults as data
(:data:`DEFAULTS`, chosen by :func:`select`) and the argument list of a launch
(:func:`call`), which :mod:`flashscope.launch` launches and :mod:`flashscope.compile`
binds offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from .base import (CAPS, DTYPE_BYTES, WARPS, Knobs, Problem, check_rules, head_dim_pad,
                   pow2_tiles, shared_memory, stages, unit_consts)

KERNEL = "triton-fwd"
MODULE, FUNCTION = "attention_fwd", "_attn_fwd"


@dataclass(frozen=True)
class TritonFwdConfig(Knobs):
    """Tile and launch knobs of the portable forward.

    BLOCK_M x BLOCK_N is the score tile each program computes per step (BLOCK_M query rows
    against BLOCK_N keys). Q_IN_REGS keeps the Q tile live in registers across the key
    loop (False re-reads it every iteration: fewer live registers, more shared-memory/L1
    traffic). ``maxnreg`` caps registers per thread (NVIDIA ptxas ``.maxnreg``);
    ``waves_per_eu`` asks the AMD backend for that many waves per SIMD. Both are analysis
    axes of the report and the sweep."""

    KERNEL: ClassVar[str] = KERNEL

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    Q_IN_REGS: bool = True
    maxnreg: Optional[int] = None
    waves_per_eu: Optional[int] = None

    def _label_parts(self) -> list:
        return [f"{self.BLOCK_M}x{self.BLOCK_N}", f"w{self.num_warps}", f"s{self.num_stages}",
                *([] if self.Q_IN_REGS else ["q-reload"]), *self._caps()]


Config = TritonFwdConfig

def min_shared_bytes(cfg: TritonFwdConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """A lower bound on the kernel's shared memory, in bytes: the K and V tiles
    (BLOCK_N x D_pad each) staged by a software pipeline of S stages keep at least
    max(1, S - 1) copies of each in flight. Triton may use more (Q, conversion scratch),
    never less, so a config over the limit by this bound certainly cannot launch."""
    elt = DTYPE_BYTES[dtype]
    return 2 * cfg.BLOCK_N * head_dim_pad(head_dim) * elt * max(1, cfg.num_stages - 1)


RULES = (
    pow2_tiles("BLOCK_M", "BLOCK_N"),
    WARPS,
    stages(1, 8),
    CAPS,
    shared_memory(min_shared_bytes, lambda c: f"BLOCK_M={c.BLOCK_M}, BLOCK_N={c.BLOCK_N}"),
)

#: the values a one-knob search steps along (:func:`~.base.neighbours`); the rules decide
#: which of them a target takes
STEPS = {"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (16, 32, 64, 128, 256),
         "num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2, 3, 4, 5, 6, 7, 8),
         "maxnreg": (96, 128, 168, 232, None), "waves_per_eu": (1, 2, 3, 4, None)}


def check(cfg: TritonFwdConfig, target="sm90", head_dim: int = 128,
          dtype: str = "bfloat16") -> TritonFwdConfig:
    """``cfg`` unchanged if it can be built for ``target``; else ConfigError naming the
    knob and the limit it breaks."""
    return check_rules(cfg, RULES, target, head_dim, dtype)


# Defaults as data: (target name or family, largest head dim, causal or None for both)
# -> config. The first row whose key matches the target (name before family), whose
# head-dim bound holds and whose causal flag matches wins. sm90 rows: the best of a
# 20-config scan on an H100 (bf16, B*N = 16384, H*D = 2048): 128/64/8w/3s was
# best for D = 64 everywhere and for D = 128 non-causal (501 TFLOP/s at N = 4096);
# 64/64/4w/3s was best for causal D = 128 at N <= 4096 (432 TFLOP/s against 411).
# Rows naming gfx90a, gfx942, gfx950, gfx1100 and gfx1201 (no AMD GPU timed): chosen from
# the code objects by ``flashscope tune offline`` (flashscope.tune.offline; Triton 3.6):
# each is free of VGPR and SGPR spills and scratch, its waves do not repeat each other's
# matrix work, it is not within 16 VGPRs or 8 KB of LDS of gaining a workgroup, and it
# beats every rule-valid config one knob (or one paired two-knob move) away on waves per
# SIMD (up to 2), then resident score elements per CU, then BLOCK_M; docs/report.md has
# the readings. Cells whose choice differs from these rows are tuned entries (search
# "offline"). gfx1100 and gfx1201 at D = 256 have no clean config near their defaults: the
# rows are the least bad (no spills, but the loop issues more WMMA multiply-adds than the
# tile needs: waves of 8 rows against a 16-row instruction); the former gfx1100 32x16 w4
# spilled 24 VGPRs, the former gfx1201 64x32 w4 at D = 128 causal 7. gfx950: both dtypes
# agree in every cell (240-253 VGPRs, 2 waves/SIMD). The cdna and rdna rows are the
# earlier hand-read choice, for targets the offline search has not covered.
C = TritonFwdConfig
DEFAULTS = (
    ("sm90", 64, None, C(128, 64, 8, 3)),
    ("sm90", 128, False, C(128, 64, 8, 3)),
    ("sm90", 128, True, C(64, 64, 4, 3)),
    ("sm90", 256, None, C(64, 64, 4, 2)),
    ("nvidia", 64, None, C(128, 64, 4, 3)),
    ("nvidia", 128, None, C(128, 64, 8, 2)),
    ("nvidia", 256, None, C(64, 32, 4, 2)),
    ("gfx90a", 64, None, C(256, 32, 4, 2, waves_per_eu=2)),
    ("gfx90a", 128, None, C(256, 64, 8, 2)),
    ("gfx90a", 256, None, C(128, 16, 8, 2, waves_per_eu=2)),
    ("gfx942", 64, None, C(256, 32, 4, 2, waves_per_eu=2)),
    ("gfx942", 128, None, C(256, 32, 8, 2)),
    ("gfx942", 256, None, C(128, 16, 8, 1, waves_per_eu=2)),
    ("gfx950", 64, False, C(256, 64, 4, 2, waves_per_eu=2)),
    ("gfx950", 64, True, C(256, 64, 4, 1, waves_per_eu=2)),
    ("gfx950", 128, False, C(256, 128, 8, 2)),
    ("gfx950", 128, True, C(256, 64, 8, 2)),
    ("gfx950", 256, False, C(256, 32, 8, 1, waves_per_eu=2)),
    ("gfx950", 256, True, C(256, 16, 8, 1, waves_per_eu=2)),
    ("gfx1100", 64, False, C(64, 128, 4, 1, waves_per_eu=6)),
    ("gfx1100", 64, True, C(128, 128, 8, 1)),
    ("gfx1100", 128, None, C(128, 64, 8, 1)),
    ("gfx1100", 256, False, C(128, 16, 16, 1)),
    ("gfx1201", 64, None, C(64, 64, 4, 1, waves_per_eu=12)),
    ("gfx1201", 128, False, C(128, 128, 8, 1)),
    ("gfx1201", 128, True, C(128, 128, 8, 1, waves_per_eu=4)),
    ("gfx1201", 256, None, C(32, 32, 4, 1)),
    ("cdna", 64, None, C(128, 64, 4, 2, waves_per_eu=2)),
    ("cdna", 128, None, C(128, 64, 8, 2)),
    ("cdna", 256, None, C(64, 32, 4, 1, waves_per_eu=2)),
    ("rdna", 128, None, C(64, 32, 4, 1)),
    ("rdna", 256, None, C(32, 16, 4, 1)),
)
del C


def select(problem: Problem) -> TritonFwdConfig:
    """The default for a problem: pure, tensor-free, deterministic."""
    from .base import table_select

    return table_select(DEFAULTS, KERNEL, problem)


def accepts(problem: Problem) -> Optional[str]:
    """Why this family cannot run ``problem``, or None: it runs every problem, packed
    batches included."""
    return None


def packed_shape(q, k, packed) -> tuple:
    """(B, rows, keys, per-sequence lengths or None) of a launch over q (B, H, Nq, D) and
    k (B, Hkv, Nk, D): the grid's batch and the longest rows and keys it covers; with a
    :class:`~flashscope.launch.Packed` batch its sequences' count and longest lengths,
    which the host knows only as bounds (the kernels read the rest on the device)."""
    if packed is None:
        return q.shape[0], q.shape[2], k.shape[2], (q.shape[2], k.shape[2])
    return packed.batch, packed.max_seqlen_q, packed.max_seqlen_k, (None, None)


def _args(q, k, v, out, lse, scalars: tuple, cu: tuple) -> tuple:
    """``_attn_fwd``'s positional arguments: the tensors (``out`` in the slot of a missing
    log-sum-exp), the scalars (strides, sizes, the mask's), the prefix sums (or any two
    tensors, unread without VARLEN)."""
    return (q, k, v, out, lse if lse is not None else out, *scalars, *cu)


def call(q, k, v, out, lse, *, mask, scale: float, cfg: TritonFwdConfig, packed=None):
    """(grid, positional args, constexpr keywords) of one ``_attn_fwd`` launch: what
    :func:`flashscope.launch.forward` launches and offline compilation binds (on meta
    tensors). ``lse=None``: no log-sum-exp (``out`` is passed in its slot). ``packed``: a
    :class:`~flashscope.launch.Packed` batch (VARLEN): q (1, H, total_q, D), the grid
    over its longest sequence, the mask's lengths per sequence on the device."""
    from ..launch import LOG2E, triton_cdiv

    _, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    B, rows, _, lengths = packed_shape(q, k, packed)
    grid = (triton_cdiv(rows, cfg.BLOCK_M), B * H)
    switches = mask.switches(*lengths)
    cu = (q, q) if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k)
    args = _args(q, k, v, out, lse, (*q.stride(), *k.stride(), *v.stride(), *out.stride(),
                                      H, H // Hkv, Nq, Nk, scale * LOG2E,
                                      *mask.scalars(*lengths), *mask.cap_args(scale)), cu)
    consts = dict(HEAD_DIM=D, HEAD_DIM_PAD=head_dim_pad(D),
                  BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, Q_IN_REGS=bool(cfg.Q_IN_REGS),
                  RETURN_LSE=lse is not None,
                  EVEN_N=packed is None and Nk % cfg.BLOCK_N == 0,
                  SCALE_POS=scale > 0, HEAVY_FIRST=mask.causal and not mask.left_bounded,
                  **switches, VARLEN=packed is not None, **unit_consts(q, k, v, out))
    return grid, args, consts


def run(q, k, v, out, lse, *, mask, scale: float, cfg: TritonFwdConfig,
        packed=None) -> None:
    """Launch the kernel (GPU, or Triton's interpreter on CPU tensors)."""
    from .. import kernels
    from ..launch import interpreting, launch_jit, launch_options

    grid, args, consts = call(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg,
                              packed=packed)
    kernel = getattr(kernels.load(MODULE, interpret=interpreting()), FUNCTION)
    launch_jit(kernel, grid, args, consts, launch_options(cfg, q.device), q.device)


def bind(q, k, v, out, lse, *, mask, scale: float, cfg: TritonFwdConfig):
    """:func:`run` for every later launch on a GPU on tensors of these tensors' geometry
    (:class:`flashscope.launch.BoundForward`): the arguments but the addresses and the
    compiled kernel are found once. A function of (q, k, v, out, lse)."""
    from .. import kernels
    from ..launch import launch_compiled, launch_options

    grid, args, consts = call(q, k, v, out, lse, mask=mask, scale=scale, cfg=cfg)
    scalars = args[5:-2]  # :func:`_args`: five tensors, the scalars, two prefix sums
    kernel, options, cache = getattr(kernels.load(MODULE), FUNCTION), \
        launch_options(cfg, q.device), {}

    def go(q, k, v, out, lse):
        launch_compiled(kernel, grid, _args(q, k, v, out, lse, scalars, (q, q)), consts,
                        options, cache=cache)
    return go
