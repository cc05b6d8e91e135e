"""Ablations: one knob of a base config changed at a time, each side compiled and measured.

The steps are data (:data:`KNOBS`); :func:`variants` lists the configs they need and
:func:`steps` pairs measured rows into before/after deltas per target. A variant the
config checks reject (e.g. BLOCK_M below 16) is left out rather than changed.

The wavefront-64 amplification is reported in numbers: a step that adds dR registers per
thread costs dR x L x 4 bytes of register file per warp/wave (L = 32 or 64 lanes), so the
same per-thread growth takes twice the file on CDNA, where the 512-entry VGPR file per SIMD
lane then holds fewer waves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..families.triton_fwd import TritonFwdConfig, check
from ..errors import FlashscopeError

#: Head dims of the head-dim ablation: 64 -> 128 -> 256.
HEAD_DIM_STEPS = (64, 128, 256)

#: (step name, knob, how the value changes): factor (x2, x0.5) or "flip" for booleans.
KNOBS = (
    ("Q_IN_REGS off", "Q_IN_REGS", "flip"),
    ("BLOCK_M halved", "BLOCK_M", 0.5),
    ("BLOCK_M doubled", "BLOCK_M", 2),
    ("BLOCK_N halved", "BLOCK_N", 0.5),
    ("BLOCK_N doubled", "BLOCK_N", 2),
    ("num_warps halved", "num_warps", 0.5),
    ("num_warps doubled", "num_warps", 2),
)


@dataclass(frozen=True)
class Step:
    """One ablation: (config, head dim) before -> after."""

    name: str
    knob: str
    before: TritonFwdConfig
    after: TritonFwdConfig
    head_dim_before: int
    head_dim_after: int


def _changed(cfg: TritonFwdConfig, knob: str, how) -> TritonFwdConfig:
    value = getattr(cfg, knob)
    new = (not value) if how == "flip" else int(value * how)
    return cfg.replace(**{knob: new})


#: Knob names :func:`plan` accepts (``HEAD_DIM``: the head-dim steps).
KNOB_NAMES = ("Q_IN_REGS", "BLOCK_M", "BLOCK_N", "num_warps", "HEAD_DIM")


def parse_knobs(text: str, names: tuple = KNOB_NAMES) -> tuple:
    """``"Q_IN_REGS,BLOCK_M"`` -> the knob names; ``"all"`` -> every knob of ``names``;
    ``"none"`` -> ()."""
    low = str(text).strip().lower()
    if low == "all":
        return names
    if low == "none":
        return ()
    by_lower = {k.lower(): k for k in names}
    out = []
    for part in low.split(","):
        part = part.strip()
        if not part:
            continue
        if part not in by_lower:
            raise FlashscopeError(f"--ablate {part!r}: expected some of "
                                  f"{', '.join(names)}, or all, or none")
        out.append(by_lower[part])
    return tuple(dict.fromkeys(out))


def plan(base: TritonFwdConfig, head_dim: int, targets, knobs=KNOB_NAMES) -> list:
    """The ablation steps around ``base`` at ``head_dim`` (knob steps whose variant passes
    the config checks on every target), then head dim 64 -> 128 -> 256 at ``base``; only
    the steps of ``knobs``."""
    out = []
    for name, knob, how in KNOBS:
        if knob not in knobs:
            continue
        if knob == "Q_IN_REGS" and not base.Q_IN_REGS:
            name = "Q_IN_REGS on"
        after = _changed(base, knob, how)
        try:
            for t in targets:
                check(after, t, head_dim)
        except FlashscopeError:
            continue
        out.append(Step(name, knob, base, after, head_dim, head_dim))
    for a, b in zip(HEAD_DIM_STEPS, HEAD_DIM_STEPS[1:]):
        if "HEAD_DIM" not in knobs:
            break
        out.append(Step(f"HEAD_DIM {a} -> {b}", "HEAD_DIM", base, base, a, b))
    return out


def needed(steps) -> set:
    """(config, head dim) pairs the steps compile."""
    pairs = set()
    for s in steps:
        pairs.add((s.before, s.head_dim_before))
        pairs.add((s.after, s.head_dim_after))
    return pairs


def _side(row) -> dict:
    if row is None or row.record is None:
        return {"ok": False, "error": None if row is None else row.error,
                "refused": row is not None and row.refused}
    r, o = row.record, row.occ
    return {"ok": True, "registers": r.registers, "spills": row.spills,
            "occupancy": None if o is None else o.occupancy,
            "active_blocks": None if o is None else o.active_blocks,
            "waves_per_simd": None if o is None else o.waves_per_simd,
            "limiter": None if o is None else list(o.limiter)}


def steps(plan_steps, rows_by_key: dict, targets) -> list:
    """Measured deltas per step and target: registers, spills (NVIDIA STL+LDL instructions,
    AMD VGPR spills), occupancy before/after, and register file per warp/wave in bytes."""
    out = []
    for s in plan_steps:
        per_target = {}
        for t in targets:
            a = _side(rows_by_key.get((s.before.key, s.head_dim_before, t.name)))
            b = _side(rows_by_key.get((s.after.key, s.head_dim_after, t.name)))
            entry = {"before": a, "after": b}
            if a["ok"] and b["ok"]:
                d_regs = b["registers"] - a["registers"]
                entry.update({
                    "d_registers": d_regs,
                    "d_spills": b["spills"] - a["spills"],
                    "d_occupancy": (None if a["occupancy"] is None or b["occupancy"] is None
                                    else round(b["occupancy"] - a["occupancy"], 6)),
                    "d_blocks": (None if a["active_blocks"] is None
                                 or b["active_blocks"] is None
                                 else b["active_blocks"] - a["active_blocks"]),
                    "d_file_bytes_per_wave": d_regs * t.warp_size * 4,
                    "lanes": t.warp_size,
                })
            per_target[t.name] = entry
        out.append({"name": s.name, "knob": s.knob, "before": s.before.label,
                    "after": s.after.label, "head_dim_before": s.head_dim_before,
                    "head_dim_after": s.head_dim_after, "targets": per_target})
    return out
