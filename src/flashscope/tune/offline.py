"""Defaults chosen offline: for an AMD target with no GPU to time on, the portable forward's
config per (dtype, head dim, mask) is chosen from what the compiled code objects say.

For one cell (target, dtype, head dim, mask), starting from a config (the current default):

1. **Candidates**: the start, every config one knob from it that the family's rules accept
   (:func:`flashscope.families.neighbours`: BLOCK_M, BLOCK_N, num_warps, num_stages,
   waves_per_eu one step along their ladders, Q_IN_REGS flipped), and the two-knob moves
   that keep a per-lane quantity while trading another (:data:`PAIRS`: BLOCK_M with
   num_warps keeps the rows per wave, BLOCK_N with num_warps the score columns per wave,
   BLOCK_M against BLOCK_N the score tile's area) or pay for a tile or warp move's
   registers by reloading Q. Tens of configs, never a grid.
2. **Readings**: each candidate compiled for the target (cached) and read from its code
   object: VGPRs (AGPRs included), spills, scratch, LDS, instructions; occupancy and its
   cliffs from :mod:`flashscope.occupancy`.
3. **Rejections**, in this order: the build fails; the kernel spills VGPRs or SGPRs or
   uses scratch; its waves repeat each other's matrix work (the loop's matrix
   instructions, multiply-adds read from their mnemonics, times the waves, exceed the
   BLOCK_M x BLOCK_N x head-dim products of one iteration: Triton spreads an attention
   tile's rows over the waves, and a wave with fewer rows than its matrix instruction
   computes rows another wave computes too); it cannot be resident; it sits just past
   an occupancy cliff, i.e. at
   most :data:`flashscope.report.cliffs.NEAR` of one resource (16 VGPRs, 8 KB of LDS) from
   gaining a workgroup per CU/WGP. That margin is the report's own definition of "just
   past a cliff" (so a chosen default never appears in the report's cliff table): two
   CDNA allocation granules, under one RDNA granule of 24, the range over which small
   code changes and ``waves_per_eu`` move the allocation. A candidate just past the VGPR
   cliff is also read again with ``waves_per_eu`` set to the occupancy the saving would
   reach (the compiler then aims under the cliff; it may spill, and the readings say).
4. **Model**, over the survivors; larger is better, compared in this order:

   - waves per SIMD, counted up to :data:`WAVES_WANTED` (2): a second resident wave lets
     the SIMD issue one wave's matrix instructions while the other waits on its K/V loads
     or computes its softmax (exponentials, row max and sum);
   - resident score elements per CU (WGP): workgroups x BLOCK_M x BLOCK_N, the matrix work
     held in flight at once, from more waves or from larger tiles alike;
   - BLOCK_M: every K/V tile loaded serves BLOCK_M query rows, so halving it doubles the
     K/V traffic per FLOP;
   - fewer instructions per matrix instruction (static counts): less code around the
     same matrix work;
   - fewer knobs moved from the start (a tie keeps what runs today).

   The model sees neither latency that a software pipeline hides nor the grid's tail;
   it ranks what the readings show and nothing else.
5. **Rounds**: if a candidate other than the start wins, the search starts again from it
   (candidates around it, most readings already cached) until the start wins: the
   chosen config is then best among its own neighbours, which is what the report shows.
   At most :data:`MAX_ROUNDS` rounds.

6. **Relatives**: the bf16 cells without a mask at head dims 64, 128 and 256 are searched
   as above. Every other cell (fp16, causal, head dims padded to a power of two) first
   reads the choice of its relative (:func:`seed_cell`: the bf16 full-mask cell of its
   head dim, and 80 and 96 that of 128) and keeps it when that reading is spill-free and
   cliff-safe too; only where it is not does the cell search from it. Compiling is what
   costs (seconds per kernel): this keeps a five-target run to about a thousand builds.

:func:`choose` is a pure function of the readings (tests feed it records made by hand);
:func:`search` adds the rounds, with ``read`` (:func:`offline_reader` compiles) given by
the caller; :func:`choose_cells` runs many cells in order, relatives after their seeds.
The choices become data in :mod:`.offline_data` (tuned entries, the defaults table's rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..errors import FlashscopeError
from ..families import Problem, default_config, neighbours
from ..families.base import head_dim_pad
from ..families.triton_fwd import TritonFwdConfig
from ..targets import get_target
from .search import step_name

#: Waves per SIMD that the model asks for before anything else (module docstring, 4).
WAVES_WANTED = 2
#: Rounds of the search at most (module docstring, 5).
MAX_ROUNDS = 5
#: Two-knob moves: (knob, other knob, +1 both the same way / -1 opposite ways / 0 the
#: other knob's every move: the Q_IN_REGS flip, which pays for a move's registers).
PAIRS = (("BLOCK_M", "num_warps", +1), ("BLOCK_N", "num_warps", +1),
         ("BLOCK_M", "BLOCK_N", -1), ("BLOCK_M", "Q_IN_REGS", 0),
         ("BLOCK_N", "Q_IN_REGS", 0), ("num_warps", "Q_IN_REGS", 0))
#: Largest ratio of issued to needed matrix multiply-adds that counts as no repetition
#: (module docstring, 3).
REPEAT_OK = 1.0
#: The five AMD targets, head dims and dtypes a full run covers.
AMD_TARGETS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")
HEAD_DIMS = (64, 80, 96, 128, 256)
DTYPES = ("bfloat16", "float16")

_SHORT = {"bfloat16": "bf16", "float16": "fp16"}
_RESOURCE = {"registers": "VGPR", "shared_mem": "LDS"}


@dataclass(frozen=True)
class Cell:
    """One problem class a default is chosen for."""

    target: str
    dtype: str = "bfloat16"
    head_dim: int = 128
    causal: bool = False

    @property
    def name(self) -> str:
        return (f"{self.target} D{self.head_dim} {_SHORT.get(self.dtype, self.dtype)} "
                f"{'causal' if self.causal else 'full'}")

    @property
    def problem(self) -> Problem:
        return Problem(self.target, self.dtype, self.head_dim, self.causal)


def cells(targets=AMD_TARGETS, head_dims=HEAD_DIMS, dtypes=DTYPES,
          causal=(False, True)) -> list:
    """The cells of a run, AMD targets only, in the order :func:`choose_cells` decides
    them: per target, the power-of-two head dims before those padded to them, bf16 before
    fp16, the full mask before causal (each cell's relatives come first)."""
    out = []
    for t in targets:
        rec = get_target(t)
        if rec.vendor != "amd":
            raise FlashscopeError(f"--target {rec.name}: the offline choice is for AMD "
                                  "targets (NVIDIA defaults are timed: flashscope tune cells)")
        dims = sorted(set(head_dims), key=lambda d: (head_dim_pad(d) != d, d))
        for d in dims:
            for dt in dtypes:
                for c in causal:
                    out.append(Cell(rec.name, dt, int(d), bool(c)))
    return out


def seed_cell(cell: Cell) -> Optional[Cell]:
    """The relative whose choice ``cell`` starts from: the bf16 full-mask cell of the same
    head dim, and for that cell the one of its padded head dim (80 and 96 from 128);
    None for a bf16 full-mask cell of a power-of-two head dim."""
    if cell.dtype != "bfloat16" or cell.causal:
        return Cell(cell.target, "bfloat16", cell.head_dim, False)
    pad = head_dim_pad(cell.head_dim)
    return None if pad == cell.head_dim else Cell(cell.target, "bfloat16", pad, False)


# -- candidates -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A config and the move from the start that made it (``start``, ``block-m128``,
    ``block-m128+num-warps8``, ``...+waves-per-eu3``); ``knobs``: how many knobs moved."""

    move: str
    config: TritonFwdConfig
    knobs: int


def _side(value, now) -> int:
    rank = (lambda v: float("inf") if v is None else float(v))
    return (rank(value) > rank(now)) - (rank(value) < rank(now))


def candidates(start: TritonFwdConfig, cell: Cell) -> list:
    """The start, its one-knob neighbours and the :data:`PAIRS` moves, each config once."""
    out, seen = [Candidate("start", start, 0)], {start}

    def add(move, cfg, knobs):
        if cfg not in seen:
            seen.add(cfg)
            out.append(Candidate(move, cfg, knobs))

    one = neighbours(start, cell.target, cell.head_dim, cell.dtype)
    for knob, value, cfg in one:
        add(step_name(knob, value), cfg, 1)
    for a, b, same in PAIRS:
        for knob, va, ca in one:
            if knob != a:
                continue
            way = _side(va, getattr(start, a)) * same
            for knob2, vb, cb in neighbours(ca, cell.target, cell.head_dim, cell.dtype):
                if knob2 == b and (same == 0 or _side(vb, getattr(start, b)) == way):
                    add(f"{step_name(a, va)}+{step_name(b, vb)}", cb, 2)
    return out


# -- readings ---------------------------------------------------------------------------------

@dataclass
class Reading:
    """One candidate as compiled: the report's Row (record, occupancy, or the build's
    error) and, from the kernel's loops in its assembly, their instructions, matrix
    instructions and ``repeat``: the multiply-adds the workgroup's matrix instructions
    issue per iteration over those the score tile needs (1 when each wave does its own
    share; None where the assembly was not read, and then the whole kernel's counts stand
    in for the loops')."""

    row: object  # a flashscope.report.collect.Row
    loop_instructions: Optional[int] = None
    loop_matrix: Optional[int] = None
    repeat: Optional[float] = None

    def per_matrix(self) -> float:
        """Instructions per matrix instruction, in the loops when read, else the whole
        kernel; infinite without matrix instructions."""
        rec = self.row.record
        if self.loop_matrix:
            return self.loop_instructions / self.loop_matrix
        mma = matrix_instructions(rec)
        return (rec.instructions or 0) / mma if mma else float("inf")


_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)")
_BLOCKS = re.compile(r"_(\d+)b(?:_|$)")


def matrix_macs(op: str) -> int:
    """Multiply-adds of one wave's matrix instruction from its mnemonic:
    ``v_mfma_f32_32x32x8_bf16`` 32 x 32 x 8, ``v_wmma_f32_16x16x16_bf16`` 16 x 16 x 16,
    times its blocks (``_4b``); 0 for any other instruction."""
    m = _SHAPE.search(op)
    if m is None:
        return 0
    b = _BLOCKS.search(op)
    return int(m[1]) * int(m[2]) * int(m[3]) * (int(b[1]) if b else 1)


def loop_counts(text: str, kernel: str, cfg: TritonFwdConfig, head_dim: int) -> tuple:
    """(instructions, matrix instructions, repeat) over the loop bodies of ``kernel``:
    ``repeat`` is the largest over its loops of the loop's multiply-adds per wave times
    the waves, over the two products of one iteration (Q K^T and P V, BLOCK_M x BLOCK_N x
    the padded head dim each); None without a loop."""
    from ..isa.amd import CLASSES, loops

    matrix = CLASSES["mfma"] + CLASSES["wmma"]
    bodies = loops(text, kernel)
    need = 2 * cfg.BLOCK_M * cfg.BLOCK_N * head_dim_pad(head_dim)
    repeat = max((sum(matrix_macs(op) for op in b if op.startswith(matrix))
                  * cfg.num_warps / need for b in bodies), default=None)
    return (sum(len(b) for b in bodies),
            sum(op.startswith(matrix) for b in bodies for op in b), repeat)


# -- judging one reading ------------------------------------------------------------------------

@dataclass
class Judged:
    """One candidate's reading and verdict. ``kind``: ``ok`` (eligible), ``failed``,
    ``spills``, ``repeats``, ``no-launch`` or ``cliff``; ``why``: the reason in words;
    ``cliff``: the nearest cliff's numbers (resource, save_to_gain, room_before_loss)."""

    candidate: Candidate
    reading: Reading
    kind: str
    why: str = ""
    cliff: dict = field(default_factory=dict)
    outranked: str = ""  # set by choose() for eligible candidates that lost

    @property
    def config(self) -> TritonFwdConfig:
        return self.candidate.config

    @property
    def row(self):
        return self.reading.row

    @property
    def eligible(self) -> bool:
        return self.kind == "ok"

    def as_dict(self) -> dict:
        r, occ = self.row.record, self.row.occ
        return {
            "move": self.candidate.move, "config": self.config.label,
            "config_fields": self.config.as_dict(), "kind": self.kind,
            "why": self.why or self.outranked or None,
            "vgprs": None if r is None else r.registers,
            "agprs": None if r is None else r.agprs,
            "sgprs": None if r is None else r.sgprs,
            "spills": None if r is None else self.row.spills,
            "scratch_bytes": None if r is None else (r.local_bytes or 0),
            "lds_bytes": None if r is None else r.shared_bytes,
            "instructions": None if r is None else r.instructions,
            "matrix_instructions": None if r is None else matrix_instructions(r),
            "loop_instructions": self.reading.loop_instructions,
            "loop_matrix_instructions": self.reading.loop_matrix,
            "repeat": self.reading.repeat,
            "waves_per_simd": None if occ is None else occ.waves_per_simd,
            "workgroups": None if occ is None else occ.active_blocks,
            "occupancy": None if occ is None else occ.occupancy,
            "limiter": None if occ is None else list(occ.limiter),
            "cliff": self.cliff or None, "error": self.row.error,
        }


def matrix_instructions(record) -> int:
    """MFMA (CDNA) plus WMMA (RDNA) instructions in the code object."""
    mix = record.mix or {}
    return int(mix.get("mfma", 0) or 0) + int(mix.get("wmma", 0) or 0)


def _nearest_cliff(row) -> dict:
    """The cliff of ``row`` with the smallest saving, as :func:`cliff_view` reports it,
    and the room before losing a workgroup (VGPRs)."""
    from ..report.cliffs import NEAR, cliff_view

    items = cliff_view([row])
    room = (row.occ.cliffs.get("registers") or {}).get("room_before_loss")
    if not items:
        return {"resource": None, "save_to_gain": None, "near": False, "room_before_loss": room}
    near = [c for c in items if c["near"]]
    c = min(near or items, key=lambda c: c["save_to_gain"] / NEAR[c["resource"]])
    return {"resource": c["resource"], "save_to_gain": c["save_to_gain"], "near": c["near"],
            "blocks": c["active_blocks"], "blocks_after": c["blocks_after"],
            "room_before_loss": room}


def judge(cand: Candidate, reading: Reading) -> Judged:
    """The verdict on one reading (module docstring, 3)."""
    row = reading.row
    rec, occ = row.record, row.occ
    if rec is None:
        return Judged(cand, reading, "failed", f"does not build: {row.error or 'no record'}")
    scratch = rec.local_bytes or 0
    if row.spills or scratch:
        what = [f"{n} {k}" for n, k in ((rec.vgpr_spills or 0, "VGPRs"),
                                        (rec.sgpr_spills or 0, "SGPRs")) if n]
        return Judged(cand, reading, "spills",
                      f"spills {' and '.join(what) or 'nothing'}"
                      f"{f' ({scratch} B of scratch)' if scratch else ''}")
    if reading.repeat is not None and reading.repeat > REPEAT_OK:
        return Judged(cand, reading, "repeats",
                      f"its waves repeat each other's matrix work: the loop issues "
                      f"{reading.repeat:.3g}x the multiply-adds of the "
                      f"{cand.config.BLOCK_M}x{cand.config.BLOCK_N} tile")
    if occ is None or not occ.active_blocks:
        return Judged(cand, reading, "no-launch",
                      f"cannot be resident: {(occ.reason if occ else row.error) or '?'}")
    cliff = _nearest_cliff(row)
    if cliff["near"]:
        unit = "VGPRs" if cliff["resource"] == "registers" else "bytes of LDS"
        return Judged(cand, reading, "cliff",
                      f"past the {_RESOURCE[cliff['resource']]} cliff by "
                      f"{cliff['save_to_gain']} {unit} ({cliff['save_to_gain']} fewer give "
                      f"{cliff['blocks']} -> {cliff['blocks_after']} workgroups)", cliff)
    return Judged(cand, reading, "ok", "", cliff)


def cap_for(j: Judged) -> Optional[tuple]:
    """For a reading just past the VGPR cliff: (its config with ``waves_per_eu`` at the
    waves per SIMD that the saving reaches, the first three model terms it would have if
    the compiler got there); None where there is no such cap, or no new one."""
    from ..occupancy.amd import vgpr_waves

    if j.kind != "cliff" or j.cliff.get("resource") != "registers":
        return None
    rec, cfg = j.row.record, j.config
    t = get_target(rec.target)
    waves = vgpr_waves(t, rec.registers - j.cliff["save_to_gain"], rec.wave_size or
                       t.wave_size)
    if waves > t.max_waves_per_simd or (cfg.waves_per_eu or 0) >= waves:
        return None
    blocks = j.cliff["blocks_after"]
    per_wg = -(-rec.threads // (rec.wave_size or t.wave_size))
    per_simd = min(waves, -(-blocks * per_wg // t.simds_per_unit))
    return (cfg.replace(waves_per_eu=waves),
            (min(per_simd, WAVES_WANTED), blocks * cfg.BLOCK_M * cfg.BLOCK_N, cfg.BLOCK_M))


# -- the model ---------------------------------------------------------------------------------

#: The model's terms in order: (name, how a loss on it is said).
TERMS = ("waves per SIMD (up to 2)", "resident score elements per CU",
         "BLOCK_M (K/V reuse)", "loop instructions per matrix instruction",
         "knobs moved from the start")


def model_key(j: Judged) -> tuple:
    """The model's terms for one eligible reading, each larger-is-better. Instructions
    per matrix instruction are rounded to a whole number: closer counts are one
    schedule's noise, not a difference in work."""
    occ, cfg = j.row.occ, j.config
    per = j.reading.per_matrix()
    return (min(occ.waves_per_simd or 0, WAVES_WANTED),
            occ.active_blocks * cfg.BLOCK_M * cfg.BLOCK_N, cfg.BLOCK_M,
            -(round(per) if per != float("inf") else per), -j.candidate.knobs)


def _lost_on(a: tuple, b: tuple) -> str:
    """Why key ``a`` ranks below key ``b``: the first term that differs, both values."""
    for name, x, y in zip(TERMS, a, b):
        if x != y:
            if name.startswith(("loop", "knobs")):
                x, y = -x, -y
            return f"outranked on {name}: {x:g} against {y:g}"
    return "outranked: the same readings, later in order"


def _fallback_key(j: Judged) -> tuple:
    """The least bad reading when none is eligible: it launches, then fewest spills and
    scratch, then the least repeated matrix work, then the model's terms."""
    rec, occ = j.row.record, j.row.occ
    if rec is None or occ is None or not occ.active_blocks:
        return (0, 0, 0, ())
    return (1, -(j.row.spills + (rec.local_bytes or 0)), -(j.reading.repeat or 1),
            model_key(j))


@dataclass
class Round:
    """One round of a search: its start and every candidate judged."""

    start: TritonFwdConfig
    judged: list
    pick: Judged
    clean: bool  # the pick is eligible (spill-free, cliff-safe), not the least bad

    def as_dict(self) -> dict:
        return {"start": self.start.label, "pick": self.pick.config.label,
                "clean": self.clean, "candidates": [j.as_dict() for j in self.judged]}


def choose(start: TritonFwdConfig, judged: list) -> Round:
    """The best of ``judged`` by the model (module docstring, 4), ties to the earlier
    candidate; every eligible loser gets the term it lost on. Pure."""
    ok = [j for j in judged if j.eligible]
    if ok:
        best = max(ok, key=model_key)  # max keeps the first of equals
        top = model_key(best)
        for j in ok:
            j.outranked = "" if j is best else _lost_on(model_key(j), top)
        return Round(start, judged, best, True)
    best = max(judged, key=_fallback_key)
    return Round(start, judged, best, False)


# -- the search --------------------------------------------------------------------------------

@dataclass
class Choice:
    """The outcome for one cell: the start, the chosen config, every round, whether the
    last round's start won (converged) and whether the choice is clean."""

    cell: Cell
    start: TritonFwdConfig
    rounds: list
    converged: bool
    seed: Optional[Cell] = None  #: the relative whose choice was kept, read again here

    @property
    def last(self) -> Round:
        return self.rounds[-1]

    @property
    def chosen(self) -> Judged:
        return self.last.pick

    @property
    def clean(self) -> bool:
        return self.last.clean

    @property
    def read(self) -> int:
        return len({j.config for r in self.rounds for j in r.judged})

    def neighbours(self) -> list:
        """The last round's candidates other than the chosen one, with their verdicts."""
        return [j for j in self.last.judged if j.config != self.chosen.config]

    def verdicts(self) -> list:
        """The last round as a person reads it: its start first (``role`` "default"),
        then every other candidate ("neighbour"), each with its readings and one
        sentence of verdict (``verdict``) and its ``kind`` (ok, failed, spills,
        no-launch, cliff)."""
        start, pick = self.last.start, self.chosen
        eligible = sum(j.eligible for j in self.last.judged)
        out = []
        for j in self.last.judged:
            d = j.as_dict()
            if self.seed is not None:
                verdict = (f"kept: the choice of {self.seed.name}, spill-free and "
                           "cliff-safe here too (its neighbours not read)")
            elif j.config == start:
                if pick.config == start:
                    verdict = (f"kept: best by the model of the {eligible} spill-free, "
                               "cliff-safe configs here" if self.clean else
                               "kept as the least bad: no config here is spill-free and "
                               "cliff-safe")
                else:
                    verdict = (f"{j.why or j.outranked}; {pick.candidate.move} "
                               f"({pick.config.label}) beats it")
            elif j is pick:
                verdict = ("chosen: best by the model" if self.clean
                           else "chosen as the least bad")
            else:
                verdict = j.why or j.outranked
            out.append({"role": "default" if j.config == start else "neighbour",
                        "move": j.candidate.move, "config": j.config.label,
                        "kind": j.kind, "verdict": verdict, "vgprs": d["vgprs"],
                        "spills": d["spills"], "waves_per_simd": d["waves_per_simd"],
                        "workgroups": d["workgroups"], "occupancy": d["occupancy"]})
        return out

    def as_dict(self) -> dict:
        c = self.chosen
        return {"cell": self.cell.name, "target": self.cell.target, "dtype": self.cell.dtype,
                "head_dim": self.cell.head_dim, "causal": self.cell.causal,
                "start": self.start.label, "chosen": c.config.label,
                "chosen_fields": c.config.as_dict(), "clean": self.clean,
                "seed": None if self.seed is None else self.seed.name,
                "converged": self.converged, "read": self.read,
                "reading": c.as_dict(), "verdicts": self.verdicts(),
                "rounds": [r.as_dict() for r in self.rounds]}


def search(cell: Cell, start: TritonFwdConfig, read: Callable, *,
           max_rounds: int = MAX_ROUNDS, seed: Optional[Cell] = None) -> Choice:
    """Rounds of :func:`choose` from ``start`` (module docstring, 5). ``read(cell,
    configs)`` returns one :class:`Reading` per config (:func:`offline_reader`); every
    config is read once. A cap (:func:`cap_for`) is read only where the terms it
    promises beat the round's best eligible reading so far. With ``seed`` (``start`` is
    that cell's choice) the start alone is read first and kept when eligible (module
    docstring, 6)."""
    readings = {}

    def judged_of(cands):
        need = [c.config for c in cands if c.config not in readings]
        if need:
            readings.update(zip(need, read(cell, need)))
        return [judge(c, readings[c.config]) for c in cands]

    if seed is not None:
        (alone,) = judged_of([Candidate("start", start, 0)])
        if alone.eligible:
            return Choice(cell, start, [Round(start, [alone], alone, True)], True, seed)

    rounds, here = [], start
    for _ in range(max_rounds):
        cands = candidates(here, cell)
        judged = judged_of(cands)
        best = max((model_key(j)[:3] for j in judged if j.eligible), default=None)
        have = {c.config for c in cands}
        capped = []
        for j in judged:
            cap = cap_for(j)
            if cap is None or cap[0] in have or (best is not None and cap[1] <= best):
                continue
            have.add(cap[0])
            move = f"waves-per-eu{cap[0].waves_per_eu}"
            capped.append(Candidate(move if j.candidate.move == "start"
                                    else f"{j.candidate.move}+{move}", cap[0],
                                    j.candidate.knobs + 1))
        judged += judged_of(capped)
        rnd = choose(here, judged)
        rounds.append(rnd)
        if rnd.pick.config == here:
            return Choice(cell, start, rounds, True)
        here = rnd.pick.config
    return Choice(cell, start, rounds, False)


def offline_reader(jobs: int = 2, progress: Optional[Callable] = None) -> Callable:
    """``read(cell, configs)``: compile (cached) and read each config for the cell with
    :func:`flashscope.isa.inspect_pairs` in ``jobs`` processes, and count the loops of
    its assembly; a :class:`Reading` per config."""
    from pathlib import Path

    from ..compile import load_cached
    from ..isa import inspect_pairs
    from ..report.collect import Row, measure_row

    def read(cell: Cell, configs: list) -> list:
        recs = inspect_pairs([(c, cell.target) for c in configs], jobs=jobs,
                             occupancy=False, progress=progress, head_dim=cell.head_dim,
                             dtype=cell.dtype, causal=cell.causal)
        out = []
        for c, rec in zip(configs, recs):
            row = Row(c, cell.head_dim, cell.target)
            reading = Reading(row)
            if measure_row(row, rec) and rec.source:
                art = load_cached(Path(rec.source).name)
                if art is not None:
                    (reading.loop_instructions, reading.loop_matrix,
                     reading.repeat) = loop_counts(art.asm, rec.kernel, c, cell.head_dim)
            out.append(reading)
        return out

    return read


def current_default(cell: Cell, data_dir=None) -> TritonFwdConfig:
    """What the portable forward runs for the cell today: its tuned entry or rule."""
    from ..families import triton_fwd

    return default_config(cell.problem, triton_fwd, data_dir)


def choose_cells(todo: list, read: Callable, *, data_dir=None,
                 max_rounds: int = MAX_ROUNDS, seeded: bool = True,
                 log: Optional[Callable] = None) -> list:
    """A :class:`Choice` per cell, in order; with ``seeded`` a cell whose
    :func:`seed_cell` was decided earlier in ``todo`` keeps that choice where it reads
    spill-free and cliff-safe, else searches from it (module docstring, 6); the others
    search from the current default."""
    done = {}
    out = []
    for cell in todo:
        seed = seed_cell(cell) if seeded else None
        seed = seed if seed in done else None
        start = done[seed].chosen.config if seed else current_default(cell, data_dir)
        ch = search(cell, start, read, max_rounds=max_rounds, seed=seed)
        done[cell] = ch
        out.append(ch)
        if log is not None:
            log(ch)
    return out


__all__ = ["AMD_TARGETS", "Candidate", "Cell", "Choice", "DTYPES", "HEAD_DIMS", "Judged",
           "MAX_ROUNDS", "PAIRS", "Round", "TERMS", "WAVES_WANTED", "candidates", "cap_for",
           "cells", "choose", "choose_cells", "current_default", "judge",
           "model_key", "offline_reader", "search", "seed_cell"]
