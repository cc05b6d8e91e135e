"""Kernel families: one module per kernel, each with a frozen config record, its rules
table, a pure default-selection function and the argument lists of its launches.

- :mod:`.triton_fwd` (``triton-fwd``): the portable forward, every target and the
  interpreter.
- :mod:`.sm90_fwd` (``sm90-fwd``): the Hopper forward in Gluon.
- :mod:`.triton_bwd` (``triton-bwd``): the portable backward.
- :mod:`.sm90_bwd` (``sm90-bwd``): the Hopper backward in Gluon, where its rule prefers
  it (:func:`default_backward`).
- :mod:`.triton_decode` (``triton-decode``): decoding against a dense or paged KV cache.

A default config comes from the problem alone (:class:`~.base.Problem`: target, dtype,
head dim, mask, lengths, heads): the first forward family that accepts the problem, then
its tuned entry (:mod:`flashscope.tuned`) or its rule (:func:`select`). Adding a kernel
family is one module here and one line in :data:`FAMILIES`.
"""

from __future__ import annotations

from ..errors import ConfigError, lookup
from . import sm90_bwd, sm90_fwd, triton_bwd, triton_decode, triton_fwd
from .base import Knobs, Problem

#: every family by its name
FAMILIES = {m.KERNEL: m for m in (triton_fwd, sm90_fwd, triton_bwd, sm90_bwd, triton_decode)}
#: forward families in order of preference: the first that accepts a problem runs it
FORWARD = (sm90_fwd, triton_fwd)
BACKWARD = (sm90_bwd, triton_bwd)


def family(name: str):
    """The family module called ``name`` (e.g. ``sm90-fwd``)."""
    return lookup(FAMILIES, name, "kernel", what="kernel family", error=ConfigError)


def family_of(cfg):
    """The family module a config record belongs to."""
    if not isinstance(cfg, Knobs):
        raise ConfigError(f"config: expected a kernel config record (one of "
                          f"{', '.join(m.Config.__name__ for m in FAMILIES.values())}), got "
                          f"{type(cfg).__name__}")
    return FAMILIES[cfg.KERNEL]


def forward_family(problem: Problem):
    """The first forward family that accepts ``problem``."""
    for fam in FORWARD:
        if fam.accepts(problem) is None:
            return fam
    raise ConfigError(f"no forward kernel accepts {problem}")  # triton-fwd accepts all


def default_config(problem: Problem, fam=None, data_dir=None) -> Knobs:
    """The default config of ``fam`` (default: :func:`forward_family`) for ``problem``:
    its tuned entry where the target's data file has one, else its rule, then fitted to
    the problem's sizes where the family has a ``fit`` (a tuned entry stands for a class
    of lengths)."""
    from .. import tuned

    fam = fam or forward_family(problem)
    cfg = tuned.lookup(problem, fam.KERNEL, data_dir)[0]
    fit = getattr(fam, "fit", None)
    return fit(cfg, problem) if fit is not None else cfg


def _keys(body) -> set:
    if isinstance(body, dict):
        return set(body)
    return {p.split("=", 1)[0].strip() for p in str(body).split(",") if "=" in p}


def _family_with(problem: Problem, keys: set):
    """The forward family that runs ``problem``, or the first that accepts it and has all
    of ``keys`` (the default family's error names the unknown key when none has)."""
    fam = forward_family(problem)
    if keys <= set(fam.Config.field_names()):
        return fam
    for other in FORWARD:
        if other.accepts(problem) is None and keys <= set(other.Config.field_names()):
            return other
    return fam


def default_backward(problem: Problem) -> Knobs:
    """The backward's default for ``problem``: the Hopper one pass where its rule prefers
    it (:func:`.sm90_bwd.prefers`), else the portable two passes."""
    if sm90_bwd.prefers(problem) is None:
        return sm90_bwd.select(problem)
    return triton_bwd.select(problem)


def parse_config(text: str, kernel: str, base=None) -> Knobs:
    """``KEY=VALUE,...`` on top of ``base`` (default: the family's defaults)."""
    return family(kernel).Config.parse(text, base)


def config_from_text(text, problem: Problem, kernel: "str | None" = None,
                     data_dir=None, base: "Knobs | None" = None) -> Knobs:
    """A config as a person writes it on a command line, for ``problem``:
    ``[family:]KEY=VALUE,...`` (or a dict of knobs) on top of that family's default for
    the problem (its tuned entry or rule), the family being the one named, ``kernel``, or
    the forward family that runs the problem by default; if that one has no knob of a key
    given, the first forward family whose record has all of them (``num_warps`` is a
    portable-kernel knob). Keys not given keep the target's own default, not a generic
    one (its tuned entry read from ``data_dir``, default the package's files), or
    ``base``'s where given (a kernel whose default is not its family's)."""
    if isinstance(text, dict):
        body, name = text, kernel
    else:
        name, sep, body = str(text).partition(":")
        if not sep:
            name, body = kernel, text
        elif name not in FAMILIES:
            raise ConfigError(f"config {text!r}: {name!r} is not a kernel family; expected "
                              f"one of {', '.join(FAMILIES)} before ':'")
    fam = family(name) if name else _family_with(problem, _keys(body))
    if base is None or base.KERNEL != fam.KERNEL:
        base = default_config(problem, fam, data_dir) if fam in FORWARD else \
            fam.select(problem)
    return base.replace(**body) if isinstance(body, dict) else type(base).parse(body, base)


def neighbours(cfg: Knobs, target, head_dim: int, dtype: str = "bfloat16") -> list:
    """``(knob, value, config)`` for every config one knob from ``cfg`` that its family's
    rules accept for the target, head dim and dtype (:func:`.base.neighbours` along the
    family's ``STEPS``)."""
    from .base import neighbours as step

    fam = family_of(cfg)
    return step(cfg, fam.STEPS, fam.RULES, target, head_dim, dtype)


__all__ = ["BACKWARD", "FAMILIES", "FORWARD", "Knobs", "Problem", "config_from_text",
           "default_backward", "default_config", "family", "family_of", "forward_family",
           "neighbours", "parse_config"]
