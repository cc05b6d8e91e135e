"""Register liveness over a kernel's instructions, for any ISA: a backward dataflow over the
basic blocks of the control-flow graph, with registers as bits of Python integers.

Each vendor's reader turns its instructions into :class:`Step` values: the registers an
instruction reads (``uses``) and writes (``defs``), the writes that certainly replace the
old value (``kills``: not those under a guard predicate, SASS ``@P0``, which leave the
other lanes' value alone) and where control goes next (``succ``: indices of the steps
that may run after it). :func:`liveness` gives, per instruction, the registers live on
entry: some path from there reads them before writing them.

Guarded writes follow nvdisasm's rules, so that the counts equal
``nvdisasm --life-range-mode count`` instruction by instruction (tested on real kernels):
liveness is summarized over spans between branch targets (:func:`regions`), and a guarded
write ends the old value's life for the span's predecessors (ptxas guards a write so only
when the other lanes do not need the old value, e.g. ``@P0 MOV R5, ..`` read by ``@P0``
users only) but not within the span.

The reading a per-line view needs at each instruction is ``live_in | defs``: what the
instruction holds while it runs, its results included (nvdisasm's count).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Step:
    """One instruction as liveness sees it (registers as bit masks)."""

    uses: int
    defs: int
    kills: int
    succ: tuple
    targets: tuple = ()  # the steps it branches to by name (labels start spans)


def regions(steps: list) -> list:
    """The spans liveness summarizes, as (first, last) step indices: a span starts at the
    kernel's entry, at every branch target and after a step that does not fall through;
    a guarded branch out of a span does not end it (nvdisasm's rule)."""
    n = len(steps)
    start = [False] * n
    if n:
        start[0] = True
    for i, s in enumerate(steps):
        for j in s.targets:
            start[j] = True
        if s.succ != (i + 1,):
            for j in s.succ:
                if j != i + 1:
                    start[j] = True
            if i + 1 < n and i + 1 not in s.succ:
                start[i + 1] = True
    firsts = [i for i in range(n) if start[i]]
    return [(a, b - 1) for a, b in zip(firsts, firsts[1:] + [n])]


def liveness(steps: list) -> list:
    """Registers live on entry to each step (bit masks).

    Each span (:func:`regions`) is summarized for the spans that lead into it by a walk
    that keeps two sets: what the span itself reads (ended by unguarded writes only) and
    what the places it leaves for need (ended by any write, guarded or not); the spans are
    iterated to a fixed point. Then each span's steps are walked once more from what their
    successors need, a guarded write ending nothing."""
    spans = regions(steps)
    owner = [0] * len(steps)
    for k, (a, b) in enumerate(spans):
        for i in range(a, b + 1):
            owner[i] = k
    exits = [sorted({owner[j] for i in range(a, b + 1) for j in steps[i].succ
                     if not (j == i + 1 and j <= b)}) for a, b in spans]
    preds = [[] for _ in spans]
    for k, ss in enumerate(exits):
        for j in ss:
            preds[j].append(k)
    live_in = [0] * len(spans)

    def summary(k):
        a, b = spans[k]
        own = outside = 0
        for i in range(b, a - 1, -1):
            s = steps[i]
            for j in s.succ:
                if not (j == i + 1 and j <= b):
                    outside |= live_in[owner[j]]
            own = s.uses | (own & ~s.kills)
            outside &= ~s.defs
        return own | outside

    work = list(range(len(spans)))  # popped from the end: the last spans first
    queued = [True] * len(spans)
    while work:
        k = work.pop()
        queued[k] = False
        new = summary(k)
        if new != live_in[k]:
            live_in[k] = new
            for p in preds[k]:
                if not queued[p]:
                    queued[p] = True
                    work.append(p)
    live = [0] * len(steps)
    for k, (a, b) in enumerate(spans):
        for i in range(b, a - 1, -1):
            out = 0
            for j in steps[i].succ:
                out |= live[j] if j == i + 1 and j <= b else live_in[owner[j]]
            live[i] = steps[i].uses | (out & ~steps[i].kills)
    return live


def defining_steps(steps: list, live: list, at: int) -> dict:
    """{step index: registers (mask)} that explain what is live at step ``at``: for each
    register, the nearest step back along the graph (breadth first) that writes it. The
    masks are disjoint; a register no write reaches (a kernel argument, say) is left out."""
    from collections import deque

    preds = [[] for _ in range(len(steps))]
    for i, s in enumerate(steps):
        for j in s.succ:
            preds[j].append(i)
    found = {}
    explained = 0
    seen = {}  # step -> registers already carried back through it
    work = deque((p, live[at]) for p in preds[at])
    while work:
        i, want = work.popleft()
        want &= ~(seen.get(i, 0) | explained)
        if not want:
            continue
        seen[i] = seen.get(i, 0) | want
        hit = want & steps[i].defs
        if hit:
            found[i] = found.get(i, 0) | hit
            explained |= hit
            want &= ~hit
        if want:
            work.extend((p, want) for p in preds[i])
    return found
