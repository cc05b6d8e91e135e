"""Build the report's typed records: compile every (config, head dim) x target offline
(cached), read registers and spills from the binaries, attach occupancy, the analytic
budget and its error, the ablation deltas and the cliff view.

Defaults (``flashscope report`` with no arguments): targets sm90, sm80, gfx942, gfx1100;
head dim 128, bfloat16, non-causal; the base config :data:`DEFAULT_BASE` of the portable
kernel (``triton-fwd``) plus its single-knob ablation variants, which also makes every
ablation step a row of the budget table: 10 (config, head dim) pairs x 4 targets = 40
compiles. Besides those, :attr:`Report.defaults` holds, per target and head dim, the kernel
the library runs there by default with its default config (on sm90 the Gluon kernel,
``sm90-fwd``; elsewhere the portable one), read the same way: the kernel that actually runs,
next to the portable kernel the ablations study. With :attr:`ReportSpec.neighbours`,
:attr:`Report.choices` holds each AMD target's default (per head dim) next to its
neighbours as the offline choice reads them (:mod:`flashscope.tune.offline`): which of
them spill, which sit just past a cliff, which the model ranks lower, and whether the
default is still the best of them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import budget as fbudget
from ..families.base import check_head_dim
from ..families.triton_fwd import TritonFwdConfig
from ..errors import ConfigError, FlashscopeError, LimitError
from ..targets import parse_targets
from . import ablations
from .cliffs import cliff_view

DEFAULT_TARGETS = "sm90,sm80,gfx942,gfx1100"
DEFAULT_HEAD_DIMS = (128,)
#: The base of the ablations: 128 x 64 tile, 8 warps, 2 stages, Q in registers. With 4
#: warps (or a doubled tile on top of 4 warps) every target spills thousands of times and
#: ptxas alone takes minutes per kernel; from 8 warps each single step stays within a few
#: spills of the cap, so the cold default compiles in about a minute or two.
DEFAULT_BASE = TritonFwdConfig(128, 64, 8, 2)


@dataclass(frozen=True)
class ReportSpec:
    """What to compile: configs x head dims x targets, plus the ablation base."""

    targets: tuple
    configs: tuple
    head_dims: tuple = DEFAULT_HEAD_DIMS
    base: TritonFwdConfig = DEFAULT_BASE
    dtype: str = "bfloat16"
    causal: bool = False
    knobs: tuple = ablations.KNOB_NAMES
    variant: tuple = ()  #: (option, value) pairs of :data:`flashscope.compile.VARIANT_OPTIONS`
    #: the AMD defaults' neighbourhoods (about 20 compiles per AMD target and head dim,
    #: cached); the command asks for them with --neighbours
    neighbours: bool = False


@dataclass
class Row:
    """One compiled kernel: measured record (or the error that stopped it), occupancy, the
    budget model and its comparison with the measurement. ``refused``: no record because
    the target cannot run the config (a rule or a limit, :class:`~flashscope.errors.
    LimitError`), not because its build failed."""

    config: object  # a family's config record
    head_dim: int
    target: str
    record: object = None
    error: Optional[str] = None
    refused: bool = False
    occ: object = None
    budget: object = None
    comparison: Optional[dict] = None

    @property
    def spills(self) -> int:
        r = self.record
        if r is None:
            return 0
        if r.vendor == "nvidia":
            return (r.spill_stores or 0) + (r.spill_loads or 0)
        return (r.vgpr_spills or 0) + (r.sgpr_spills or 0)

    @property
    def spill_cell(self) -> str:
        """The spills as a table shows them, with the wgmma ptxas serialized and the
        16-bit global loads of a kernel that reads narrow, if any: costs the register
        count alone does not show."""
        serial = getattr(self.record, "wgmma_serialized", None)
        notes = [f"{serial} wgmma serial"] if serial else []
        if self.record is not None and self.record.reads_narrow:
            notes.append(f"{self.record.narrow_loads[0]} 16-bit loads")
        return f"{self.spills} ({', '.join(notes)})" if notes else str(self.spills)

    def as_dict(self) -> dict:
        r = self.record
        return {
            "config": self.config.label, "config_key": self.config.key,
            "family": self.config.KERNEL, "config_fields": self.config.as_dict(),
            "head_dim": self.head_dim, "target": self.target, "error": self.error,
            "refused": self.refused,
            "measured": None if r is None else {
                k: getattr(r, k) for k in ("registers", "agprs", "sgprs", "spill_stores",
                                           "spill_loads", "vgpr_spills", "sgpr_spills",
                                           "local_bytes", "shared_bytes", "threads",
                                           "wave_size", "wgmma_serialized", "global_widths",
                                           "features")},
            "spills": self.spills if r is not None else None,
            "occupancy": None if self.occ is None else self.occ.as_dict(),
            "budget": None if self.budget is None else self.budget.as_dict(),
            "comparison": self.comparison,
        }


@dataclass
class Report:
    spec: ReportSpec
    rows: list
    ablations: list
    cliffs: list
    timings: dict = field(default_factory=dict)
    defaults: list = field(default_factory=list)  #: rows of the kernel each target runs
    choices: list = field(default_factory=list)  #: AMD defaults and their neighbours

    def default_kernels(self) -> dict:
        """target -> the label of the config (and so the kernel) the library runs there by
        default, at the report's first head dim."""
        d = self.spec.head_dims[0]
        return {r.target: r.config.label for r in self.defaults if r.head_dim == d}

    def by_key(self) -> dict:
        return {(r.config.key, r.head_dim, r.target): r for r in self.rows}

    def main_rows(self) -> list:
        keys = {(c.key, d) for c in self.spec.configs for d in self.spec.head_dims}
        return [r for r in self.rows if (r.config.key, r.head_dim) in keys]

    def model_summary(self) -> dict:
        """Per target: mean and max |relative error| of the budget over the compiled rows
        that do not spill (a spilling kernel's count is not its demand), the number of
        spilling rows, and how often each component dominates."""
        out = {}
        for t in self.spec.targets:
            cmp = [r.comparison for r in self.rows if r.target == t.name and r.comparison]
            if not cmp:
                continue
            clean = [abs(c["rel_error"]) for c in cmp if not c["spilled"]]
            dom = {}
            for c in cmp:
                dom[c["dominant"]] = dom.get(c["dominant"], 0) + 1
            out[t.name] = {
                "rows": len(cmp), "spilled": len(cmp) - len(clean),
                "mean_abs_rel_error": round(sum(clean) / len(clean), 4) if clean else None,
                "max_abs_rel_error": round(max(clean), 4) if clean else None,
                "dominant": dom}
        return out

    def as_dict(self) -> dict:
        s = self.spec
        return {
            "spec": {"targets": [t.name for t in s.targets],
                     "configs": [c.as_dict() | {"key": c.key, "label": c.label}
                                 for c in s.configs],
                     "head_dims": list(s.head_dims), "base": s.base.label,
                     "dtype": s.dtype, "causal": s.causal, "ablate": list(s.knobs),
                     "variant": dict(s.variant)},
            "model": {"components": list(fbudget.COMPONENTS), "rest": fbudget.REST,
                      "summary": self.model_summary()},
            "rows": [r.as_dict() for r in self.rows],
            "defaults": [r.as_dict() for r in self.defaults],
            "ablations": self.ablations,
            "cliffs": self.cliffs,
            "amd_defaults": [c.as_dict() for c in self.choices],
            "timings": self.timings,
        }


def default_configs(base: TritonFwdConfig = DEFAULT_BASE, head_dim: int = 128,
                    targets=None, knobs=ablations.KNOB_NAMES) -> tuple:
    """The base and its single-knob ablation variants, in plan order."""
    targets = parse_targets(DEFAULT_TARGETS) if targets is None else targets
    out = [base]
    for s in ablations.plan(base, head_dim, targets, knobs):
        if s.after not in out:
            out.append(s.after)
    return tuple(out)


def load_configs(path) -> tuple:
    """Configs from a JSON file: a list of objects (or {"configs": [...]}) with
    the portable kernel's knobs, e.g. [{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4}]."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"--configs {path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"--configs {path}: not valid JSON ({e})") from None
    if isinstance(data, dict):
        data = data.get("configs")
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise ConfigError(f"--configs {path}: expected a non-empty JSON list of config "
                          "objects (or {\"configs\": [...]})")
    out = []
    for d in data:
        c = TritonFwdConfig.from_dict({k: v for k, v in d.items() if k not in ("key", "label")})
        if c not in out:
            out.append(c)
    return tuple(out)


def parse_head_dims(text: str) -> tuple:
    dims = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            d = int(part)
        except ValueError:
            raise ConfigError(f"--head-dims: expected integers like 64,128, got {part!r}") \
                from None
        check_head_dim(d)
        if d not in dims:
            dims.append(d)
    if not dims:
        raise ConfigError("--head-dims: expected at least one head dim, e.g. 128")
    return tuple(dims)


def make_spec(targets: str = DEFAULT_TARGETS, configs_file=None, head_dims=None,
              dtype: str = "bfloat16", causal: bool = False, ablate: str = "all",
              variant: "dict | None" = None, neighbours: bool = False) -> ReportSpec:
    """The spec from CLI-style strings; ``ablate``: knobs to ablate (see
    :func:`ablations.parse_knobs`); ``variant``: the kernel variant every build takes
    (:data:`flashscope.compile.VARIANT_OPTIONS`: a window, alignment, softcap, varlen)."""
    ts = tuple(parse_targets(targets))
    knobs = ablations.parse_knobs(ablate)
    dims = DEFAULT_HEAD_DIMS if head_dims is None else parse_head_dims(head_dims)
    if configs_file:
        cfgs = load_configs(configs_file)
        base = cfgs[0]
    else:
        base = DEFAULT_BASE
        cfgs = default_configs(base, dims[0], ts, knobs)
    return ReportSpec(ts, cfgs, dims, base, dtype, causal, knobs,
                      tuple(sorted((variant or {}).items())), neighbours)


def unbuilt(refused: bool, error: Optional[str]) -> tuple:
    """(cell, reason) of a kernel without a record: NOT BUILT, "does not fit: ..." for a
    config its target cannot run (a rule or a limit: an ablation that crosses one is a
    result, not a fault), FAILED, "build failed: ..." for a build that failed."""
    if refused:
        return "NOT BUILT", f"does not fit: {error or 'refused by the rules'}"
    return "FAILED", f"build failed: {error or 'no record'}"


def no_comparison(row) -> tuple:
    """(cell, reason) of a row without a budget comparison: :func:`unbuilt`'s where it
    has no record, else its measured registers and why there is nothing to compare."""
    if row.record is None:
        return unbuilt(row.refused, row.error)
    return row.record.registers, f"no comparison: {row.error or 'no budget for this target'}"


def measure_row(row, rec):
    """Fill ``row.record`` and ``row.occ`` from an inspect record, or ``row.error`` from the
    error that stopped the build (or the occupancy). Returns whether a record is there."""
    from ..occupancy import occupancy_for_record

    if isinstance(rec, FlashscopeError):
        row.error = str(rec)
        row.refused = isinstance(rec, LimitError)
        return False
    row.record = rec
    try:
        row.occ = occupancy_for_record(rec)
    except FlashscopeError as e:
        row.error = f"occupancy: {e}"
    return True


def _row(cfg, hd, t, rec) -> Row:
    row = Row(cfg, hd, t.name)
    if not measure_row(row, rec):
        return row
    try:
        row.budget = fbudget.budget(cfg, t, hd)
    except FlashscopeError as e:
        row.error = f"budget: {e}"
        return row
    if rec.registers:
        row.comparison = fbudget.compare(row.budget, rec.registers, spilled=row.spills > 0)
    return row


def collect(spec: ReportSpec, *, jobs: int = 0,
            progress: Optional[Callable[[int, int], None]] = None) -> Report:
    """Compile (or read from the cache) every needed pair for every target and assemble the
    report. ``progress(done, total)`` is called after each config's targets are in."""
    from ..isa import inspect_configs

    t0 = time.perf_counter()
    steps = ablations.plan(spec.base, spec.head_dims[0], spec.targets, spec.knobs)
    pairs = [(c, d) for d in spec.head_dims for c in spec.configs]
    for p in sorted(ablations.needed(steps), key=lambda p: (p[1], p[0].key)):
        if p not in pairs:
            pairs.append(p)
    total = len(pairs) * len(spec.targets)
    done = 0
    if progress:
        progress(0, total)
    rows = []
    chunk = max(1, (jobs or 2) // len(spec.targets))
    for i in range(0, len(pairs), chunk):
        part = pairs[i:i + chunk]
        for hd in sorted({d for _, d in part}):
            cfgs = [c for c, d in part if d == hd]
            recs = inspect_configs(cfgs, list(spec.targets), jobs=jobs, occupancy=False,
                                   head_dim=hd, dtype=spec.dtype, causal=spec.causal,
                                   **dict(spec.variant))
            it = iter(recs)
            for c in cfgs:
                for t in spec.targets:
                    rows.append(_row(c, hd, t, next(it)))
        done += len(part) * len(spec.targets)
        if progress:
            progress(done, total)
    rep_defaults = _default_rows(spec, jobs)
    choices = default_choices(spec, jobs) if spec.neighbours else []
    t1 = time.perf_counter()
    rep = Report(spec, rows, [], [], defaults=rep_defaults, choices=choices)
    rep.ablations = ablations.steps(steps, rep.by_key(), spec.targets)
    rep.cliffs = cliff_view(rep.main_rows())
    rep.timings = {"compile_s": round(t1 - t0, 3),
                   "analysis_s": round(time.perf_counter() - t1, 3),
                   "kernels": total + len(rep_defaults)
                   + sum(len(c.last.judged) for c in choices)}
    return rep


def default_choices(spec: ReportSpec, jobs: int) -> list:
    """Per AMD target and head dim: the default and its neighbours, read and judged as
    the offline choice does, in one round from the default (:func:`flashscope.tune.
    offline.search`): the default stays when none of them beats it."""
    from ..tune import offline

    read = offline.offline_reader(jobs)
    out = []
    for t in spec.targets:
        if t.vendor != "amd":
            continue
        for hd in spec.head_dims:
            cell = offline.Cell(t.name, spec.dtype, hd, spec.causal)
            out.append(offline.search(cell, offline.current_default(cell), read,
                                      max_rounds=1))
    return out


def _default_rows(spec: ReportSpec, jobs: int) -> list:
    """Per head dim and target, the row of the config the library runs by default
    (:func:`flashscope.compile.default_config` of ``fwd``), read like the others."""
    from ..compile import default_config
    from ..isa import inspect_pairs

    rows = []
    for hd in spec.head_dims:
        pairs = [(default_config("fwd", t, hd, spec.dtype, spec.causal, **dict(spec.variant)),
                  t) for t in spec.targets]
        recs = inspect_pairs(pairs, jobs=jobs, occupancy=False, head_dim=hd,
                             dtype=spec.dtype, causal=spec.causal, **dict(spec.variant))
        rows += [_row(c, hd, t, rec) for (c, t), rec in zip(pairs, recs)]
    return rows
