"""The :class:`Occupancy` record both vendors' calculators return, and the cliff search.

Cliff semantics (keys ``"registers"`` and ``"shared_mem"`` on both vendors; on AMD they
mean VGPRs per lane and LDS bytes per workgroup):

- ``save_to_gain``: the fewest registers (bytes) to remove so that the kernel holds at least
  one more block (workgroup) per SM (CU/WGP), all other inputs unchanged. ``None`` when no
  reduction of that resource alone gains a block (another limit binds, or it is already the
  maximum).
- ``room_before_loss``: the most registers (bytes) that can be added while keeping the same
  number of blocks; bounded by the per-thread (per-block) maximum, so a kernel far from any
  cliff reports the headroom up to that maximum. ``None`` when the kernel cannot launch.

Both are found by bisection: the block count is a non-increasing step function of each
resource, so the boundary is unique.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel launch on one SM (NVIDIA) or CU/WGP (AMD).

    ``limits`` maps each resource to the blocks (workgroups) it alone allows per SM (CU);
    ``None`` means that resource does not limit. ``limiter`` names every resource whose
    limit equals ``active_blocks`` (all of them when tied). ``occupancy`` is
    active_warps / max_warps (waves over wave slots). ``details`` holds the intermediate
    quantities (allocation sizes, the carveout, LLVM's own estimate) for reports; it is not
    part of :meth:`as_dict`.
    """

    target: str
    active_blocks: int
    active_warps: int
    occupancy: float
    limiter: tuple
    limits: dict
    cliffs: dict
    waves_per_simd: Optional[int] = None
    reason: Optional[str] = None
    details: dict = field(default_factory=dict, compare=False)

    def as_dict(self, details: bool = False) -> dict:
        d = {"target": self.target, "active_blocks": self.active_blocks,
             "active_warps": self.active_warps, "occupancy": self.occupancy,
             "limiter": list(self.limiter), "limits": dict(self.limits),
             "cliffs": {k: dict(v) for k, v in self.cliffs.items()}}
        if self.waves_per_simd is not None:
            d["waves_per_simd"] = self.waves_per_simd
        if self.reason is not None:
            d["reason"] = self.reason
        if details:
            d["details"] = dict(self.details)
        return d


def binding(limits: dict) -> tuple:
    """(active blocks, names of the limits equal to it) over the limits that apply."""
    applied = {k: v for k, v in limits.items() if v is not None}
    active = min(applied.values())
    return active, tuple(k for k, v in applied.items() if v == active)


def cliff(blocks_at: Callable[[int], int], x: int, lo: int, hi: int) -> dict:
    """Cliffs of a non-increasing step function ``blocks_at`` around ``x`` on [lo, hi]."""
    now = blocks_at(x)
    gain = None
    if x > lo and blocks_at(lo) > now:
        a, b = lo, x  # blocks_at(a) > now, blocks_at(b) == now: find the largest such a
        while b - a > 1:
            m = (a + b) // 2
            if blocks_at(m) > now:
                a = m
            else:
                b = m
        gain = x - a
    room = None
    if now > 0:
        if blocks_at(hi) >= now:
            room = hi - x
        else:
            a, b = x, hi  # blocks_at(a) == now, blocks_at(b) < now
            while b - a > 1:
                m = (a + b) // 2
                if blocks_at(m) >= now:
                    a = m
                else:
                    b = m
            room = a - x
    return {"save_to_gain": gain, "room_before_loss": room}


def positive_int(name: str, value, what: str = "a positive integer") -> int:
    """``value`` as an int >= 1, or a FlashscopeError naming ``name``."""
    from ..errors import FlashscopeError

    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
            isinstance(value, float) and value.is_integer()):
        raise FlashscopeError(f"{name}={value!r}: expected {what}")
    value = int(value)
    if value < 1:
        raise FlashscopeError(f"{name}={value}: expected {what}")
    return value


def nonneg_int(name: str, value) -> int:
    from ..errors import FlashscopeError

    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
            isinstance(value, float) and value.is_integer()):
        raise FlashscopeError(f"{name}={value!r}: expected a non-negative integer (bytes)")
    value = int(value)
    if value < 0:
        raise FlashscopeError(f"{name}={value}: expected a non-negative integer (bytes)")
    return value
