"""``flashscope inspect``: registers, spills, memory and instruction mix read from compiled
kernels, for any config x target, without a GPU; or from binaries already on disk."""

from __future__ import annotations

import sys
from pathlib import Path

from . import common

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
                    "directory instead (links leading outside the directory are not "
                    "followed).")
    p.add_argument("path", nargs="?", help=".cubin, .hsaco, a Triton cache directory, or "
                   "FILE.py:KERNEL (any @triton.jit or Gluon kernel, compiled for --target "
                   "with --signature and --constexpr)")
    common.add_target(p, default="sm90")
    p.add_argument("--config", action="append", default=[], metavar="[FAMILY:]K=V,...",
                   help="config, e.g. BLOCK_M=128,num_warps=8 (repeatable; keys not given "
                        "keep the target's own default); a family prefix picks the kernel, "
                        "e.g. sm90-fwd:BLOCK_M=192; default: the target's default config")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs (objects or 'K=V,...' strings)")
    common.add_head_dim(p, default=None, help="head dims, comma list (default 128; with "
                        "--shape its D)")
    p.add_argument("--shape", metavar="B,H,N,D[,Nk[,Hkv]]",
                   help="build for this problem, as bench's --shape: the launch arguments "
                        "and the default config of these lengths and heads (a key length "
                        "off the tiles, say, builds the masked tail a real call runs); "
                        "default: a representative problem of 1024 rows, all multiples of "
                        "16")
    common.add_dtype(p, default="bf16")
    common.add_causal(p, default="no")
    p.add_argument("--lse", action="store_true",
                   help="build the variant that also writes the log-sum-exp (training)")
    common.add_variant(p)
    p.add_argument("--kernel", default="fwd",
                   help="fwd (default: the forward kernel each target runs), triton-fwd, "
                        "sm90-fwd, bwd_preprocess, bwd_dkdv, bwd_dq, bwd_sum (a shared GQA "
                        "group's partial sums), sm90-bwd (the Hopper backward), "
                        "triton-decode, decode_paged, decode_merge, decode_append or "
                        "decode_rows (decoding's wide rows on the sm_90 forward)")
    p.add_argument("--jobs", type=common.integer(0), default=0,
                   help="parallel compile processes (default 0: one per CPU core)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"),
                   help="compare two configs (K=V,... on the first --target; target=, "
                        "head_dim=, dtype=, causal=, varlen= set that side's build) or two "
                        "artifacts; "
                        "with --lines also loop by loop and the source lines that changed "
                        "most")
    p.add_argument("--opcodes", action="store_true",
                   help="also print per-opcode counts (with --diff: the opcodes whose count "
                        "differs)")
    common.add_output(p)
    p.add_argument("--lines", action="store_true",
                   help="per source line: instructions by class, live registers (peak and "
                        "mean), spills, and what inlined helpers add at their call sites; "
                        "with the register checks of each kernel")
    p.add_argument("--top", type=common.integer(0), default=0, metavar="N",
                   help="with --lines: the N lines with the most instructions (default all; "
                        "with --diff the 20 that changed most)")
    user = p.add_argument_group("FILE.py:KERNEL (a kernel of your own)")
    user.add_argument("--signature", default="", metavar="NAME=TYPE,...",
                      help="types of the non-constexpr parameters, e.g. "
                           "'X=*fp32,Y=*fp32,N=i32:16' or '*fp32,*fp32,i32' in order "
                           "(pointers 16-byte aligned unless TYPE:1; an integer :16 is a "
                           "multiple of 16)")
    user.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                      help="a tl.constexpr value (repeatable); parameters with a default "
                           "may be left out")
    user.add_argument("--num-warps", type=common.integer(1), default=4)
    user.add_argument("--num-stages", type=common.integer(1), default=3)
    p.set_defaults(func=run)


def _config_items(args) -> list:
    """The --config texts and --configs entries (objects or 'K=V,...' strings), each parsed
    later per target and variant, on top of that target's own default."""
    items = list(args.config)
    if args.configs:
        data = common.read_json(args.configs, "--configs")
        if isinstance(data, dict) and "configs" in data:
            data = data["configs"]
        if not isinstance(data, list) or not data:
            from ..errors import FlashscopeError

            raise FlashscopeError(f"--configs {args.configs}: expected a non-empty JSON list "
                                  "of configs (objects or 'K=V,...' strings)")
        items += [(i, it) for i, it in enumerate(data)]
    return items


def _parse(args, item, target, d, dt, c, variant=None):
    """A config on top of ``target``'s default for the variant (``variant``: build
    keywords instead of the command's, a --diff side's)."""
    from .. import compile as fcompile

    where = (f"--configs {args.configs}: entry {item[0]}" if isinstance(item, tuple)
             else f"--config {item!r}")  # a --diff operand is a --config alike
    text = item[1] if isinstance(item, tuple) else item
    kw = _extra(args) if variant is None else variant
    shape = kw.get("problem")
    kw = {k: v for k, v in kw.items() if k != "problem"}
    return common.config_from(
        lambda x: fcompile.parse_config(x, args.kernel, target, d, dt, c, shape=shape, **kw),
        text, where)


def _resolve_shape(args) -> None:
    """--shape into the head dim and the build's problem (``args.problem``: (B, H, Hkv,
    Nq, Nk), None without one); --head-dim beside it is refused."""
    from ..bench.suite import parse_shape
    from ..errors import FlashscopeError

    args.problem = None
    if args.shape is None:
        args.head_dim = args.head_dim or [128]
        return
    if args.head_dim is not None:
        raise FlashscopeError("--head-dim: give the head dim in --shape B,H,N,D[,Nk[,Hkv]] "
                              "or --head-dim, not both")
    B, H, Nq, D, Nk, Hkv = parse_shape(args.shape)
    args.head_dim, args.problem = [D], (B, H, Hkv, Nq, Nk)


def _extra(args) -> dict:
    """The build keywords of the command's variant flags and --shape."""
    kw = common.variant_kw(args)
    if getattr(args, "problem", None) is not None:
        kw["problem"] = args.problem
    return kw


def _variants(args) -> list:
    """(head_dim, dtype, causal) of every kernel variant asked for."""
    return [(d, t, c) for d in args.head_dim for t in args.dtype for c in args.causal]


def _build_kw(args, head_dim, dtype, causal, variant=None) -> dict:
    kw = dict(head_dim=head_dim, dtype=dtype, causal=causal, kernel=args.kernel,
              **(_extra(args) if variant is None else variant))
    if args.lse:
        kw["return_lse"] = True
    return kw


def _compile_records(args):
    from .. import compile as fcompile
    from ..isa import inspect_pairs
    from ..progress import Progress

    fcompile.kernel_spec(args.kernel)  # an unknown --kernel is refused before any work
    texts = _config_items(args) or [""]
    batches = []  # (items, pairs, kw)
    for d, dt, c in _variants(args):
        kw = _build_kw(args, d, dt, c)
        pairs = [(_parse(args, x, t, d, dt, c), t) for x in texts for t in args.target]
        batches.append(([(cfg, t, kw) for cfg, t in pairs], pairs, kw))
    total = sum(len(b[0]) for b in batches)
    items, results = [], []
    with Progress("compiling", total) as bar:
        for its, pairs, kw in batches:
            before = len(results)
            results += inspect_pairs(pairs, jobs=args.jobs,
                                     progress=lambda done, _: bar.update(before + done), **kw)
            items += its
    return items, results


def _artifacts(items, results):
    """The compiled artifacts behind the records of a config run (cache hits by now)."""
    from .. import compile as fcompile

    return [fcompile.build(c, t, **kw) for (c, t, kw), r in zip(items, results)
            if not isinstance(r, Exception)]


#: build settings a --diff operand may name beside its knobs, for its side alone
SIDE_SETTINGS = ("target", "head_dim", "dtype", "causal", "varlen")


def _side_settings(text, args) -> tuple:
    """(config text, target, head dim, dtype, causal, build keywords, the settings named)
    of a --diff operand: its knobs, and the command's first target and variant but for
    the :data:`SIDE_SETTINGS` it names (e.g. ``head_dim=96`` against ``head_dim=128``,
    ``varlen=1``: a packed build against the dense one, ``target=gfx942``)."""
    from ..errors import FlashscopeError
    from ..targets import parse_targets

    d, dt, c = common.one(_variants(args), "--head-dim/--dtype/--causal", "variant")
    t = args.target[0]
    kw = _extra(args)
    prefix, sep, body = text.rpartition(":") if ":" in text.split("=", 1)[0] else ("", "", text)
    knobs, named = [], []
    for part in filter(None, (x.strip() for x in body.split(","))):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in SIDE_SETTINGS:
            knobs.append(part)
            continue
        named.append(part)
        try:
            if key == "target":
                t = common.one(parse_targets(value), f"--diff {text!r}: target", "target")
            elif key == "head_dim":
                d = common.one(common.parse_int_list(value), f"--diff {text!r}: head_dim")
            elif key == "dtype":
                dt = common.one(common.parse_dtypes(value), f"--diff {text!r}: dtype")
            else:
                word = {"1": "yes", "0": "no"}.get(value.strip(), value)
                on = common.one(common.parse_causal(word), key)
                if key == "causal":
                    c = on
                elif on:
                    kw["varlen"] = True
                else:
                    kw.pop("varlen", None)
        except FlashscopeError as e:
            raise FlashscopeError(f"--diff {text!r}: {key}: {e}") from None
    return prefix + sep + ",".join(knobs), t, d, dt, c, kw, ",".join(named)


def _resolve_side(text, args):
    """A --diff operand: an existing path (its single kernel), else a config, with the
    build settings it names for its side (:func:`_side_settings`). Returns its record,
    with --lines its per-line view (:class:`~flashscope.isa.lines.KernelLines`; else
    None) and the settings it named ("" for a path)."""
    from .. import compile as fcompile
    from ..errors import FlashscopeError
    from ..isa import attach_occupancy, lines, read_path, record_for

    if Path(text).exists():
        recs = read_path(text)
        if len(recs) != 1:
            raise FlashscopeError(f"--diff {text}: holds {len(recs)} kernels; give one binary")
        if not args.lines:
            return recs[0], None, ""
        (_, views), = lines.lines_for_path(text)
        if isinstance(views, Exception):
            raise views
        return recs[0], views[0], ""
    if "=" not in text and not text.endswith(":"):  # "sm90-fwd:": a family's default
        raise FlashscopeError(f"--diff {text!r}: neither an existing file nor a config "
                              "(K=V,... or FAMILY:K=V,...)")
    knobs, t, d, dt, c, variant, named = _side_settings(text, args)
    cfg = _parse(args, knobs, t, d, dt, c, variant)
    art = fcompile.build(cfg, t, **_build_kw(args, d, dt, c, variant))
    rec = attach_occupancy(record_for(art))  # inspect_config's record, of this one build
    if not args.lines:
        return rec, None, named
    view, = lines.lines_for_artifacts([art])
    if isinstance(view, Exception):
        raise view
    return rec, view, named


def _user_records(args):
    """Records and artifacts of ``FILE.py:KERNEL`` for each --target."""
    from ..errors import FlashscopeError
    from ..isa import attach_occupancy, record_for, user_kernel

    if args.config or args.configs:
        raise FlashscopeError("FILE.py:KERNEL takes --signature/--constexpr, not --config")
    path, name = user_kernel.parse_spec(args.path)
    src = user_kernel.KernelSource(path, name, args.signature,
                                   user_kernel.parse_constexprs(args.constexpr),
                                   args.num_warps, args.num_stages)
    targets = args.target
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

    _resolve_shape(args)
    if args.diff:
        if args.path or args.config or args.configs:
            raise FlashscopeError("--diff A B takes its two operands alone (no PATH/--config)")
        common.prepare(args)
        (ra, va, na), (rb, vb, nb) = (_resolve_side(x, args) for x in args.diff)
        d = diff(ra, rb, opcodes=args.opcodes)
        for side, named in (("a", na), ("b", nb)):  # what tells two builds of one config
            if named:
                d[side] += f" ({named})"
        if args.lines:
            from ..isa.lines import diff_lines

            d["by_line"] = diff_lines(va, vb, args.top or 20)
        rows = [{"field": name, **e} for name, e in _diff_rows(d)]
        common.emit(args, d, rows=rows, render=lambda con: _diff_table(con, d))
        missing = [f"{v.source or v.kernel}: {v.note}" for v in (va, vb)
                   if v is not None and not v.line_table]
        if missing:  # the totals are out; say once what the line view lacked
            raise FlashscopeError(missing[0])
        return 0
    errors, arts = [], None
    if (args.signature or args.constexpr) and not _is_user_kernel(args.path):
        raise FlashscopeError("--signature/--constexpr go with FILE.py:KERNEL")
    if _is_user_kernel(args.path):
        common.prepare(args)
        records, arts, errors = _user_records(args)
    elif args.path:
        if args.config or args.configs:
            raise FlashscopeError("PATH and --config/--configs exclude each other")
        common.prepare(args)
        records = read_path(args.path)
    else:
        common.prepare(args)
        items, results = _compile_records(args)
        records = [r for r in results if not isinstance(r, Exception)]
        errors = [{"target": t.name, "config": c.as_dict() | {"key": c.key, "label": c.label},
                   "head_dim": kw["head_dim"], "dtype": kw["dtype"], "causal": kw["causal"],
                   "error": str(r)}
                  for (c, t, kw), r in zip(items, results) if isinstance(r, Exception)]
        if not records:
            raise FlashscopeError(errors[0]["error"])
        if args.lines:
            arts = _artifacts(items, results)
    if args.lines:
        from .inspect_lines import show

        return show(args, records, arts, errors)
    doc = {"kernels": [r.as_dict() for r in records], "errors": errors}
    rows = [_flat(r) for r in records] + [
        {"target": e["target"], "config": e["config"].get("label"), "head_dim": e["head_dim"],
         "dtype": e["dtype"], "causal": e["causal"], "error": e["error"]} for e in errors]
    common.emit(args, doc, rows=rows, render=lambda con: _table(con, records, errors,
                                                                 args.opcodes))
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
            v = common.label(v) if v else None
        elif isinstance(v, list):
            v = ";".join(map(str, v))
        row[k] = v
    for c, n in (d.get("mix") or {}).items():
        row[f"mix.{c}"] = n
    for c, n in (d.get("global_widths") or {}).items():
        row[f"global.{c}"] = n
    return row


def _n(v):
    return "-" if v is None else str(v)


def _shared(r) -> str:
    s = _n(r.shared_bytes)
    if r.dynamic_shared_bytes is not None and r.static_shared_bytes:
        s += f" ({r.static_shared_bytes} static)"
    if r.reserved_shared_bytes:
        s += f" +{r.reserved_shared_bytes} reserved"
    return s


#: Table columns: header, cell of a record, and whether the column is shown for a set of
#: records (columns that would hold one value or dashes only are left to --json/--csv).
_COLUMNS = (
    ("target", lambda r: r.target, None),
    ("config", lambda r: common.label(r.config) if r.config else r.kernel, None),
    ("D", lambda r: _n(r.head_dim), lambda rs: len({r.head_dim for r in rs}) > 1),
    ("mask", lambda r: _mask_cell(r), lambda rs: len({_mask_cell(r) for r in rs}) > 1),
    ("dtype", lambda r: _n(r.dtype), lambda rs: len({r.dtype for r in rs}) > 1),
    ("warps", lambda r: _n(r.num_warps), None),
    ("regs per thread", lambda r: _n(r.registers), None),
    ("AGPR/ SGPR", lambda r: f"{_n(r.agprs)}/ {_n(r.sgprs)}" if r.vendor == "amd" else "-",
     lambda rs: any(r.vendor == "amd" for r in rs)),
    ("spills", lambda r: (f"{r.spill_stores}/{r.spill_loads}" if r.vendor == "nvidia"
                          else f"v{_n(r.vgpr_spills)} s{_n(r.sgpr_spills)}"), None),
    ("local (B)", lambda r: _n(r.local_bytes), lambda rs: any(r.local_bytes for r in rs)),
    ("shared (B)", _shared, None),
    ("mma", lambda r: _mma_cell(r), None),
    ("occupancy", lambda r: common.pct(r.occupancy), None),
    ("limiter", lambda r: ", ".join(r.limiter) if r.limiter else "-", None),
)


def _mma_cell(r) -> str:
    """Tensor-core instructions, and how many wgmma of them ptxas serialized."""
    n = _n((r.mix or {}).get("mma", (r.mix or {}).get("mfma")))
    return f"{n} ({r.wgmma_serialized} serial)" if r.wgmma_serialized else n


#: Printed under a table that has a serialized wgmma: what it costs and where to read on.
SERIAL_NOTE = ("serial: wgmma that ptxas made wait for the one before (too few registers for "
               "the wgmma pipeline, or an accumulator written while a wgmma is in flight, e.g. "
               "handed from one loop to the next); each product's k-steps then run one at a "
               "time (docs/inspect.md, wgmma_serialized)")


def narrow_note(records) -> "str | None":
    """The note for records that read narrow
    (:attr:`~flashscope.isa.record.KernelRecord.reads_narrow`), or None."""
    hits = []
    for r in records:
        if r.reads_narrow:
            narrow, loads = r.narrow_loads
            hits.append(f"{r.kernel} @ {r.target}{f' D={r.head_dim}' if r.head_dim else ''} "
                        f"{narrow} of {loads}")
    if not hits:
        return None
    return ("narrow loads: " + "; ".join(hits) + " global loads move 16 bits a thread or "
            "fewer: rows read an element at a time, where the compiler cannot prove them "
            "16 bytes apart (docs/inspect.md, global_widths)")


#: constexpr switches of a kernel variant and how the mask column names them
_VARIANT_SWITCHES = (("HAS_LEFT", "window"), ("HAS_RIGHT", "window"),
                     ("SHIFTED", "bottom-right"), ("SOFTCAP", "softcap"), ("VARLEN", "varlen"))


def _mask_cell(r) -> str:
    """causal or full, then the variant's switches the binary was built with."""
    consts = r.constants or {}
    extra = dict.fromkeys(name for key, name in _VARIANT_SWITCHES if consts.get(key))
    return " ".join(["causal" if r.causal else "full", *extra])


def _table(con, records, errors, opcodes):
    cols = [c for c in _COLUMNS if c[2] is None or c[2](records)]
    t = common.table(*(c[0] for c in cols),
                     title="Kernel resources, read from the binaries (spills: NVIDIA "
                           "stores/loads, AMD VGPR/SGPR; --json for the instruction mix)",
                     left=("target", "config", "mask", "dtype", "limiter"))
    for r in records:
        t.add_row(*(c[1](r) for c in cols))
    for e in errors:
        cells = {"target": e["target"], "config": common.label(e["config"]),
                 "D": str(e["head_dim"]), "regs per thread": "FAILED",
                 "limiter": e["error"]}
        t.add_row(*(cells.get(c[0], "-") for c in cols))
    common.show(con, t)
    if any(r.wgmma_serialized for r in records):
        con.print(SERIAL_NOTE)
    note = narrow_note(records)
    if note:
        con.print(note)
    if opcodes:
        for r in records:
            con.print(f"{r.label} (features: {', '.join(r.features) or '-'}) " + " ".join(
                f"{k}:{v}" for k, v in sorted((r.opcodes or {}).items(),
                                              key=lambda kv: -kv[1])))


def _field_rows(d) -> list:
    """(field, {"a", "b", "delta"}) rows of the records: their fields, mix, global
    accesses by width and, with --opcodes, the opcodes whose count differs."""
    return (list(d["fields"].items()) + [(f"mix.{k}", v) for k, v in d["mix"].items()]
            + [(f"global.{k}", v) for k, v in d.get("global", {}).items()]
            + [(f"opcode.{k}", v) for k, v in d.get("opcodes", {}).items()])


def _diff_rows(d) -> list:
    """:func:`_field_rows`, then with --lines each loop's and each changed line's
    instruction count (the CSV)."""
    rows = _field_rows(d)
    by = d.get("by_line")
    if by:
        def count(e):
            return {k: None if e[k] is None else e[k]["count"] for k in ("a", "b")} | {
                "delta": e["delta"]}
        rows += [(f"loop {_at(e)} depth {e['depth']} #{e['rank']} instructions", count(e))
                 for e in by["loops"]]
        rows += [(f"line {_at(e)} instructions", count(e)) for e in by["lines"]]
    return rows


def _at(e) -> str:
    return f"{Path(e['file']).name if e['file'] else '?'}:{e['line']}"


def _signed(v) -> str:
    return "-" if v is None else (f"{v:+d}" if isinstance(v, int) else f"{v:+}")


def _diff_table(con, d):
    t = common.table("field", "A", "B", "B - A", title=f"B - A   A = {d['a']}   "
                                                      f"B = {d['b']}", left=("field",))
    for name, e in _field_rows(d):
        t.add_row(name, _n(e["a"]), _n(e["b"]), _signed(e["delta"]))
    common.show(con, t)
    by = d.get("by_line")
    if by:
        from .lines_view import CLASS_COLUMNS, LOOP_SHOWN, _cols

        def cells(e):
            a, b = e["a"], e["b"]
            if a is None or b is None:
                return ["-"] * len(CLASS_COLUMNS)
            return [_signed(y - x) for x, y in zip(_cols(a["instructions"]),
                                                   _cols(b["instructions"]))]

        def pair(e, *keys):
            return " -> ".join("-" if e[s] is None else "/".join(str(e[s][k]) for k in keys)
                               for s in ("a", "b"))

        for what, entries, first in (("loops, matched by statement, depth and rank",
                                      by["loops"], "loop"),
                                     ("source lines whose own instructions changed most",
                                      by["lines"], "line")):
            t = common.table(first, "source", "A", "B", "B - A",
                             *[f"d {c}" for c, _ in CLASS_COLUMNS], "spills st/ld",
                             "live max", title=f"B - A by {what}",
                             left=(first, "source"))
            small = 0
            for e in entries:
                if first == "loop" and all(e[s] is None or e[s]["count"] < LOOP_SHOWN
                                           for s in ("a", "b")):
                    small += 1
                    continue
                where = _at(e) + (f" d{e['depth']}" if first == "loop" else "")
                t.add_row(where, (e["source"] or "").strip()[:48],
                          *[_n(None if e[s] is None else e[s]["count"]) for s in ("a", "b")],
                          _signed(e["delta"]), *cells(e),
                          pair(e, "spill_stores", "spill_loads"),
                          pair(e, "live_registers_max"))
            common.show(con, t)
            if small:
                con.print(f"  {small} loops of fewer than {LOOP_SHOWN} instructions (waits) "
                          "on both sides left out here; --json lists them")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run as: flashscope inspect ...")
