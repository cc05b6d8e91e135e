"""The ``flashscope`` command line: a thin shell over the library.

Each subcommand lives in ``flashscope.commands.<name>`` and exposes ``register(sub)``,
which adds its parser and sets ``func``. Command modules import heavy packages (torch,
Triton) inside their ``run`` so that ``flashscope --help`` stays instant. A
:class:`~flashscope.errors.FlashscopeError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import FlashscopeError

#: Subcommands in help order (a module missing from the install is not listed).
COMMANDS = ("report", "selfcheck", "inspect", "occupancy", "targets", "bench", "sweep",
            "tune", "profile", "roofline", "breakdown", "version")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashscope",
        description="A tunable FlashAttention in Triton, and the instruments to see inside "
                    "it: ISA, occupancy, register budgets, sweeps, benchmarks, profiles.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"flashscope {__version__}")
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


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except FlashscopeError as e:
        print(f"flashscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flashscope {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
