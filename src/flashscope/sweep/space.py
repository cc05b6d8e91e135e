"""The search space as data, and feasibility pruning with a reason per pruned point.

A space is a plain dict (or a JSON file with the same shape)::

    {"targets": ["sm90"], "dtypes": ["bfloat16"], "head_dims": [64, 128],
     "causal": [false, true],
     "BLOCK_M": [64, 128], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8],
     "num_stages": [2, 3, 4], "Q_IN_REGS": [true], "maxnreg": [null], "waves_per_eu": [null]}

or ``{"spaces": [space, ...]}`` when the axes differ per target, dtype, head dim or causal
flag. An axis left out takes the one value of the kernel family's default record. Every
key and value is checked by :func:`parse_space` before any work starts.

Points are the product problem x axes. A vendor-specific knob (``maxnreg`` on NVIDIA,
``waves_per_eu`` on AMD) is set to None for targets of the other vendor, so one space can
cover both; the duplicates this makes are dropped. Each remaining point goes through its
family's rules (:mod:`flashscope.families`: shared memory, threads, register caps, the
sm90 kernel's tile list); the points they reject are kept with the rule's message as the
reason.

Kernels (``kernel=``): ``fwd`` or ``triton-fwd`` (the portable forward), ``sm90-fwd`` (the
Hopper forward; its knobs are the axes: BLOCK_M, BLOCK_N, num_stages and its switches),
``bwd_dkdv`` and ``bwd_dq`` (the portable backward's two main kernels, axes BLOCK_M1,
BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages, maxnreg, waves_per_eu). The tiles of
the other backward kernel do not enter the one swept (dK/dV uses BLOCK_M1/BLOCK_N1, dQ
BLOCK_M2/BLOCK_N2), so those two axes collapse to their first listed value, like a
foreign vendor knob.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, FlashscopeError, closest
from ..families import family
from ..families.base import DTYPE_BYTES, MAX_HEAD_DIM, MIN_HEAD_DIM
from ..targets import get_target

#: Kernels a space may sweep -> (family, the family's knobs the sweep leaves at their
#: default, tile axes the kernel does not use).
KERNELS = {
    "fwd": ("triton-fwd", (), ()),
    "triton-fwd": ("triton-fwd", (), ()),
    "sm90-fwd": ("sm90-fwd", (), ()),
    "bwd_dkdv": ("triton-bwd", ("PRE_BLOCK",), ("BLOCK_M2", "BLOCK_N2")),
    "bwd_dq": ("triton-bwd", ("PRE_BLOCK",), ("BLOCK_M1", "BLOCK_N1")),
}
#: Problem keys of a space and their defaults.
PROBLEM_KEYS = {"targets": ("sm90",), "dtypes": ("bfloat16",), "head_dims": (128,),
                "causal": (False, True)}

#: Which vendor each vendor-only knob belongs to.
VENDOR_KNOBS = {"maxnreg": "nvidia", "waves_per_eu": "amd"}


def _pow2_in(lo, hi):
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
            and v & (v - 1) == 0, f"a power of two in {lo}..{hi}")


def _int_in(lo, hi, none_ok=False):
    def ok(v):
        if v is None:
            return none_ok
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    return ok, f"an integer in {lo}..{hi}" + (" or null" if none_ok else "")


_BOOL = (lambda v: isinstance(v, bool), "true or false")

#: Per axis, where a value can be refused before any target is known: (predicate, what it
#: expects). Target-specific limits (threads per block, registers, shared memory, the
#: sm90 kernel's tile list) are the family rules' job, per point. An axis not listed here
#: must be a boolean switch.
AXIS_RULES = {
    "BLOCK_M": _pow2_in(16, 256),
    "BLOCK_N": _pow2_in(16, 256),
    "num_warps": _pow2_in(1, 16),
    "num_stages": _int_in(1, 8),
    "maxnreg": _int_in(16, 255, none_ok=True),
    "waves_per_eu": _int_in(1, 16, none_ok=True),
    **{k: _pow2_in(16, 256) for k in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")},
}
#: the sm90 kernel's BLOCK_M counts warpgroups (192 = three), not a power of two
SM90_AXIS_RULES = {"BLOCK_M": ((lambda v: v in (64, 128, 192)), "64, 128 or 192")}


def axis_rule(kernel: str, axis: str) -> tuple:
    if kernel == "sm90-fwd" and axis in SM90_AXIS_RULES:
        return SM90_AXIS_RULES[axis]
    return AXIS_RULES.get(axis, _BOOL)


#: Built-in spaces per vendor (about 30 points per problem after pruning).
DEFAULT_AXES = {
    "nvidia": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8],
               "num_stages": [2, 3, 4], "Q_IN_REGS": [True], "maxnreg": [None],
               "waves_per_eu": [None]},
    "amd": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
            "num_stages": [1, 2], "Q_IN_REGS": [True], "maxnreg": [None],
            "waves_per_eu": [None, 2]},
}

#: Built-in space of the sm90 kernel: the tile shapes it takes, ring depth, Q in registers
#: and the consumers' turns; the other switches at the family's defaults (24 points per
#: problem before pruning).
DEFAULT_SM90_AXES = {"BLOCK_M": [64, 128, 192], "BLOCK_N": [128], "num_stages": [2, 3],
                     "Q_IN_REGS": [False, True], "PINGPONG": [False, True]}

#: Built-in backward spaces per vendor: around the backward defaults (resident tile 64 or
#: 128 rows, streamed tile 16 or 32), per kernel 16 (NVIDIA) or 8-16 (AMD) points per
#: problem before pruning.
DEFAULT_BWD_AXES = {
    "nvidia": {"BLOCK_M1": [16, 32], "BLOCK_N1": [64, 128], "BLOCK_M2": [64, 128],
               "BLOCK_N2": [16, 32], "num_warps": [4, 8], "num_stages": [2, 3],
               "maxnreg": [None], "waves_per_eu": [None]},
    "amd": {"BLOCK_M1": [16, 32], "BLOCK_N1": [32, 64], "BLOCK_M2": [32, 64],
            "BLOCK_N2": [16, 32], "num_warps": [4, 8], "num_stages": [1],
            "maxnreg": [None], "waves_per_eu": [None, 1]},
}


def kernel_axes(kernel: str) -> tuple:
    """(axes, config record type, unused tile axes) of ``kernel``; ConfigError if unknown.
    The axes are the family record's knobs, in its field order."""
    try:
        fam, fixed, unused = KERNELS[kernel]
    except KeyError:
        raise ConfigError(f"--kernel {kernel!r}: expected one of {', '.join(KERNELS)}") \
            from None
    record = family(fam).Config
    return tuple(k for k in record.field_names() if k not in fixed), record, unused


#: the axes of the portable forward and of the backward kernels (the records' knobs)
AXES = kernel_axes("fwd")[0]
BWD_AXES = kernel_axes("bwd_dkdv")[0]


def is_forward(kernel: str) -> bool:
    return KERNELS[kernel][0] != "triton-bwd" if kernel in KERNELS else False


@dataclass(frozen=True)
class Problem:
    """What a config is tuned for: target, dtype, head dim, causal mask."""

    target: str
    dtype: str
    head_dim: int
    causal: bool

    @property
    def label(self) -> str:
        return (f"{self.target} {self.dtype} D={self.head_dim} "
                f"{'causal' if self.causal else 'full'}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SubSpace:
    """One block of a space: problems x axes (each axis a tuple of allowed values)."""

    targets: tuple
    dtypes: tuple
    head_dims: tuple
    causal: tuple
    axes: dict  # axis name -> tuple of values
    kernel: str = "fwd"

    def problems(self) -> list:
        return [Problem(get_target(t).name, dt, d, c) for t, dt, d, c in
                itertools.product(self.targets, self.dtypes, self.head_dims, self.causal)]

    def axes_for(self, target) -> dict:
        """The axes as they apply to ``target``: foreign vendor knobs collapse to (None,),
        tiles the kernel does not use to their first value."""
        vendor = get_target(target).vendor
        unused = kernel_axes(self.kernel)[2]
        return {k: ((None,) if VENDOR_KNOBS.get(k, vendor) != vendor else
                    v[:1] if k in unused else v) for k, v in self.axes.items()}


@dataclass(frozen=True)
class Space:
    blocks: tuple  # of SubSpace
    kernel: str = "fwd"

    @property
    def axis_names(self) -> tuple:
        return kernel_axes(self.kernel)[0]

    def problems(self) -> list:
        seen, out = set(), []
        for b in self.blocks:
            for p in b.problems():
                if p not in seen:
                    seen.add(p)
                    out.append(p)
        return out

    def axes_for(self, problem: Problem) -> dict:
        """Union of the axis values of every block that covers ``problem`` (sorted)."""
        merged = {k: set() for k in self.axis_names}
        for b in self.blocks:
            if problem in b.problems():
                for k, vals in b.axes_for(problem.target).items():
                    merged[k].update(vals)
        return {k: tuple(sorted(v, key=_order)) for k, v in merged.items()}

    def points(self, problem: Optional[Problem] = None) -> tuple:
        """(feasible, pruned) for one problem or all: feasible is a list of
        (Problem, config); pruned a list of (Problem, config, reason). Configs are records
        of the kernel's family."""
        names, record, _ = kernel_axes(self.kernel)
        problems = [problem] if problem is not None else self.problems()
        feasible, pruned = [], []
        for p in problems:
            seen = set()
            for b in self.blocks:
                if p not in b.problems():
                    continue
                axes = b.axes_for(p.target)
                for values in itertools.product(*(axes[k] for k in names)):
                    cfg = record(**dict(zip(names, values)))
                    if cfg in seen:
                        continue
                    seen.add(cfg)
                    reason = infeasible(cfg, p)
                    if reason is None:
                        feasible.append((p, cfg))
                    else:
                        pruned.append((p, cfg, reason))
        return feasible, pruned


def _order(v):
    """Sort key putting None first, then numbers/bools by value."""
    return (v is not None, v if v is not None else 0)


def infeasible(cfg, problem: Problem) -> Optional[str]:
    """The family rules' reason when ``cfg`` cannot be built for ``problem``, else None."""
    try:
        family(cfg.KERNEL).check(cfg, problem.target, problem.head_dim, problem.dtype)
    except ConfigError as e:
        return str(e)
    return None


def _where(src: str, i: Optional[int]) -> str:
    return src if i is None else f"{src} spaces[{i}]"


def _parse_block(d, src: str, i: Optional[int], kernel: str = "fwd") -> SubSpace:
    where = _where(src, i)
    names, record, _ = kernel_axes(kernel)
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected an object of axes, got {type(d).__name__}")
    known = tuple(PROBLEM_KEYS) + names
    for key in d:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{closest(str(key), known)}; "
                              f"expected some of {', '.join(known)}")

    def values(key, default):
        v = d.get(key, default)
        if not isinstance(v, (list, tuple)):
            v = [v]
        if len(v) == 0:
            raise ConfigError(f"{where}: {key} is empty; give at least one value")
        out = []
        for x in v:
            if x not in out:
                out.append(x)
        return tuple(out)

    targets = values("targets", PROBLEM_KEYS["targets"])
    for t in targets:
        if not isinstance(t, str):
            raise ConfigError(f"{where}: targets: expected names like 'sm90', got {t!r}")
        get_target(t)
    dtypes = values("dtypes", PROBLEM_KEYS["dtypes"])
    for dt in dtypes:
        if dt not in DTYPE_BYTES:
            raise ConfigError(f"{where}: dtypes: {dt!r} is not one of "
                              f"{', '.join(DTYPE_BYTES)}")
    head_dims = values("head_dims", PROBLEM_KEYS["head_dims"])
    for hd in head_dims:
        if isinstance(hd, bool) or not isinstance(hd, int) or not (
                MIN_HEAD_DIM <= hd <= MAX_HEAD_DIM):
            raise ConfigError(f"{where}: head_dims: {hd!r} is not an integer in "
                              f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    causal = values("causal", PROBLEM_KEYS["causal"])
    for c in causal:
        if not isinstance(c, bool):
            raise ConfigError(f"{where}: causal: expected true/false, got {c!r}")
    default = record()
    axes = {}
    for k in names:
        vals = values(k, [getattr(default, k)])
        ok, expected = axis_rule(kernel, k)
        for v in vals:
            if not ok(v):
                raise ConfigError(f"{where}: {k}: {v!r} is impossible; expected {expected}")
        axes[k] = vals
    for knob, vendor in VENDOR_KNOBS.items():
        if knob in axes and any(v is not None for v in axes[knob]) and not any(
                get_target(t).vendor == vendor for t in targets):
            raise ConfigError(f"{where}: {knob} is set but applies only to {vendor} targets"
                              f" and none is listed ({', '.join(targets)})")
    return SubSpace(targets, dtypes, head_dims, causal, axes, kernel)


def parse_space(data, src: str = "space", kernel: str = "fwd") -> Space:
    """A :class:`Space` of ``kernel`` (:data:`KERNELS`) from a dict (one block, or
    ``{"spaces": [...]}``); ConfigError naming the key and the expected values on anything
    wrong."""
    if isinstance(data, dict) and "spaces" in data:
        extra = sorted(set(data) - {"spaces"})
        if extra:
            raise ConfigError(f"{src}: next to 'spaces' expected no other key, got "
                              f"{', '.join(extra)}")
        blocks = data["spaces"]
        if not isinstance(blocks, list) or not blocks:
            raise ConfigError(f"{src}: 'spaces' must be a non-empty list of objects")
        return Space(tuple(_parse_block(b, src, i, kernel) for i, b in enumerate(blocks)),
                     kernel)
    return Space((_parse_block(data, src, None, kernel),), kernel)


def load_space(path, kernel: str = "fwd") -> Space:
    """Read and check a JSON space file (``--space FILE``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise FlashscopeError(f"--space {p}: cannot read ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--space {p}: not valid JSON ({e})") from None
    return parse_space(data, f"--space {p}", kernel)


def default_space(targets=("sm90",), dtypes=("bfloat16",), head_dims=(64, 128),
                  causal=(False, True), kernel: str = "fwd") -> Space:
    """The built-in space: :data:`DEFAULT_AXES` (:data:`DEFAULT_BWD_AXES` for a backward
    kernel, :data:`DEFAULT_SM90_AXES` for the sm90 kernel) of each target's vendor."""
    blocks = []
    for t in targets:
        vendor = get_target(t).vendor
        table = (DEFAULT_SM90_AXES if kernel == "sm90-fwd" else
                 DEFAULT_AXES[vendor] if is_forward(kernel) else DEFAULT_BWD_AXES[vendor])
        blocks.append(_parse_block({"targets": [t], "dtypes": list(dtypes),
                                    "head_dims": list(head_dims), "causal": list(causal),
                                    **table}, "default space", None, kernel))
    return Space(tuple(blocks), kernel)


def restrict(space: Space, *, targets=None, dtypes=None, head_dims=None,
             causal=None) -> Space:
    """Command-line overrides of the problem keys. A one-block space takes them as given;
    a space of several blocks keeps, per block, only the given values it lists (so a
    block written for one target never gets another's axes). ConfigError when nothing
    is left."""
    over = {"targets": targets, "dtypes": dtypes, "head_dims": head_dims, "causal": causal}
    if targets:
        over["targets"] = [get_target(t).name for t in targets]
    blocks = []
    for b in space.blocks:
        keys = {}
        for name, given in over.items():
            mine = tuple(get_target(t).name for t in b.targets) if name == "targets" \
                else getattr(b, name)
            if not given:
                keys[name] = getattr(b, name)
            elif len(space.blocks) == 1:
                keys[name] = tuple(given)
            else:
                keys[name] = tuple(v for v in mine if v in given)
        if all(keys.values()):
            blocks.append(SubSpace(axes=b.axes, kernel=b.kernel, **keys))
    if not blocks:
        raise ConfigError("space: no block of the space covers the requested "
                          + ", ".join(f"{k}={v}" for k, v in over.items() if v))
    return Space(tuple(blocks), space.kernel)
