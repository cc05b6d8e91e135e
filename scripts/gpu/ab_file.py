"""A/B timing of another copy of the sm90 kernel module against this tree's, on one shape.

For changes that are not a knob: save the kernel file as it was (``git show
REV:src/flashscope/kernels/attention_fwd_sm90.py > old.py``; for a change in its
``sm90_*`` helper modules, the whole folder: see :func:`_module`), edit, then time both with
the same launch arguments (flashscope's default config for the shape, built by
``launch.forward_call``) and cuDNN, in interleaved bursts as :mod:`ab` does. Both
kernels go through Triton's ``kernel[grid]`` launch (the same host cost each), followed
by the merge of cut blocks where the config has SPLIT_KV (the same merge launch for
both); each output is poisoned with NaN, then checked against cuDNN's.

Usage: PYTHONPATH=src python scripts/gpu/ab_file.py OLD.py|OLD_DIR --shape 1,32,16384,64
       [--causal] [--rounds 12] [--reps 10] [--json OUT.json] [--flush]
"""

import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import _provider, check_output, interleaved, report, shape_args  # noqa: E402

from flashscope import api, kernels, launch  # noqa: E402


OLD_TAG = "flashscope_ab_old"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before running it: Gluon resolves callees through it
    spec.loader.exec_module(mod)
    return mod


def _module(path):
    """The kernel module at ``path``: a copy of ``attention_fwd_sm90.py`` (its helper
    modules this tree's), or a folder holding one beside copies of the ``sm90_*`` modules
    it imports (``git archive REV src/flashscope/kernels | tar x --strip-components 3 -C
    old``), loaded under names of their own with the imports between them pointed at
    those copies (rewritten into a temporary folder: Triton reads a kernel's source from
    its file)."""
    import tempfile

    import triton.experimental.gluon.language  # noqa: F401  (as kernels.load does)

    if not os.path.isdir(path):
        return _load(OLD_TAG, path)
    out = tempfile.mkdtemp(prefix="ab_old_")
    names = sorted(n for n in os.listdir(path) if n.startswith("sm90_") and n.endswith(".py"))
    for name in names + ["attention_fwd_sm90.py"]:
        with open(os.path.join(path, name)) as f:
            text = f.read().replace("from flashscope.kernels.sm90_", f"from {OLD_TAG}_sm90_")
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    for name in names:
        _load(f"{OLD_TAG}_{name[:-3]}", os.path.join(out, name))
    return _load(OLD_TAG, os.path.join(out, "attention_fwd_sm90.py"))


def _runner(mod, q, k, v, causal, cfg, ref):
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    grid, args, consts = launch.forward_call(q, k, v, out, None, causal=causal,
                                             scale=scale, cfg=cfg)
    opts = launch.launch_options(cfg, q.device)
    fn = mod._attn_fwd_sm90
    known = {p.name for p in fn.params}  # an older kernel may lack a newer knob
    consts = {n: c for n, c in consts.items() if n in known}
    # SPLIT_KV: the cut blocks' partials (args[6]) merged into their rows (a no-op otherwise)
    plan = launch.gluon_plan(q, k, v, out, None, causal=causal, scale=scale, cfg=cfg)

    def run():
        fn[grid](*args, **consts, **opts)
        plan.merge(args[6], out, None)
        return out
    out.fill_(float("nan"))
    run()
    check_output(mod.__name__, out, ref)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    shape_args(ap, rounds=12)
    a = ap.parse_args()
    B, H, N, D = map(int, a.shape.split(","))
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = api._default_config(q, k, v, a.causal)
    ref = _provider("cudnn", q, k, v, a.causal)().float()
    names = ["new", "old", "cudnn"]
    fns = [_runner(kernels.load("attention_fwd_sm90"), q, k, v, a.causal, cfg, ref),
           _runner(_module(a.old), q, k, v, a.causal, cfg, ref),
           _provider("cudnn", q, k, v, a.causal)]
    print(f"config {cfg.key}")
    report(a, names, interleaved(names, fns, a.rounds, a.reps, a.flush),
           {"config": cfg.key, "old": a.old})


if __name__ == "__main__":
    main()
