"""The offline choices (:mod:`.offline`) as data: the ``source`` text of a tuned entry (what
was read and why), the entries a run writes through the tuned files' one writer (never over
a measured entry), and the rows of ``triton_fwd.DEFAULTS`` they suggest."""

from __future__ import annotations

from ..targets import get_target
from .offline import REPEAT_OK, Choice


def source_text(ch: Choice, triton_version: str) -> str:
    """The ``source`` of a tuned entry: what was read and why this config."""
    j = ch.chosen
    rec, occ, cl = j.row.record, j.row.occ, j.cliff
    scratch = rec.local_bytes or 0
    parts = [f"{rec.registers} VGPRs",
             "no spills or scratch" if not (j.row.spills or scratch) else
             f"{j.row.spills} spilled registers, {scratch} B of scratch"]
    if j.reading.repeat is not None:
        parts.append("no repeated matrix work" if j.reading.repeat <= REPEAT_OK else
                     f"{j.reading.repeat:.3g}x the tile's matrix work")
    parts.append(f"{rec.shared_bytes} B LDS, {occ.waves_per_simd} waves/SIMD, "
                 f"{occ.active_blocks} workgroups per {get_target(rec.target).unit} "
                 f"({100 * occ.occupancy:.1f}%, limited by {', '.join(occ.limiter)})")
    if cl.get("room_before_loss") is not None:
        parts.append(f"{cl['room_before_loss']} VGPRs from losing a workgroup")
    if cl.get("save_to_gain") is not None:
        unit = "VGPRs" if cl["resource"] == "registers" else "B of LDS"
        parts.append(f"{cl['save_to_gain']} {unit} from gaining one")
    n = len(ch.last.judged)
    if ch.seed is not None:
        how = f"the choice for {ch.seed.name}, read again here"
    elif ch.clean:
        ok = sum(x.eligible for x in ch.last.judged)
        how = f"best by the model of {ok} spill-free, cliff-safe configs among the {n} " \
              "around it"
    else:
        how = (f"the least bad of the {n} around it: none is free of spills and repeated "
               "matrix work and clear of a cliff")
    return (f"flashscope tune offline (Triton {triton_version}, no GPU timed): "
            + ", ".join(parts) + f"; {how}")


def differs(ch: Choice) -> bool:
    """Whether the choice differs from the family's rule (``select``) for the cell."""
    from ..families import triton_fwd

    return ch.chosen.config != triton_fwd.select(ch.cell.problem)


def planned_entries(choices: list, triton_version: str, data_dir=None) -> tuple:
    """({target: [tuned entry, ...]}, [note, ...]): for each converged choice that the
    rule does not already give (or that updates an earlier offline entry), one entry per
    key-length class, the readings being the same at every length; a choice that is only
    the least bad says so in its source. A measured entry (``search`` other than
    ``offline``) is never replaced: its cell is left out with a note, as is a choice that
    did not converge."""
    from ..tuned import SEQ_CLASSES, entry_key, load_tuned, make_entry

    out, notes = {}, []
    for ch in choices:
        c = ch.cell
        have = load_tuned(c.target, data_dir)
        keys = [entry_key("triton-fwd", c.dtype, c.head_dim, c.causal, cls)
                for cls, _ in SEQ_CLASSES]
        measured = [k for k in keys if k in have and have[k][1].get("search") != "offline"]
        if measured:
            notes.append(f"{c.name}: kept the measured entry ({measured[0][4]})")
            continue
        if not ch.converged:
            n = len(ch.rounds)
            notes.append(f"{c.name}: nothing written (not settled in {n} "
                         f"round{'s' if n != 1 else ''})")
            continue
        if not differs(ch) and not any(k in have for k in keys):
            continue
        src = source_text(ch, triton_version)
        for cls, _ in SEQ_CLASSES:
            out.setdefault(c.target, []).append(make_entry(
                ch.chosen.config, c.dtype, c.head_dim, c.causal, cls, search="offline",
                source=src))
    return out, notes


def write(choices: list, triton_version: str, data_dir=None) -> tuple:
    """Write :func:`planned_entries` through :func:`flashscope.tuned.write_entries`;
    returns (paths written, notes)."""
    from ..tuned import write_entries

    planned, notes = planned_entries(choices, triton_version, data_dir)
    return [write_entries(t, es, data_dir) for t, es in sorted(planned.items())], notes


def rule_rows(choices: list) -> list:
    """The defaults table's rows the choices suggest: per (target, head dim), the config
    when both dtypes and both masks chose it (``causal`` None), else per mask when both
    dtypes agree; cells left over need entries. ``[(target, head_dim, causal, config)]``."""
    by = {}
    for ch in choices:
        by.setdefault((ch.cell.target, ch.cell.head_dim), []).append(ch)
    out = []
    for (t, d), chs in by.items():
        cfgs = {ch.chosen.config for ch in chs}
        if len(cfgs) == 1:
            out.append((t, d, None, cfgs.pop()))
            continue
        for causal in (False, True):
            these = {ch.chosen.config for ch in chs if ch.cell.causal == causal}
            if len(these) == 1:
                out.append((t, d, causal, these.pop()))
    return out


__all__ = ["differs", "planned_entries", "rule_rows", "source_text", "write"]
