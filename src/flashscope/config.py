"""Kernel configs: the knobs as one frozen record, default selection, feasibility checks.

Flow (after FlashAttention's cute ``config.py``): problem facts (head dim, dtype, causal,
target) -> the pure :func:`select_config` -> a resolved :class:`AttentionConfig`.
Selection never reads tensor contents, synchronizes or allocates. A caller's config goes
through :func:`check_config`: it is honoured as given or rejected with the limit it breaks,
never silently changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .errors import ConfigError
from .targets import get_target

#: Head dims the kernels accept; anything in between is padded inside the kernel.
MIN_HEAD_DIM, MAX_HEAD_DIM = 1, 256

DTYPE_BYTES = {"float16": 2, "bfloat16": 2}


class _Knobs:
    """What both config records share: dict/text round trips that reject unknown keys, a
    short label, and the vendor caps. Subclasses are frozen dataclasses that set
    ``_WHAT`` (the noun in error messages), ``_TILES`` (their power-of-two tile knobs) and
    ``_core_key()``."""

    _WHAT = "config"
    _TILES: tuple = ()

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def key(self) -> str:
        """Short stable label (e.g. ``m128n64w4s3q1``); caps appended when set."""
        s = self._core_key()
        if self.maxnreg is not None:
            s += f"r{self.maxnreg}"
        if self.waves_per_eu is not None:
            s += f"e{self.waves_per_eu}"
        return s

    @classmethod
    def from_dict(cls, d: dict):
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ConfigError(f"{cls._WHAT}: unknown key(s) {', '.join(unknown)}; "
                              f"expected some of {', '.join(fields)}")
        return cls(**{k: _coerce(k, v) for k, v in d.items()})

    @classmethod
    def parse(cls, text: str, base=None):
        """``"KEY=VALUE,..."`` (e.g. ``BLOCK_M=128,num_warps=8``) on top of ``base`` (the
        default record)."""
        d = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ConfigError(f"{cls._WHAT}: expected KEY=VALUE, got {part!r}")
            k, v = (x.strip() for x in part.split("=", 1))
            d[k] = v
        parsed = cls.from_dict(d)
        return dataclasses.replace(base or cls(), **{k: getattr(parsed, k) for k in d})


@dataclass(frozen=True)
class AttentionConfig(_Knobs):
    """Tile and launch knobs of the forward kernel.

    BLOCK_M x BLOCK_N is the score tile each program computes per step (BLOCK_M query rows
    against BLOCK_N keys). Q_IN_REGS keeps the Q tile live in registers across the KV loop
    (False re-reads it every iteration: fewer live registers, more shared-memory/L1
    traffic). ``maxnreg`` caps registers per thread (NVIDIA ptxas ``.maxnreg``);
    ``waves_per_eu`` asks the AMD backend for that many waves per SIMD.

    Hopper (sm_90+) knobs: TMA loads Q, K, V with tensor-memory-accelerator descriptors
    instead of per-thread addresses; WARP_SPEC (needs TMA and num_warps=4) has Triton's
    Hopper pass split the kernel into a TMA producer warp group and two consumer warp
    groups of BLOCK_M/2 rows each: 12 warps run, 4 of them loading.

    EXP2_POLY (0, 2 or 4; 8 too with GLUON): one score column in EXP2_POLY takes its
    exponential from a degree-3 polynomial on the FMA pipe instead of the special-function
    unit (MUFU.EX2, 16 per SM per clock on sm_80/sm_90); 0 keeps every exponential on MUFU.

    OVERLAP issues the next key tile's Q K^T before this tile's softmax (software
    pipelining by hand, as FlashAttention-3 does inside a warp group): two score tiles are
    live, and the last prefetch of each loop is computed and dropped.

    GLUON selects the Hopper variant written in Gluon
    (:mod:`flashscope.kernels.attention_fwd_sm90`): a TMA producer (one warp, or the default
    warpgroup with BLOCK_M=192) and one consumer warpgroup per 64 query rows, each
    overlapping its softmax with its own P V wgmma.
    num_stages is its K/V ring depth. Its rules: sm_90, head dim 64 or 128, TMA=1,
    num_warps=4 (per warpgroup), BLOCK_M 64, 128 or 192, BLOCK_N 64 or 128, 2..4 stages,
    no maxnreg (setmaxnreg budgets are set per partition), and no WARP_SPEC. There
    Q_IN_REGS=1 loads each consumer's Q slot into registers once per work tile and feeds
    Q K^T from them (wgmma's register A operand): each key tile then reads K from shared
    memory but not Q (at D = 128, 16 of the 80 KB a consumer reads per key tile), for D / 4
    more registers per thread (too many for three consumers at 160); with EARLY_Q the Q
    slot goes back after the first Q K^T instead of the last. Its loop already issues the next
    tile's Q K^T with this tile's P V; OVERLAP says how much of the softmax runs under
    that product, since ptxas would otherwise hoist the P V wait above all of it: 1 pins
    the exponentials ahead of the wait (FlashAttention-3's intra-warpgroup overlap), 2 only
    the row maximum, the exponentials following the wait (FlashAttention-4's order).
    PERSISTENT (GLUON only) launches one program per SM, each looping over work tiles, so
    the K/V loads of the next tile start under the previous tile's epilogue; causal grids
    then run a work list built on the host (:mod:`flashscope.schedule`: L2-sized sections
    of heads, longest row blocks first, each placed on the least-loaded program).
    PINGPONG (GLUON, BLOCK_M >= 128) makes the consumer warpgroups issue their wgmma in
    turn, so one's softmax runs while the others' products hold the tensor cores
    (FlashAttention-3's ping-pong schedule).
    LAZY_RESCALE (GLUON) keeps a row's running maximum until a key tile raises it by more
    than 8 (base 2, a factor 256), so most tiles skip the O *= alpha rescale; a warp runs
    it only when one of its rows moved that far (FlashAttention-4's conditional rescaling).
    EARLY_Q (GLUON) stages each consumer's output in a shared-memory slot of its own
    (BLOCK_M x D more), so the Q slot goes back to the producer at the work tile's last
    Q K^T and the next Q loads under the last P V and the epilogue instead of after the
    output store; that store is waited for only before the slot is written again.
    K_EARLY (GLUON) hands each K slot back as soon as its Q K^T completes instead of
    with its V after the P V, so a ring of num_stages slots prefetches one K tile further
    (one mbarrier arrive more per key tile).
    MASKED_FIRST (GLUON) loads and consumes each work tile's masked key tiles first (the
    diagonal ones, or the partial last one), so each consumer masks only its first tile
    and its loop carries no mask; a causal consumer's tiles past its own rows (which it
    only passes on) then come first too. ptxas schedules the shorter loop differently:
    +1-2% at D = 64 causal with BLOCK_M = 192, -1 to -3% on other entries (run 74).
    OUT_RCP (GLUON) scales each output row by one reciprocal of its sum l instead of
    dividing each of its values by l (each division carries ptxas's range fix-up): a
    shorter epilogue, which counts where work tiles are short.
    BALANCE (GLUON, PERSISTENT) prices a head's last row block by the consumers that
    hold real rows (those whose rows are all past Nq pass its key tiles on) and splits
    the heads into sections of nearly equal size in the host's work list
    (:mod:`flashscope.schedule`), so the cheap blocks fill the programs' ragged last
    round. A non-causal grid runs that list only with BALANCE (else round-robin, every
    consumer computing); a causal grid always runs a list, without BALANCE one that
    prices every block whole and leaves a small last section.
    JOINT_KV (GLUON) lands a ring slot's K and V tiles on one mbarrier, so each consumer
    waits once per key tile instead of twice (a wait that has already completed still
    costs its latency on the consumer's path); the first Q K^T of a work tile then waits
    for V too, so the producer issues a work tile's first V with its first K. Each key
    tile's Q K^T then waits for its V as well, a tile of V prefetch less: 0.99 of the
    time at D = 64 with N = 1024-4096 and three stages, 1.5-1.7x with K_EARLY and two
    stages (D = 128), where the ring has no slack left (runs 143-144).
    SPLIT_KV (GLUON, PERSISTENT) evens out the programs' ends by cutting row blocks
    along the keys: the host's work list (:func:`flashscope.schedule.split_schedule`,
    causal or not) takes the last blocks off the programs over a target load and places
    them again where there is room, cut where that room ends; each piece writes its
    unnormalized output and softmax state to a float32 workspace and a second kernel
    (:mod:`flashscope.kernels.attention_merge`) combines a block's pieces. Non-causal
    without BALANCE the list starts round-robin and every consumer computes, padding
    rows too (so any block may be cut); with BALANCE it starts from that list. It also
    spreads few long row blocks (short Nq, long Nk) over every SM.
    LEAN_RELEASE (GLUON) hands ring slots back without a warpgroup barrier: the slots'
    free mbarriers move to static shared memory outside Triton's allocation, where its
    barrier analysis does not see them, and one elected lane of each consumer warp
    arrives once its wgmma wait has returned (CUTLASS's consumer release). Each
    consumer's loop loses one ``bar.sync`` a key tile, the producer one a wait.
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    Q_IN_REGS: bool = True
    maxnreg: Optional[int] = None
    waves_per_eu: Optional[int] = None
    TMA: bool = False
    WARP_SPEC: bool = False
    EXP2_POLY: int = 0
    OVERLAP: int = 0
    GLUON: bool = False
    PERSISTENT: bool = False
    PINGPONG: bool = False
    LAZY_RESCALE: bool = False
    EARLY_Q: bool = False
    K_EARLY: bool = False
    MASKED_FIRST: bool = False
    OUT_RCP: bool = False
    BALANCE: bool = False
    JOINT_KV: bool = False
    SPLIT_KV: bool = False
    LEAN_RELEASE: bool = False

    _TILES = ("BLOCK_M", "BLOCK_N")

    def _core_key(self) -> str:
        return (f"m{self.BLOCK_M}n{self.BLOCK_N}w{self.num_warps}s{self.num_stages}"
                f"q{int(self.Q_IN_REGS)}" + ("t" if self.TMA else "")
                + ("ws" if self.WARP_SPEC else "")
                + (f"e{self.EXP2_POLY}" if self.EXP2_POLY else "")
                + ("o" if self.OVERLAP == 1 else f"o{self.OVERLAP}" if self.OVERLAP else "")
                + ("g" if self.GLUON else "")
                + ("p" if self.PERSISTENT else "")
                + ("x" if self.PINGPONG else "")
                + ("l" if self.LAZY_RESCALE else "")
                + ("h" if self.EARLY_Q else "") + ("k" if self.K_EARLY else "")
                + ("f" if self.MASKED_FIRST else "") + ("i" if self.OUT_RCP else "")
                + ("b" if self.BALANCE else "") + ("j" if self.JOINT_KV else "")
                + ("v" if self.SPLIT_KV else "") + ("r" if self.LEAN_RELEASE else ""))


_BOOL_KNOBS = ("Q_IN_REGS", "TMA", "WARP_SPEC", "GLUON", "PERSISTENT",
               "PINGPONG", "LAZY_RESCALE", "EARLY_Q", "K_EARLY", "MASKED_FIRST", "OUT_RCP",
               "BALANCE", "JOINT_KV", "SPLIT_KV", "LEAN_RELEASE")
#: integer knobs that also take true/false (they were switches before they had levels)
_LEVEL_KNOBS = ("OVERLAP",)


def _switch(value):
    """True or False for a switch's spellings (bools, 1/0, true/false, yes/no, on/off),
    None for anything else."""
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    return True if low in ("1", "true", "yes", "on") else \
        False if low in ("0", "false", "no", "off") else None


def _coerce(key, value):
    if key in _BOOL_KNOBS:
        on = _switch(value) if isinstance(value, str) else bool(value)
        if on is None:
            raise ConfigError(f"config: {key} expects true/false, got {value!r}")
        return on
    if key in _LEVEL_KNOBS:
        on = _switch(value)
        if on is not None:
            return int(on)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        if key in ("maxnreg", "waves_per_eu"):
            return None
        raise ConfigError(f"config: {key} needs an integer")
    try:
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        return int(float(value))
    except (TypeError, ValueError):
        raise ConfigError(f"config: {key} expects an integer, got {value!r}") from None


def head_dim_pad(head_dim: int) -> int:
    """Next power of two >= head_dim, at least 16 (tensor-core K dimension)."""
    p = 16
    while p < head_dim:
        p *= 2
    return p


def check_head_dim(head_dim: int) -> None:
    if not (MIN_HEAD_DIM <= int(head_dim) <= MAX_HEAD_DIM):
        raise ConfigError(f"head dim {head_dim} is not supported: expected "
                          f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM} (padded to a power of two inside)")


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def min_shared_bytes(cfg: AttentionConfig, head_dim: int, dtype: str = "bfloat16") -> int:
    """A lower bound on the forward kernel's shared memory, in bytes.

    The K and V tiles (BLOCK_N x D_pad each) are staged through shared memory; a software
    pipeline of S stages keeps at least max(1, S - 1) copies of each in flight. Triton may
    use more (Q, conversion scratch), never less, so a config over the limit by this bound
    certainly cannot launch.
    """
    elt = DTYPE_BYTES[dtype]
    if cfg.GLUON:  # Q (and O with EARLY_Q), the K/V ring (exact, but for the barriers)
        rows = cfg.BLOCK_M * (2 if cfg.EARLY_Q else 1) + 2 * cfg.num_stages * cfg.BLOCK_N
        pin = 16 * cfg.BLOCK_M if cfg.OVERLAP else 0  # 4 fp32 a row, stored to with OVERLAP
        # LEAN_RELEASE's static barriers: 1 KB, so that Triton's dynamic part stays
        # 1024-aligned (128-byte swizzled TMA tiles need it)
        lean = 1024 if cfg.LEAN_RELEASE else 0
        return rows * head_dim_pad(head_dim) * elt + pin + lean
    return 2 * cfg.BLOCK_N * head_dim_pad(head_dim) * elt * max(1, cfg.num_stages - 1)


def _check_knobs(cfg, target, head_dim: int, dtype: str, need: int, tiles_text: str):
    """The checks both records share; ``need`` is the kernel's shared-memory lower bound
    and ``tiles_text`` the knobs that decide it, for the message."""
    t = get_target(target)
    check_head_dim(head_dim)
    where = f"for {t.name}"
    # the Gluon variant's tiles were checked against its own list (BLOCK_M 192 included)
    for name in () if getattr(cfg, "GLUON", False) else cfg._TILES:
        v = getattr(cfg, name)
        if not (_pow2(v) and 16 <= v <= 256):
            raise ConfigError(f"{name}={v}: expected a power of two in 16..256")
    if not (_pow2(cfg.num_warps) and cfg.num_warps <= 16):
        raise ConfigError(f"num_warps={cfg.num_warps}: expected a power of two in 1..16")
    threads = cfg.num_warps * t.warp_size
    if threads > t.max_threads_per_block:
        raise ConfigError(f"num_warps={cfg.num_warps} gives {threads} threads per block, over "
                          f"the {t.max_threads_per_block} allowed {where}")
    if not (1 <= cfg.num_stages <= 8):
        raise ConfigError(f"num_stages={cfg.num_stages}: expected 1..8")
    if cfg.maxnreg is not None:
        if t.vendor != "nvidia":
            raise ConfigError(f"maxnreg={cfg.maxnreg} is an NVIDIA register cap; {t.name} is "
                              "AMD (use waves_per_eu)")
        if not (16 <= cfg.maxnreg <= t.max_regs_per_thread):
            raise ConfigError(f"maxnreg={cfg.maxnreg}: expected 16..{t.max_regs_per_thread} "
                              f"registers per thread {where}")
    if cfg.waves_per_eu is not None:
        if t.vendor != "amd":
            raise ConfigError(f"waves_per_eu={cfg.waves_per_eu} is an AMD option; {t.name} "
                              "is NVIDIA (use maxnreg)")
        if not (1 <= cfg.waves_per_eu <= t.max_waves_per_simd):
            raise ConfigError(f"waves_per_eu={cfg.waves_per_eu}: expected "
                              f"1..{t.max_waves_per_simd} {where}")
    limit = t.smem_per_block_optin
    if need > limit:
        raise ConfigError(
            f"{tiles_text}, HEAD_DIM={head_dim} with {cfg.num_stages} stages needs at least "
            f"{need // 1024} KB of shared memory, more than the {limit // 1024} KB a "
            f"{t.name} block may have")
    return cfg


def check_config(cfg: AttentionConfig, target="sm90", head_dim: int = 128,
                 dtype: str = "bfloat16") -> AttentionConfig:
    """Return ``cfg`` unchanged if it can be built for ``target``; else raise ConfigError
    naming the knob and the limit it breaks. Pure: no compilation, no GPU."""
    t = get_target(target)
    if cfg.GLUON:
        _check_gluon(cfg, t, head_dim)
    else:
        for knob in ("PERSISTENT", "PINGPONG", "LAZY_RESCALE", "EARLY_Q", "K_EARLY",
                     "MASKED_FIRST", "OUT_RCP", "BALANCE", "JOINT_KV", "SPLIT_KV",
                     "LEAN_RELEASE"):
            if getattr(cfg, knob):
                raise ConfigError(f"{knob}=1 is a knob of the Gluon variant: it needs GLUON=1")
    levels = (0, 1, 2) if cfg.GLUON else (0, 1)
    if cfg.OVERLAP not in levels:
        raise ConfigError(f"OVERLAP={cfg.OVERLAP}: expected one of "
                          f"{', '.join(map(str, levels))}" + ("" if cfg.GLUON else
                                                              "; 2 needs GLUON=1"))
    polys = (2, 4, 8) if cfg.GLUON else (2, 4)
    if cfg.EXP2_POLY not in (0, *polys):
        shown = ", ".join(map(str, polys))
        raise ConfigError(f"EXP2_POLY={cfg.EXP2_POLY}: expected 0 (every exponential on "
                          f"MUFU) or one of {shown} (one score column in that many by "
                          "polynomial)" + ("" if cfg.GLUON else "; 8 needs GLUON=1"))
    if cfg.TMA:
        if t.vendor != "nvidia" or t.cc < 90:
            raise ConfigError(f"TMA=1 needs an NVIDIA target of sm_90 or later; {t.name} has "
                              "no tensor memory accelerator (use TMA=0)")
        if head_dim != head_dim_pad(head_dim):
            raise ConfigError(f"TMA=1 needs a head dim that is a power of two >= 16 (the "
                              f"tile is the row), got {head_dim} (use TMA=0)")
    if cfg.WARP_SPEC:
        if not cfg.TMA:
            raise ConfigError("WARP_SPEC=1 needs TMA=1 (the producer warp group issues TMA "
                              "copies)")
        if cfg.num_warps != 4:
            raise ConfigError(f"WARP_SPEC=1 needs num_warps=4 (one warp group per consumer; "
                              f"12 warps run), got num_warps={cfg.num_warps}")
        if cfg.num_stages > 2:
            # Measured on an H100 (scripts/gpu/fwd_hopper.py, 2026-11-21): Triton 3.6's
            # Hopper pass builds kernels that return NaN with 3 stages, for every shape.
            raise ConfigError(f"WARP_SPEC=1 needs num_stages <= 2 (Triton 3.6 builds wrong "
                              f"kernels with more), got num_stages={cfg.num_stages}")
        if cfg.OVERLAP:
            # Triton 3.6's Hopper pass stops (UNREACHABLE in WarpSpecialization) on a
            # loop-carried score tile.
            raise ConfigError("WARP_SPEC=1 cannot take OVERLAP=1 (Triton 3.6's Hopper pass "
                              "cannot specialize a loop that carries the next score tile; "
                              "use OVERLAP=0)")
        if cfg.EXP2_POLY:
            # Triton 3.6's data partitioning (WSDataPartition.cpp) stops on the reshape and
            # split that pick the polynomial columns: "unsupported op type".
            raise ConfigError(f"WARP_SPEC=1 cannot take EXP2_POLY={cfg.EXP2_POLY} (Triton 3.6's "
                              "Hopper pass cannot partition the column split; use "
                              "EXP2_POLY=0)")
    return _check_knobs(cfg, target, head_dim, dtype, min_shared_bytes(cfg, head_dim, dtype),
                        f"BLOCK_M={cfg.BLOCK_M}, BLOCK_N={cfg.BLOCK_N}")


#: (knob, allowed values, why) of the Gluon Hopper variant (AttentionConfig.GLUON).
_GLUON_RULES = (
    ("BLOCK_M", (64, 128, 192), "one consumer warpgroup per 64 query rows"),
    ("BLOCK_N", (64, 128), "the wgmma N of the score tile"),
    ("num_warps", (4,), "the warps of one consumer warpgroup"),
    ("num_stages", (2, 3, 4), "the depth of the K/V ring"),
    ("TMA", (True,), "every load is a TMA copy"),
    ("maxnreg", (None,), "register budgets are set per partition with setmaxnreg"),
    ("WARP_SPEC", (False,), "it is warp-specialized by hand"),
)


def _check_gluon(cfg: AttentionConfig, t, head_dim: int) -> None:
    if t.vendor != "nvidia" or t.cc // 10 != 9:
        raise ConfigError(f"GLUON=1 is the sm_90 (Hopper) variant; {t.name} is not sm_90 "
                          "(use GLUON=0)")
    if head_dim not in (64, 128):
        raise ConfigError(f"GLUON=1 takes head dim 64 or 128, got {head_dim} (use GLUON=0)")
    for knob, allowed, why in _GLUON_RULES:
        value = getattr(cfg, knob)
        if value not in allowed:
            shown = " or ".join(str(int(a) if isinstance(a, bool) else a) for a in allowed)
            raise ConfigError(f"GLUON=1 needs {knob}={shown} ({why}), got {knob}="
                              f"{int(value) if isinstance(value, bool) else value}")
    if cfg.PINGPONG and cfg.BLOCK_M < 128:
        raise ConfigError(f"PINGPONG=1 needs two or three consumer warpgroups to take turns "
                          f"(BLOCK_M=128 or 192), got BLOCK_M={cfg.BLOCK_M}")
    for knob in ("BALANCE", "SPLIT_KV"):
        if getattr(cfg, knob) and not cfg.PERSISTENT:
            raise ConfigError(f"{knob}=1 places work tiles on the programs of a persistent "
                              "grid: it needs PERSISTENT=1")


# Defaults as data: (target name or family, largest head dim, causal or None for both)
# -> config. The first row whose key matches the target (name before family), whose
# head-dim bound holds and whose causal flag matches wins. sm90 rows: the best of a
# 20-config scan on an H100 (bf16, B*N = 16384, H*D = 2048, 2026-11-21): 128/64/8w/3s was
# best for D = 64 everywhere and for D = 128 non-causal (501 TFLOP/s at N = 4096);
# 64/64/4w/3s was best for causal D = 128 at N <= 4096 (432 TFLOP/s vs 411).
_DEFAULTS = (
    ("sm90", 64, None, AttentionConfig(128, 64, 8, 3)),
    ("sm90", 128, False, AttentionConfig(128, 64, 8, 3)),
    ("sm90", 128, True, AttentionConfig(64, 64, 4, 3)),
    ("sm90", 256, None, AttentionConfig(64, 64, 4, 2)),
    ("nvidia", 64, None, AttentionConfig(128, 64, 4, 3)),
    ("nvidia", 128, None, AttentionConfig(128, 64, 8, 2)),
    ("nvidia", 256, None, AttentionConfig(64, 32, 4, 2)),
    ("cdna", 64, None, AttentionConfig(128, 64, 4, 2, waves_per_eu=2)),
    # gfx942, D = 128, read offline (no MI300X timed): 4 warps with waves_per_eu=2 forces
    # 256 VGPRs and spills 18; without the cap it needs 360 (1 wave/SIMD); 8 warps fit in
    # 230 VGPRs with no spill at 2 waves/SIMD.
    ("cdna", 128, None, AttentionConfig(128, 64, 8, 2)),
    ("cdna", 256, None, AttentionConfig(64, 32, 4, 1, waves_per_eu=2)),
    ("rdna", 128, None, AttentionConfig(64, 32, 4, 1)),
    ("rdna", 256, None, AttentionConfig(32, 16, 4, 1)),
)


def _family(t) -> str:
    return t.vendor if t.vendor == "nvidia" else t.family.rstrip("0123456789")


def _select(table, what: str, head_dim: int, causal: bool, target):
    t = get_target(target)
    check_head_dim(head_dim)
    for key, max_d, when_causal, cfg in table:
        if (key in (t.name, _family(t)) and head_dim <= max_d
                and when_causal in (None, bool(causal))):
            return cfg
    raise ConfigError(f"no default {what} for {t.name}, head dim {head_dim}")


def select_config(head_dim: int, dtype: str = "bfloat16", causal: bool = False,
                  target="sm90") -> AttentionConfig:
    """The default forward config for a problem: pure, tensor-free, deterministic."""
    return _select(_DEFAULTS, "config", head_dim, causal, target)


@dataclass(frozen=True)
class AttentionBwdConfig(_Knobs):
    """Tile and launch knobs of the backward kernels.

    The dK/dV kernel keeps a key tile of BLOCK_N1 rows (K, V, dK, dV) and streams query
    tiles of BLOCK_M1 rows; the dQ kernel keeps a query tile of BLOCK_M2 rows (Q, dO, dQ)
    and streams key tiles of BLOCK_N2. The resident tile is the large one (as in Triton's
    fused-attention tutorial: 32/128 and 128/32), so the streamed operands are small and
    the fp32 accumulators are what fills the registers. PRE_BLOCK is the row tile of the
    delta = rowsum(dO * O) preprocess. ``num_warps``, ``num_stages``, ``maxnreg`` and
    ``waves_per_eu`` apply to both main kernels (the preprocess is memory-bound: 4 warps,
    1 stage).
    """

    BLOCK_M1: int = 32
    BLOCK_N1: int = 128
    BLOCK_M2: int = 128
    BLOCK_N2: int = 32
    num_warps: int = 4
    num_stages: int = 3
    PRE_BLOCK: int = 64
    maxnreg: Optional[int] = None
    waves_per_eu: Optional[int] = None

    _WHAT = "bwd config"
    _TILES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "PRE_BLOCK")

    def _core_key(self) -> str:
        return (f"m{self.BLOCK_M1}n{self.BLOCK_N1}m{self.BLOCK_M2}n{self.BLOCK_N2}"
                f"w{self.num_warps}s{self.num_stages}p{self.PRE_BLOCK}")


def min_shared_bytes_bwd(cfg: AttentionBwdConfig, head_dim: int,
                         dtype: str = "bfloat16") -> int:
    """A lower bound on the larger backward kernel's shared memory, in bytes.

    The dK/dV kernel streams Q and dO tiles (BLOCK_M1 x D_pad each), the dQ kernel K and V
    tiles (BLOCK_N2 x D_pad each), with max(1, S - 1) copies in flight for S stages. The
    resident tiles may also live in shared memory; this bound leaves them out, so a config
    over the limit by it certainly cannot launch.
    """
    elt = DTYPE_BYTES[dtype]
    copies = max(1, cfg.num_stages - 1)
    streamed = max(cfg.BLOCK_M1, cfg.BLOCK_N2)
    return 2 * streamed * head_dim_pad(head_dim) * elt * copies


def check_bwd_config(cfg: AttentionBwdConfig, target="sm90", head_dim: int = 128,
                     dtype: str = "bfloat16") -> AttentionBwdConfig:
    """Return ``cfg`` unchanged if the backward can be built with it for ``target``; else
    raise ConfigError naming the knob and the limit it breaks. Pure: no compilation."""
    return _check_knobs(cfg, target, head_dim, dtype,
                        min_shared_bytes_bwd(cfg, head_dim, dtype),
                        f"BLOCK_M1={cfg.BLOCK_M1}, BLOCK_N2={cfg.BLOCK_N2}")


# Backward defaults as data, keyed like _DEFAULTS (causal None: both). Start: Triton's fused-attention tutorial
# (32/128 for dK/dV, 128/32 for dQ). Pruned by registers and local memory ("stack") of the
# sm90 cubins, bf16, read offline with cuobjdump (no GPU), dK/dV | dQ, non-causal / causal:
#   D=64,  32/128/128/32 w8 s3: 194/252 regs, no stack | 103/127   (w4: dK/dV 48 B stack)
#   D=128, 16/128/128/32 w8 s2: 243/254 regs, no stack | 203/195   (32/128 w8 s3: 16/144 B)
#   D=256, 16/32/32/16 w8 s2:   208/245 regs, no stack | 252/254   (16/64 w8: 136/680 B)
# Then timed on an H100 (scripts/gpu/bwd_check.py, bf16, N = 4096, 2026-11-21): the
# smaller 32/64/64/32 with 4 warps and 3 stages beat every spill-free wide tile, for both
# head dims (backward TFLOP/s, non-causal / causal):
#   D=64:  32/64/64/32 w4 s3 349 / 316  vs 32/128/128/32 w8 s3 313 / 303   (FA2 270 / 229)
#   D=128: 32/64/64/32 w4 s3 385 / 298  vs 16/128/128/32 w8 s2 246 / 178   (FA2 290 / 251)
_BWD_DEFAULTS = (
    ("sm90", 64, None, AttentionBwdConfig(32, 64, 64, 32, 4, 3)),
    ("sm90", 128, None, AttentionBwdConfig(32, 64, 64, 32, 4, 3)),
    # D=256 on an H200 (scripts/gpu/bwd_scan.py, N = 4096, non-causal / causal TFLOP/s):
    # 64/64/64/64 w8 s2 217 / 173 against the spill-free 16/32/32/16 w8 s2 at 43 / 43;
    # it spills 80 B in dK/dV (20 STL), which costs less than tiles too small for wgmma.
    ("sm90", 256, None, AttentionBwdConfig(64, 64, 64, 64, 8, 2)),
    ("nvidia", 64, None, AttentionBwdConfig(32, 128, 128, 32, 8, 2)),
    ("nvidia", 128, None, AttentionBwdConfig(16, 128, 128, 32, 8, 2)),
    ("nvidia", 256, None, AttentionBwdConfig(16, 32, 32, 16, 8, 1)),
    ("cdna", 128, None, AttentionBwdConfig(32, 64, 64, 32, 4, 1, waves_per_eu=1)),
    ("cdna", 256, None, AttentionBwdConfig(16, 32, 32, 16, 4, 1, waves_per_eu=1)),
    ("rdna", 128, None, AttentionBwdConfig(16, 32, 32, 16, 4, 1)),
    ("rdna", 256, None, AttentionBwdConfig(16, 16, 16, 16, 4, 1)),
)


def select_bwd_config(head_dim: int, dtype: str = "bfloat16", causal: bool = False,
                      target="sm90") -> AttentionBwdConfig:
    """The default backward config for a problem: pure, tensor-free, deterministic."""
    return _select(_BWD_DEFAULTS, "backward config", head_dim, causal, target)
