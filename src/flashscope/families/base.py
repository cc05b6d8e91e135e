"""What every kernel family's config record shares: strict parsing, the rules table, labels.

A family's record is a frozen dataclass of its knobs (subclass of :class:`Knobs`), with
``KERNEL`` naming the family. Records cross process and file boundaries as dicts
(:meth:`Knobs.from_dict` refuses unknown keys and values of the wrong type, naming the key)
or as ``KEY=VALUE,...`` text (:meth:`Knobs.parse`). :meth:`Knobs.diff` is what a tuned
entry stores (the knobs that differ from the family's defaults); :attr:`Knobs.label` is what
a person reads (``sm90-fwd 192x128 s3 pingpong``); :attr:`Knobs.key` a stable hash for
caches and stores.

A family's checks are data: a tuple of :class:`Rule` (the knob, what it must satisfy and
why), run in order by :func:`check_rules`; the first that fails raises
:class:`~flashscope.errors.ConfigError` with its message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple, Optional

from ..errors import ConfigError, LimitError
from ..targets import get_target

#: Head dims the kernels accept; anything in between is padded inside the kernel.
MIN_HEAD_DIM, MAX_HEAD_DIM = 1, 256

DTYPE_BYTES = {"float16": 2, "bfloat16": 2}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def head_dim_pad(head_dim: int) -> int:
    """Next power of two >= head_dim, at least 16 (the tensor cores' K step)."""
    p = 16
    while p < head_dim:
        p *= 2
    return p


def row_unit(*tensors) -> int:
    """The kernels' ROW_UNIT for a launch on ``tensors`` (:func:`flashscope.kernels.common.
    in_units`): 16 bytes in elements where each tensor's strides but its last are
    multiples of that and not all of them multiples of 16 elements (which the compiler
    learns without it), else 1."""
    strides = [s for t in tensors for s in tuple(t.stride())[:-1]]
    unit = max(1, 16 // max(t.element_size() for t in tensors))
    if unit == 1 or all(s % 16 == 0 for s in strides) or any(s % unit for s in strides):
        return 1
    return unit


def unit_consts(*tensors) -> dict:
    """A launch's constexpr for :func:`row_unit` on ``tensors``: none where it is 1, so
    the builds of head dims whose strides Triton already knows stay as they were."""
    unit = row_unit(*tensors)
    return {"ROW_UNIT": unit} if unit > 1 else {}


def head_parts(d: int) -> tuple:
    """(main, tail): the column parts a kernel runs head dim ``d`` as. Tiles are powers of
    two wide; a D between two of them runs as the lower power and a tail of the next power
    of two (at least 16, the tensor cores' K step) past the rest, where that is narrower
    than padding D whole: 80 as 64 + 16, 96 as 64 + 32, 48 as 32 + 16, 160 as 128 + 32,
    192 as 128 + 64; 112 runs as 128 (64 + 64 would be no narrower), and a D of 32 or
    less whole. The tail's share of the matrix work is its width: D = 96 pays for 96
    columns, not 128."""
    whole = head_dim_pad(d)
    main = whole // 2
    if main < 32 or d <= main:
        return whole, 0
    tail = head_dim_pad(d - main)
    return (main, tail) if main + tail < whole else (whole, 0)


def check_head_dim(head_dim: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not (
            MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM):
        raise ConfigError(f"head dim {head_dim!r} is not supported: expected an integer in "
                          f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM} (padded to a power of two inside)")


def pow2(x) -> bool:
    return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def _field_kind(f) -> str:
    t = str(f.type)
    return "bool" if t == "bool" else "opt_int" if "Optional" in t else "int"


def coerce(key: str, kind: str, value, what: str = "config"):
    """``value`` as the knob's type: bool switches take true/false, 1/0, yes/no, on/off;
    integers take integral numbers (or their text); optional integers also None/"none".
    Anything else (a float with a fraction, inf, nan, 1e400, text) is refused by name."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        low = str(value).strip().lower() if isinstance(value, str) else None
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ConfigError(f"{what}: {key} expects true/false, got {value!r}")
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        if kind == "opt_int":
            return None
        raise ConfigError(f"{what}: {key} needs an integer, got {value!r}")
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {key} expects an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        x = float(value) if isinstance(value, (str, float)) else None
    except ValueError:
        x = None
    if x is None or not math.isfinite(x) or x != int(x) or abs(x) >= 2 ** 31:
        raise ConfigError(f"{what}: {key} expects an integer, got {value!r}")
    return int(x)


class Knobs:
    """Mixin of the frozen config records. Subclasses set ``KERNEL`` (the family) and
    define :meth:`_label_parts`."""

    KERNEL: ClassVar[str] = ""

    def __post_init__(self):
        """A record built directly (not through :meth:`from_dict` or :meth:`parse`) still
        holds only values of its knobs' types: refused by name otherwise."""
        for f in dataclasses.fields(self):
            v, kind = getattr(self, f.name), _field_kind(f)
            ok = (isinstance(v, bool) if kind == "bool" else
                  (v is None or (isinstance(v, int) and not isinstance(v, bool)))
                  if kind == "opt_int" else isinstance(v, int) and not isinstance(v, bool))
            if not ok:
                what = "true/false" if kind == "bool" else "an integer"
                raise ConfigError(f"{self.KERNEL} config: {f.name} expects {what}, got {v!r}")

    def replace(self, **changes):
        return dataclasses.replace(self, **self.coerced(changes))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def coerced(cls, d: dict) -> dict:
        """``d`` with every value coerced to its knob's type; unknown keys refused."""
        kinds = {f.name: _field_kind(f) for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(kinds))
        if unknown:
            names = ", ".join(map(str, unknown))
            raise ConfigError(f"{cls.KERNEL} config: unknown key(s) {names}; "
                              f"expected some of {', '.join(kinds)}")
        return {k: coerce(k, kinds[k], v, f"{cls.KERNEL} config") for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict):
        if not isinstance(d, dict):
            raise ConfigError(f"{cls.KERNEL} config: expected an object of knobs, got "
                              f"{type(d).__name__}")
        return cls(**cls.coerced(d))

    @classmethod
    def parse(cls, text: str, base=None):
        """``"KEY=VALUE,..."`` (e.g. ``BLOCK_M=128,num_stages=2``) on top of ``base``
        (default: the family's default record)."""
        d = {}
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ConfigError(f"{cls.KERNEL} config: expected KEY=VALUE, got {part!r}")
            k, v = (x.strip() for x in part.split("=", 1))
            if k in d:
                raise ConfigError(f"{cls.KERNEL} config: {k} given twice")
            d[k] = v
        return (base or cls()).replace(**d)

    @classmethod
    def parse_list(cls, text: str) -> list:
        """The ``;``-separated ``KEY=VALUE,...`` texts of ``text``, each checked to parse
        (a :class:`ConfigError` names the first that does not): what a sweep applies on
        top of each problem's default."""
        texts = [t.strip() for t in str(text or "").split(";") if t.strip()]
        for t in texts:
            try:
                cls.parse(t)
            except ConfigError as e:
                raise ConfigError(f"{t!r}: {e}") from None
        return texts

    def diff(self) -> dict:
        """The knobs that differ from the family's defaults (what a tuned entry stores)."""
        base = type(self)()
        return {k: v for k, v in self.as_dict().items() if getattr(base, k) != v}

    @property
    def text(self) -> str:
        """``KEY=VALUE,...`` of every knob (what crosses the custom-op boundary)."""
        return ",".join(f"{k}={v}" for k, v in self.as_dict().items())

    @property
    def key(self) -> str:
        """A stable 12-hex-digit hash of the family and every knob (caches, stores)."""
        blob = json.dumps({"kernel": self.KERNEL, **self.as_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        """What a person reads: the family, then the knobs that matter, e.g.
        ``sm90-fwd 192x128 s3 pingpong``."""
        return " ".join([self.KERNEL, *self._label_parts()])

    def _label_parts(self) -> list:  # pragma: no cover - every family defines it
        raise NotImplementedError

    def _caps(self) -> list:
        """Label parts of the vendor register caps, when set."""
        out = []
        if getattr(self, "maxnreg", None) is not None:
            out.append(f"maxnreg={self.maxnreg}")
        if getattr(self, "waves_per_eu", None) is not None:
            out.append(f"waves={self.waves_per_eu}")
        return out


class Context(NamedTuple):
    """What a rule may look at besides the config: the target record, head dim, dtype."""

    target: object
    head_dim: int
    dtype: str


@dataclass(frozen=True)
class Rule:
    """One row of a family's rules table: ``test(cfg, ctx)`` returns None when the config
    passes, else the message (which names the knob, the limit and the reason)."""

    knob: str
    why: str
    test: Callable


def check_rules(cfg, rules, target, head_dim: int, dtype: str):
    """Return ``cfg`` unchanged if every rule passes for (target, head dim, dtype); else raise
    :class:`~flashscope.errors.LimitError` (a ConfigError) with the first failing rule's
    message. Pure: no compiler, no GPU."""
    check_head_dim(head_dim)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    ctx = Context(get_target(target), int(head_dim), dtype)
    for rule in rules:
        msg = rule.test(cfg, ctx)
        if msg:
            raise LimitError(msg)
    return cfg


def not_sm90(t) -> Optional[str]:
    """Why target record ``t`` cannot run a Hopper kernel (wgmma, TMA, setmaxnreg), or
    None."""
    if t.vendor != "nvidia" or t.cc // 10 != 9:
        return f"{t.name} is not sm_90"
    return None


def sm90_only(kernel: str, portable: str) -> Rule:
    """A rule: ``kernel`` builds for sm_90 only; elsewhere ``portable`` runs."""
    def test(cfg, ctx):
        why = not_sm90(ctx.target)
        return f"{kernel} is the sm_90 (Hopper) kernel; {why} (use {portable})" if why else None
    return Rule("target", "the kernel uses wgmma, TMA and setmaxnreg", test)


def allowed(knob: str, values: tuple, why: str) -> Rule:
    """A rule: ``knob`` takes one of ``values``."""
    def test(cfg, ctx):
        v = getattr(cfg, knob)
        if v not in values:
            shown = " or ".join(str(int(a) if isinstance(a, bool) else a) for a in values)
            got = int(v) if isinstance(v, bool) else v
            return f"{cfg.KERNEL}: {knob}={got}: expected {shown} ({why})"
        return None
    return Rule(knob, why, test)


def needs(knob: str, other: str, why: str) -> Rule:
    """A rule: ``knob`` on requires ``other`` on."""
    def test(cfg, ctx):
        if getattr(cfg, knob) and not getattr(cfg, other):
            return f"{cfg.KERNEL}: {knob}=1 needs {other}=1 ({why})"
        return None
    return Rule(knob, why, test)


def pow2_tiles(*knobs: str, lo: int = 16, hi: int = 256) -> Rule:
    def test(cfg, ctx):
        for k in knobs:
            v = getattr(cfg, k)
            if not (pow2(v) and lo <= v <= hi):
                return f"{cfg.KERNEL}: {k}={v}: expected a power of two in {lo}..{hi}"
        return None
    return Rule(",".join(knobs), "tile shapes are powers of two", test)


def _warps(cfg, ctx):
    t = ctx.target
    if not (pow2(cfg.num_warps) and cfg.num_warps <= 16):
        return f"{cfg.KERNEL}: num_warps={cfg.num_warps}: expected a power of two in 1..16"
    threads = cfg.num_warps * t.warp_size
    if threads > t.max_threads_per_block:
        return (f"{cfg.KERNEL}: num_warps={cfg.num_warps} gives {threads} threads per block, "
                f"over the {t.max_threads_per_block} allowed for {t.name}")
    return None


WARPS = Rule("num_warps", "threads per block", _warps)


def stages(lo: int, hi: int, why: str = "software pipeline depth") -> Rule:
    def test(cfg, ctx):
        if not (lo <= cfg.num_stages <= hi):
            return f"{cfg.KERNEL}: num_stages={cfg.num_stages}: expected {lo}..{hi} ({why})"
        return None
    return Rule("num_stages", why, test)


def _caps(cfg, ctx):
    t = ctx.target
    if cfg.maxnreg is not None:
        if t.vendor != "nvidia":
            return (f"{cfg.KERNEL}: maxnreg={cfg.maxnreg} is an NVIDIA register cap; {t.name} "
                    "is AMD (use waves_per_eu)")
        if not (16 <= cfg.maxnreg <= t.max_regs_per_thread):
            return (f"{cfg.KERNEL}: maxnreg={cfg.maxnreg}: expected 16..{t.max_regs_per_thread}"
                    f" registers per thread for {t.name}")
    if cfg.waves_per_eu is not None:
        if t.vendor != "amd":
            return (f"{cfg.KERNEL}: waves_per_eu={cfg.waves_per_eu} is an AMD option; {t.name}"
                    " is NVIDIA (use maxnreg)")
        if not (1 <= cfg.waves_per_eu <= t.max_waves_per_simd):
            return (f"{cfg.KERNEL}: waves_per_eu={cfg.waves_per_eu}: expected "
                    f"1..{t.max_waves_per_simd} for {t.name}")
    return None


CAPS = Rule("maxnreg,waves_per_eu", "vendor register caps", _caps)


def _kb(n: int) -> str:
    """Bytes as KB, exact where a whole number of KB would hide the difference."""
    return f"{n // 1024} KB" if n % 1024 == 0 else f"{n:,} bytes"


def shared_memory(bound: Callable, tiles: Callable, per_target: bool = False) -> Rule:
    """A rule: the family's lower bound on shared memory (``bound(cfg, head_dim, dtype)``,
    or with ``per_target`` ``bound(cfg, head_dim, dtype, target)``) fits a block of the
    target; ``tiles(cfg)`` names the knobs that decide it."""
    def test(cfg, ctx):
        need = bound(cfg, ctx.head_dim, ctx.dtype, *((ctx.target,) if per_target else ()))
        limit = ctx.target.smem_per_block_optin
        if need > limit:
            return (f"{cfg.KERNEL}: {tiles(cfg)}, head dim {ctx.head_dim} with "
                    f"{cfg.num_stages} stages needs at least {_kb(need)} of shared "
                    f"memory, more than the {_kb(limit)} a {ctx.target.name} block "
                    "may have")
        return None
    return Rule("shared memory", "one block's shared memory", test)


def neighbours(cfg, steps: dict, rules, target, head_dim: int, dtype: str) -> list:
    """``(knob, value, config)`` for every config one knob away from ``cfg`` that its
    family's ``rules`` accept for (target, head dim, dtype): each switch flipped, and each
    other knob moved to the nearest value below and above its own on its ladder in
    ``steps`` that the rules accept (values they refuse are stepped over). A ladder is an
    ordered tuple; None (no cap) sorts last. One step of a coordinate search."""
    out = []
    for f in dataclasses.fields(cfg):
        knob, now = f.name, getattr(cfg, f.name)
        if _field_kind(f) == "bool":
            sides = [[not now]]
        else:
            ladder = steps.get(knob)
            if ladder is None:
                raise ConfigError(f"{cfg.KERNEL}: knob {knob} has no ladder of values to "
                                  "step along (the family's STEPS)")
            rank = [_ladder_rank(v) for v in ladder]
            here = _ladder_rank(now)
            sides = [[v for v, r in zip(ladder, rank) if r < here][::-1],
                     [v for v, r in zip(ladder, rank) if r > here]]
        for side in sides:
            for value in side:
                moved = dataclasses.replace(cfg, **{knob: value})
                try:
                    check_rules(moved, rules, target, head_dim, dtype)
                except ConfigError:
                    continue
                out.append((knob, value, moved))
                break
    return out


def _ladder_rank(v) -> float:
    return math.inf if v is None else float(v)


@dataclass(frozen=True)
class Problem:
    """The facts a default config is chosen from, all known before any tensor is read:
    target, dtype, head dim, mask, lengths, how many (batch, head) pairs there are and
    how many query heads share a kv head."""

    target: str
    dtype: str = "bfloat16"
    head_dim: int = 128
    causal: bool = False
    n_q: int = 1024
    n_k: int = 1024
    heads: int = 0  # batch x query heads (0: not known, as for a kernel built offline)
    window: bool = False  # a sliding window (or bottom-right alignment) bounds the keys
    varlen: bool = False  # packed sequences of different lengths
    softcap: bool = False  # scores capped by c tanh(s / c)
    group: int = 1  # query heads per kv head (GQA); decoding packs a group's rows in a tile
    paged: bool = False  # decoding: the cache is read through a block table
    band_keys: int = 0  # a window bounded on both sides: the keys it spans (Mask.span)
    deterministic: bool = False  # the backward must give the same bits on every run
    device: str = ""  # the GPU's name as its driver gives it ("": offline, or unknown)

    @property
    def seq_len(self) -> int:
        return max(self.n_q, self.n_k)

    def target_record(self):
        return get_target(self.target)

    @property
    def units(self) -> int:
        """SMs (CUs on AMD) of the target's example product, which the rules size grids
        against (an H100 SXM's 132 for sm90; the H200 has as many): a rule stays a pure
        function of the problem. A launch sizes a persistent grid by the device's own
        count (:func:`flashscope.launch.sm_count`)."""
        return self.target_record().units


def describe(cfg: Optional[Knobs]) -> str:
    return "defaults" if cfg is None else cfg.label


def target_family(t) -> str:
    """"nvidia" for NVIDIA targets, else the AMD family without its generation number
    ("cdna", "rdna"): the keys of the defaults tables besides target names."""
    return t.vendor if t.vendor == "nvidia" else t.family.rstrip("0123456789")


def table_select(table, kernel: str, problem: Problem):
    """The config of the first row of a defaults table ``(target name or family, largest
    head dim, causal or None for both, config)`` that matches ``problem``."""
    t = get_target(problem.target)
    check_head_dim(problem.head_dim)
    for key, max_d, when_causal, cfg in table:
        if (key in (t.name, target_family(t)) and problem.head_dim <= max_d
                and when_causal in (None, bool(problem.causal))):
            return cfg
    raise ConfigError(f"no default {kernel} config for {t.name}, head dim {problem.head_dim}")
