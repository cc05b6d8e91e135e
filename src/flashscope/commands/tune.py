"""``flashscope tune``: interleaved, L2-flushed A/B timing of forward configs against the
default and the peers, the one-knob and transplant search steps, the adoption rule that
writes the tuned files, and the offline tools around them (:mod:`flashscope.tune`).

On a GPU: ``ab`` (one shape), ``cells`` (many cells, one worker per GPU). Anywhere:
``adopt`` (recorded A/B results -> tuned entries), ``convert`` (a format-1 tuned file ->
format 2), ``compare-sass`` (two Nsight Compute source pages)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import FlashscopeError

HELP = "A/B-time configs, search around the tuned defaults, adopt the winners"
DESCRIPTION = """\
Interleaved, L2-flushed A/B timing of forward configs against the default and the peers,
the one-knob and transplant search steps, the adoption rule that writes the tuned files.

on a GPU:  ab (one shape), cells (many cells, one worker process per GPU)
anywhere:  adopt (A/B results -> tuned entries), convert (format-1 tuned file -> format 2),
           compare-sass (two Nsight Compute source pages)
guide:     docs/tune.md"""
VARIANTS = ("NAME=SPEC;... with SPEC +K=V,... (on the problem's default), FAMILY:K=V,... "
            "(sm90-fwd, triton-fwd), cudnn, fa4 or another bench provider; the first "
            "variant is the base of every ratio")


def register(sub) -> None:
    p = sub.add_parser("tune", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="tune_command", metavar="SUBCOMMAND")
    _ab(tsub)
    _cells(tsub)
    _adopt(tsub)
    _convert(tsub)
    _compare(tsub)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p) -> int:
    p.print_help()
    return 0


def _timing(q, rounds: int) -> None:
    q.add_argument("--dtype", default="bf16", help="bf16 or fp16 (default bf16)")
    q.add_argument("--rounds", type=int, default=rounds,
                   help=f"interleaved rounds (default {rounds})")
    q.add_argument("--reps", type=int, default=10,
                   help="timed launches per burst, after one warm-up (default 10)")
    q.add_argument("--no-flush", action="store_true",
                   help="do not evict the L2 before every launch (the default evicts it, "
                        "as the bench harness does)")
    q.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    q.add_argument("--tuned", metavar="DIR", help="tuned files to read the defaults from "
                                                  "(default: the package's)")
    q.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: Triton's interpreter, the portable kernel only (tests, tiny "
                        "shapes; never adopted)")
    q.add_argument("--json", action="store_true", help="print the result as JSON")


def _ab(tsub) -> None:
    q = tsub.add_parser("ab", help="A/B of variants on one shape (GPU)",
                        description="Validate, then time variants on one shape in "
                                    "interleaved bursts; print each one's median time, "
                                    "TFLOP/s and median (IQR) ratio to the first.")
    q.add_argument("--shape", required=True, metavar="B,H,N,D[,Nk[,Hkv]]")
    q.add_argument("--causal", action="store_true")
    q.add_argument("--variants", required=True, help=VARIANTS)
    q.add_argument("--out", metavar="DIR", help="write DIR/<cell>.json (the A/B result)")
    q.add_argument("--force", action="store_true", help="overwrite that file")
    _timing(q, 20)
    q.set_defaults(func=run_ab)


def _cells(tsub) -> None:
    q = tsub.add_parser("cells", help="A/Bs of many cells, one worker per GPU (GPU)",
                        description="For each cell: the default (d=+), --variants, "
                                    "--extra, --neighbours, --transplants and the peers, "
                                    "validated and timed in interleaved bursts; each cell "
                                    "on one GPU, the cells spread over all of them.")
    q.add_argument("--cells", required=True,
                   help="comma list of d<D><c|n><N>k (standard suite, e.g. d64c1k) or "
                        "BxHxNqxD[xNk[xHkv]]<c|n>")
    q.add_argument("--variants", default="", help="variants for every cell: " + VARIANTS)
    q.add_argument("--extra", default="", help="CELL:NAME=SPEC;... variants of one cell")
    q.add_argument("--neighbours", action="store_true",
                   help="every config one knob from each cell's default that the rules "
                        "accept")
    q.add_argument("--transplants", action="store_true",
                   help="the other tuned entries of the cell's kernel, dtype and head dim")
    q.add_argument("--peers", default="cudnn",
                   help="comma list of cudnn, fa4 (named n, f), or none (default cudnn)")
    q.add_argument("--out", required=True, metavar="DIR",
                   help="DIR/<cell>.json per cell, DIR/summary.json")
    q.add_argument("--resume", action="store_true", help="skip the cells already in DIR")
    q.add_argument("--force", action="store_true", help="time every cell again into DIR")
    q.add_argument("--devices", help="GPU ids to use (default: every visible one)")
    q.add_argument("--jobs", type=int, default=0,
                   help="processes of the offline compiles first (default: one per core)")
    _timing(q, 12)
    q.set_defaults(func=run_cells)


def _adopt(tsub) -> None:
    q = tsub.add_parser("adopt", help="adopt A/B winners into the tuned files (offline)",
                        description="Apply the adoption rule to a folder of A/B results "
                                    "and write the winners through the tuned files' one "
                                    "writer (docs/tune.md gives the rule).")
    q.add_argument("ab_dir", metavar="AB_DIR")
    q.add_argument("--confirm", action="append", default=[], metavar="DIR",
                   help="another A/B run of the same cells that must agree (repeatable)")
    q.add_argument("--max-ratio", type=float, default=0.995,
                   help="largest median ratio to the default adopted (default 0.995)")
    q.add_argument("--q3-below", type=float, default=1.0,
                   help="bound on each reading's third quartile (default 1; above 1 only "
                        "with two or more --confirm runs)")
    q.add_argument("--pooled", action="store_true",
                   help="the rule on every reading's rounds pooled (sign test) instead of "
                        "bounds per reading; needs --confirm")
    q.add_argument("--alpha", type=float, default=0.01,
                   help="--pooled: the sign test's level (default 0.01)")
    q.add_argument("--tuned", metavar="DIR", help="tuned files to update (default: the "
                                                  "package's)")
    q.add_argument("--dry-run", action="store_true", help="decide, write nothing")
    q.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    q.set_defaults(func=run_adopt)


def _convert(tsub) -> None:
    q = tsub.add_parser("convert", help="a format-1 tuned file -> format 2 (offline)")
    q.add_argument("file", metavar="FILE")
    q.add_argument("--out", metavar="PATH", help="where to write (default: FILE itself)")
    q.add_argument("--force", action="store_true", help="overwrite PATH")
    q.add_argument("--json", action="store_true", help="print the converted file")
    q.set_defaults(func=run_convert)


def _compare(tsub) -> None:
    q = tsub.add_parser("compare-sass", help="two ncu source pages: opcodes and stalls "
                                             "(offline)")
    q.add_argument("a", metavar="A", help="ncu --page source --csv export (.csv or .csv.gz)")
    q.add_argument("b", metavar="B")
    q.add_argument("--top", type=int, default=16, help="opcodes shown (default 16)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=run_compare)


# -- GPU subcommands -------------------------------------------------------------------------

def _settings(args):
    from ..bench.suite import parse_dtype
    from ..tune.ab import Settings

    args.dtype = parse_dtype(args.dtype)
    return Settings(args.rounds, args.reps, not args.no_flush, args.seed)


def _device_target(args) -> "str | None":
    """The GPU's target; refused at once when there is no GPU (``--device cpu``: None)."""
    from .bench import _device

    dev = _device(args)
    if dev.type == "cpu":
        return None
    import torch

    from ..launch import device_target

    if not torch.cuda.is_available():
        raise FlashscopeError(f"tune {args.tune_command}: needs a CUDA/ROCm GPU and none is "
                              "visible (adopt, convert and compare-sass run anywhere)")
    target = device_target(dev)
    if target is None:
        raise FlashscopeError(f"tune {args.tune_command}: {torch.cuda.get_device_name(dev)} "
                              "is not in flashscope's target tables")
    return target


def run_ab(args) -> int:
    from ..tune.ab import run_ab as time_cell
    from ..tune.cells import shape_cell
    from ..tune.results import write_result
    from ..tune.variants import parse_variants

    settings = _settings(args)
    cell = shape_cell(args.shape, args.causal, args.dtype)
    specs = parse_variants(args.variants)
    path = Path(args.out) / f"{cell.name}.json" if args.out else None
    if path is not None and path.exists() and not args.force:
        raise FlashscopeError(f"--out: {path} exists; pass --force to replace it")
    _device_target(args)
    res = time_cell(cell, specs, settings, device=args.device, data_dir=args.tuned,
                    log=_stderr)
    if path is not None:
        write_result(path, res)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        _print_ab(res)
        if path is not None:
            print(f"wrote {path}")
    return 0


def run_cells(args) -> int:
    from ..tune.batch import cell_specs, parse_extra, run_cells as time_cells
    from ..tune.cells import parse_cells
    from ..tune.variants import parse_variants

    settings = _settings(args)
    if args.resume and args.force:
        raise FlashscopeError("--resume and --force: give one or the other")
    if args.jobs < 0:
        raise FlashscopeError(f"--jobs {args.jobs}: expected 0 (one per core) or more")
    cells = parse_cells(args.cells, args.dtype)
    common = parse_variants(args.variants)
    extra = parse_extra(args.extra, cells)
    peers = [] if args.peers.strip() == "none" else [
        p.strip() for p in args.peers.split(",") if p.strip()]
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices \
        else None
    target = _device_target(args)
    plan = {c.name: (c, cell_specs(c, target, common=common, extra=extra.get(c.name),
                                   neighbours=args.neighbours, transplants=args.transplants,
                                   peers=peers, data_dir=args.tuned)) for c in cells}
    executor = None
    if args.device == "cpu":
        from ..sweep.executors import SerialExecutor

        executor = SerialExecutor()

    def log(row):
        if "error" in row:
            _stderr(f"{row['cell']}: FAILED: {row['error']}")
        else:
            _stderr(f"{row['cell']}: done on GPU {row['gpu']} ({row['device']})")

    summary = time_cells(plan, args.out, settings, target=target, devices=devices,
                         executor=executor, device=args.device, data_dir=args.tuned,
                         resume=args.resume, force=args.force, jobs=args.jobs, log=log)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_cells(summary)
    return 1 if summary["cells"] and all("error" in r for r in summary["cells"]) else 0


def _stderr(text: str) -> None:
    import sys

    print(text, file=sys.stderr, flush=True)


def _print_ab(res: dict) -> None:
    m = res["meta"]
    print(f"{m['cell']} ({m['shape']}{' causal' if m['causal'] else ''}, {m['dtype']}) on "
          f"{m['device']}{', L2 flushed' if m['flush'] else ''}: time / "
          f"{res['rows'][0]['name']}'s, median of {m['rounds']} rounds of {m['reps']} (IQR)")
    for r in res["rows"]:
        print(f"  {r['name']:>14} {r['ms']:9.4f} ms {r['tflops']:7.1f} TFLOP/s  "
              f"{r['ratio']:.4f} ({r['ratio_q1']:.4f}-{r['ratio_q3']:.4f})  "
              f"{r.get('label', r['provider'])}")
    for name, why in res["dropped"].items():
        print(f"  {name:>14} dropped: {why}")


def _print_cells(summary: dict) -> None:
    names = []
    for r in summary["cells"]:
        names += [n for n in r.get("ratios", {}) if n not in names]
    print("time / d's, median of rounds; d's TFLOP/s")
    print(f"{'cell':>22} {'d TF/s':>7} " + " ".join(f"{n:>10}" for n in names))
    for r in summary["cells"]:
        if "error" in r:
            print(f"{r['cell']:>22} FAILED: {r['error']}")
            continue
        rat = r["ratios"]
        print(f"{r['cell']:>22} {r['tflops'].get('d', 0):7.1f} " + " ".join(
            f"{rat[n]:10.3f}" if n in rat else f"{'-':>10}" for n in names))


# -- offline subcommands ---------------------------------------------------------------------

def run_adopt(args) -> int:
    from ..tune.adopt import Rule, adopt

    rule = Rule(args.max_ratio, args.q3_below, args.alpha if args.pooled else None,
                tuple(args.confirm))
    verdicts = adopt(args.ab_dir, rule, data_dir=args.tuned, dry_run=args.dry_run)
    if args.json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=1))
    else:
        for v in verdicts:
            print(v.line)
        if args.dry_run:
            print("dry run: nothing written")
    return 0


def run_convert(args) -> int:
    from ..errors import ArtifactError
    from ..tuned import atomic_write, convert, read_json

    out = Path(args.out or args.file)
    if out.exists() and not args.force:
        raise FlashscopeError(f"{out}: exists; pass --force to replace it"
                              + (" (converting in place)" if out == Path(args.file) else ""))
    if out.exists() and out.is_dir():
        raise FlashscopeError(f"--out {out}: is a folder, expected a file path")
    data = convert(read_json(args.file), args.file)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, text)
    except OSError as e:
        raise ArtifactError(f"{out}: cannot write ({e.strerror or e})") from None
    if args.json:
        print(text, end="")
    else:
        print(f"wrote {out}: {len(data['entries'])} entries, format 2")
    return 0


def run_compare(args) -> int:
    from ..tune.sass import compare

    if args.top < 1:
        raise FlashscopeError(f"--top {args.top}: expected 1 or more")
    res = compare(args.a, args.b, args.top)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    a, b = res["a"], res["b"]
    ta, tb = a["instructions"], b["instructions"]
    print(f"== warp instructions executed (millions): A {ta / 1e6:.1f}, B {tb / 1e6:.1f} "
          f"({(ta - tb) / 1e6:+.1f})")
    print(f"  {'opcode':<28} {'A':>9} {'B':>9} {'A - B':>9}")
    for d in res["opcode_diff"]:
        print(f"  {d['opcode']:<28} {d['a'] / 1e6:9.1f} {d['b'] / 1e6:9.1f} "
              f"{d['a_minus_b'] / 1e6:+9.1f}")
    print("== stall reasons, share of samples: A, B, A - B")
    order = sorted(res["stall_diff"], key=lambda k: -max(a["stall_reasons"].get(k, 0),
                                                         b["stall_reasons"].get(k, 0)))
    for k in order[:10]:
        print(f"  {k:<28} {a['stall_reasons'].get(k, 0):8.1%} "
              f"{b['stall_reasons'].get(k, 0):8.1%} {res['stall_diff'][k]:+8.1%}")
    for side, name in ((a, "A"), (b, "B")):
        print(f"== {name} ({side['path']}): most stalled instructions")
        for t in side["top_stalls"][:6]:
            print(f"  {t['share']:6.1%} {t['address']:>16} {t['sass']:<60} {t['reasons']}")
    return 0
