"""The cliff view: which measured configs sit just past an occupancy cliff, per target, and
the saving that would cross back.

A row is "just past" a cliff when removing at most :data:`NEAR` of one resource (registers
per thread, VGPRs per lane, or shared memory/LDS bytes per block) gains a block (workgroup)
per SM (CU/WGP). The saving comes from the occupancy calculator's cliffs
(``save_to_gain``); the occupancy after the saving is recomputed, not assumed.
"""

from __future__ import annotations

import dataclasses

from ..errors import FlashscopeError

#: Largest saving still called "just past": 16 registers (a few NVIDIA allocation steps of
#: 8 per thread, two CDNA VGPR granules of 8) and 8 KB of shared memory/LDS.
NEAR = {"registers": 16, "shared_mem": 8192}

_FIELD = {"registers": "registers", "shared_mem": "shared_bytes"}


def _after_saving(record, resource: str, save: int):
    from ..occupancy import occupancy_for_record

    field = _FIELD[resource]
    changed = dataclasses.replace(record, **{field: getattr(record, field) - save})
    return occupancy_for_record(changed)


def cliff_view(rows) -> list:
    """Every (row, resource) with a finite saving, sorted by target then saving; each item
    says whether it is within :data:`NEAR` and the occupancy the saving would reach."""
    out = []
    for row in rows:
        if row.record is None or row.occ is None:
            continue
        for resource, c in row.occ.cliffs.items():
            save = c.get("save_to_gain")
            if save is None or resource not in _FIELD:
                continue
            try:
                gained = _after_saving(row.record, resource, save)
            except FlashscopeError:  # the reduced kernel is outside the calculator's domain
                continue
            out.append({
                "target": row.target, "config": row.config.label, "head_dim": row.head_dim,
                "resource": resource, "value": getattr(row.record, _FIELD[resource]),
                "save_to_gain": save, "near": save <= NEAR[resource],
                "active_blocks": row.occ.active_blocks, "occupancy": row.occ.occupancy,
                "blocks_after": gained.active_blocks, "occupancy_after": gained.occupancy,
                "room_before_loss": c.get("room_before_loss"),
            })
    out.sort(key=lambda d: (d["target"], not d["near"], d["resource"], d["save_to_gain"]))
    return out
