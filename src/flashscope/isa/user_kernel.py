"""Any ``@triton.jit`` (or Gluon) kernel, compiled offline for any target: ``FILE.py:KERNEL``
with a signature and constexpr values, as a :class:`~flashscope.compile.Artifact` that the
readers take like one of flashscope's own builds.

Signature spelling (``--signature``): comma-separated ``NAME=TYPE`` (or bare ``TYPE`` in
the order of the kernel's non-constexpr parameters), TYPE one of Triton's names: ``*fp32``,
``*bf16``, ``i32``, ``fp32``, ... A pointer is taken 16-byte aligned, as a PyTorch
allocation is (``*fp32:1`` for one that is not); an integer ``:16`` is a multiple of 16
(``i32:16``). Both become Triton's ``tt.divisibility`` 16, what a launch with such values
specializes; on AMD a pointer is also taken within 2 GB (buffer instructions), as Triton
does for tensors that small. Constexprs (``--constexpr NAME=VALUE``): integers, floats,
True/False, or text; parameters with a default may be left out.

The module is imported and compiled in a forked process (an abort in Triton's native code
ends only that process and becomes a one-line error), or in a clean worker process when
this one runs Triton's interpreter. Builds are cached under ``$FLASHSCOPE_CACHE`` by the
kernel's own cache key (its source and the functions it calls), the signature, constexprs,
options, target and Triton version.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import asdict, dataclass

from ..errors import ConfigError, FlashscopeError

_TYPES = ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp8e4nv",
          "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16", "fp16", "bf16", "fp32", "fp64")
_TYPE = re.compile(r"^(\*?)(" + "|".join(_TYPES) + r")(?::(1|16))?$")


@dataclass(frozen=True)
class KernelSource:
    """What to compile: ``path``'s ``kernel`` with a signature and constexprs."""

    path: str
    kernel: str
    signature: str
    constexprs: tuple = ()  # ((name, value), ...)
    num_warps: int = 4
    num_stages: int = 3

    @property
    def key(self) -> str:
        """The build's name beside the kernel's: its constexprs and launch options."""
        cs = [f"{k}={v}" for k, v in self.constexprs]
        return ",".join(cs + [f"num_warps={self.num_warps}", f"num_stages={self.num_stages}"])


def parse_spec(text: str) -> tuple:
    """``FILE.py:KERNEL`` -> (absolute path, kernel name); a clear error otherwise."""
    path, sep, name = text.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ConfigError(f"{text!r}: expected FILE.py:KERNEL (a Python file and the name of "
                          "its @triton.jit function)")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file")
    return os.path.abspath(path), name


def parse_constexprs(items) -> tuple:
    """``NAME=VALUE`` texts -> ((name, value), ...), values as int, float, bool or text."""
    out = []
    for it in items or ():
        name, sep, val = it.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ConfigError(f"--constexpr {it!r}: expected NAME=VALUE, e.g. BLOCK=1024")
        out.append((name, _value(val.strip())))
    return tuple(out)


def _value(text: str):
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _load(path: str, name: str):
    """The kernel object ``name`` of the module at ``path`` (imported under a private name,
    with its folder on sys.path for its own imports)."""
    mod_name = "flashscope_user_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(f"{path}: importing it failed{where}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    fn = getattr(module, name, None)
    if fn is None:
        found = sorted(k for k, v in vars(module).items() if hasattr(v, "params")
                       and hasattr(v, "cache_key"))
        raise ConfigError(f"{path}: no kernel {name!r}; @jit functions there: "
                          f"{', '.join(found) or 'none'}")
    if not (hasattr(fn, "params") and hasattr(fn, "cache_key")):
        raise ConfigError(f"{path}:{name} is a {type(fn).__name__}, not a @triton.jit or "
                          "Gluon kernel")
    return fn


def bind(fn, src: KernelSource, buffer_ops: bool = False) -> tuple:
    """(signature {name: type}, constexprs {name: value}, attribute letters {(index,):
    "D"/"S"...}) for ``fn``; ``buffer_ops``: pointers within 2 GB (AMD with Triton's buffer
    instructions on). Raises ConfigError naming what does not match its parameters."""
    params = list(fn.params)
    names = [p.name for p in params]
    const_names = [p.name for p in params if p.is_constexpr]
    runtime = [p for p in params if not p.is_constexpr]
    given = [s.strip() for s in src.signature.split(",") if s.strip()] if src.signature \
        else []
    types = {}
    if given and all("=" in g for g in given):
        for g in given:
            k, _, t = g.partition("=")
            k = k.strip()
            if k not in names:
                raise ConfigError(f"--signature: {src.kernel} has no parameter {k!r}; its "
                                  f"parameters: {', '.join(names)}")
            if k in const_names:
                raise ConfigError(f"--signature: {k} is a tl.constexpr; give it with "
                                  f"--constexpr {k}=VALUE")
            types[k] = t.strip()
    elif given and not any("=" in g for g in given):
        if len(given) != len(runtime):
            raise ConfigError(f"--signature: {len(given)} types for the {len(runtime)} "
                              f"non-constexpr parameters of {src.kernel} "
                              f"({', '.join(p.name for p in runtime)})")
        types = {p.name: t for p, t in zip(runtime, given)}
    elif given:
        raise ConfigError("--signature: give every entry as NAME=TYPE, or all of them as "
                          "bare types in parameter order")
    missing = [p.name for p in runtime if p.name not in types]
    if missing:
        raise ConfigError(f"--signature: no type for {', '.join(missing)} of {src.kernel} "
                          f"(e.g. --signature '{','.join(p.name + '=*fp32' for p in runtime)}')")
    consts = dict(src.constexprs)
    for k in consts:
        if k not in names:
            raise ConfigError(f"--constexpr {k}: {src.kernel} has no parameter {k!r}; its "
                              f"constexprs: {', '.join(const_names) or 'none'}")
        if k not in const_names:
            raise ConfigError(f"--constexpr {k}: not a tl.constexpr parameter of "
                              f"{src.kernel}; give its type with --signature")
    for p in params:
        if p.is_constexpr and p.name not in consts:
            if not p.has_default:
                raise ConfigError(f"--constexpr: no value for {p.name} of {src.kernel} "
                                  f"(--constexpr {p.name}=VALUE)")
            consts[p.name] = p.default
    signature, attrs = {}, {}
    for i, p in enumerate(params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            continue
        m = _TYPE.match(types[p.name])
        if not m:
            raise ConfigError(f"--signature {p.name}={types[p.name]}: expected a Triton type "
                              f"such as *fp32, *bf16, i32 or fp32 (known: "
                              f"{', '.join(_TYPES)}), optionally :16 or :1")
        ptr, base, hint = m.groups()
        signature[p.name] = ptr + base
        desc = ""
        if ptr and hint != "1" or not ptr and hint == "16":
            desc += "D"
        if ptr and buffer_ops:
            desc += "S"
        if desc:
            attrs[(i,)] = desc
    return signature, consts, attrs


def cache_key(src: KernelSource, fn, target) -> str:
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars

    blob = json.dumps({"user_kernel": asdict(src), "source": fn.cache_key,
                       "triton": triton.__version__,
                       "target": [target.vendor, str(target.triton_arch), target.warp_size],
                       "env": sorted(get_cache_invalidating_env_vars().items())},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class _Label:
    """What :func:`flashscope.compile.compile_failure` names a failed build by."""

    maxnreg = None

    def __init__(self, key):
        self.key = key


@contextlib.contextmanager
def _own_triton_cache():
    """Triton's cache in a folder of this build's own: Triton keys a kernel on its text,
    so a build of the same text from another file would come back naming that file in
    its line tables (gone, or not the one asked about); flashscope's cache, keyed with
    the path, keeps the builds instead."""
    import tempfile

    import triton

    knobs = triton.knobs.cache
    saved = knobs.dir
    with tempfile.TemporaryDirectory(prefix="flashscope-triton-") as d:
        knobs.dir = d
        try:
            yield
        finally:
            knobs.dir = saved


def _compile(src: KernelSource, target_name: str):
    """Compile in this process (Triton imported as a compiler): the Artifact."""
    import io

    import triton

    from .. import compile as fcompile
    from ..targets import get_target, gpu_target

    t = get_target(target_name)
    fn = _load(src.path, src.kernel)
    key = cache_key(src, fn, t)
    art = fcompile.load_cached(key)
    if art is not None:
        return art
    target = gpu_target(t)
    from triton.compiler import ASTSource, make_backend

    backend = make_backend(target)
    signature, consts, attr_desc = bind(fn, src, t.vendor == "amd" and
                                        triton.knobs.amd.use_buffer_ops)
    attrs = {k: backend.parse_attr(v) for k, v in attr_desc.items()}
    options = {"num_warps": src.num_warps, "num_stages": src.num_stages}
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    source = ASTSource(fn, signature, consts, attrs)
    label = _Label(f"{src.kernel}[{src.key}]")

    def run():
        native = []
        try:
            with contextlib.redirect_stdout(io.StringIO()), fcompile._compiler_mode(), \
                    fcompile._native_stderr() as native, _own_triton_cache():
                compiled = triton.compile(source, target=target, options=options)
        except Exception as e:
            raise ConfigError(fcompile.compile_failure(fcompile.failure_text(e), label, t,
                                                       "".join(native))) from None
        meta = fcompile.compiled_metadata(compiled)
        binkey, asmkey = ("cubin", "ptx") if t.vendor == "nvidia" else ("hsaco", "amdgcn")
        return fcompile.Artifact(
            kernel=src.kernel, target=t.name, vendor=t.vendor,
            binary=bytes(compiled.asm[binkey]), asm=str(compiled.asm[asmkey]), metadata=meta,
            config={"key": src.key, "file": src.path, "signature": signature,
                    "num_warps": src.num_warps, "num_stages": src.num_stages},
            head_dim=None, dtype=None, causal=None,
            constants={k: fcompile._plain(v) for k, v in consts.items()}, key=key)

    art = fcompile._forked(run, label, t)
    try:
        fcompile.store(art)
    except OSError as e:
        raise FlashscopeError(f"compile cache {fcompile.cache_root()}: cannot write "
                              f"({e.strerror or e})") from None
    return art


def _task(item):
    src, target = item
    try:
        return _compile(src, target)
    except FlashscopeError as e:
        return e


def build(src: KernelSource, targets, jobs: int = 1) -> list:
    """One Artifact or FlashscopeError per target name, compiled in worker processes when
    this process runs Triton's interpreter (or more than one job is asked for)."""
    from .. import compile as fcompile

    items = [(src, t) for t in targets]
    if fcompile.interpreter_imported() or (jobs > 1 and len(items) > 1):
        return fcompile.run_clean(_task, items, max(1, jobs))
    return [_task(it) for it in items]
