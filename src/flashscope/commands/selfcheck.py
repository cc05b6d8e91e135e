"""``flashscope selfcheck``: run the forward kernel on an embedded default problem and print
its relative error against a float64 reference.

Without a GPU the kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1`` is set
before the kernels are built); with one, ``--device cuda`` runs it for real.
"""

from __future__ import annotations

from . import common

#: The embedded default problem: small enough for the interpreter, with odd lengths,
#: GQA and a padded head dim so every masked path runs.
DEFAULT_PROBLEM = dict(B=1, H=4, Hkv=2, Nq=97, Nk=130, D=80)


def register(sub):
    p = sub.add_parser("selfcheck", help="run the kernel on a default shape and check it "
                                         "against a float64 reference", description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cpu = Triton interpreter (default when no GPU is visible)")
    common.add_output(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..testing.interpreter import choose_device

    common.prepare(args)
    device = choose_device(args.device)
    import torch

    import flashscope
    from ..testing.reference import ERROR_BOUND, reference_attention, rel_error

    p = DEFAULT_PROBLEM
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            q = torch.randn(p["B"], p["H"], p["Nq"], p["D"], device=device).to(dtype)
            k = torch.randn(p["B"], p["Hkv"], p["Nk"], p["D"], device=device).to(dtype)
            v = torch.randn_like(k)
            out = flashscope.attention(q, k, v, is_causal=causal, enable_gqa=True)
            err = rel_error(out, reference_attention(q, k, v, is_causal=causal))
            rows.append({"dtype": str(dtype).replace("torch.", ""), "causal": causal,
                         "rel_error": err, "bound": ERROR_BOUND[dtype],
                         "ok": err <= ERROR_BOUND[dtype]})
    ok = all(r["ok"] for r in rows)
    where = "Triton interpreter (CPU)" if device == "cpu" else torch.cuda.get_device_name()
    doc = {"device": device, "where": where, "problem": p, "results": rows, "ok": ok}

    def render(con):
        shape = (f"q ({p['B']}, {p['H']}, {p['Nq']}, {p['D']}), k/v ({p['B']}, {p['Hkv']}, "
                 f"{p['Nk']}, {p['D']})")
        con.print(f"flashscope selfcheck on {where}: {shape}, GQA, against float64")
        for r in rows:
            con.print(f"  {r['dtype']:<9} causal={str(r['causal']):<5}  rel. error "
                      f"{r['rel_error']:.2e}  (bound {r['bound']:.0e})  "
                      f"{'ok' if r['ok'] else 'FAILED'}")
    common.emit(args, doc, rows=rows, render=render)
    return 0 if ok else 1
