"""The search steps: which variants an A/B of a cell's default should time.

- :func:`neighbour_specs`: every config one knob away from the default that its family's
  rules accept for the target (each switch flipped, each tile, stage count or cap moved
  one valid step along its ladder, :func:`flashscope.families.neighbours`). Timed and
  adopted by the rule of :mod:`.rule`, that is one step of a coordinate search.
- :func:`transplant_specs`: the other tuned entries of the same kernel, dtype and head dim
  (other masks and length classes), whole. A coordinate search stops where every single
  change loses even when a combination wins: the D = 128 non-causal 16k entry sat at 0.96
  of FlashAttention-4's speed through five one-knob searches while the 4k entry's recipe,
  five knobs away, ran it in 0.955 of the time.

Both return ``{name: spec}`` in :mod:`.variants`' syntax; names say what moved
(``pingpong1``, ``num-stages4``; transplants ``x<c|n><class>``, ``xn4k`` being the
non-causal ``le4k`` entry).
"""

from __future__ import annotations

from ..families import Knobs, Problem, neighbours
from ..tuned import load_tuned


def _shown(value) -> str:
    """A knob's value as a spec writes it: ``1``/``0`` for switches, ``none`` for no cap."""
    if value is None:
        return "none"
    return str(int(value)) if isinstance(value, bool) else str(value)


def step_name(knob: str, value) -> str:
    """``pingpong1``, ``num-stages4``, ``maxnreg-none``: a variant name for one move."""
    return knob.lower().replace("_", "-") + ("-none" if value is None else _shown(value))


def neighbour_specs(base: Knobs, problem: Problem) -> dict:
    """``{name: "+KNOB=V"}`` for each config one knob from ``base`` (module docstring)."""
    return {step_name(knob, value): f"+{knob}={_shown(value)}"
            for knob, value, _ in neighbours(base, problem.target, problem.head_dim,
                                             problem.dtype)}


def transplant_specs(base: Knobs, problem: Problem, data_dir=None) -> dict:
    """``{name: "KERNEL:every knob"}`` for each entry of the target's tuned file with
    ``base``'s kernel, the problem's dtype and head dim, whose config differs from
    ``base`` and from every earlier one."""
    seen = {base}
    out = {}
    entries = load_tuned(problem.target, data_dir)
    for (kernel, dtype, head_dim, causal, cls), (cfg, _) in sorted(entries.items(), key=str):
        if (kernel, dtype, head_dim) != (base.KERNEL, problem.dtype, problem.head_dim):
            continue
        if cfg in seen:
            continue
        seen.add(cfg)
        out[f"x{'c' if causal else 'n'}{cls.removeprefix('le')}"] = f"{kernel}:{cfg.text}"
    return out
