"""The conventions every ``flashscope`` command follows, in one place.

Arguments, one spelling each:

- ``--target LIST`` (also spelled ``--targets``): architectures or products, comma-separated
  (``sm90,gfx942``, ``H100,MI300X``);
- ``--dtype LIST``: ``bf16``/``fp16`` or the torch names (``bfloat16``, ``float16``,
  ``torch.bfloat16``, ``half``);
- ``--causal [no|yes|both]``: ``--causal`` alone means yes;
- ``--head-dim LIST`` (also ``--head-dims``): comma-separated integers.

A command that takes one value of such a list says so when given several. Numbers are
checked where they are parsed: an integer out of range, a number that is not finite
(``nan``, ``inf``, ``1e400``) or a negative time ends the command at once.

Results: a table on the terminal (:mod:`flashscope.terminal`: readable at 100 columns and
when redirected, long cells wrapped instead of cut); ``--json`` prints the command's JSON
document on stdout and ``--csv`` its rows, header first; ``--out DIR`` writes
``<command>.json`` (the same document) and ``<command>.csv`` (the same rows) plus the
command's own files. The folder
and every file a command will write are checked before any work starts: the parent must
exist, the place must be writable, and a file already there is only replaced with
``--force``. Files are written whole (a temporary file renamed into place), so a killed run
leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..errors import FlashscopeError
from ..outfiles import csv_text, json_text, write_atomic  # noqa: F401  (re-exported)
from ..terminal import console, label, pct, show, table  # noqa: F401  (re-exported)

# ---------------------------------------------------------------------------------------
# parsing


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``flashscope bench: error: argument --rounds: ...``
    and exit status 2, without the usage block (``--help`` shows it)."""

    def error(self, message):  # noqa: D401  (argparse's hook)
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def argtype(fn: Callable, what: str) -> Callable:
    """An argparse ``type`` from ``fn``: a FlashscopeError or ValueError becomes argparse's
    one-line error naming the flag (argparse adds 'argument --flag: ')."""
    def convert(text):
        try:
            return fn(text)
        except (FlashscopeError, ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(str(e) or f"expected {what}") from None
    convert.__name__ = what
    return convert


def integer(lo: Optional[int] = None, hi: Optional[int] = None) -> Callable:
    """An integer within [lo, hi] (either bound may be open)."""
    what = ("an integer" + (f" >= {lo}" if lo is not None and hi is None else "")
            + (f" in {lo}..{hi}" if lo is not None and hi is not None else "")
            + (f" <= {hi}" if hi is not None and lo is None else ""))

    def parse(text):
        try:
            v = int(str(text).strip())
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"expected {what}, got {v}")
        return v
    return argtype(parse, what)


def number(lo: Optional[float] = None, *, strict: bool = False) -> Callable:
    """A finite number >= lo (> lo with ``strict``); nan, inf and overflows are refused."""
    what = "a finite number" + ("" if lo is None else f" {'>' if strict else '>='} {lo:g}")

    def parse(text):
        try:
            v = float(str(text).strip())
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(v) or (lo is not None and (v <= lo if strict else v < lo)):
            raise ValueError(f"expected {what}, got {text!r}")
        return v
    return argtype(parse, what)


def _split(text) -> list:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def parse_dtypes(text) -> tuple:
    """``"bf16,fp16"`` -> ``("bfloat16", "float16")``."""
    from ..bench.suite import parse_dtype

    vals = tuple(dict.fromkeys(parse_dtype(x) for x in _split(text)))
    if not vals:
        raise FlashscopeError(f"--dtype {text!r}: expected bf16 or fp16")
    return vals


CAUSAL = {"no": (False,), "yes": (True,), "both": (False, True),
          "false": (False,), "true": (True,)}


def parse_causal(text) -> tuple:
    try:
        return CAUSAL[str(text).strip().lower()]
    except KeyError:
        raise FlashscopeError(f"expected no, yes or both, got {text!r}") from None


def parse_int_list(text) -> tuple:
    try:
        vals = tuple(int(x) for x in _split(text))
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise FlashscopeError(f"expected a comma list of positive integers (e.g. 64,128), "
                              f"got {text!r}")
    return vals


def _targets(text) -> list:
    from ..targets import parse_targets

    return parse_targets(text)


def add_target(p, default: Optional[str] = "sm90", required: bool = False,
               help: str = "") -> None:
    p.add_argument("--target", "--targets", dest="target", required=required,
                   default=default, type=argtype(_targets, "target names"),
                   metavar="LIST", help=help or "comma list of architectures or products, "
                   "e.g. sm90,gfx942 or H100,MI300X" + (f" (default {default})"
                                                         if default else ""))


def add_dtype(p, default: str = "bf16", help: str = "") -> None:
    p.add_argument("--dtype", "--dtypes", dest="dtype", default=default,
                   type=argtype(parse_dtypes, "dtype names"), metavar="LIST",
                   help=help or f"bf16 and/or fp16, comma list (default {default})")


def _causal_one(text) -> tuple:
    vals = parse_causal(text)
    if len(vals) != 1:
        raise FlashscopeError(f"expected no or yes (this command builds one mask), got "
                              f"{text!r}")
    return vals


def add_causal(p, default: str = "no", both: bool = True, help: str = "") -> None:
    """``--causal [no|yes|both]`` -> a tuple of bools; without ``both`` the tuple holds one
    value (:func:`one` takes it out)."""
    choices = "no|yes|both" if both else "no|yes"
    p.add_argument("--causal", nargs="?", const="yes", default=default,
                   type=argtype(parse_causal if both else _causal_one, choices),
                   metavar=choices,
                   help=help or f"mask; --causal alone means yes (default {default})")


def parse_window(text) -> tuple:
    """``L,R`` -> (left, right): a sliding window of keys p - L .. p + R around a row's
    position p; a side given as -1, ``none`` or left empty is unbounded."""
    parts = [x.strip() for x in str(text).split(",")]
    if len(parts) != 2:
        raise FlashscopeError(f"expected L,R (keys left and right of a row; -1 or none: "
                              f"unbounded), got {text!r}")
    sides = []
    for x in parts:
        if x.lower() in ("", "none", "-1"):
            sides.append(None)
            continue
        try:
            v = int(x)
        except ValueError:
            v = -2
        if v < 0:
            raise FlashscopeError(f"expected L,R as integers >= 0 (or -1/none), got {text!r}")
        sides.append(v)
    return tuple(sides)


def add_variant(p, mask_only: bool = False, title: str = "kernel variant (with --causal: "
                "the mask a build is for)") -> None:
    """``--window L,R``, ``--align``, ``--softcap C``, ``--varlen``, ``--page N``: the
    kernel variant a build takes (:data:`flashscope.compile.VARIANT_OPTIONS`), beside
    ``--causal``; with ``mask_only`` the mask's three flags alone (a timed cell's)."""
    g = p.add_argument_group(title)
    g.add_argument("--window", type=argtype(parse_window, "L,R"), metavar="L,R",
                   help="a sliding window: row p sees keys p-L .. p+R (-1 or none: "
                        "unbounded side)")
    g.add_argument("--align", choices=("top_left", "bottom_right"), default="top_left",
                   help="where rows sit against keys (default top_left; bottom_right moves "
                        "them by Nk - Nq, per sequence with --varlen)")
    g.add_argument("--softcap", type=number(0, strict=True), metavar="C",
                   help="cap the scores as C tanh(s / C)")
    if not mask_only:
        g.add_argument("--varlen", action="store_true",
                       help="a packed batch of variable-length sequences (cu_seqlens)")
        g.add_argument("--page", type=integer(1), metavar="N",
                       help="keys a page of a paged KV cache: decode_paged's (default 16), "
                            "decode_rows' (default: a dense cache)")


def variant_kw(args) -> dict:
    """The build options of :func:`add_variant`'s flags, only those set (a default build
    keeps its cache key)."""
    kw = {}
    if getattr(args, "window", None) is not None and args.window != (None, None):
        kw["window"] = args.window
    if getattr(args, "align", "top_left") != "top_left":
        kw["align"] = args.align
    if getattr(args, "softcap", None) is not None:
        kw["softcap"] = args.softcap
    if getattr(args, "varlen", False):
        kw["varlen"] = True
    if getattr(args, "page", None) is not None:
        kw["page"] = args.page
    return kw


def add_head_dim(p, default: Optional[str] = "128", help: str = "") -> None:
    p.add_argument("--head-dim", "--head-dims", dest="head_dim", default=default,
                   type=argtype(parse_int_list, "head dims"), metavar="LIST",
                   help=help or "head dims, comma list" + (f" (default {default})"
                                                           if default else ""))


def one(values, flag: str, what: str = "value"):
    """The single element of a parsed list option, or an error naming ``flag``."""
    values = list(values)
    if len(values) != 1:
        shown = ",".join(getattr(v, "name", str(v)) for v in values)
        raise FlashscopeError(f"{flag} {shown}: this command takes one {what}")
    return values[0]


def add_output(p, *, csv: bool = True, out: bool = True, plot: bool = False,
               out_help: str = "", force_help: str = "") -> None:
    """``--json`` / ``--csv`` (stdout), ``--out DIR``, ``--force`` and, with ``plot``,
    ``--plot FILE``."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true",
                   help="print the results as JSON on stdout (the schema of <command>.json)")
    if csv:
        g.add_argument("--csv", action="store_true",
                       help="print the result rows as CSV on stdout, header first")
    if out:
        p.add_argument("--out", metavar="DIR",
                       help=out_help or "write <command>.json, <command>.csv and the "
                                        "command's files into DIR (its parent must exist)")
    if plot:
        p.add_argument("--plot", metavar="FILE",
                       help="write the plot to FILE (.png, .svg or .pdf)")
    p.add_argument("--force", action="store_true",
                   help=force_help or "replace files that are already there")


# ---------------------------------------------------------------------------------------
# files

PLOT_EXTS = (".png", ".svg", ".pdf")


def _probe(folder: Path, flag: str, shown) -> None:
    """Create and remove a file in ``folder``: the one test of writability that holds for
    every user (root included), file system (read-only mounts) and ACL."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".flashscope-probe-")
    except OSError as e:
        raise FlashscopeError(f"{flag} {shown}: cannot write in {folder} "
                              f"({e.strerror or e})") from None
    os.close(fd)
    os.unlink(tmp)


def check_new_file(path, flag: str, force: bool = False, exts: Iterable[str] = ()) -> Path:
    """An output file: its extension known, its folder existing and writable, and the file
    itself absent unless ``force``. Nothing is created."""
    p = Path(path)
    exts = tuple(exts)
    if exts and p.suffix.lower() not in exts:
        raise FlashscopeError(f"{flag} {path}: unknown extension {p.suffix or '(none)'!r}; "
                              f"expected {', '.join(exts)}")
    if p.is_dir():
        raise FlashscopeError(f"{flag} {path}: is a folder, expected a file name")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise FlashscopeError(f"{flag} {path}: the folder {parent} {what}")
    if p.exists() and not force:
        raise FlashscopeError(f"{flag} {path}: exists; pass --force to replace it")
    _probe(parent, flag, path)
    return p


class OutDir:
    """An output folder checked before the work (see :func:`check_out_dir`); created on
    the first write."""

    def __init__(self, path: Path):
        self.path = path

    def file(self, name: str) -> Path:
        self.path.mkdir(exist_ok=True)
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)


def check_out_dir(path, files: Iterable[str], force: bool = False,
                  flag: str = "--out") -> OutDir:
    """``path`` as an output folder: a folder or absent, its parent existing, writable, and
    none of ``files`` (names or glob patterns) already in it unless ``force``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FlashscopeError(f"{flag} {path}: exists and is not a folder")
    if not p.exists():
        parent = p.parent
        if not parent.is_dir():
            what = "is not a folder" if parent.exists() else "does not exist"
            raise FlashscopeError(f"{flag} {path}: its parent {parent} {what}")
        _probe(parent, flag, path)
        return OutDir(p)
    _probe(p, flag, path)
    if not force:
        for pattern in files:
            hit = next(iter(sorted(p.glob(pattern))), None)
            if hit is not None:
                raise FlashscopeError(f"{flag} {path}: {hit.name} is already there (an "
                                      "earlier run?); pass --force to replace it, or "
                                      "choose another folder")
    return OutDir(p)


def check_input_file(path, flag: str) -> Path:
    """A file to read: present and a file (a folder or a missing path is named)."""
    p = Path(path)
    if not p.exists():
        raise FlashscopeError(f"{flag} {path}: no such file")
    if p.is_dir():
        raise FlashscopeError(f"{flag} {path}: is a folder, expected a file")
    return p


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def read_json(path, flag: str):
    """The JSON document in the file ``path`` (named ``flag`` in errors). Binary data,
    text that is not UTF-8, invalid JSON, NaN/Infinity literals and documents nested too
    deeply to parse each end in one line naming the file and the place."""
    p = check_input_file(path, flag)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FlashscopeError(f"{flag} {path}: cannot read ({e.strerror or e})") from None
    if b"\x00" in data:
        raise FlashscopeError(f"{flag} {path}: binary data (NUL bytes), expected JSON text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FlashscopeError(f"{flag} {path}: not UTF-8 text (byte {e.start}), expected "
                              "JSON") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise FlashscopeError(f"{flag} {path}: JSON nested too deeply to read") from None
    except json.JSONDecodeError as e:
        raise FlashscopeError(f"{flag} {path}: not valid JSON ({e.msg} at line {e.lineno} "
                              f"column {e.colno})") from None
    except ValueError as e:
        raise FlashscopeError(f"{flag} {path}: not valid JSON ({e})") from None


def config_from(parse, item, where: str):
    """A config record from a ``[family:]K=V,...`` string or a JSON object (its ``key`` and
    ``label`` fields, as flashscope writes them, ignored), through ``parse(item)`` (a
    record class, whose ``parse``/``from_dict`` are used, or a function taking the string
    or dict, e.g. on top of a target's default). Values of the wrong type (a list, an
    object, a number too large for any knob) are refused naming ``where`` and the knob."""
    from ..errors import ConfigError

    build = parse if not isinstance(parse, type) else (
        lambda it: parse.parse(it) if isinstance(it, str) else parse.from_dict(it))
    try:
        if isinstance(item, str):
            return build(item)
        if not isinstance(item, dict):
            raise ConfigError(f"expected an object or a 'K=V,...' string, got "
                              f"{type(item).__name__}")
        for k, v in item.items():
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise ConfigError(f"{k}: expected a number, true/false or null, got "
                                  f"{type(v).__name__}")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{k}: expected a finite number, got {v!r}")
        return build({k: v for k, v in item.items() if k not in ("key", "label")})
    except FlashscopeError as e:
        raise ConfigError(f"{where}: {e}") from None
    except OverflowError:
        raise ConfigError(f"{where}: a number too large for any knob") from None
    except (TypeError, ValueError) as e:  # a value no knob can hold
        raise ConfigError(f"{where}: {e}") from None


def read_configs(path, parse, flag: str = "--configs") -> list:
    """Configs from a JSON file: a non-empty list (or ``{"configs": [...]}``) of objects or
    ``K=V,...`` strings, each checked by :func:`config_from`."""
    data = read_json(path, flag)
    if isinstance(data, dict) and "configs" in data:
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise FlashscopeError(f"{flag} {path}: expected a non-empty JSON list of configs "
                              "(objects or 'K=V,...' strings)")
    out = []
    for i, item in enumerate(data):
        c = config_from(parse, item, f"{flag} {path}: entry {i}")
        if c not in out:
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------
# results


def out_files(name: str, *, csv: bool = True, meta: bool = False,
              extra: Iterable[str] = ()) -> list:
    """The files :func:`emit` writes under ``--out`` for command ``name``."""
    return ([f"{name}.json"] + ([f"{name}.csv"] if csv else [])
            + ([f"{name}.meta.json"] if meta else []) + list(extra))


def prepare(args, *, csv: bool = True, meta: bool = False, extra: Iterable[str] = (),
            plot: bool = False, name: Optional[str] = None) -> Optional[OutDir]:
    """Check ``--out`` (and ``--plot``) before any work; stores the checked folder on
    ``args`` for :func:`emit`. ``extra``: the command's own files under ``--out``;
    ``name``: the files' stem where it is not the command's (a subcommand's)."""
    force = getattr(args, "force", False)
    if plot and getattr(args, "plot", None):
        check_new_file(args.plot, "--plot", force, PLOT_EXTS)
    out = None
    if getattr(args, "out", None):
        out = check_out_dir(args.out, out_files(name or args.command, csv=csv, meta=meta,
                                                extra=extra), force)
    args.out_dir = out
    return out


def emit(args, doc, *, rows: Optional[list] = None, meta: Optional[dict] = None,
         render: Optional[Callable] = None, write: bool = True,
         name: Optional[str] = None) -> None:
    """Deliver a command's results: files under ``--out`` (checked by :func:`prepare`;
    ``write=False`` when the command wrote them itself), then ``--json`` / ``--csv`` on
    stdout, else ``render(console)``. ``name``: as for :func:`prepare`."""
    out = getattr(args, "out_dir", None) if write else None
    name = name or args.command
    written = []
    if out is not None:
        written.append(write_atomic(out.file(f"{name}.json"), json_text(doc)))
        if rows is not None:
            written.append(write_atomic(out.file(f"{name}.csv"), csv_text(rows)))
        if meta is not None:
            written.append(write_atomic(out.file(f"{name}.meta.json"), json_text(meta)))
    if getattr(args, "json", False):
        sys.stdout.write(json_text(doc))
    elif getattr(args, "csv", False) is True:
        sys.stdout.write(csv_text(rows or []))
    elif render is not None:
        con = console()
        render(con)
        for w in written:
            con.print(f"wrote {w}")


def quiet(args) -> bool:
    """Whether stdout carries data (``--json``/``--csv``), so notes must stay off it."""
    return bool(getattr(args, "json", False) or getattr(args, "csv", False) is True)
