"""The ``flashscope`` command line: a thin shell over the library.

Each subcommand lives in ``flashscope.commands.<name>`` and exposes ``register(sub)``,
which adds its parser and sets ``func``; the conventions they share (argument spellings,
``--json``/``--csv``/``--out``/``--force``, tables) are :mod:`flashscope.commands.common`.
Command modules import heavy packages (torch, Triton) inside their ``run`` so that
``flashscope --help`` stays instant.

Whatever happens, the command ends with one line on stderr, never a traceback:

- bad input (a :class:`~flashscope.errors.FlashscopeError`, an argument argparse refuses,
  a file that cannot be read or written, a document nested too deeply to parse): exit 2;
- Ctrl-C: "interrupted", exit 130;
- stdout closed early (``| head``): exit 141 quietly, as a shell reports SIGPIPE;
- anything else is a bug in flashscope: "internal error", exit 1; ``flashscope
  --traceback COMMAND ...`` shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .commands.common import Parser
from .errors import FlashscopeError

#: pyproject's dependencies a command imports on first use, by module name: missing from an
#: environment that skipped them, they are named in one line, not reported as a bug
DEPENDENCIES = {"elftools": "pyelftools", "msgpack": "msgpack", "rich": "rich",
                "matplotlib": "matplotlib"}

#: Subcommands in help order (a module missing from the install is not listed).
COMMANDS = ("report", "selfcheck", "inspect", "occupancy", "targets", "bench", "sweep",
            "tune", "profile", "roofline", "breakdown", "version")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="flashscope",
        description="A tunable FlashAttention in Triton, and the instruments to see inside "
                    "it: ISA, occupancy, register budgets, sweeps, benchmarks, profiles.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"flashscope {__version__}")
    parser.add_argument("--traceback", action="store_true",
                        help="on an internal error, print Python's traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        modname = f"flashscope.commands.{name}"
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue
            raise
        mod.register(sub)
    return parser


def _say(command, text: str) -> None:
    """One line on stderr, whatever ``text`` holds."""
    where = f"flashscope {command}" if command else "flashscope"
    try:
        sys.stderr.write(f"{where}: {' '.join(str(text).split())}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def main(argv=None) -> int:
    command = None
    traceback = False
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: 0 after --help/--version, 2 for bad input
            if e.code in (0, None):
                raise
            return 2
        command, traceback = args.command, args.traceback
        args.argv = list(sys.argv[1:] if argv is None else argv)  # the stamp of a run
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        return int(args.func(args) or 0)
    except FlashscopeError as e:
        _say(command, f"error: {e}")
        return 2
    except KeyboardInterrupt:
        _say(command, "interrupted")
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (| head): stop quietly, and keep Python from
        # failing again when it flushes stdout at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except (OSError, RecursionError, MemoryError, UnicodeError) as e:
        if traceback:
            raise
        _say(command, f"error: {_describe(e)}")
        return 2
    except Exception as e:  # noqa: BLE001  (a bug: one line, and --traceback for the rest)
        if traceback:
            raise
        package = DEPENDENCIES.get(e.name) if isinstance(e, ModuleNotFoundError) else None
        if package:
            _say(command, f"error: the package {package} is not installed (a dependency of "
                          f"flashscope: pip install {package})")
            return 1
        _say(command, f"internal error: {type(e).__name__}: {e} (a bug in flashscope; "
                      "rerun with 'flashscope --traceback ...' and report it)")
        return 1


def _describe(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "input nested too deeply to read"
    if isinstance(e, MemoryError):
        return "out of memory (input too large?)"
    if isinstance(e, OSError):
        name = e.filename if e.filename is not None else ""
        return f"{name}{': ' if name else ''}{e.strerror or e}"
    return str(e)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
