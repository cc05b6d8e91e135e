"""``flashscope inspect``: registers, spills, memory and instruction mix read from compiled
kernels, for any config x target, without a GPU; or from binaries already on disk."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCALARS = ("kernel", "target", "config", "head_dim", "dtype", "causal", "num_warps",
           "num_stages", "wave_size", "threads", "registers", "agprs", "sgprs",
           "spill_stores", "spill_loads", "vgpr_spills", "sgpr_spills", "local_bytes",
           "static_shared_bytes", "dynamic_shared_bytes", "shared_bytes",
           "reserved_shared_bytes", "barriers",
           "instructions", "occupancy", "limiter", "features", "source")


def register(sub):
    p = sub.add_parser(
        "inspect", help="registers, spills, shared memory and instruction mix from binaries",
        description="Compile flashscope's attention kernel for configs x targets (no GPU "
                    "needed) and read, from the cubin/SASS or hsaco/amdgcn: registers per "
                    "thread (AMD: .vgpr_count, AGPRs included on gfx90a+), spills (NVIDIA: "
                    "STL/LDL instructions; AMD: the code object's spill counts), local/scratch "
                    "bytes, shared = static + dynamic bytes as the driver counts them (the "
                    "1 KB system reserve of sm_90+ cubins reported apart), and the "
                    "instruction mix. With PATH, read a .cubin, a .hsaco or a Triton cache "
                    "directory instead.")
    p.add_argument("path", nargs="?", help=".cubin, .hsaco, a Triton cache directory, or "
                   "FILE.py:KERNEL (any @triton.jit or Gluon kernel, compiled for --target "
                   "with --signature and --constexpr)")
    p.add_argument("--target", default="sm90",
                   help="comma-separated targets, e.g. sm90,gfx942 (default sm90)")
    p.add_argument("--config", action="append", default=[], metavar="K=V,...",
                   help="config, e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8 (repeatable; keys "
                        "not given keep their defaults); default: the target's default config")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs (objects or 'K=V,...' strings)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--lse", action="store_true",
                   help="build the variant that also writes the log-sum-exp (training)")
    p.add_argument("--kernel", default="fwd", help="registered kernel name (default fwd)")
    p.add_argument("--jobs", type=int, default=0,
                   help="parallel compile processes (default: one per CPU core)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"),
                   help="compare two configs (K=V,... on the first --target) or two artifacts")
    p.add_argument("--opcodes", action="store_true", help="also print per-opcode counts")
    p.add_argument("--lines", action="store_true",
                   help="per source line: instructions by class, live registers (peak and "
                        "mean), spills, and what inlined helpers add at their call sites; "
                        "with the register checks of each kernel")
    p.add_argument("--top", type=int, default=0, metavar="N",
                   help="with --lines: the N lines with the most instructions (default all)")
    user = p.add_argument_group("FILE.py:KERNEL (a kernel of your own)")
    user.add_argument("--signature", default="", metavar="NAME=TYPE,...",
                      help="types of the non-constexpr parameters, e.g. "
                           "'X=*fp32,Y=*fp32,N=i32:16' or '*fp32,*fp32,i32' in order "
                           "(pointers 16-byte aligned unless TYPE:1; an integer :16 is a "
                           "multiple of 16)")
    user.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                      help="a tl.constexpr value (repeatable); parameters with a default "
                           "may be left out")
    user.add_argument("--num-warps", type=int, default=4)
    user.add_argument("--num-stages", type=int, default=3)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON on stdout")
    out.add_argument("--csv", action="store_true", help="CSV on stdout")
    p.set_defaults(func=run)


def _configs(args, spec):
    from ..errors import ConfigError

    texts = list(args.config)
    if args.configs:
        try:
            items = json.loads(Path(args.configs).read_text())
        except OSError as e:
            raise ConfigError(f"--configs {args.configs}: cannot read ({e.strerror})") from None
        except ValueError as e:
            raise ConfigError(f"--configs {args.configs}: not JSON ({e})") from None
        if not isinstance(items, list) or not items:
            raise ConfigError(f"--configs {args.configs}: expected a non-empty JSON list")
        for it in items:
            if isinstance(it, dict):
                texts.append(spec.config_type.from_dict(it))
            elif isinstance(it, str):
                texts.append(it)
            else:
                raise ConfigError(f"--configs {args.configs}: each entry must be an object "
                                  f"or a 'K=V,...' string, got {type(it).__name__}")
    return [t if isinstance(t, spec.config_type) else spec.config_type.parse(t) for t in texts]


def _build_kw(args):
    kw = dict(head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
              kernel=args.kernel)
    if args.lse:
        kw["return_lse"] = True
    return kw


def _compile_records(args):
    from .. import compile as fcompile
    from ..errors import FlashscopeError
    from ..isa import inspect_configs
    from ..targets import parse_targets

    if args.jobs < 0:
        raise FlashscopeError(f"--jobs {args.jobs}: expected 0 (one per core) or more")
    spec = fcompile.kernel_spec(args.kernel)
    targets = parse_targets(args.target)
    configs = _configs(args, spec)
    kw = _build_kw(args)
    if configs:
        items = [(c, t) for c in configs for t in targets]
        results = inspect_configs(configs, targets, jobs=args.jobs, **kw)
    else:
        if spec.default is None:
            raise FlashscopeError(f"--kernel {args.kernel}: no default config; pass --config")
        items, results = [], []
        for t in targets:
            c = spec.default(args.head_dim, args.dtype, args.causal, t)
            items.append((c, t))
            results += inspect_configs([c], [t], jobs=args.jobs, **kw)
    return items, results


def _artifacts(args, items, results):
    """The compiled artifacts behind the records of a config run (cache hits by now)."""
    from .. import compile as fcompile

    kw = _build_kw(args)
    return [fcompile.build(c, t, **kw) for (c, t), r in zip(items, results)
            if not isinstance(r, Exception)]


def _resolve_side(text, args):
    """A --diff operand: an existing path (its single kernel), else a config."""
    from ..errors import FlashscopeError
    from ..isa import inspect_config, read_path
    from ..targets import parse_targets

    if Path(text).exists():
        recs = read_path(text)
        if len(recs) != 1:
            raise FlashscopeError(f"--diff {text}: holds {len(recs)} kernels; give one binary")
        return recs[0]
    from .. import compile as fcompile

    spec = fcompile.kernel_spec(args.kernel)
    if "=" not in text:
        raise FlashscopeError(f"--diff {text!r}: neither an existing file nor a K=V config")
    return inspect_config(spec.config_type.parse(text), parse_targets(args.target)[0],
                          **_build_kw(args))


def _user_records(args):
    """Records and artifacts of ``FILE.py:KERNEL`` for each --target."""
    from ..errors import FlashscopeError
    from ..isa import attach_occupancy, record_for, user_kernel
    from ..targets import parse_targets

    if args.config or args.configs:
        raise FlashscopeError("FILE.py:KERNEL takes --signature/--constexpr, not --config")
    if args.num_warps < 1 or args.num_stages < 1:
        raise FlashscopeError("--num-warps and --num-stages: expected positive integers")
    path, name = user_kernel.parse_spec(args.path)
    src = user_kernel.KernelSource(path, name, args.signature,
                                   user_kernel.parse_constexprs(args.constexpr),
                                   args.num_warps, args.num_stages)
    targets = parse_targets(args.target)
    records, arts, errors = [], [], []
    for t, art in zip(targets, user_kernel.build(src, [t.name for t in targets], args.jobs)):
        if isinstance(art, FlashscopeError):
            errors.append({"target": t.name, "config": {"key": src.key}, "error": str(art)})
            continue
        records.append(attach_occupancy(record_for(art)))
        arts.append(art)
    if not records:
        raise FlashscopeError(errors[0]["error"])
    return records, arts, errors


def _is_user_kernel(path) -> bool:
    import re

    return bool(path) and re.search(r"\.py:[A-Za-z_]\w*$", path) is not None


def run(args):
    from ..errors import FlashscopeError
    from ..isa import diff, read_path

    if args.diff:
        if args.lines:
            raise FlashscopeError("--lines reads kernels one by one; give them without --diff")
        if args.path or args.config or args.configs:
            raise FlashscopeError("--diff A B takes its two operands alone (no PATH/--config)")
        d = diff(_resolve_side(args.diff[0], args), _resolve_side(args.diff[1], args))
        if args.json:
            json.dump(d, sys.stdout, indent=1)
            print()
        elif args.csv:
            _diff_csv(d)
        else:
            _diff_table(d)
        return 0
    errors, arts = [], None
    if args.top < 0:
        raise FlashscopeError(f"--top {args.top}: expected 0 (all lines) or more")
    if (args.signature or args.constexpr) and not _is_user_kernel(args.path):
        raise FlashscopeError("--signature/--constexpr go with FILE.py:KERNEL")
    if _is_user_kernel(args.path):
        records, arts, errors = _user_records(args)
    elif args.path:
        if args.config or args.configs:
            raise FlashscopeError("PATH and --config/--configs exclude each other")
        records = read_path(args.path)
    else:
        items, results = _compile_records(args)
        records = [r for r in results if not isinstance(r, Exception)]
        errors = [{"target": t.name, "config": c.as_dict(), "error": str(r)}
                  for (c, t), r in zip(items, results) if isinstance(r, Exception)]
        if not records:
            raise errors and FlashscopeError(errors[0]["error"])
        if args.lines:
            arts = _artifacts(args, items, results)
    if args.lines:
        from .inspect_lines import show

        return show(args, records, arts, errors)
    if args.json:
        json.dump({"kernels": [r.as_dict() for r in records], "errors": errors},
                  sys.stdout, indent=1)
        print()
    elif args.csv:
        _csv(records)
    else:
        _table(records, errors, args.opcodes)
    if errors:
        raise FlashscopeError(f"{len(errors)} of {len(errors) + len(records)} builds failed; "
                              f"first: {errors[0]['error']}")
    return 0


def _flat(rec) -> dict:
    d = rec.as_dict()
    row = {}
    for k in SCALARS:
        v = d.get(k)
        if k == "config":
            v = (v or {}).get("key") if isinstance(v, dict) else v
        elif isinstance(v, list):
            v = ";".join(map(str, v))
        row[k] = v
    for c, n in (d.get("mix") or {}).items():
        row[f"mix.{c}"] = n
    return row


def _csv(records):
    import csv

    rows = [_flat(r) for r in records]
    cols = list(SCALARS) + sorted({k for r in rows for k in r if k.startswith("mix.")})
    w = csv.DictWriter(sys.stdout, fieldnames=cols, restval="")
    w.writeheader()
    w.writerows(rows)


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0%}" if v <= 1 else f"{v:.2f}"
    return str(v)


def _table(records, errors, opcodes):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title="Kernel resources, read from the binaries")
    for col in ("target", "config", "warps", "regs", "agpr/sgpr", "spills st/ld",
                "local B", "shared B (static+dyn)", "mma", "exp", "features", "occupancy",
                "limiter"):
        t.add_column(col)
    for r in records:
        cfg = (r.config or {}).get("key") if isinstance(r.config, dict) else None
        spills = (f"{r.spill_stores}/{r.spill_loads}" if r.vendor == "nvidia"
                  else f"v{_fmt(r.vgpr_spills)} s{_fmt(r.sgpr_spills)}")
        gprs = f"{_fmt(r.agprs)}/{_fmt(r.sgprs)}" if r.vendor == "amd" else "-"
        shared = (f"{_fmt(r.shared_bytes)} ({_fmt(r.static_shared_bytes)}+"
                  f"{_fmt(r.dynamic_shared_bytes)})"
                  + (f" +{r.reserved_shared_bytes} rsv" if r.reserved_shared_bytes else ""))
        mix = r.mix or {}
        t.add_row(r.target, cfg or r.kernel, _fmt(r.num_warps), _fmt(r.registers), gprs,
                  spills, _fmt(r.local_bytes), shared, _fmt(mix.get("mma", mix.get("mfma"))),
                  _fmt(mix.get("exp")), ", ".join(r.features) or "-", _fmt(r.occupancy),
                  ", ".join(r.limiter) if r.limiter else "-")
    for e in errors:
        t.add_row(e["target"], e["config"].get("key", "?") if isinstance(e["config"], dict)
                  else "?", *["-"] * 8, "error", "-", "-")
    console.print(t)
    if opcodes:
        for r in records:
            console.print(f"[bold]{r.label}[/bold] " + " ".join(
                f"{k}:{v}" for k, v in sorted((r.opcodes or {}).items(),
                                              key=lambda kv: -kv[1])))


def _diff_table(d):
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"B - A   A = {d['a']}   B = {d['b']}")
    for col in ("field", "A", "B", "delta"):
        t.add_column(col)
    for name, e in list(d["fields"].items()) + [(f"mix.{k}", v) for k, v in d["mix"].items()]:
        delta = e["delta"]
        t.add_row(name, _fmt(e["a"]), _fmt(e["b"]),
                  "-" if delta is None else (f"{delta:+d}" if isinstance(delta, int)
                                             else f"{delta:+}"))
    Console(width=None if sys.stdout.isatty() else 160).print(t)


def _diff_csv(d):
    import csv

    w = csv.writer(sys.stdout)
    w.writerow(["field", "a", "b", "delta"])
    for name, e in list(d["fields"].items()) + [(f"mix.{k}", v) for k, v in d["mix"].items()]:
        w.writerow([name, e["a"], e["b"], e["delta"]])
