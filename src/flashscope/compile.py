"""Offline compilation: build any kernel config for any target, without a GPU.

:func:`build` binds the same argument list a launch passes (built by the kernel family's
``call`` (:mod:`flashscope.families`) on meta tensors of a contiguous (B, H, N, D) problem)
with the JIT's own binder for the requested target, so the specialization (which integers
are 1 or multiples of 16, pointer alignment, dtypes) and the options are exactly those of a
real launch; then ``triton.compile`` runs for that ``GPUTarget``.

Results are kept in a content-addressed cache: the key hashes the kernel's source (Triton's
``cache_key``, which covers the functions it calls), the kernel name, config, target, head
dim, dtype, causal flag, variant (window, alignment, softcap, packed), problem shape,
Triton version and the sources that build the argument list and options (launch.py,
variants.py, the family's module). The cache lives
in ``$FLASHSCOPE_CACHE``, else ``$XDG_CACHE_HOME/flashscope`` or ``~/.cache/flashscope``; a
hit needs neither torch nor a compile.

Kernels are looked up in :data:`KERNELS` (every family's kernels, registered by
:func:`_register_all` with the argument lists of :mod:`flashscope.variants`, which also
builds a variant's mask or packed batch; ``fwd`` stands for the forward family a target
runs by default).
Each compile runs in a forked child
(:func:`_forked`), so that an assertion in Triton's native code, which aborts the process
that meets it, is reported as a failed config instead of ending the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .errors import ConfigError, FlashscopeError, LimitError
from .families import Problem, family, family_of, forward_family
from .families.base import DTYPE_BYTES
from .masks import Mask
from .targets import get_target
from .variants import (VARIANT_OPTIONS, _meta_tensors, bwd_call, fwd_call, sm90_bwd_call,
                       variant_problem)

#: Representative problem a build binds: (batch, heads, kv heads, query length, key length).
#: Every size a multiple of 16, as in the benchmark suite, so the integer arguments
#: specialize like a typical launch.
DEFAULT_PROBLEM = (2, 16, 16, 1024, 1024)


# -- the kernels and their configs -------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """How to build one kernel: where its body lives (``flashscope.kernels.<module>``,
    function), the family whose config record it takes, and ``call(cfg, problem, head_dim,
    dtype, causal, **extra)`` returning (positional args, constexpr keywords) for the JIT
    binder."""

    name: str
    family: str
    module: str
    function: str
    call: Callable
    #: the (batch, heads, kv heads, query length, key length) a build binds and its
    #: default config is chosen for; None: :data:`DEFAULT_PROBLEM` and the family's
    #: default for the target, head dim, dtype and mask alone
    problem: Optional[tuple] = None
    #: the default config for a :class:`~flashscope.families.base.Problem`, where it is
    #: not the family's own (a decoding call's rows on the sm_90 forward); None: the
    #: family's
    default: Optional[Callable] = None


KERNELS: dict = {}
#: names that stand for the forward family a target runs by default
FORWARD_ALIASES = ("fwd",)


def register_kernel(spec: KernelSpec) -> None:
    """Make ``spec.name`` buildable by :func:`build` and ``flashscope inspect --kernel``."""
    KERNELS[spec.name] = spec


def kernel_names() -> tuple:
    return (*FORWARD_ALIASES, *KERNELS)


def kernel_spec(name: str, target=None, cfg=None) -> KernelSpec:
    """The kernel ``name`` stands for: a registered kernel, or ``fwd``: the forward of
    ``cfg``'s family, else the one ``target`` runs by default (sm90-fwd on sm_90,
    triton-fwd elsewhere)."""
    from .errors import unknown

    if name in FORWARD_ALIASES:
        if cfg is not None:
            fam = family_of(cfg).KERNEL
            if fam not in KERNELS:  # a family of several launches: which one to build
                own = [k for k, s in KERNELS.items() if s.family == fam]
                raise ConfigError(f"--config {fam}:...: a {fam} config builds one of its "
                                  f"kernels; name it with --kernel ({', '.join(own)})")
            return KERNELS[fam]
        t = get_target(target or "sm90")
        fam = forward_family(Problem(t.name, head_dim=128))
        return KERNELS[fam.KERNEL]
    if name not in KERNELS:
        raise unknown("--kernel", name, kernel_names(), what="kernel", error=ConfigError)
    return KERNELS[name]


def default_config(kernel: str, target, head_dim: int = 128, dtype: str = "bfloat16",
                   causal: bool = False, shape=None, **variant):
    """The config the library would run ``kernel`` with for this problem on ``target``:
    the family's tuned entry or rule (the forward family the target runs, for ``fwd``).
    ``shape``: (batch, heads, kv heads, query length, key length), else the kernel's
    representative problem; ``variant``: :data:`VARIANT_OPTIONS`."""
    return parse_config("", kernel, target, head_dim, dtype, causal, shape=shape, **variant)


def parse_config(text, kernel: str, target, head_dim: int = 128, dtype: str = "bfloat16",
                 causal: bool = False, shape=None, **variant):
    """``[family:]K=V,...`` text (or a dict of knobs) on top of ``target``'s own default for
    ``kernel`` (:func:`flashscope.families.config_from_text`) for the problem ``shape``
    (as :func:`default_config`'s); ``variant``: :data:`VARIANT_OPTIONS`."""
    from .families import config_from_text

    problem = variant_problem(target, dtype, head_dim, causal, **variant)
    spec = None if kernel in FORWARD_ALIASES else kernel_spec(kernel)
    shape = shape or (None if spec is None else spec.problem)
    if shape is not None:
        problem = dataclasses.replace(problem, **problem_fields(shape))
    base = spec.default(problem) if spec is not None and spec.default else None
    return config_from_text(text, problem, None if spec is None else spec.family, base=base)


def problem_fields(shape: tuple) -> dict:
    """The :class:`~flashscope.families.base.Problem` fields of a kernel's representative
    problem (batch, heads, kv heads, query length, key length)."""
    B, H, Hkv, Nq, Nk = shape
    return dict(n_q=Nq, n_k=Nk, heads=B * H, group=H // Hkv)


def _decode_call(kernel: str, paged: bool) -> Callable:
    """Call builder for one decoding kernel (:mod:`flashscope.families.triton_decode`) on
    meta tensors: q (B, Nq, H, D) against a cache of Nk keys a sequence, dense or in pages
    of ``page`` keys (default 16, the smallest common page size; the dense kernels build
    as they are under any), with as many new keys as queries. The attention takes a
    window and a cap (its rows always sit at the cache's end, so either alignment builds
    the same kernel); the append and the merge read no mask, so every mask builds them
    the same; no decoding kernel takes a packed batch (refused by name)."""

    def call(cfg, problem, head_dim, dtype, causal, return_lse=False, window=None,
             align="top_left", softcap=None, varlen=False, page=None):
        import torch

        from . import launch
        from .families import triton_decode as fam

        if varlen:
            raise FlashscopeError(f"--varlen: {kernel} takes no packed batch (a decoding "
                                  "step's sequences have lengths of their own)")

        B, H, Hkv, Nq, Nk = problem
        page = (page or 16) if paged else 0
        cache_shape = (B * -(-Nk // page), page, Hkv, head_dim) if paged else \
            (B, Nk, Hkv, head_dim)
        q, out, kc, vc, kn, vn = _meta_tensors(
            problem, head_dim, dtype, (B, Nq, H, head_dim), (B, Nq, H, head_dim),
            cache_shape, cache_shape, (B, Nq, Hkv, head_dim), (B, Nq, Hkv, head_dim))
        lens = torch.empty((B,), dtype=torch.int32, device="meta")
        table = torch.empty((B, -(-Nk // page)), dtype=torch.int32, device="meta") \
            if paged else None
        cache = fam.Cache.of(kc, vc, lens, table)
        lse = torch.empty((B, H, Nq), dtype=torch.float32, device="meta") \
            if return_lse else None
        size = fam.workspace_size(q.shape, cache, cfg)
        part = torch.empty((max(1, size),), dtype=torch.float32, device="meta")
        if kernel == "decode_append":
            _, args, consts = fam.append_call(kn, vn, cache)
            return args, {**consts, **fam.SMALL_OPTIONS}
        if kernel == "decode_merge":
            _, args, consts = fam.merge_call(q, cache, out, lse, part, cfg)
            return args, {**consts, **fam.SMALL_OPTIONS}
        mask = Mask.of(causal, window, "bottom_right", softcap)
        _, args, consts = fam.call(q, cache, out, lse, part, Nq, mask=mask,
                                   scale=launch.default_scale(head_dim), cfg=cfg)
        return args, {**consts, "num_stages": fam.triton_stages(cfg, paged)}

    return call


#: the decoding kernels' representative problem: one Llama-3-8B layer (32 query heads over
#: 8 kv heads) decoding one token for 8 sequences against 8192 keys
DECODE_PROBLEM = (8, 32, 8, 1, 8192)
#: the wide rows' (:func:`flashscope.families.triton_decode.forward_rows`): 64 sequences
#: of 64 query heads over 8 kv heads verifying 16 tokens against 8192 keys
DECODE_ROWS_PROBLEM = (64, 64, 8, 16, 8192)


def _decode_rows_call(cfg, problem, head_dim, dtype, causal, return_lse=False, window=None,
                      align="top_left", softcap=None, varlen=False, page=None):
    """Call builder for a decoding call's rows on the sm_90 forward
    (:class:`flashscope.kvcache._ForwardRows`) on meta tensors: q and out in the caller's
    layout (B, Nq, Hkv, G, D) where G divides 64 (GROUPED), else packed as (1, Hkv, B Nq
    G, D), a dense cache of Nk keys a sequence seen as (1, Hkv, B Nk, D) (``page``: a
    paged one, B x Nk / page pages and a block table), each sequence's keys from its
    length plus Nq appended ones, G = H / Hkv rows a position, the mask aligned
    bottom-right as a decoding call's."""
    import torch

    from . import launch
    from .families import sm90_fwd

    if varlen:
        raise FlashscopeError("--varlen: decode_rows takes no packed batch (a decoding "
                              "step's sequences have lengths of their own)")
    B, H, Hkv, Nq, Nk = problem
    G = H // Hkv
    table = None
    if page:
        check_rows_page(page)
        cols = -(-Nk // page)
        slots, rows_a_slot = B * cols, page
        table = torch.empty(B, cols, dtype=torch.int32, device="meta")
        Nk = cols * page
    else:
        slots, rows_a_slot = B, Nk
    grouped = sm90_fwd.grouped_ok(G)
    rows = (B, Nq, Hkv, G, head_dim) if grouped else (1, Hkv, B * Nq * G, head_dim)
    q, out, cache = _meta_tensors(problem, head_dim, dtype, rows, rows,
                                  (slots, rows_a_slot, Hkv, head_dim))
    kv = cache.view(1, slots * rows_a_slot, Hkv, head_dim).permute(0, 2, 1, 3)
    lse = None
    if return_lse:
        lse = torch.empty((B, H, Nq) if grouped else q.shape[:3], dtype=torch.float32,
                          device="meta")
    cu = [torch.empty(B + 1, dtype=torch.int32, device="meta") for _ in range(2)]
    used = torch.empty(B, dtype=torch.int32, device="meta")
    packed = launch.Packed(*cu, Nq * G, Nk, seqused_k=used, added_k=Nq, row_group=G,
                           block_table=table, page=page or 0)
    _, args, consts = sm90_fwd.call(q, kv, kv, out, lse,
                                    mask=Mask.of(causal, window, "bottom_right", softcap),
                                    scale=launch.default_scale(head_dim), cfg=cfg,
                                    packed=packed)
    return args, consts


def check_rows_page(page: int) -> None:
    """FlashscopeError naming ``--page`` where decode_rows cannot read pages of ``page``
    keys (:func:`flashscope.families.sm90_fwd.paged_ok`)."""
    from .families import sm90_fwd

    if not sm90_fwd.paged_ok(page):
        raise FlashscopeError(f"--page {page}: decode_rows reads pages of a power of two "
                              "of 16 keys or more")


def _decode_rows_default(problem):
    from .kvcache import forward_config

    return forward_config(problem)


def _register_all() -> None:
    from .families import sm90_bwd, sm90_fwd, triton_bwd, triton_decode, triton_fwd

    for fam in (triton_fwd, sm90_fwd):
        register_kernel(KernelSpec(fam.KERNEL, fam.KERNEL, fam.MODULE, fam.FUNCTION,
                                   fwd_call(fam.KERNEL)))
    for name, fn in triton_bwd.FUNCTIONS.items():
        register_kernel(KernelSpec(name, triton_bwd.KERNEL, triton_bwd.MODULE, fn,
                                   bwd_call(name)))
    register_kernel(KernelSpec(sm90_bwd.KERNEL, sm90_bwd.KERNEL, sm90_bwd.MODULE,
                               sm90_bwd.FUNCTION, sm90_bwd_call))
    decode = {**triton_decode.FUNCTIONS, "decode_paged": triton_decode.FUNCTION}
    for name, fn in decode.items():
        register_kernel(KernelSpec(name, triton_decode.KERNEL, triton_decode.MODULE, fn,
                                   _decode_call(name, name == "decode_paged"), DECODE_PROBLEM))
    register_kernel(KernelSpec("decode_rows", sm90_fwd.KERNEL, sm90_fwd.MODULE,
                               sm90_fwd.FUNCTION, _decode_rows_call, DECODE_ROWS_PROBLEM,
                               _decode_rows_default))


_register_all()


# -- compiling one config ----------------------------------------------------------------

@dataclass
class Artifact:
    """One compiled kernel: the binary (cubin or hsaco), Triton's assembly text (PTX or
    amdgcn), Triton's metadata (name, num_warps, num_stages, shared = dynamic shared bytes,
    target) and what it was built from. ``path`` is its cache directory."""

    kernel: str
    target: str
    vendor: str
    binary: bytes
    asm: str
    metadata: dict
    config: dict
    head_dim: int
    dtype: str
    causal: bool
    constants: dict
    key: str
    path: Optional[str] = None
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def binary_ext(self) -> str:
        return "cubin" if self.vendor == "nvidia" else "hsaco"


def cache_root() -> Path:
    """``$FLASHSCOPE_CACHE``, else ``$XDG_CACHE_HOME/flashscope``, else
    ``~/.cache/flashscope`` (the XDG base directory default)."""
    if os.environ.get("FLASHSCOPE_CACHE"):
        return Path(os.environ["FLASHSCOPE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "flashscope"


def _jit_function(spec: KernelSpec, cfg=None):
    from . import kernels

    return getattr(kernels.load(spec.module, interpret=False), spec.function)


def cache_key(kernel: str, cfg, target, head_dim: int, dtype: str, causal: bool,
              problem=DEFAULT_PROBLEM, **extra) -> str:
    """sha256 over everything that decides the binary (see the module docstring)."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars

    spec = kernel_spec(kernel, target, cfg)
    t = get_target(target)
    fn = _jit_function(spec, cfg)
    blob = json.dumps({
        "kernel": spec.name, "family": cfg.KERNEL, "source": fn.cache_key,
        "triton": triton.__version__,
        "target": [t.vendor, str(t.triton_arch), t.warp_size],
        "config": dataclasses.asdict(cfg), "head_dim": head_dim, "dtype": dtype,
        "causal": bool(causal), "problem": list(problem), "extra": extra,
        # The launcher derives the options (maxnreg, waves_per_eu), the family module and
        # the mask the argument list.
        "launcher": _launcher_hash(spec.family),
        "env": sorted(get_cache_invalidating_env_vars().items()),
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _launcher_hash(fam: str) -> str:
    here = Path(__file__).parent
    files = ("launch.py", "masks.py", "variants.py", f"families/{fam.replace('-', '_')}.py",
             "families/base.py")
    h = hashlib.sha256()
    for f in files:
        h.update((here / f).read_bytes())
    return h.hexdigest()


def _bind(spec: KernelSpec, cfg, t, head_dim, dtype, causal, problem, extra):
    """(ASTSource, options dict, constants by name) exactly as ``JITFunction.run`` makes
    them on a device of target ``t``."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from .compat import run_keywords
    from .launch import vendor_options
    from .targets import gpu_target

    fn = _jit_function(spec, cfg)
    target = gpu_target(t)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args, consts = spec.call(cfg, problem, head_dim, dtype, causal, **extra)
    kwargs = run_keywords(fn, {**vendor_options(cfg, t.vendor), **consts})
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                           specialization, options)
    names = list(fn.signature.parameters)
    constants = {names[path[0]]: _plain(v) for path, v in constexprs.items() if len(path) == 1}
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    return ASTSource(fn, signature, constexprs, attrs), target, options, constants


#: Compiler messages that mean a resource limit, and the limit to name.
_LIMIT_MESSAGES = (
    ("Insufficient registers", "registers per thread"),
    ("too much shared data", "shared memory"),
    ("out of resource", "shared memory"),
    ("local memory", "local memory"),
)


#: Lines of native compiler output (MLIR/LLVM on fd 2) that say why a pass failed.
_NATIVE_CAUSES = ("UNREACHABLE", "unsupported", "LLVM ERROR", "Assertion", "error:")
_NATIVE_NOISE = ("Failures have been detected", "Pipeline failed while executing")


def failure_text(e: BaseException) -> str:
    """The text of a compile exception, with the message of its innermost cause first
    when the outer one is only a source location: a frontend error nested in a
    ``warp_specialize`` partition reads ``at 62:8:`` and a source excerpt, and the reason
    (``rank must be equal to ...``) is on the exception it was raised from."""
    text = str(e)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not re.fullmatch(r"at \d+:\d+:", first):
        return text
    inner, seen = e, set()
    while (inner.__cause__ or inner.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    reason = next((ln.strip() for ln in reversed(str(inner).splitlines()) if ln.strip()), "")
    return f"{reason} ({first[:-1]})\n{text}" if reason and reason != first else text


def compile_failure(message: str, cfg, t, native: str = "") -> str:
    """One line for a failed compile: the compiler's own diagnostic line (ptxas fatal/error
    lines first, then the first cause in ``native``, what MLIR/LLVM printed) and, when it
    is a resource limit, which one."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    diag = next((ln for ln in lines if "fatal" in ln or "error" in ln.lower()
                 and "ptxas" in ln), lines[0] if lines else "unknown error")
    cause = next((ln.strip() for ln in native.splitlines()
                  if any(c in ln for c in _NATIVE_CAUSES)
                  and not any(n in ln for n in _NATIVE_NOISE)), None)
    if cause:
        # "python: /path/File.cpp:1200: <signature>: Assertion `...' failed." -> its place
        # and the assertion, which the signature would push past the line's end
        m = re.match(r"(?:\S+: )?(\S+\.\w+):(\d+): .*?: (Assertion .*)$", cause)
        if m:
            cause = f"{os.path.basename(m.group(1))}:{m.group(2)}: {m.group(3)}"
    if cause and cause not in diag:
        diag = f"{diag}: {cause}"
    limit = next((name for pat, name in _LIMIT_MESSAGES if pat in message), None)
    if limit == "registers per thread" and getattr(cfg, "maxnreg", None) is not None:
        lead = (f"config {_label(cfg)}: maxnreg={cfg.maxnreg} is too few registers per thread "
                f"for {t.name}")
    elif limit:
        lead = f"config {_label(cfg)}: over the {limit} limit of {t.name}"
    else:
        lead = f"config {_label(cfg)}: Triton could not compile it for {t.name}"
    return f"{lead} ({diag[:240]})"


def _plain(v):
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


#: set in a forked compile (:func:`_forked`): the folder where :func:`_native_stderr`
#: keeps its text under a name the parent can read should the child die
_native_dir: Optional[str] = None


@contextlib.contextmanager
def _native_stderr():
    """Hold what native code (MLIR, LLVM) writes to file descriptor 2 during the block: a
    failing pass prints a whole IR reproducer there. Yields a list that receives the text;
    the caller passes it on (success) or condenses it into the error (failure)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    held = []
    with (open(os.path.join(_native_dir, "native.txt"), "w+b") if _native_dir
          else tempfile.TemporaryFile()) as f:
        os.dup2(f.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            held.append(f.read().decode("utf-8", "replace"))


@contextlib.contextmanager
def _compiler_mode():
    """Triton's code generator consults ``knobs.runtime.interpret`` while lowering (integer
    division, for one); a process running the CPU interpreter (TRITON_INTERPRET=1) must
    still compile for the GPU here."""
    import triton

    knobs = triton.knobs.runtime
    saved = knobs.interpret
    knobs.interpret = False
    try:
        yield
    finally:
        knobs.interpret = saved


def _forked(fn, cfg, t):
    """``fn()`` in a forked child process: its result, or the exception it raised, pickled
    back. An MLIR or LLVM assertion inside the compiler ends its process with SIGABRT,
    which Python cannot catch: here it ends the child, and becomes a ConfigError naming the
    config, the signal and the assertion the compiler printed (instead of this process
    dying without a word, its stderr held by :func:`_native_stderr`). Where ``os.fork``
    is missing, ``fn()`` runs in this process."""
    global _native_dir
    if not hasattr(os, "fork"):
        return fn()
    import pickle
    import signal
    import sys
    import traceback

    with tempfile.TemporaryDirectory(prefix="flashscope-compile-") as d:
        result = os.path.join(d, "result.pickle")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: reports through ``result`` and never returns
            code = 1
            try:
                import faulthandler

                faulthandler.disable()  # an abort here is the parent's to report
                _native_dir = d
                try:
                    out = (True, fn())
                except BaseException as e:  # noqa: BLE001 (all of it goes to the parent)
                    out = (False, e)
                try:
                    data = pickle.dumps(out)
                except Exception:  # an exception that does not pickle: its text does
                    data = pickle.dumps((False, FlashscopeError(
                        "".join(traceback.format_exception(out[1])).strip())))
                with open(result, "wb") as f:
                    f.write(data)
                code = 0
            finally:
                os._exit(code)
        try:
            _, status = os.waitpid(pid, 0)
        except BaseException:  # interrupted (Ctrl-C): the child goes too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            with open(result, "rb") as f:
                ok, value = pickle.load(f)
            if ok:
                return value
            raise value
        native_path = os.path.join(d, "native.txt")
        native = ""
        if os.path.exists(native_path):
            with open(native_path, "rb") as f:
                native = f.read().decode("utf-8", "replace")
        how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
               else f"exit status {os.WEXITSTATUS(status)}")
        raise ConfigError(compile_failure(f"the compiler's process ended ({how})", cfg, t,
                                          native))


def _compile(spec, cfg, t, head_dim, dtype, causal, problem, extra, key) -> Artifact:
    src, target, options, constants = _bind(spec, cfg, t, head_dim, dtype, causal, problem,
                                            extra)
    return _forked(lambda: _run_compiler(spec, cfg, t, head_dim, dtype, causal, extra, key,
                                         src, target, options, constants), cfg, t)


def _run_compiler(spec, cfg, t, head_dim, dtype, causal, extra, key, src, target, options,
                  constants) -> Artifact:
    """``triton.compile`` of what :func:`_bind` made, and the Artifact of its binary."""
    import triton

    native = []
    try:
        # Triton prints a whole PTX reproducer on stdout when ptxas fails, MLIR an IR one on
        # fd 2 when a pass fails; keep both out of the caller's output (the error below
        # names the cause).
        with contextlib.redirect_stdout(io.StringIO()), _compiler_mode(), \
                _native_stderr() as native:
            compiled = triton.compile(src, target=target, options=options.__dict__)
    except Exception as e:
        raise ConfigError(compile_failure(failure_text(e), cfg, t, "".join(native))) from None
    if native and native[0].strip():
        import sys

        sys.stderr.write(native[0])
    meta = compiled_metadata(compiled)
    binkey = "cubin" if t.vendor == "nvidia" else "hsaco"
    asmkey = "ptx" if t.vendor == "nvidia" else "amdgcn"
    return Artifact(kernel=spec.name, target=t.name, vendor=t.vendor,
                    binary=bytes(compiled.asm[binkey]), asm=str(compiled.asm[asmkey]),
                    metadata=meta, config=_config_dict(cfg), head_dim=head_dim, dtype=dtype,
                    causal=bool(causal), constants=constants, key=key, extra=dict(extra))


def compiled_metadata(compiled) -> dict:
    """What an Artifact keeps of a compiled kernel's metadata (JSON-ready): name, warps,
    stages, dynamic shared bytes, target, Triton's version and the register options."""
    import triton

    md = compiled.metadata
    meta = {"name": md.name, "num_warps": md.num_warps, "num_stages": md.num_stages,
            "shared": md.shared, "target": {"backend": md.target.backend,
                                            "arch": md.target.arch,
                                            "warp_size": md.target.warp_size},
            "triton_version": triton.__version__}
    for opt in ("maxnreg", "waves_per_eu"):
        if getattr(md, opt, None) is not None:
            meta[opt] = getattr(md, opt)
    return meta


def _config_dict(cfg) -> dict:
    return {**dataclasses.asdict(cfg), "kernel": cfg.KERNEL, "key": cfg.key,
            "label": cfg.label}


def _label(cfg) -> str:
    return getattr(cfg, "label", None) or str(cfg)


# -- the cache ---------------------------------------------------------------------------

def _entry_dir(key: str) -> Path:
    return cache_root() / key[:2] / key


def load_cached(key: str) -> Optional[Artifact]:
    """The cached artifact for ``key``, or None (a damaged entry counts as a miss)."""
    d = _entry_dir(key)
    try:
        meta = json.loads((d / "artifact.json").read_text())
        binary = (d / meta["binary_file"]).read_bytes()
        asm = (d / meta["asm_file"]).read_text()
    except (OSError, ValueError, KeyError):
        return None
    fields = {f.name for f in dataclasses.fields(Artifact)} - {"binary", "asm", "path"}
    return Artifact(binary=binary, asm=asm, path=str(d),
                    **{k: v for k, v in meta.items() if k in fields})


def store(art: Artifact) -> Artifact:
    """Write ``art`` under its key; files first, ``artifact.json`` last and atomically."""
    d = _entry_dir(art.key)
    d.mkdir(parents=True, exist_ok=True)
    binary_file = f"{art.name}.{art.binary_ext}"
    asm_file = f"{art.name}.{'ptx' if art.vendor == 'nvidia' else 'amdgcn'}"
    _atomic_write(d / binary_file, art.binary)
    _atomic_write(d / asm_file, art.asm.encode())
    meta = {f.name: getattr(art, f.name) for f in dataclasses.fields(Artifact)
            if f.name not in ("binary", "asm", "path")}
    meta.update(binary_file=binary_file, asm_file=asm_file)
    _atomic_write(d / "artifact.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    art.path = str(d)
    return art


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- the public entry point --------------------------------------------------------------

def check_limits(art: Artifact) -> Artifact:
    """LimitError (a ConfigError) when the binary needs more shared memory (static +
    Triton's dynamic) or threads than one block may have on its target (Triton itself
    only fails at launch)."""
    t = get_target(art.target)
    shared = int(art.metadata.get("shared") or 0)
    threads = int(art.metadata["num_warps"]) * t.warp_size
    label = art.config.get("label") or art.config.get("key", art.kernel)
    if shared > t.smem_per_block_optin:
        what = "shared memory" if t.vendor == "nvidia" else "LDS"
        raise LimitError(f"config {label}, head dim {art.head_dim}: the {art.kernel} kernel "
                         f"needs {shared} bytes of {what} per block; {t.name} allows "
                         f"{t.smem_per_block_optin}")
    if threads > t.max_threads_per_block:
        raise LimitError(f"config {label}: {threads} threads per block; {t.name} allows "
                         f"{t.max_threads_per_block}")
    return art


def build(config, target, *, head_dim: int = 128, dtype: str = "bfloat16",
          causal: bool = False, kernel: str = "fwd", problem=None,
          use_cache: bool = True, check: bool = True, **extra) -> Artifact:
    """Compile ``kernel`` with ``config`` for ``target`` (e.g. "sm90", "gfx942").

    ``config``: a config record of the kernel's family (for ``fwd``: any forward family's,
    which picks the kernel), or ``K=V,...`` text on top of the target's own default
    (:func:`parse_config`). The family's rules first, then the cache, then the compiler;
    with ``check`` the binary's shared memory and threads are checked against the target.
    ``extra`` goes to the kernel's call builder (forward: ``return_lse``; every kernel:
    :data:`VARIANT_OPTIONS`, which also pick the ``fwd`` family and the default config
    that ``K=V`` text starts from)."""
    t = get_target(target)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if isinstance(config, (str, dict)):
        config = parse_config(config, kernel, t, head_dim, dtype, causal, shape=problem,
                              **{k: v for k, v in extra.items() if k in VARIANT_OPTIONS})
    spec = kernel_spec(kernel, t, config)
    if getattr(config, "KERNEL", None) != spec.family:
        raise ConfigError(f"config for kernel {spec.name!r}: expected a {spec.family} config, "
                          f"got {type(config).__name__}")
    family(spec.family).check(config, t, head_dim, dtype)
    problem = tuple(int(x) for x in (problem or spec.problem or DEFAULT_PROBLEM))
    key = cache_key(spec.name, config, t, head_dim, dtype, causal, problem, **extra)
    art = load_cached(key) if use_cache else None
    if art is None and interpreter_imported():
        art = run_clean(_build_task, [(config, t.name, dict(
            head_dim=head_dim, dtype=dtype, causal=causal, kernel=spec.name, problem=problem,
            use_cache=use_cache, check=False, **extra))])[0]
        if isinstance(art, Exception):
            raise art
    elif art is None:
        art = _compile(spec, config, t, head_dim, dtype, causal, problem, extra, key)
        if use_cache:
            try:
                store(art)
            except OSError as e:
                raise FlashscopeError(f"compile cache {cache_root()}: cannot write "
                                      f"({e.strerror or e})") from None
    return check_limits(art) if check else art


# -- compiling in other processes --------------------------------------------------------

def interpreter_imported() -> bool:
    """True when this process runs Triton's CPU interpreter (TRITON_INTERPRET=1 when
    Triton was imported): its language helpers are then interpreter functions and cannot
    be compiled for a GPU in this process, so compiles go to clean worker processes."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _build_task(item):
    cfg, target, kw = item
    try:
        return build(cfg, target, **kw)
    except FlashscopeError as e:
        return e


def run_clean(fn, items, jobs: int = 1) -> list:
    """``[fn(item) for item in items]`` in up to ``jobs`` worker processes
    (:func:`run_clean_iter`, results put back in order)."""
    out = [None] * len(items)
    for i, r in run_clean_iter(fn, items, jobs):
        out[i] = r
    return out


def run_clean_iter(fn, items, jobs: int = 1):
    """Yield ``(i, fn(items[i]))`` as each finishes, in up to ``jobs`` worker processes
    that take the items in list order.

    Workers are forked (instant: Triton is loaded already) unless this process runs the
    interpreter; then they are spawned with TRITON_INTERPRET removed from their
    environment, so that they import Triton as a compiler."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    items = list(items)
    if not items:
        return
    clean = interpreter_imported()
    methods = multiprocessing.get_all_start_methods()
    method = "fork" if "fork" in methods and not clean else "spawn"
    if method == "fork":
        import torch  # noqa: F401  (bound once here, not once per forked worker)
    saved = os.environ.pop("TRITON_INTERPRET", None) if clean else None
    from .workers import pool_args, stop_pool

    try:
        pool = ProcessPoolExecutor(max_workers=max(1, min(jobs, len(items))),
                                   mp_context=multiprocessing.get_context(method),
                                   **pool_args())
        try:
            futs = {pool.submit(fn, it): i for i, it in enumerate(items)}
            if saved is not None:  # spawned workers are started by now: restore at once
                os.environ["TRITON_INTERPRET"] = saved
                saved = None
            for f in as_completed(futs):
                yield futs[f], f.result()
        except BaseException:  # Ctrl-C, an error, or the consumer gone: stop at once
            stop_pool(pool)
            raise
        pool.shutdown(wait=True)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
