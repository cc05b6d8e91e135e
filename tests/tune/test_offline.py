"""The offline choice of AMD defaults (flashscope.tune.offline) on readings made up here,
no compiler: what is rejected and why, what the model ranks first, the rounds, the caps,
the entries written, the command and the report's section."""

import json

import pytest

from flashscope.cli import main
from flashscope.families import triton_fwd
from flashscope.families.triton_fwd import TritonFwdConfig as C
from flashscope.isa import KernelRecord
from flashscope.isa.amd import loops
from flashscope.report.collect import Row, measure_row
from flashscope.targets import get_target
from flashscope.tune import offline, offline_data
from flashscope.tune.offline import Candidate, Cell, Reading
from flashscope.tuned import load_tuned, lookup, make_entry, write_entries

CELL = Cell("gfx942", "bfloat16", 128, False)


def record(cfg, target="gfx942", vgprs=128, spills=0, scratch=0, lds=None, instr=2000,
           mma=64):
    t = get_target(target)
    lds = 2 * cfg.BLOCK_N * 128 * 2 * max(1, cfg.num_stages - 1) if lds is None else lds
    return KernelRecord(kernel="_attn_fwd", target=t.name, vendor="amd", registers=vgprs,
                        agprs=0, sgprs=40, vgpr_spills=spills, sgpr_spills=0,
                        local_bytes=scratch, shared_bytes=lds,
                        threads=cfg.num_warps * t.wave_size, num_warps=cfg.num_warps,
                        wave_size=t.wave_size, instructions=instr,
                        mix={"mfma": mma, "wmma": 0})


def reading(cfg, **kw):
    rec = kw.pop("record", None) or record(cfg, **kw)
    row = Row(cfg, 128, rec.target)
    measure_row(row, rec)
    return Reading(row)


def model_vgprs(cfg, target="gfx942") -> tuple:
    """A made-up register demand: the score tile, the output accumulator and Q per lane
    (fp32, 64 lanes), 40 for the rest; a ``waves_per_eu`` cap below it spills the
    difference. Returns (VGPRs, spills)."""
    t = get_target(target)
    lanes = cfg.num_warps * t.wave_size
    need = 40 + (2 * cfg.BLOCK_M * cfg.BLOCK_N + cfg.BLOCK_M * 128
                 + (cfg.BLOCK_M * 64 if cfg.Q_IN_REGS else 0)) // lanes
    cap = t.max_vgprs_per_wave
    if cfg.waves_per_eu:
        cap = min(cap, t.vgprs_per_simd_lane // cfg.waves_per_eu // 8 * 8)
    return min(need, cap), max(0, need - cap)


def made_up_reader(log=None):
    def read(cell, configs):
        if log is not None:
            log.extend(configs)
        out = []
        for c in configs:
            v, s = model_vgprs(c, cell.target)
            out.append(reading(c, target=cell.target, vgprs=v, spills=s,
                               scratch=4 * s, instr=1000 + c.BLOCK_M * c.BLOCK_N // 8))
        return out
    return read


# -- one reading ---------------------------------------------------------------------------------

def test_spills_scratch_and_cliffs_are_rejected_with_their_numbers():
    cfg = C(128, 64, 4, 2)
    spilled = offline.judge(Candidate("start", cfg, 0), reading(cfg, vgprs=256, spills=18,
                                                                 scratch=72))
    assert (spilled.kind, spilled.why) == ("spills", "spills 18 VGPRs (72 B of scratch)")
    scratch = offline.judge(Candidate("start", cfg, 0), reading(cfg, scratch=16))
    assert scratch.kind == "spills" and "16 B of scratch" in scratch.why
    # gfx942, a 4-wave workgroup: 260 VGPRs hold 1 wave per SIMD; 256 would hold 2
    past = offline.judge(Candidate("start", cfg, 0), reading(cfg, vgprs=260))
    assert past.kind == "cliff"
    assert past.why == "past the VGPR cliff by 4 VGPRs (4 fewer give 1 -> 2 workgroups)"
    # 200 VGPRs: 2 waves, 32 above the 168 that would give 3: not "just past"
    fine = offline.judge(Candidate("start", cfg, 0), reading(cfg, vgprs=200, lds=16384))
    assert fine.eligible and fine.cliff["save_to_gain"] == 32
    assert fine.cliff["room_before_loss"] == 56
    failed = offline.judge(Candidate("start", cfg, 0), Reading(Row(cfg, 128, "gfx942",
                                                                   error="LDS over")))
    assert failed.kind == "failed" and "LDS over" in failed.why


def test_matrix_multiply_adds_from_mnemonics_and_repeated_work_rejected():
    assert offline.matrix_macs("v_mfma_f32_32x32x8_bf16") == 8192
    assert offline.matrix_macs("v_mfma_f32_32x32x8bf16_1k") == 8192
    assert offline.matrix_macs("v_wmma_f32_16x16x16_bf16") == 4096
    assert offline.matrix_macs("v_mfma_f32_32x32x4_2b_f16") == 8192
    assert offline.matrix_macs("v_add_f32") == 0
    cfg = C(128, 64, 8, 2)
    r = reading(cfg, vgprs=200, lds=16384)
    r.repeat = 1.5
    j = offline.judge(Candidate("start", cfg, 0), r)
    assert j.kind == "repeats" and j.why == (
        "its waves repeat each other's matrix work: the loop issues 1.5x the "
        "multiply-adds of the 128x64 tile")
    r.repeat = 1.0
    assert offline.judge(Candidate("start", cfg, 0), r).eligible


def test_the_cap_aims_under_the_cliff_it_missed():
    cfg = C(128, 64, 4, 2)
    past = offline.judge(Candidate("start", cfg, 0), reading(cfg, vgprs=260))
    capped, promise = offline.cap_for(past)
    assert capped == cfg.replace(waves_per_eu=2) and promise == (2, 2 * 128 * 64, 128)
    assert offline.cap_for(offline.judge(Candidate("s", capped, 1),
                                         reading(capped, vgprs=260))) is None  # already
    fine = offline.judge(Candidate("start", cfg, 0), reading(cfg, vgprs=200, lds=16384))
    assert offline.cap_for(fine) is None


# -- the model ------------------------------------------------------------------------------------

def test_the_model_ranks_waves_then_resident_work_then_block_m():
    a = C(128, 64, 4, 2)  # 200 VGPRs: 2 waves, 2 workgroups: 16384 resident
    b = C(64, 64, 4, 2)  # 120 VGPRs: 4 waves, 4 workgroups: 16384, smaller BLOCK_M
    c = C(64, 32, 4, 2)  # 150 VGPRs: 3 waves, 3 workgroups: 6144
    d = C(128, 128, 4, 2)  # 300 VGPRs: 1 wave
    js = [offline.judge(Candidate(m, cfg, 1), reading(cfg, vgprs=v, lds=8192))
          for m, cfg, v in (("a", a, 200), ("b", b, 120), ("c", c, 150), ("d", d, 300))]
    assert all(j.eligible for j in js)
    rnd = offline.choose(a, js)
    assert rnd.pick.config == a and rnd.clean
    by = {j.candidate.move: j.outranked for j in js}
    assert by["a"] == ""
    assert by["b"] == "outranked on BLOCK_M (K/V reuse): 64 against 128"
    assert by["c"] == "outranked on resident score elements per CU: 6144 against 16384"
    assert by["d"] == "outranked on waves per SIMD (up to 2): 1 against 2"


def test_ties_keep_the_start_and_instructions_count_in_whole_numbers():
    a, q = C(128, 64, 4, 2), C(128, 64, 4, 2, Q_IN_REGS=False)
    start = offline.judge(Candidate("start", a, 0), reading(a, vgprs=200, instr=2000))
    close = offline.judge(Candidate("q", q, 1), reading(q, vgprs=200, instr=1990))
    assert offline.choose(a, [start, close]).pick is start  # 31.25 and 31.1: both 31
    assert close.outranked == "outranked on knobs moved from the start: 1 against 0"
    lean = offline.judge(Candidate("q", q, 1), reading(q, vgprs=200, instr=1900))
    assert offline.choose(a, [start, lean]).pick is lean
    assert start.outranked == ("outranked on loop instructions per matrix instruction: "
                               "31 against 30")


def test_loop_counts_read_the_loops_of_the_assembly():
    mfma = "v_mfma_f32_32x32x8_bf16"
    text = "\n".join(["_attn_fwd:", "\ts_mov_b32 s0, 0", ".LBB0_1:", f"\t{mfma} v0",
                      "\tv_add_f32 v1", ".Ltmp3:", f"\t{mfma} v2",
                      "\ts_cbranch_scc1 .LBB0_1", "\ts_endpgm", ".Lfunc_end0:",
                      "other:", ".LBB1_0:", "\ts_branch .LBB1_0"])
    assert loops(text, "_attn_fwd") == [[mfma, "v_add_f32", mfma, "s_cbranch_scc1"]]
    # two 32x32x8 per wave, 2 waves: 32768 multiply-adds; a 32x16 tile at D = 16 needs
    # 2 x 32 x 16 x 16 = 16384 per iteration: each wave repeats the other's
    assert offline.loop_counts(text, "_attn_fwd", C(32, 16, 2, 1), 16) == (4, 2, 2.0)
    assert offline.loop_counts(text, "_attn_fwd", C(32, 16, 1, 1), 16) == (4, 2, 1.0)
    assert offline.loop_counts("k:\n\ts_endpgm", "k", C(), 64) == (0, 0, None)
    r = reading(C(), instr=900, mma=30)
    r.loop_instructions, r.loop_matrix = 4, 2
    assert r.per_matrix() == 2 and Reading(r.row).per_matrix() == 30


# -- the search ------------------------------------------------------------------------------------

def test_candidates_are_one_knob_and_paired_moves_within_the_rules():
    start = C(128, 64, 8, 2)
    cands = offline.candidates(start, CELL)
    assert cands[0] == Candidate("start", start, 0)
    assert len({c.config for c in cands}) == len(cands) <= 30
    for c in cands:
        triton_fwd.check(c.config, "gfx942", 128)
        moved = {k for k, v in c.config.as_dict().items() if getattr(start, k) != v}
        assert len(moved) == c.knobs
        if c.knobs == 2:
            assert moved in ({"BLOCK_M", "num_warps"}, {"BLOCK_N", "num_warps"},
                             {"BLOCK_M", "BLOCK_N"}, {"BLOCK_M", "Q_IN_REGS"},
                             {"BLOCK_N", "Q_IN_REGS"}, {"num_warps", "Q_IN_REGS"})
    pairs = {c.move for c in cands if c.knobs == 2}
    assert "block-m256+num-warps16" in pairs and "block-m64+num-warps4" in pairs
    assert "block-m64+block-n128" in pairs and "block-m64+num-warps16" not in pairs
    assert "num-warps16+q-in-regs0" in pairs and "block-m64+q-in-regs0" in pairs
    assert "maxnreg" not in " ".join(c.move for c in cands)  # an NVIDIA knob: refused


def test_search_walks_to_a_spill_free_cliff_safe_config_that_beats_its_neighbours():
    seen = []
    start = C(128, 128, 4, 2, waves_per_eu=2)  # needs 264; 512 / 2 caps it at 256
    assert model_vgprs(start) == (256, 8)
    ch = offline.search(CELL, start, made_up_reader(seen))
    assert ch.converged and ch.clean and len(ch.rounds) >= 2
    assert len(seen) == len(set(seen)) == ch.read  # every config read once
    best = ch.chosen
    assert best.eligible and best.row.spills == 0 and not best.cliff["near"]
    assert ch.last.start == best.config  # it is best among its own neighbours
    for j in ch.neighbours():
        assert j.why or j.outranked
        assert j.kind != "ok" or offline.model_key(j) <= offline.model_key(best)
    first = ch.verdicts()[0]
    assert first["role"] == "default" and first["verdict"].startswith("kept: best")
    assert [v["role"] for v in ch.verdicts()].count("default") == 1
    assert "spills" in ch.rounds[0].judged[0].why  # the start was rejected


def test_nothing_clean_gives_the_least_bad_and_says_so():
    def read(cell, configs):
        return [reading(c, vgprs=256, spills=8 + c.BLOCK_M // 16) for c in configs]

    ch = offline.search(CELL, C(128, 64, 8, 2), read)
    assert not ch.clean and ch.chosen.row.spills == min(
        j.row.spills for j in ch.last.judged)
    assert ch.converged and ch.chosen.config.BLOCK_M == 16
    src = offline_data.source_text(ch, "3.6.0")
    assert f"{ch.chosen.row.spills} spilled registers" in src and "least bad" in src
    written, notes = offline_data.planned_entries([ch], "3.6.0")
    (entry, *_), = written.values()
    assert entry["source"] == src and notes == []
    short = offline.search(CELL, C(128, 64, 8, 2), read, max_rounds=1)
    assert offline_data.planned_entries([short], "3.6.0") == (
        {}, ["gfx942 D128 bf16 full: nothing written (not settled in 1 round)"])


def test_cells_order_and_seeds():
    cs = offline.cells(["gfx1100"], (96, 128, 80, 64), ("bfloat16", "float16"))
    assert [c.head_dim for c in cs[::4]] == [64, 128, 80, 96]
    assert cs[0] == Cell("gfx1100", "bfloat16", 64, False)
    assert offline.seed_cell(cs[0]) is None
    assert offline.seed_cell(Cell("gfx1100", "float16", 80, True)) == Cell(
        "gfx1100", "bfloat16", 80, False)
    assert offline.seed_cell(Cell("gfx1100", "bfloat16", 80, False)) == Cell(
        "gfx1100", "bfloat16", 128, False)
    with pytest.raises(Exception, match="AMD targets"):
        offline.cells(["sm90"])


def test_choose_cells_starts_relatives_from_the_choice_of_their_seed():
    todo = offline.cells(["gfx942"], (128, 96), ("bfloat16",), (False, True))
    starts = []
    read = made_up_reader()
    choices = offline.choose_cells(todo, lambda c, cfgs: read(c, cfgs),
                                   log=lambda ch: starts.append(ch.start))
    lead = choices[0]
    assert starts[0] == offline.current_default(todo[0])
    assert starts[1:] == [lead.chosen.config] * 3
    for ch in choices[1:]:  # kept: read alone, spill-free and cliff-safe here too
        assert ch.seed == offline.seed_cell(ch.cell) and ch.read == 1
        assert ch.chosen.config == lead.chosen.config
        assert ch.verdicts()[0]["verdict"].startswith(f"kept: the choice of {ch.seed.name}")
    rows = offline_data.rule_rows(choices)
    assert rows == [("gfx942", 128, None, lead.chosen.config),
                    ("gfx942", 96, None, lead.chosen.config)]


def test_a_relative_searches_where_the_seeds_choice_spills_there():
    lead, rel = Cell("gfx942", "bfloat16", 128, False), Cell("gfx942", "float16", 128, False)
    base = made_up_reader()

    def read(cell, configs):  # fp16 needs 60 more VGPRs than bf16 in this made-up model
        out = base(cell, configs)
        if cell.dtype == "float16":
            out = [reading(r.row.config, vgprs=min(256, r.row.record.registers + 60),
                           spills=max(0, r.row.record.registers + 60 - 256))
                   for r in out]
        return out

    first, second = offline.choose_cells([lead, rel], read)
    assert second.seed is None and second.start == first.chosen.config
    assert second.read > 1 and second.clean and second.chosen.row.spills == 0
    assert second.rounds[0].judged[0].kind in ("spills", "cliff")


# -- what is written -------------------------------------------------------------------------------

def test_entries_only_where_the_rule_differs_and_never_over_a_measurement(tmp_path):
    read = made_up_reader()
    todo = [Cell("gfx942", "bfloat16", 128, False), Cell("gfx942", "float16", 128, True)]
    choices = offline.choose_cells(todo, read, data_dir=tmp_path)
    for ch in choices:
        assert offline_data.differs(ch)
    measured = make_entry(C(64, 64, 4, 1), "float16", 128, True, "le4k", ms=1.0,
                          search="ab", source="an A/B on an MI300X")
    write_entries("gfx942", [measured], tmp_path)
    paths, notes = offline_data.write(choices, "3.6.0", tmp_path)
    assert [p.name for p in paths] == ["gfx942.json"]
    assert notes == ["gfx942 D128 fp16 causal: kept the measured entry (le4k)"]
    have = load_tuned("gfx942", tmp_path)
    offline_entries = [e for _, e in have.values() if e.get("search") == "offline"]
    assert len(offline_entries) == 4  # every length class of the one cell written
    src = offline_entries[0]["source"]
    assert src.startswith("flashscope tune offline (Triton 3.6.0, no GPU timed): ")
    assert "no spills or scratch" in src and "waves/SIMD" in src
    from flashscope.families import Problem

    cfg, tuned, _ = lookup(Problem("gfx942", "bfloat16", 128, False, 4096, 4096),
                           "triton-fwd", tmp_path)
    assert tuned and cfg == choices[0].chosen.config
    # a second run over the written file: the same choice, the same entries
    again = offline.choose_cells(todo[:1], read, data_dir=tmp_path, seeded=False)
    assert again[0].start == cfg and again[0].rounds[0].pick.config == cfg


def test_shipped_offline_entries_state_their_readings():
    """Every offline entry in the package's AMD files says what was read (the Triton
    version, VGPRs, waves; no spills unless it is only the least bad) and none repeats
    the rule."""
    from flashscope.families import Problem

    for t in offline.AMD_TARGETS:
        for key, (cfg, e) in load_tuned(t).items():
            if e.get("search") != "offline":
                continue
            src = e["source"]
            assert src.startswith("flashscope tune offline (Triton ")
            assert " VGPRs, " in src and "waves/SIMD" in src
            assert "no spills or scratch" in src or "least bad" in src
            _, dtype, d, causal, _ = key
            assert cfg != triton_fwd.select(Problem(t, dtype, d, causal))


# -- the command and the report ------------------------------------------------------------------

@pytest.fixture
def fake_reader(monkeypatch):
    monkeypatch.setattr(offline, "offline_reader", lambda jobs=2, progress=None:
                        made_up_reader())


def test_command_json_and_write(fake_reader, tmp_path, capsys):
    argv = ["tune", "offline", "--target", "gfx942", "--head-dim", "128", "--dtype", "bf16",
            "--causal", "no", "--tuned", str(tmp_path), "--write", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    (ch,) = doc["choices"]
    assert ch["clean"] and ch["converged"] and ch["reading"]["spills"] == 0
    assert doc["written"] == [str(tmp_path / "gfx942.json")]
    assert doc["rule_rows"][0]["config"] == ch["chosen"]
    assert {v["role"] for v in ch["verdicts"]} == {"default", "neighbour"}


@pytest.mark.parametrize("argv, needle", [
    (["--target", "sm90"], "AMD targets"),
    (["--head-dim", "300"], "head dim 300"),
    (["--rounds", "0"], "--rounds"),
])
def test_command_bad_input(fake_reader, capsys, argv, needle):
    assert main(["tune", "offline", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_report_section_in_terminal_json_and_html(tmp_path):
    from flashscope.report import Report, ReportSpec
    from flashscope.report.html import write_html
    from flashscope.report.render_terminal import neighbours_table
    import io

    from rich.console import Console

    from flashscope.targets import parse_targets

    start = C(128, 64, 4, 2, waves_per_eu=2)
    ch = offline.search(CELL, start, made_up_reader(), max_rounds=1)
    rep = Report(ReportSpec(tuple(parse_targets("gfx942")), (start,)), [], [], [],
                 choices=[ch])
    assert rep.as_dict()["amd_defaults"][0]["verdicts"][0]["config"] == start.label
    con = Console(file=io.StringIO(), width=100, record=True, markup=False)
    con.print(neighbours_table(rep))
    text = con.export_text()
    assert "spills" in text and ch.chosen.config.label.split()[1] in text
    html = (tmp_path / "r.html")
    write_html(rep, html, {})
    page = html.read_text()
    assert "AMD defaults and their neighbours" in page and 'class="spill"' in page
    assert "beats it" in page
