"""Time decoding configs on a GPU: one decoding step (:func:`flashscope.attention_with_kvcache`,
causal, no append) against a full cache, dense and paged, each problem's ``triton-decode``
default first and then configs given as ``K=V,...`` of :class:`flashscope.TritonDecodeConfig`
on top of that default, or as ``sm90-fwd:K=V,...`` (``sm90-fwd:`` alone: no change) on top of
the sm_90 forward's config for the decoding rows (:func:`flashscope.kvcache.forward_config`;
wide rows run there by default, docs/decode.md; a cache it cannot read is a failed row).
Where the call itself runs the sm_90 forward (``api_default`` marks the row of the config
:func:`flashscope.attention_with_kvcache` runs), its config is timed too, as ``sm90-fwd:``.
Every config's output is checked against the float32 reference before it is timed.
GPU time with the L2 flushed and the host hidden (the decode suite's timer,
:func:`flashscope.bench.timing.gpu_time`). No command does this: ``flashscope bench --suite
decode`` times the defaults against the peers. The decode rules' measured reasons
(docs/decode.md) come from sweeps like this one.

Shapes as ``flashscope bench --shape``: B,H,Nq,D,Nk,Hkv (Nq the query tokens, Nk the keys
each sequence holds), ``;`` between shapes. Pages: 0 for the dense cache, else the page
size (pages handed out in random order; ``--page-order inorder,8,shuffled`` runs each
paged cache with its pages in order, the dense cache's bytes, shuffled within groups of
8, and shuffled: what a page layout costs apart from the kernel's page reads; each row's
``of_dense_config`` is its speed over the same entry's on the dense cache). ``--rounds
R`` times the configs of a cache in turn R times, in alternating order, and keeps each
one's median: an A/B of two configs then sees the same clock (a 12-15 us step read 13.3
and 14.9 us in one sweep without it). Writes OUTDIR/decode_scan.json; each row gives the
time, the cache's GB/s and the speed over the dense cache's default. Each finished row
is also kept in OUTDIR/decode_scan.partial.jsonl as it is timed, so a sweep stopped by a
signal or a time limit keeps what it finished.

``--against REV`` (a git revision of this checkout, or a path to a ``triton_decode.py``)
adds, after each default, the default that version of the rules chose for the same
problem, where it differs (a row with ``"against": true``): a change to the rules is
timed against the rules before it, config by config, on the shapes given.

Usage: PYTHONPATH=src python scripts/gpu/decode_scan.py OUTDIR \\
       --shapes "8,32,1,128,1024,8;64,32,1,128,1024,8" --pages 0,16 \\
       --configs "SPLITS=1;SPLITS=2;num_stages=2" --rounds 3
       PYTHONPATH=src python scripts/gpu/decode_scan.py OUTDIR --against HEAD~1 \\
       --shapes "8,64,16,128,1024,8" --rounds 3
       PYTHONPATH=src python scripts/gpu/decode_scan.py OUTDIR --pages 0 --rounds 4 \\
       --shapes "64,64,16,128,8192,8;17,64,16,128,32768,8" --configs "sm90-fwd:"
       PYTHONPATH=src python scripts/gpu/decode_scan.py OUTDIR --pages 0,16 --rounds 3 \\
       --page-order inorder,8,shuffled --shapes "64,64,16,128,8192,8" --configs "sm90-fwd:"
"""

import argparse
import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
import tempfile

from pathlib import Path

import torch

import flashscope
from flashscope import launch
from flashscope.bench.output import stamp
from flashscope.bench.suite import parse_shape
from flashscope.bench.timing import Timer
from flashscope.commands.common import check_out_dir
from flashscope.errors import FlashscopeError
from flashscope.families import family
from flashscope.families.triton_decode import Cache, select
from flashscope.kvcache import _default_config, forward_config, problem_of
from flashscope.masks import Mask
from flashscope.outfiles import PartialLines, json_text, write_atomic
from flashscope.testing.inputs import make_kvcache
from flashscope.testing.reference import ERROR_BOUND, reference_kvcache, rel_error

ROOT = Path(__file__).resolve().parents[2]
#: the prefix of a --configs entry for the sm_90 forward's decoding rows
FORWARD = "sm90-fwd:"
RULES = "src/flashscope/families/triton_decode.py"
CAUSAL = Mask.of(True, (-1, -1), "bottom_right", None)
#: each finished row as it is timed, removed once decode_scan.json holds them all
PARTIAL = "decode_scan.partial.jsonl"


def load_rules(spec: str):
    """The ``select`` of another version of the decoding rules: ``spec`` a path to a
    ``triton_decode.py`` or a git revision of this checkout. A :class:`FlashscopeError`
    says why it could not be loaded."""
    path = Path(spec)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise FlashscopeError(f"--against {spec!r}: cannot be read as Python source "
                                  f"({e})") from None
    else:
        try:
            r = subprocess.run(["git", "show", f"{spec}:{RULES}"], cwd=ROOT, text=True,
                               capture_output=True)
        except OSError as e:  # no git on this machine
            raise FlashscopeError(f"--against {spec!r}: not a file, and git could not "
                                  f"be run ({e})") from None
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["git show failed"])[-1]
            raise FlashscopeError(f"--against {spec!r}: neither a file nor a git revision "
                                  f"holding {RULES} ({why})")
        text = r.stdout
    name = "flashscope.families._rules_against"  # its relative imports find the package
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    try:
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, f.name))
        sys.modules[name] = module
        module.__spec__.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001  a version this package cannot import
        raise FlashscopeError(f"--against {spec!r}: does not import against this "
                              f"package: {type(e).__name__}: {e}") from None
    finally:
        Path(f.name).unlink()
    if not callable(getattr(module, "select", None)):
        raise FlashscopeError(f"--against {spec!r}: has no select(problem)")
    return module.select


def scan(shape: tuple, pages: list, texts: list, device: str = "cuda",
         dtype=torch.bfloat16, rounds: int = 1, keep=None, against=None,
         orders=("shuffled",)) -> list:
    """One row per (cache, config) of one shape, the default first: label, knobs off the
    default, relative error, and microseconds (the median over ``rounds``, each round
    timing every config of the cache once, in the opposite order to the round before),
    GB/s and speed over the dense default and over the same entry (the default, the
    other rules' or a ``texts`` one) on the dense cache (or why it was not timed).
    ``keep``: a :class:`~flashscope.outfiles.PartialLines` each finished row is added
    to; ``against``: another version's ``select`` (:func:`load_rules`), whose default
    comes second where it differs; ``orders``: each paged cache once per page order
    (:func:`~flashscope.testing.inputs.page_order`)."""
    B, H, Nq, D, Nk, Hkv = shape
    timer = Timer(device=device, hide_host=True)
    target = launch.device_target(torch.device(device)) or "sm90"
    dtype_name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    rows, dense_us, dense_by_config = [], None, {}
    for page, order in [(p, o) for p in pages for o in (orders if p else [None])]:
        inp = make_kvcache(device, B, Nq, H, Hkv, D, Nk, page=page, dtype=dtype,
                           order=order or "shuffled")
        cache = Cache.of(inp.k_cache, inp.v_cache, inp.cache_seqlens, inp.block_table)
        want, _ = reference_kvcache(inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens,
                                    block_table=inp.block_table,
                                    compute_dtype=torch.float32)
        problem = problem_of(inp.q, cache, CAUSAL)
        default = select(problem)
        # the config attention_with_kvcache runs for this cache: the family's default, or
        # the sm_90 forward's where the rows go there (timed too if no entry names it)
        api = _default_config(inp.q, cache, CAUSAL, launch.default_scale(D))
        routed = isinstance(api, flashscope.Sm90FwdConfig)
        kv_bytes = 2 * B * Nk * Hkv * D * inp.k_cache.element_size()
        timed, first = [], len(rows)  # (row, step) of the configs that passed the checks
        entry_of = {}  # a timed row's --configs entry ("": the default; "against")
        other = None
        if against is not None:
            other = flashscope.TritonDecodeConfig(**against(problem).as_dict())
            other = None if other == default else other
        extra = [FORWARD] if routed and FORWARD not in texts else []
        for text in ["", *([other] if other else []), *extra, *texts]:
            entry = "against" if isinstance(text, flashscope.TritonDecodeConfig) else text
            if isinstance(text, flashscope.TritonDecodeConfig):
                cfg, text = text, text.text
            elif text.startswith(FORWARD):
                cfg = flashscope.Sm90FwdConfig.parse(text[len(FORWARD):],
                                                     base=forward_config(problem))
            else:
                cfg = flashscope.TritonDecodeConfig.parse(text, base=default)

            def step(cfg=cfg):
                return flashscope.attention_with_kvcache(
                    inp.q, inp.k_cache, inp.v_cache, cache_seqlens=inp.cache_seqlens,
                    block_table=inp.block_table, config=cfg)

            head = {"shape": list(shape), "page": page, "order": order, "config": cfg.label,
                    "api_default": cfg == api}
            try:
                family(cfg.KERNEL).check(cfg, target, D, dtype_name)
                err = rel_error(step(), want)
            except FlashscopeError as e:  # the family's rules, or the call's: a row
                rows.append({**head, "default": not text, "against": cfg is other,
                             "failed": str(e)})
                continue
            off = {k: v for k, v in cfg.as_dict().items() if getattr(default, k, v) != v}
            row = {**head, "knobs": off, "default": not text, "against": cfg is other,
                   "error": err}
            if not err <= ERROR_BOUND[dtype]:
                row["failed"] = f"relative error {err:.2e} > {ERROR_BOUND[dtype]}"
            else:
                row["us_rounds"] = []
                timed.append((row, step))
                entry_of[id(row)] = entry
            rows.append(row)
        for r in range(rounds):
            for row, step in (timed if r % 2 == 0 else timed[::-1]):
                row["us_rounds"].append(timer.time(step) * 1e3)
        for row in rows[first:]:
            if "us_rounds" in row:
                us = statistics.median(row["us_rounds"])
                dense_us = us if dense_us is None else dense_us
                entry = entry_of[id(row)]
                if not page:
                    dense_by_config.setdefault(entry, us)
                row.update(us=us, gbps=kv_bytes / us / 1e3, of_dense_default=dense_us / us)
                if entry in dense_by_config:
                    row["of_dense_config"] = dense_by_config[entry] / us
            print(json.dumps(row), flush=True)
            if keep is not None:
                keep.add(row)
        del inp, cache, timed
    return rows


def _checked(args) -> tuple:
    """(shapes, pages, page orders, config texts, the output folder, the other rules'
    select or None) from the arguments, in the order given; a :class:`FlashscopeError`
    names the first that is wrong, before anything is written."""
    try:
        shapes = [parse_shape(t.strip()) for t in args.shapes.split(";") if t.strip()]
    except FlashscopeError as e:  # the message names the shape
        raise FlashscopeError(f"--shapes: {e}") from None
    try:
        pages = [int(p) for p in args.pages.split(",")]
    except ValueError:
        pages = [-1]
    if any(p < 0 for p in pages):
        raise FlashscopeError(f"--pages {args.pages!r}: expected page sizes >= 0, e.g. 0,16")
    orders = [o.strip() for o in args.page_order.split(",")]
    orders = [int(o) if o.isdigit() else o for o in orders]
    if any(o not in ("shuffled", "inorder") and not (isinstance(o, int) and o > 0)
           for o in orders):
        raise FlashscopeError(f"--page-order {args.page_order!r}: expected a comma list of "
                              "shuffled, inorder or a group of pages > 0, e.g. inorder,8")
    if not (args.rounds.isdigit() and int(args.rounds) >= 1):
        raise FlashscopeError(f"--rounds {args.rounds!r}: expected a whole number >= 1")
    texts = [t.strip() for t in str(args.configs or "").split(";") if t.strip()]
    try:
        for t in texts:
            if t.startswith(FORWARD):
                flashscope.Sm90FwdConfig.parse(t[len(FORWARD):])
            else:
                flashscope.TritonDecodeConfig.parse(t)
    except FlashscopeError as e:
        raise FlashscopeError(f"--configs {t!r}: {e}") from None
    out = check_out_dir(args.outdir, ("decode_scan.json", PARTIAL), args.force, "OUTDIR")
    against = None if args.against is None else load_rules(args.against)
    return shapes, pages, orders, texts, out, against


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--shapes", required=True, help="B,H,Nq,D,Nk,Hkv, ';' between")
    ap.add_argument("--pages", default="0,16",
                    help="page sizes, 0 for the dense cache (default 0,16; the dense one "
                         "first gives the speed column its base)")
    ap.add_argument("--page-order", default="shuffled",
                    help="how the block table hands out the pool's pages, comma list: "
                         "shuffled (default), inorder (a dense cache's bytes), or G "
                         "(shuffled within aligned groups of G pages); each paged cache "
                         "once per order")
    ap.add_argument("--configs", default="",
                    help="K=V,... of TritonDecodeConfig on each default, or sm90-fwd:K=V,... "
                         "on the forward's decoding config, ';' between")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default), or cpu: Triton's interpreter with "
                         "TRITON_INTERPRET=1, for tiny shapes (perf_counter times)")
    ap.add_argument("--force", action="store_true",
                    help="replace the results of an earlier sweep in OUTDIR")
    ap.add_argument("--against", metavar="REV",
                    help="another version of the rules (a git revision, or a path to a "
                         "triton_decode.py): its default for each problem is timed "
                         "after the current one where it differs")
    ap.add_argument("--rounds", default="1",
                    help="times each config is timed, the configs of a cache in turn and "
                         "in alternating order; the median is kept (default 1)")
    args = ap.parse_args(argv)
    try:
        shapes, pages, orders, texts, out, against = _checked(args)
    except FlashscopeError as e:
        print(f"decode_scan: {e}")
        return 2
    keep = PartialLines(lambda: out.file(PARTIAL))
    rows = [row for shape in shapes
            for row in scan(shape, pages, texts, device=args.device,
                            rounds=int(args.rounds), keep=keep, against=against,
                            orders=orders)]
    argv = sys.argv[1:] if argv is None else argv
    meta = {**stamp(args.device, timer=Timer(device=args.device, hide_host=True)),
            "command": shlex.join(["scripts/gpu/decode_scan.py", *argv])}
    write_atomic(out.file("decode_scan.json"), json_text({"meta": meta, "rows": rows}))
    keep.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
