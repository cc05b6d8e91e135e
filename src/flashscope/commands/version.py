"""``flashscope version``: package versions and whether a GPU is visible."""

from __future__ import annotations

from . import common


def register(sub):
    p = sub.add_parser("version", help="versions of flashscope, Triton (and whether it is a "
                       "supported release), torch, numpy; GPU visibility", description=__doc__)
    common.add_output(p)
    p.set_defaults(func=run)


def versions() -> dict:
    import numpy
    import torch
    import triton

    from .. import __version__
    from ..compat import SUPPORTED, supported

    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    oldest, newest = (".".join(map(str, v)) for v in SUPPORTED)
    return {"flashscope": __version__, "triton": triton.__version__,
            "triton_supported": f"{'yes' if supported() else 'no'} ({oldest} to {newest})",
            "torch": torch.__version__,
            "numpy": numpy.__version__, "gpu": gpu,
            "backend": "rocm" if torch.version.hip else ("cuda" if torch.version.cuda else "cpu")}


def run(args) -> int:
    common.prepare(args)
    v = versions()

    def render(con):
        for k, val in v.items():
            con.print(f"{k:<17} {val if val is not None else 'none visible'}")
    common.emit(args, v, rows=[v], render=render)
    return 0
