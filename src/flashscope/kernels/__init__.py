"""Triton kernel bodies (Triton only: no torch, no GPU needed to import or compile).

Triton decides at decoration time whether ``@triton.jit`` builds a GPU kernel or a CPU
interpreter function. :func:`load` builds a kernel module for the one that is asked for,
whatever ``TRITON_INTERPRET`` says, so offline compilation (always the compiler) and
interpreter runs (CPU tensors) coexist in one process. The helpers a kernel module imports
from its siblings (``from flashscope.kernels.keyrange import ...``) are built in the same
mode: while a module runs, its siblings' entries in ``sys.modules`` are the copies of that
mode. Gluon kernels (``*_sm90``, ``sm90_*``) are always compiled: Gluon wraps
``triton.language``'s reductions when it is first imported, so it is imported under the
process's own mode, before the switch.
"""

from __future__ import annotations

import importlib.util
import re
import sys

_LOADED = {}
_SIBLING = re.compile(r"^from flashscope\.kernels\.(\w+) import", re.M)


def load(name: str, interpret: bool = False):
    """The module ``flashscope.kernels.<name>`` with its kernels built for Triton's compiler
    (``interpret=False``) or its CPU interpreter (``interpret=True``). Cached."""
    key = (name, bool(interpret))
    mod = _LOADED.get(key)
    if mod is None:
        import triton

        if name.endswith("_sm90"):
            import triton.experimental.gluon.language  # noqa: F401  (see the docstring)
        spec = importlib.util.find_spec(f"{__name__}.{name}")
        if spec is None:
            raise ModuleNotFoundError(f"no kernel module {name!r} in {__name__}")
        deps = _SIBLING.findall(spec.loader.get_source(spec.name) or "")
        siblings = {f"{__name__}.{d}": load(d, interpret) for d in deps}
        mod = importlib.util.module_from_spec(spec)
        knobs = triton.knobs.runtime
        saved = knobs.interpret
        saved_modules = {n: sys.modules.get(n) for n in siblings}
        knobs.interpret = bool(interpret)
        sys.modules.update(siblings)
        try:
            spec.loader.exec_module(mod)
        finally:
            knobs.interpret = saved
            for n, m in saved_modules.items():
                if m is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = m
        _LOADED[key] = mod
    return mod
