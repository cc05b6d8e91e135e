"""The key-tile loop of the sm_90 Gluon forward, read from the SASS of the shipped tuned
entries (``src/flashscope/data/tuned/sm90.json``) as the running Triton builds them: one
run per Triton release, then ``--diff`` to compare two.

Each entry is built offline through :func:`flashscope.compile.build` with its config, head
dim, causal flag and dtype. Its consumer loops are the innermost loops
(:func:`flashscope.isa.nvidia.loops`) that issue a wgmma and wait for the scores with the
P V product still in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``): one per consumer
warpgroup, each running once per key tile. Counts are per key tile (averaged over a
kernel's consumer loops); ``BAR.SYNC 0x80`` is a warpgroup barrier (128 threads),
``BAR.SYNC 0x100`` a PINGPONG turn; ``TRYWAIT`` is an mbarrier wait (a TMA-signalled one
in the loop: the K and V tiles' arrivals); the uniform-datapath integer operations
(UIADD3, ULEA, USHF, USGXT, USEL, R2UR) are where wgmma descriptors are recomputed from
the ring slot's index.

Usage (offline, any machine):
    PYTHONPATH=src python scripts/loop_sass.py OUT.json [--jobs 2]
    python scripts/loop_sass.py --diff A.json B.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

#: Opcodes the comparison names (the rest are summed in the totals).
WATCH = ("HGMMA", "TRYWAIT", "BAR.SYNC 0x80", "BAR.SYNC 0x100", "SYNCS.ARRIVE", "UIADD3",
         "ULEA", "USHF", "USGXT", "USEL", "R2UR", "MUFU.EX2", "FFMA", "FMNMX", "FMUL")
_ADDR = re.compile(r"/\*([0-9a-f]+)\*/")
_BAR_THREADS = re.compile(r"\bBAR\.SYNC(?:\.DEFER_BLOCKING)?\s+\S+,\s*(0x[0-9a-f]+)")


def _span(body) -> tuple:
    return tuple(int(_ADDR.search(body[i][1]).group(1), 16) for i in (0, -1))


def _name(op: str, line: str) -> str:
    """The counted name of one instruction: barriers by their thread count, mbarrier
    waits and arrivals by their kind."""
    if op == "BAR":
        m = _BAR_THREADS.search(line)
        return f"BAR.SYNC {m.group(1)}" if m else "BAR"
    if op == "SYNCS":
        return "TRYWAIT" if "TRYWAIT" in line else ("SYNCS.ARRIVE" if "ARRIVE" in line
                                                    else "SYNCS")
    return op


def consumer_loops(sass: str, kernel: str) -> list:
    """The consumer key-tile loops of ``kernel`` (see the module docstring), each a
    Counter of :func:`_name` counts."""
    from flashscope.isa.nvidia import loops

    found = [b for b in loops(sass).get(kernel, [])
             if any(op == "HGMMA" for op, _ in b)
             and any("WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln for _, ln in b)]
    spans = [_span(b) for b in found]
    inner = [b for b, (lo, hi) in zip(found, spans)
             if not any(lo <= lo2 and hi2 <= hi and (lo2, hi2) != (lo, hi)
                        for lo2, hi2 in spans)]
    return [Counter(_name(op, ln) for op, ln in b) for b in inner]


def _entry_label(e: dict) -> str:
    return (f"D={e['head_dim']} {'causal' if e['causal'] else 'full'} {e['seq_class']} "
            f"({e['shape']})")


def _build_one(item):
    from flashscope import compile as fcompile

    cfg, kw = item
    try:
        return fcompile.build(cfg, "sm90", kernel="sm90-fwd", **kw)
    except Exception as e:  # noqa: BLE001 (reported per entry)
        return e


def measure(jobs: int) -> dict:
    import triton

    from flashscope import compile as fcompile
    from flashscope.compat import ptxas
    from flashscope.isa import record_for
    from flashscope.isa.nvidia import disassemble

    from flashscope.tuned import load_tuned

    tuned = [v for k, v in sorted(load_tuned("sm90").items()) if k[0] == "sm90-fwd"]
    entries = [e for _, e in tuned]
    items = [(cfg, dict(head_dim=e["head_dim"], causal=e["causal"], dtype=e["dtype"]))
             for cfg, e in tuned]
    built = fcompile.run_clean(_build_one, items, jobs=jobs)
    out = {"triton": triton.__version__, "ptxas": ptxas(90).version, "entries": []}
    for e, art in zip(entries, built):
        row = {"entry": _entry_label(e)}
        if isinstance(art, Exception):
            row["error"] = str(art)
        else:
            rec = record_for(art)
            per = consumer_loops(disassemble(art.binary), art.name)
            total = Counter()
            for c in per:
                total.update(c)
            row.update(config=art.config.get("label"), loops=len(per),
                       registers=rec.registers, spills=[rec.spill_stores, rec.spill_loads],
                       instructions=sum(total.values()) / max(1, len(per)),
                       per_tile={k: v / max(1, len(per)) for k, v in sorted(total.items())})
        out["entries"].append(row)
    return out


def _fmt(a, b) -> str:
    a = "-" if a is None else f"{a:g}"
    b = "-" if b is None else f"{b:g}"
    return a if a == b else f"{a} -> {b}"


def diff(a: dict, b: dict) -> str:
    """A table: per entry, the loop's instructions a key tile and the watched opcodes,
    ``A -> B`` where they differ; then each opcode's change summed over the entries."""
    head = ["entry", "loops", "instr/tile", "regs", "spills"] + list(WATCH)
    rows = [head]
    moved = Counter()
    by_b = {r["entry"]: r for r in b["entries"]}
    for ra in a["entries"]:
        rb = by_b.get(ra["entry"])
        if rb is None or "error" in ra or "error" in rb:
            rows.append([ra["entry"], "error: " + (ra.get("error") or (rb or {}).get(
                "error") or "missing in B")[:60]] + [""] * (len(head) - 2))
            continue
        pa, pb = ra["per_tile"], rb["per_tile"]
        for k in set(pa) | set(pb):
            moved[k] += pb.get(k, 0) - pa.get(k, 0)
        rows.append([ra["entry"], _fmt(ra["loops"], rb["loops"]),
                     _fmt(ra["instructions"], rb["instructions"]),
                     _fmt(ra["registers"], rb["registers"]),
                     _fmt(sum(ra["spills"]), sum(rb["spills"]))]
                    + [_fmt(pa.get(k, 0), pb.get(k, 0)) for k in WATCH])
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = [f"A: Triton {a['triton']} (ptxas {a['ptxas']}), B: Triton {b['triton']} "
             f"(ptxas {b['ptxas']}); per key tile, mean over each kernel's consumer loops"]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("summed over the entries, B - A per key tile: " + ", ".join(
        f"{k} {v:+g}" for k, v in sorted(moved.items(), key=lambda kv: -abs(kv[1])) if v)[:2000])
    return "\n".join(lines)


def _load(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
        doc["entries"], doc["triton"], doc["ptxas"]  # noqa: B018 (the keys diff reads)
        return doc
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"loop_sass: {path}: not a loop_sass.py output ({e})", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="write this Triton's counts here (JSON)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two outputs")
    p.add_argument("--jobs", type=int, default=2, help="compile processes (default 2)")
    args = p.parse_args(argv)
    if args.diff:
        print(diff(_load(args.diff[0]), _load(args.diff[1])))
        return 0
    if not args.out:
        p.error("give OUT.json, or --diff A B")
    out = Path(args.out)
    if out.exists():
        print(f"loop_sass: {out}: exists (remove it first)", file=sys.stderr)
        return 2
    doc = measure(args.jobs)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["entries"]:
        print(r["entry"], r.get("error") or f"{r['loops']} loops, "
              f"{r['instructions']:g} instructions a key tile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
