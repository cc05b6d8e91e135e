"""User-facing errors.

Every error a user can cause (a bad argument, an unknown target, a corrupt binary, a
malformed CSV) is a :class:`FlashscopeError`: the CLI prints its message on one line and
exits with status 2, without a traceback. Library callers can catch it as a ``ValueError``.
"""

from __future__ import annotations

import difflib


class FlashscopeError(ValueError):
    """A clear, one-line error about something the caller supplied."""


class UnknownTargetError(FlashscopeError):
    pass


class ConfigError(FlashscopeError):
    """A config that cannot be compiled or launched for a target (with the limit named)."""


class LimitError(ConfigError):
    """A config its target cannot run: a rule of its family refuses it, or its binary
    needs more than the target has (shared memory or LDS, threads), the limit named. The
    compiler did not fail: a report or sweep shows such a config as one that does not
    fit, not as a failed build."""


class ArtifactError(FlashscopeError):
    """A binary or cache directory that cannot be read (truncated, corrupt, wrong kind)."""


class ParseError(FlashscopeError):
    """A profiler export (CSV) that is malformed."""


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest of ``choices``, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown(flag: str, name, choices, what: str = "", hint: str = "",
            error: type = FlashscopeError) -> FlashscopeError:
    """The one-line error for ``name`` not among ``choices``:
    "<flag> 'name': unknown <what> (did you mean X?); known: a, b<hint>"."""
    return error(f"{flag} {name!r}: unknown{' ' + what if what else ''}"
                 f"{closest(str(name), choices)}; known: {', '.join(choices)}{hint}")


def lookup(table: dict, name, flag: str, **kw):
    """``table[name]``, or raise :func:`unknown`'s error (``kw``: what, hint, error)."""
    try:
        return table[name]
    except KeyError:
        raise unknown(flag, name, table, **kw) from None
