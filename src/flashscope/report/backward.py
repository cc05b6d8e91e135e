"""``flashscope report --kernel bwd|sm90-bwd|decode|decode-rows``: the kernels of one family
besides the forward (the backward's dK/dV and dQ, the decoding attention, its paged build
and merge, decoding's wide rows on the Hopper forward) at each target's default config and
one-knob ablations of it, compiled offline and measured.

What differs between the families is data (:class:`FamilyKernels`: :data:`BWD`,
:data:`DECODE`). Per target the base is the family's default at the report's head dim
(so each target starts from its own default). The steps are data; a step applies only to
the kernels that read its knob (BLOCK_M1/BLOCK_N1: dK/dV, BLOCK_M2/BLOCK_N2: dQ; the
decoding merge reads BLOCK_M only), and a variant the family's rules reject on a target
is left out there (shown "not built"). Head dim steps 64 -> 128 -> 256 keep the base
config.

Measured only: registers, spills, shared memory/LDS, occupancy and its limiter come from
the binaries; there is no analytic register budget for these kernels here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..compile import DECODE_PROBLEM, DECODE_ROWS_PROBLEM, problem_fields
from ..families import Problem
from ..families import sm90_bwd, sm90_fwd, triton_bwd, triton_decode
from ..errors import FlashscopeError
from ..targets import parse_targets
from . import ablations
from .cliffs import cliff_view
from .collect import DEFAULT_TARGETS, Row, measure_row


@dataclass(frozen=True, eq=False)
class FamilyKernels:
    """One family's report: its ``--kernel`` name, the words its outputs use, the family
    module (``select``, ``check``), its kernels (name -> (label, short label, the knobs
    it reads)), the ablation steps ((step name, knob, factor)), the knob names
    ``--ablate`` accepts, and the :class:`~flashscope.families.base.Problem` keywords of
    its base beyond target, dtype, head dim and mask."""
    name: str
    noun: str
    family: object
    kernels: dict
    steps: tuple
    knobs: tuple
    problem: dict
    note: str
    #: the targets the family builds for (None: every target); the report's default
    #: targets narrowed to these
    only: Optional[tuple] = None

    def uses(self, kernel: str, knob: str) -> bool:
        """Whether changing ``knob`` changes ``kernel``'s binary."""
        return knob in self.kernels[kernel][2]


def _halved_doubled(*knobs) -> tuple:
    return tuple((f"{k} {w}", k, f) for k in knobs for w, f in (("halved", 0.5),
                                                                  ("doubled", 2)))


BWD = FamilyKernels(
    "bwd", "backward", triton_bwd,
    {"bwd_dkdv": ("dK/dV", "dkdv", ("BLOCK_M1", "BLOCK_N1", "num_warps")),
     "bwd_dq": ("dQ", "dq", ("BLOCK_M2", "BLOCK_N2", "num_warps"))},
    _halved_doubled("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps"),
    ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "HEAD_DIM"), {},
    "a tile knob changes only the kernel that uses it (BLOCK_M1/BLOCK_N1: dK/dV, "
    "BLOCK_M2/BLOCK_N2: dQ)")


_DECODE_TILES = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
DECODE = FamilyKernels(
    "decode", "decoding", triton_decode,
    {"triton-decode": ("attention", "dense", _DECODE_TILES),
     "decode_paged": ("paged", "paged", _DECODE_TILES),
     "decode_merge": ("merge", "merge", ("BLOCK_M",))},
    _halved_doubled("BLOCK_N", "num_warps", "num_stages") + (("BLOCK_M doubled", "BLOCK_M",
                                                              2),),
    ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "HEAD_DIM"), problem_fields(DECODE_PROBLEM),
    "the split merge reads BLOCK_M only (its warps and stages are fixed); the base is "
    "each target's default for 8 sequences of 32 query heads over 8 kv heads, one token "
    "against 8192 keys (flashscope inspect --kernel triton-decode)")


class _DecodeRows:
    """Decoding's wide rows as the report reads a family: the sm_90 forward's config
    record, its default for a decoding problem (:func:`flashscope.kvcache.forward_config`)
    and its checks with a KV cache's (:func:`~flashscope.families.sm90_fwd.check_cache`)."""

    @staticmethod
    def select(problem):
        from ..kvcache import forward_config

        return forward_config(problem)

    @staticmethod
    def check(cfg, target, head_dim: int = 128, dtype: str = "bfloat16"):
        sm90_fwd.check(cfg, target, head_dim, dtype)
        sm90_fwd.check_cache(cfg, head_dim)
        return cfg


DECODE_ROWS = FamilyKernels(
    "decode-rows", "decoding rows", _DecodeRows,
    {"decode_rows": ("forward rows", "rows", ("BLOCK_N", "num_stages", "Q_IN_REGS"))},
    (("BLOCK_N halved", "BLOCK_N", 0.5), ("num_stages doubled", "num_stages", 2),
     ("Q_IN_REGS off", "Q_IN_REGS", 0)),
    ("BLOCK_N", "num_stages", "Q_IN_REGS", "HEAD_DIM"), problem_fields(DECODE_ROWS_PROBLEM),
    "the sm_90 forward as a decoding call runs it (flashscope inspect --kernel "
    "decode_rows): 64 sequences of 64 query heads over 8 kv heads, 16 tokens against "
    "8192 keys; head dims 64, 128 and 256 only",
    only=("sm90",))

SM90_BWD = FamilyKernels(
    "sm90-bwd", "Hopper backward", sm90_bwd,
    {"sm90-bwd": ("one pass", "one-pass", ("BLOCK_M", "num_stages", "DQ_SLOTS"))},
    (("BLOCK_M doubled", "BLOCK_M", 2), ("num_stages doubled", "num_stages", 2),
     ("DQ_SLOTS halved", "DQ_SLOTS", 0.5)),
    ("BLOCK_M", "num_stages", "DQ_SLOTS", "HEAD_DIM"), {},
    "one kernel (the producer, reducer and consumer partitions); it builds for sm_90 at "
    "head dims 64, 128 and 256, the last on 64-key programs with dQ by atomics (BLOCK_N "
    "64, DQ_SLOTS 0): a HEAD_DIM step keeps its base config, so 128 -> 256 is not "
    "buildable (--head-dims 256 reports that build)",
    only=("sm90",))

#: the reports of ``--kernel``, by name
FAMILY_REPORTS = {f.name: f for f in (BWD, SM90_BWD, DECODE, DECODE_ROWS)}

#: The two main backward kernels: name -> (label, short label, knobs it reads).
BWD_KERNELS = BWD.kernels
#: (step name, knob, factor).
BWD_KNOBS = BWD.steps
#: Knob names ``--ablate`` accepts with ``--kernel bwd``.
BWD_KNOB_NAMES = BWD.knobs


def uses(kernel: str, knob: str, fam: FamilyKernels = BWD) -> bool:
    """Whether changing ``knob`` changes ``kernel``'s binary (a kernel of ``fam``)."""
    return fam.uses(kernel, knob)


@dataclass
class BwdRow(Row):
    """One compiled backward kernel (budget and comparison stay None: measured only)."""

    kernel: str = "bwd_dkdv"

    def as_dict(self) -> dict:
        d = super().as_dict()
        for k in ("budget", "comparison"):
            d.pop(k)
        return {"kernel": self.kernel, **d}


@dataclass(frozen=True)
class BwdSpec:
    targets: tuple
    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    knobs: tuple = BWD_KNOB_NAMES
    family: FamilyKernels = BWD
    variant: tuple = ()  #: (option, value) pairs of :data:`flashscope.compile.VARIANT_OPTIONS`


def make_bwd_spec(targets: str = DEFAULT_TARGETS, head_dims=None, dtype: str = "bfloat16",
                  causal: bool = False, ablate: str = "all",
                  family: FamilyKernels = BWD, variant: "dict | None" = None) -> BwdSpec:
    """The spec from CLI-style strings; one head dim (the ablations cover 64/128/256);
    ``variant`` as :func:`flashscope.report.collect.make_spec` takes it."""
    from .collect import parse_head_dims

    dims = (128,) if head_dims is None else parse_head_dims(head_dims)
    if len(dims) != 1:
        raise FlashscopeError(f"--head-dims {head_dims}: --kernel {family.name} takes one "
                              "head dim (the HEAD_DIM ablation covers 64 -> 128 -> 256)")
    chosen = tuple(parse_targets(targets))
    if family.only:
        if targets == DEFAULT_TARGETS:
            chosen = tuple(parse_targets(",".join(family.only)))
        others = [t.name for t in chosen if t.name not in family.only]
        if others:
            raise FlashscopeError(f"--targets {','.join(others)}: --kernel {family.name} "
                                  f"builds for {', '.join(family.only)} only")
    return BwdSpec(chosen, dims[0], dtype, causal,
                   ablations.parse_knobs(ablate, family.knobs), family,
                   tuple(sorted((variant or {}).items())))


def base_config(spec: BwdSpec, target):
    """The family's default for ``target`` at the spec's head dim, dtype and mask."""
    from ..targets import get_target

    return spec.family.family.select(Problem(get_target(target).name, spec.dtype,
                                             spec.head_dim, spec.causal,
                                             **spec.family.problem))


def _buildable(spec: BwdSpec, cfg, target, head_dim) -> bool:
    try:
        spec.family.family.check(cfg, target, head_dim, spec.dtype)
    except FlashscopeError:
        return False
    return True


def plan(spec: BwdSpec, target, kernel: str) -> list:
    """The ablation steps of ``kernel`` on ``target`` (:class:`ablations.Step` records);
    a step whose variant is not buildable there keeps ``after`` None."""
    base = base_config(spec, target)
    hd = spec.head_dim
    out = []
    for name, knob, how in spec.family.steps:
        if knob not in spec.knobs or not spec.family.uses(kernel, knob):
            continue
        after = base.replace(**{knob: int(getattr(base, knob) * how)})
        ok = _buildable(spec, after, target, hd)
        out.append(ablations.Step(name, knob, base, after if ok else None, hd, hd))
    if "HEAD_DIM" in spec.knobs:
        dims = ablations.HEAD_DIM_STEPS
        for a, b in zip(dims, dims[1:]):
            ok = _buildable(spec, base, target, a) and _buildable(spec, base, target, b)
            out.append(ablations.Step(f"HEAD_DIM {a} -> {b}", "HEAD_DIM", base,
                                      base if ok else None, a, b))
    return out


@dataclass
class BwdReport:
    spec: BwdSpec
    rows: list
    ablations: list
    cliffs: list
    timings: dict = field(default_factory=dict)

    @property
    def kernel(self) -> str:
        return self.spec.family.name

    def main_rows(self) -> list:
        """Rows at the report's head dim (base and knob variants), per target and kernel."""
        return [r for r in self.rows if r.head_dim == self.spec.head_dim]

    def as_dict(self) -> dict:
        s = self.spec
        return {
            "kernel": s.family.name,
            "spec": {"targets": [t.name for t in s.targets], "head_dim": s.head_dim,
                     "dtype": s.dtype, "causal": s.causal, "ablate": list(s.knobs),
                     "variant": dict(s.variant),
                     "base": {t.name: base_config(s, t).label for t in s.targets}},
            "model": "measured only: no analytic register budget for the "
                     f"{s.family.noun} kernels",
            "rows": [r.as_dict() for r in self.rows],
            "ablations": self.ablations,
            "cliffs": self.cliffs,
            "timings": self.timings,
        }


def _row(cfg, hd, t, kernel, rec) -> BwdRow:
    row = BwdRow(cfg, hd, t.name, kernel=kernel)
    measure_row(row, rec)
    return row


def collect_bwd(spec: BwdSpec, *, jobs: int = 0,
                progress: Optional[Callable[[int, int], None]] = None) -> BwdReport:
    """Compile (or read from the cache) every (config, head dim) each target's steps need,
    for each of the family's kernels, and assemble the report."""
    from ..isa import inspect_configs

    t0 = time.perf_counter()
    work = []  # (target, kernel, head dim, [configs])
    plans = {}
    for t in spec.targets:
        for kernel in spec.family.kernels:
            steps = plan(spec, t, kernel)
            plans[(t.name, kernel)] = steps
            pairs = [(base_config(spec, t), spec.head_dim)]
            for s in steps:
                if s.after is None:
                    continue
                for p in ((s.before, s.head_dim_before), (s.after, s.head_dim_after)):
                    if p not in pairs:
                        pairs.append(p)
            for hd in dict.fromkeys(d for _, d in pairs):
                work.append((t, kernel, hd, [c for c, d in pairs if d == hd]))
    total = sum(len(w[3]) for w in work)
    done = 0
    if progress:
        progress(0, total)
    rows = []
    for t, kernel, hd, cfgs in work:
        recs = inspect_configs(cfgs, [t], jobs=jobs, occupancy=False, head_dim=hd,
                               dtype=spec.dtype, causal=spec.causal, kernel=kernel,
                               **dict(spec.variant))
        rows.extend(_row(c, hd, t, kernel, r) for c, r in zip(cfgs, recs))
        done += len(cfgs)
        if progress:
            progress(done, total)
    t1 = time.perf_counter()
    rep = BwdReport(spec, rows, _ablation_entries(spec, plans, rows), [])
    for kernel in spec.family.kernels:
        mine = [r for r in rep.main_rows() if r.kernel == kernel]
        rep.cliffs.extend({"kernel": kernel, **c} for c in cliff_view(mine))
    rep.cliffs.sort(key=lambda d: (d["target"], not d["near"], d["kernel"], d["resource"],
                                   d["save_to_gain"]))
    rep.timings = {"compile_s": round(t1 - t0, 3),
                   "analysis_s": round(time.perf_counter() - t1, 3), "kernels": total}
    return rep


def _ablation_entries(spec: BwdSpec, plans: dict, rows: list) -> list:
    """Per kernel and step: per target the measured before/after and deltas (as the forward
    ablations), with that target's config keys (each target has its own base)."""
    out = []
    for kernel in spec.family.kernels:
        by_key = {(r.config.key, r.head_dim, r.target): r for r in rows if r.kernel == kernel}
        names = []
        for t in spec.targets:
            for s in plans[(t.name, kernel)]:
                if s.name not in names:
                    names.append(s.name)
        for name in names:
            entry = {"kernel": kernel, "name": name, "targets": {}}
            for t in spec.targets:
                step = next((s for s in plans[(t.name, kernel)] if s.name == name), None)
                if step is None:
                    continue
                entry["knob"] = step.knob
                if step.after is None:
                    entry["targets"][t.name] = {"before": {"ok": False, "error": None},
                                                "after": {"ok": False, "refused": True,
                                                          "error": "refused by the config "
                                                          "checks"},
                                                "config_before": step.before.label,
                                                "config_after": None}
                    continue
                got = ablations.steps([step], by_key, [t])[0]
                entry["targets"][t.name] = {**got["targets"][t.name],
                                            "config_before": step.before.label,
                                            "config_after": step.after.label,
                                            "head_dim_before": step.head_dim_before,
                                            "head_dim_after": step.head_dim_after}
            out.append(entry)
    return out
