"""``flashscope version``: package versions and whether a GPU is visible."""

from __future__ import annotations

from . import common


def register(sub):
    p = sub.add_parser("version", help="versions of flashscope, Triton, torch, numpy; GPU "
                                       "visibility", description=__doc__)
    common.add_output(p)
    p.set_defaults(func=run)


def versions() -> dict:
    import numpy
    import torch
    import triton

    from .. import __version__

    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return {"flashscope": __version__, "triton": triton.__version__, "torch": torch.__version__,
            "numpy": numpy.__version__, "gpu": gpu,
            "backend": "rocm" if torch.version.hip else ("cuda" if torch.version.cuda else "cpu")}


def run(args) -> int:
    common.prepare(args)
    v = versions()

    def render(con):
        for k, val in v.items():
            con.print(f"{k:<11} {val if val is not None else 'none visible'}")
    common.emit(args, v, rows=[v], render=render)
    return 0
