"""``flashscope report --kernel bwd``: the dK/dV and dQ kernels of the default backward
config and of one-knob ablations of it, per target, compiled offline and measured.

Per target the base is the ``triton-bwd`` family's default at the report's head dim (so each
target starts from its own default). The steps are data (:data:`BWD_KNOBS`); a
step applies only to the kernel whose tiles it changes (BLOCK_M1/BLOCK_N1: dK/dV,
BLOCK_M2/BLOCK_N2: dQ; num_warps and the head dim: both), and a variant
the family's rules reject on a target is left out there (shown
"not built"). Head dim steps 64 -> 128 -> 256 keep the base config.

Measured only: registers, spills, shared memory/LDS, occupancy and its limiter come from
the binaries; there is no analytic register budget for the backward here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..families import Problem
from ..families import triton_bwd
from ..families.triton_bwd import TritonBwdConfig
from ..errors import FlashscopeError
from ..targets import parse_targets
from . import ablations
from .cliffs import cliff_view
from .collect import DEFAULT_TARGETS, Row, measure_row

#: The two main backward kernels: name -> (label, tile knobs it uses).
BWD_KERNELS = {"bwd_dkdv": ("dK/dV", ("BLOCK_M1", "BLOCK_N1")),
               "bwd_dq": ("dQ", ("BLOCK_M2", "BLOCK_N2"))}

#: (step name, knob, factor).
BWD_KNOBS = (
    ("BLOCK_M1 halved", "BLOCK_M1", 0.5),
    ("BLOCK_M1 doubled", "BLOCK_M1", 2),
    ("BLOCK_N1 halved", "BLOCK_N1", 0.5),
    ("BLOCK_N1 doubled", "BLOCK_N1", 2),
    ("BLOCK_M2 halved", "BLOCK_M2", 0.5),
    ("BLOCK_M2 doubled", "BLOCK_M2", 2),
    ("BLOCK_N2 halved", "BLOCK_N2", 0.5),
    ("BLOCK_N2 doubled", "BLOCK_N2", 2),
    ("num_warps halved", "num_warps", 0.5),
    ("num_warps doubled", "num_warps", 2),
)

#: Knob names ``--ablate`` accepts with ``--kernel bwd``.
BWD_KNOB_NAMES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "HEAD_DIM")


def uses(kernel: str, knob: str) -> bool:
    """Whether changing ``knob`` changes ``kernel``'s binary."""
    tiles = {k for _, ts in BWD_KERNELS.values() for k in ts}
    return knob not in tiles or knob in BWD_KERNELS[kernel][1]


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
    variant: tuple = ()  #: (option, value) pairs of :data:`flashscope.compile.VARIANT_OPTIONS`


def make_bwd_spec(targets: str = DEFAULT_TARGETS, head_dims=None, dtype: str = "bfloat16",
                  causal: bool = False, ablate: str = "all",
                  variant: "dict | None" = None) -> BwdSpec:
    """The spec from CLI-style strings; one head dim (the ablations cover 64/128/256);
    ``variant`` as :func:`flashscope.report.collect.make_spec` takes it."""
    from .collect import parse_head_dims

    dims = (128,) if head_dims is None else parse_head_dims(head_dims)
    if len(dims) != 1:
        raise FlashscopeError(f"--head-dims {head_dims}: --kernel bwd takes one head dim "
                              "(the HEAD_DIM ablation covers 64 -> 128 -> 256)")
    return BwdSpec(tuple(parse_targets(targets)), dims[0], dtype, causal,
                   ablations.parse_knobs(ablate, BWD_KNOB_NAMES),
                   tuple(sorted((variant or {}).items())))


def base_config(spec: BwdSpec, target) -> TritonBwdConfig:
    from ..targets import get_target

    return triton_bwd.select(Problem(get_target(target).name, spec.dtype, spec.head_dim,
                                     spec.causal))


def _buildable(cfg, target, head_dim, dtype) -> bool:
    try:
        triton_bwd.check(cfg, target, head_dim, dtype)
    except FlashscopeError:
        return False
    return True


def plan(spec: BwdSpec, target, kernel: str) -> list:
    """The ablation steps of ``kernel`` on ``target`` (:class:`ablations.Step` records);
    a step whose variant is not buildable there keeps ``after`` None."""
    base = base_config(spec, target)
    hd = spec.head_dim
    out = []
    for name, knob, how in BWD_KNOBS:
        if knob not in spec.knobs or not uses(kernel, knob):
            continue
        after = base.replace(**{knob: int(getattr(base, knob) * how)})
        ok = _buildable(after, target, hd, spec.dtype)
        out.append(ablations.Step(name, knob, base, after if ok else None, hd, hd))
    if "HEAD_DIM" in spec.knobs:
        dims = ablations.HEAD_DIM_STEPS
        for a, b in zip(dims, dims[1:]):
            ok = _buildable(base, target, a, spec.dtype) and _buildable(base, target, b,
                                                                           spec.dtype)
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
    kernel: str = "bwd"

    def main_rows(self) -> list:
        """Rows at the report's head dim (base and knob variants), per target and kernel."""
        return [r for r in self.rows if r.head_dim == self.spec.head_dim]

    def as_dict(self) -> dict:
        s = self.spec
        return {
            "kernel": "bwd",
            "spec": {"targets": [t.name for t in s.targets], "head_dim": s.head_dim,
                     "dtype": s.dtype, "causal": s.causal, "ablate": list(s.knobs),
                     "variant": dict(s.variant),
                     "base": {t.name: base_config(s, t).label for t in s.targets}},
            "model": "measured only: no analytic register budget for the backward kernels",
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
    for each backward kernel, and assemble the report."""
    from ..isa import inspect_configs

    t0 = time.perf_counter()
    work = []  # (target, kernel, head dim, [configs])
    plans = {}
    for t in spec.targets:
        for kernel in BWD_KERNELS:
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
    for kernel, (label, _) in BWD_KERNELS.items():
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
    for kernel in BWD_KERNELS:
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
                                                "after": {"ok": False, "error":
                                                          "not buildable (config checks)"},
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
