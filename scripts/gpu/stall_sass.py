"""Where the warps of one attention kernel wait, instruction by instruction: Nsight
Compute's warp-state sampling (SourceCounters, WarpStateStats) for each provider or
flashscope config on one shape, kept as ncu's CSV pages (and reports with
``--keep-reports``).

For each NAME=SPEC, SPEC being ``cudnn``, ``fa4`` or a flashscope config ``K=V,...``, a
child process runs the forward once to warm up, then three times inside a profiler range
(``--profile-from-start off``), and ncu records the third launch there. Writes
OUTDIR/NAME_source.csv (per SASS instruction: executions and stall samples by reason) and
OUTDIR/NAME_details.csv, then prints each kernel's stall reasons and top stalled
instructions.

``--metrics`` adds raw ncu metrics (pipe activity, issue slots, eligible warps: the
defaults in METRICS) to the same launch and prints them, and the instruction mix (warp
instructions executed per opcode, from the source page) is printed beside the stalls.

With two runs or more, the opcodes whose executed counts differ most between the first
run and each other one follow. ``--diff A B`` prints that table offline from two recorded
source pages (``NAME_source.csv``, or the same gzipped).

Usage: PYTHONPATH=src python scripts/gpu/stall_sass.py OUTDIR --shape 4,16,4096,128
       [--causal] --runs "g=GLUON=1,...;cudnn=cudnn;fa4=fa4" [--ncu ncu]
       [--metrics default|NAME,NAME,...]
       PYTHONPATH=src python scripts/gpu/stall_sass.py --diff A_source.csv.gz B_source.csv
"""

import argparse
import csv
import gzip
import io
import os
import subprocess
import sys

from flashscope.profile.ncu_csv import ParseError, parse_number

_TOTAL = "Warp Stall Sampling (All Samples)"
_EXECUTED = "Instructions Executed"

#: (short name, ncu metric): what binds a loop that shares the SM between the tensor
#: pipe, MUFU (the XU pipe) and the FMA/ALU pipes, and how often a scheduler issues.
METRICS = (
    ("tensor%", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("xu%", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("fma%", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("alu%", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
    ("issue%", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("eligible", "smsp__warps_eligible.avg.per_cycle_active"),
    ("GHz", "sm__cycles_elapsed.avg.per_second"),
    ("us", "gpu__time_duration.sum"),
)

CHILD = r"""
import sys, torch
B, H, N, D = map(int, sys.argv[1].split(","))
causal, spec = sys.argv[2] == "1", sys.argv[3]
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if spec == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
elif spec == "fa4":
    from flash_attn.cute import flash_attn_func
    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    def run():
        flash_attn_func(qf, kf, vf, causal=causal)
else:
    import flashscope
    cfg = flashscope.AttentionConfig.parse(spec)
    def run():
        flashscope.attention(q, k, v, is_causal=causal, config=cfg)
run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for _ in range(3):
    run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""


def source_rows(source_csv: str) -> list:
    """The rows of ncu's ``--page source`` CSV (one per SASS instruction), from the
    ``"Address"`` header on; [] when the page has none or no warp-stall samples."""
    lines = source_csv.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"Address"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    return rows if rows and _TOTAL in rows[0] else []


def _count(row, key) -> float:
    return parse_number(row[key], f"{row.get('Address', '?')} {key}") or 0.0


def _reasons(rows) -> list:
    return [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]


def by_reason(rows) -> list:
    """(share of all samples, reason) over the whole kernel, largest first."""
    if not rows:
        return []
    total = sum(_count(r, _TOTAL) for r in rows) or 1.0
    return sorted(((sum(_count(r, k) for r in rows) / total, k) for k in _reasons(rows)),
                  reverse=True)


def top(rows, n: int = 12) -> list:
    """The n instructions with the most warp-stall samples: (share of all samples,
    address, SASS, the three largest stall reasons with their sample counts)."""
    if not rows:
        return []
    reasons = _reasons(rows)
    total = sum(_count(r, _TOTAL) for r in rows) or 1.0
    out = []
    for r in sorted(rows, key=lambda r: -_count(r, _TOTAL))[:n]:
        why = sorted(((_count(r, k), k) for k in reasons), reverse=True)[:3]
        out.append((_count(r, _TOTAL) / total, r.get("Address", ""),
                    r.get("Source", "")[:60], [(k, int(v)) for v, k in why if v]))
    return out


def metric_values(details_csv: str, names) -> dict:
    """{metric: value as printed} for the requested metrics in ncu's details page CSV."""
    rows = csv.DictReader(io.StringIO(details_csv))
    want = set(names)
    return {r["Metric Name"]: r["Metric Value"] for r in rows
            if r.get("Metric Name") in want}


def opcode_mix(rows) -> list:
    """(warp instructions executed, opcode) summed over the source page, largest first.
    The opcode is the mnemonic without its predicate, cut at the first dot (FADD.FTZ ->
    FADD), except MUFU and HGMMA, kept whole (MUFU.EX2, HGMMA.64x128x16.F32.BF16)."""
    if not rows or _EXECUTED not in rows[0]:
        return []
    mix = {}
    for r in rows:
        words = r.get("Source", "").replace("{", " ").split()
        words = [w for w in words if not w.startswith("@")]
        if not words:
            continue
        op = words[0] if words[0].startswith(("MUFU", "HGMMA")) else words[0].split(".")[0]
        mix[op] = mix.get(op, 0.0) + _count(r, _EXECUTED)
    return sorted(((v, k) for k, v in mix.items()), reverse=True)


def opcode_diff(mix_a, mix_b, n: int = 16) -> list:
    """The n opcodes whose executed counts differ most between two :func:`opcode_mix`
    lists: (opcode, count in a, count in b, a - b), largest absolute difference first."""
    a = {k: v for v, k in mix_a}
    b = {k: v for v, k in mix_b}
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0), a.get(k, 0.0) - b.get(k, 0.0))
            for k in set(a) | set(b)]
    return sorted(rows, key=lambda r: (-abs(r[3]), r[0]))[:n]


def print_diff(name_a, mix_a, name_b, mix_b, n: int = 16) -> None:
    ta, tb = sum(v for v, _ in mix_a), sum(v for v, _ in mix_b)
    print(f"== opcodes, {name_a} against {name_b} (millions of warp instructions): "
          f"{ta / 1e6:.1f} / {tb / 1e6:.1f} ({(ta - tb) / 1e6:+.1f})")
    for op, x, y, d in opcode_diff(mix_a, mix_b, n):
        print(f"  {op:<28} {x / 1e6:9.1f} {y / 1e6:9.1f} {d / 1e6:+9.1f}")


def read_source(path: str) -> list:
    """:func:`source_rows` of a recorded source page, plain or gzipped; a page without
    per-instruction rows is refused by name."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            rows = source_rows(f.read())
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SystemExit(f"--diff: cannot read {path}: {e}")
    if not rows or _EXECUTED not in rows[0]:
        raise SystemExit(f"--diff: {path} is not an ncu source page with "
                         f"'{_EXECUTED}' per instruction")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"),
                    help="offline: opcode counts of two recorded source pages, A - B")
    ap.add_argument("--shape", default="4,16,4096,128")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--metrics", default="",
                    help="'default' (the METRICS table) or comma-separated ncu metrics")
    ap.add_argument("--keep-reports", action="store_true",
                    help="keep the .ncu-rep files (default: only the CSV pages)")
    a = ap.parse_args()
    if a.diff:
        try:
            mixes = [opcode_mix(read_source(p)) for p in a.diff]
        except ParseError as e:  # a count that is not a number: its address and column
            raise SystemExit(f"--diff: {e}")
        print_diff(a.diff[0], mixes[0], a.diff[1], mixes[1])
        return
    if not a.outdir or not a.runs:
        ap.error("OUTDIR and --runs are required (or --diff A B)")
    os.makedirs(a.outdir, exist_ok=True)
    mixes = []
    metrics = ([m for _, m in METRICS] if a.metrics == "default"
               else [m for m in a.metrics.split(",") if m])
    short = {m: n for n, m in METRICS}
    child = os.path.join(a.outdir, "_child.py")
    with open(child, "w") as f:
        f.write(CHILD)
    for item in a.runs.split(";"):
        name, spec = item.split("=", 1)
        rep = os.path.join(a.outdir, name)
        cmd = [a.ncu, "--clock-control", "none", "--profile-from-start", "off",
               "--section", "WarpStateStats", "--section", "SourceCounters",
               "--section", "SpeedOfLight",
               *(["--metrics", ",".join(metrics)] if metrics else []),
               "--launch-skip", "2", "--launch-count", "1", "-f", "-o", rep,
               sys.executable, child, a.shape, str(int(a.causal)), spec]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
            print(f"{name}: ncu failed ({p.returncode}): {p.stderr[-600:]}{p.stdout[-600:]}")
            continue
        pages = {}
        for page, extra in (("source", ["--print-source", "sass"]), ("details", [])):
            q = subprocess.run([a.ncu, "-i", rep + ".ncu-rep", "--page", page, "--csv",
                                *extra], capture_output=True, text=True)
            pages[page] = q.stdout
            with open(f"{rep}_{page}.csv", "w") as f:
                f.write(q.stdout)
        if not a.keep_reports:
            os.remove(rep + ".ncu-rep")
        rows = source_rows(pages["source"])
        print(f"== {name} ({spec})")
        print("  by reason:", ", ".join(f"{k} {v:.1%}" for v, k in by_reason(rows)[:8]))
        if metrics:
            got = metric_values(pages["details"], metrics)
            print("  metrics:", ", ".join(f"{short.get(m, m)} {got.get(m, '-')}"
                                          for m in metrics))
        mix = opcode_mix(rows)
        if mix:
            mixes.append((name, mix))
            total = sum(v for v, _ in mix)
            print(f"  instructions {total:.4g}:", ", ".join(f"{k} {v / total:.1%}"
                                                        for v, k in mix[:14]))
        for share, addr, sass, why in top(rows):
            print(f"  {share:6.1%} {addr:>8} {sass:<60} {why}")
    for name, mix in mixes[1:]:
        print_diff(mixes[0][0], mixes[0][1], name, mix)


if __name__ == "__main__":
    main()
