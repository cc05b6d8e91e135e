"""A/B timing of forward variants over several cells of the standard suite in one call.

Each cell is ``d<D><c|n><N>`` (``d64c1k``: D = 64, causal, N = 1024, with the suite's
B = 16384 / N and H = 2048 / D). Every cell runs ``d=+`` (the tuned default), the common
``--variants``, the cell's own ``--extra`` variants and cuDNN through :mod:`ab`
(interleaved bursts, ratios within a round). All of them are first built and checked
against cuDNN by ``--jobs`` warm-up processes at once (one round of one launch each, so
the compiles run in parallel and land in Triton's cache); the timed runs then go one cell
at a time. Per cell ``OUTDIR/<cell>.json`` and ``.txt`` (:func:`ab.report`); last, a table
of each variant's time over the default's (median of rounds).

Usage: PYTHONPATH=src python scripts/gpu/ab_cells.py OUTDIR --cells d64c1k,d128n16k
       [--variants "i=+OUT_RCP=1"] [--extra "d128n16k:np=+PERSISTENT=0"] [--rounds 12]
       [--reps 10] [--jobs 8] [--flush] [--neighbours] [--transplants]

``--neighbours`` adds, per cell, every valid config one knob away from its tuned default
(:func:`neighbours`); with :mod:`adopt_ab` that is one step of a coordinate search.
``--transplants`` adds the tuned entries of the cell's head dim at the other masks and
lengths (:func:`transplants`): whole recipes, several knobs away, that such a step does
not reach.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cell_shape(name: str) -> tuple:
    """``d64c1k`` -> ("16,32,1024,64", True)."""
    if not (name.startswith("d") and ("c" in name or "n" in name) and name.endswith("k")):
        raise SystemExit(f"cell {name!r}: expected d<D><c|n><N>k, e.g. d64c1k")
    causal = "c" in name
    d, n = name[1:-1].split("c" if causal else "n")
    D, N = int(d), int(n) * 1024
    return f"{16384 // N},{2048 // D},{N},{D}", causal


def variant_specs(text: str) -> dict:
    """``NAME=SPEC;...`` (``--variants``) -> {name: spec}, in the order given. A name
    given twice is refused: the later spec would replace the earlier one unseen."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        if "=" not in item:
            raise SystemExit(f"--variants: expected NAME=SPEC, got {item!r}")
        name, spec = (x.strip() for x in item.split("=", 1))
        if name in out:
            raise SystemExit(f"--variants: {name!r} names two variants ({out[name]!r} and "
                             f"{spec!r})")
        out[name] = spec
    return out


def cell_default(cell: str) -> tuple:
    """(the sm90 bf16 tuned default of the cell's shape, its head dim D)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
    from flashscope.tuned import lookup

    shape, causal = cell_shape(cell)
    N, D = (int(x) for x in shape.split(",")[2:])
    return lookup("sm90", "bfloat16", D, causal, N)[0], D


#: --neighbours: one knob of the cell's default changed at a time (name, knob, values)
NEIGHBOURS = (("pp", "PINGPONG", (False, True)), ("o", "OVERLAP", (0, 1, 2)),
              ("lz", "LAZY_RESCALE", (False, True)), ("eq", "EARLY_Q", (False, True)),
              ("ke", "K_EARLY", (False, True)), ("mf", "MASKED_FIRST", (False, True)),
              ("rc", "OUT_RCP", (False, True)), ("q", "Q_IN_REGS", (False, True)),
              ("bl", "BALANCE", (False, True)), ("jk", "JOINT_KV", (False, True)),
              ("sv", "SPLIT_KV", (False, True)), ("lr", "LEAN_RELEASE", (False, True)),
              ("s", "num_stages", (2, 3, 4)))


def neighbours(cell: str) -> list:
    """``name=+KNOB=V`` for every valid config one knob away from the cell's tuned default
    (``ppN``: PINGPONG=N, ``oN``: OVERLAP=N, ``sN``: N stages, ...)."""
    from flashscope.config import check_config
    from flashscope.errors import ConfigError

    base, D = cell_default(cell)
    out = []
    for short, knob, values in NEIGHBOURS:
        for value in values:
            if value == getattr(base, knob):
                continue
            try:
                check_config(base.replace(**{knob: value}), "sm90", D)
            except ConfigError:
                continue
            out.append(f"{short}{int(value)}=+{knob}={int(value)}")
    return out


def transplants(cell: str) -> list:
    """``x<c|n><class>=CONFIG`` (``xn4k``: the non-causal ``le4k`` entry) for each sm90
    bf16 entry with the cell's head dim whose config differs from the cell's default,
    first occurrence of each config only.

    A coordinate search moves one knob at a time, so it stops where every single change
    loses even if a combination wins: the D = 128 non-causal 16k entry sat at 0.96 of
    FlashAttention-4 through five one-knob searches while the 4k entry's recipe (five knobs
    away) ran it in 0.955 of the time (run 113)."""
    from flashscope.api import config_text
    from flashscope.tuned import load_tuned

    base, D = cell_default(cell)
    seen = {base.key}
    out = []
    # the reader has checked every entry for its own head dim, which is D here
    for (dtype, head_dim, c, cls), (cfg, _) in sorted(load_tuned("sm90").items()):
        if dtype != "bfloat16" or head_dim != D or cfg.key in seen:
            continue
        seen.add(cfg.key)
        out.append(f"x{'c' if c else 'n'}{cls.removeprefix('le')}={config_text(cfg)}")
    return out


def check_names(specs: dict) -> None:
    """Refuse a cell whose variant list :func:`variant_specs` refuses (``d`` is the cell's
    default and ``n`` cuDNN, so a variant of either name would replace them), before any
    cell runs."""
    for c, spec in specs.items():
        try:
            variant_specs(spec)
        except SystemExit as e:
            raise SystemExit(f"{c}: {e} (d is the cell's default, n cuDNN)") from None


def _command(cell, variants, rounds, reps, out, flush=False):
    shape, causal = cell_shape(cell)
    cmd = [sys.executable, os.path.join(HERE, "ab.py"), "--shape", shape, "--variants",
           variants, "--rounds", str(rounds), "--reps", str(reps)]
    if causal:
        cmd.append("--causal")
    if flush:
        cmd.append("--flush")
    if out:
        cmd += ["--json", out]
    return cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--cells", required=True)
    ap.add_argument("--variants", default="")
    ap.add_argument("--extra", default="", help="CELL:NAME=SPEC;... (repeat CELL: per item)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--flush", action="store_true", help="ab.py --flush: L2 evicted before "
                    "every launch, as the bench harness's timer does")
    ap.add_argument("--neighbours", action="store_true",
                    help="also every config one knob away from each cell's default")
    ap.add_argument("--transplants", action="store_true",
                    help="also the tuned entries of the same head dim at the other masks "
                         "and lengths")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    extra = {c: [] for c in cells}
    for item in filter(None, (x.strip() for x in a.extra.split(";"))):
        cell, spec = item.split(":", 1)
        extra.setdefault(cell, []).append(spec)
    specs = {c: ";".join(["d=+", *filter(None, a.variants.split(";")), *extra[c],
                          *(neighbours(c) if a.neighbours else []),
                          *(transplants(c) if a.transplants else []), "n=cudnn"])
             for c in cells}
    check_names(specs)
    t0 = time.time()
    running, failed = [], {}
    for c in cells:  # warm-up: compile and check every variant, --jobs at a time
        while len(running) >= a.jobs:
            running = [(cc, p) for cc, p in running if p.poll() is None]
            time.sleep(0.5)
        log = open(os.path.join(a.outdir, f"{c}.warmup.log"), "w")
        running.append((c, subprocess.Popen(_command(c, specs[c], 1, 1, None), stdout=log,
                                            stderr=subprocess.STDOUT)))
    for c, p in running:
        p.wait()
    for c in cells:
        text = open(os.path.join(a.outdir, f"{c}.warmup.log")).read()
        if "TFLOP/s" not in text:
            failed[c] = text.strip().splitlines()[-1:] or ["no output"]
    print(f"warm-up: {time.time() - t0:.0f} s, failed: {failed or 'none'}", flush=True)
    table = {}
    for c in cells:
        if c in failed:
            continue
        out = os.path.join(a.outdir, f"{c}.json")
        res = subprocess.run(_command(c, specs[c], a.rounds, a.reps, out, a.flush),
                             capture_output=True, text=True)
        open(os.path.join(a.outdir, f"{c}.txt"), "w").write(res.stdout + res.stderr)
        print(res.stdout, end="", flush=True)
        if res.returncode == 0:
            table[c] = {r["name"]: r for r in json.load(open(out))["rows"]}
        else:
            failed[c] = res.stderr.strip().splitlines()[-1:]
    names = []
    for rows in table.values():
        names += [n for n in rows if n not in names]
    print(f"\ntime / d's (median of {a.rounds} rounds); d's TFLOP/s; {time.time() - t0:.0f} s")
    print(f"{'cell':>10} {'d TF/s':>7} " + " ".join(f"{n:>8}" for n in names))
    for c, rows in table.items():
        print(f"{c:>10} {rows['d']['tflops']:7.1f} " + " ".join(
            f"{rows[n]['ratio']:8.3f}" if n in rows else f"{'-':>8}" for n in names))
    for c, why in failed.items():
        print(f"{c:>10} FAILED: {' '.join(why)}")


if __name__ == "__main__":
    main()
