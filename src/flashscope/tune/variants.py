"""Variants: what an A/B times, written ``NAME=SPEC;NAME=SPEC;...``.

A SPEC is one of:

- ``+K=V,...``: the problem's default config (the forward family that runs it, its tuned
  entry or rule) with those knobs changed; ``+`` alone is the default itself;
- ``FAMILY:K=V,...`` (``sm90-fwd:BLOCK_M=192``): a config of that kernel family, the
  knobs given on top of that family's default for the problem (as ``--config`` reads it
  everywhere, :func:`flashscope.families.config_from_text`);
- ``cudnn`` (SDPA's cuDNN backend), ``fa4`` (FlashAttention-4), or the name of any other
  provider of the bench harness (``sdpa-flash``, ``sdpa-math``, ...; ``flashscope bench
  --list-baselines``): a peer, timed beside the configs and never adopted.

Every config is checked against its family's rules for the target before anything runs;
a bad spec is refused by its variant's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError, FlashscopeError
from ..families import FAMILIES, Knobs, Problem, config_from_text, family, triton_fwd

#: short peer names -> bench providers
PEERS = {"cudnn": "sdpa-cudnn", "fa4": "fa4"}
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class Variant:
    """One timed thing: its name, its spec as written, the bench provider that runs it
    and, for flashscope, the resolved config."""

    name: str
    spec: str
    provider: str
    config: Optional[Knobs] = None

    @property
    def identity(self) -> Optional[str]:
        """What makes two variants the same config across A/B runs (None for peers)."""
        return None if self.config is None else f"{self.config.KERNEL}:{self.config.key}"

    def as_dict(self) -> dict:
        d = {"name": self.name, "spec": self.spec, "provider": self.provider}
        if self.config is not None:
            d.update(kernel=self.config.KERNEL, config=self.config.as_dict(),
                     label=self.config.label)
        return d


def parse_variants(text: str, flag: str = "--variants") -> dict:
    """``NAME=SPEC;...`` -> {name: spec}, in the order given. A name given twice is
    refused (the later spec would replace the earlier unseen)."""
    out = {}
    for item in filter(None, (x.strip() for x in str(text).split(";"))):
        name, sep, spec = (x.strip() for x in item.partition("="))
        if not sep or not spec:
            raise FlashscopeError(f"{flag}: expected NAME=SPEC, got {item!r}")
        if not _NAME.fullmatch(name):
            raise FlashscopeError(f"{flag}: variant name {name!r}: expected letters, digits "
                                  "and . _ + - only")
        if name in out:
            raise FlashscopeError(f"{flag}: {name!r} names two variants ({out[name]!r} and "
                                  f"{spec!r})")
        out[name] = spec
    return out


def join_variants(specs: dict) -> str:
    """The inverse of :func:`parse_variants`."""
    return ";".join(f"{n}={s}" for n, s in specs.items())


def default_config(problem: Problem, interpreter: bool = False, data_dir=None) -> Knobs:
    """The config a call on this problem runs by default: the first forward family that
    accepts it, its tuned entry (from ``data_dir``) or rule. Triton's interpreter runs
    the portable kernel only."""
    from ..families import default_config as family_default

    return family_default(problem, triton_fwd if interpreter else None, data_dir)


def resolve(name: str, spec: str, problem: Problem, *, interpreter: bool = False,
            data_dir=None) -> Variant:
    """The variant ``NAME=SPEC`` stands for on ``problem`` (module docstring)."""
    from ..bench.providers import REGISTRY

    text = spec.strip()
    provider = PEERS.get(text, text)
    if provider in REGISTRY and provider != "flashscope":
        return Variant(name, text, provider)
    try:
        if text.startswith("+"):
            base = default_config(problem, interpreter, data_dir)
            cfg = config_from_text(text[1:], problem, base.KERNEL, data_dir) \
                if text[1:].strip() else base
        elif ":" in text and text.partition(":")[0] in FAMILIES:
            cfg = config_from_text(text, problem, data_dir=data_dir)
        else:
            peers = ", ".join([*PEERS, *(n for n in REGISTRY if n != "flashscope")])
            raise ConfigError(f"expected +K=V,..., FAMILY:K=V,... (FAMILY one of "
                              f"{', '.join(FAMILIES)}) or a peer ({peers})")
        family(cfg.KERNEL).check(cfg, problem.target, problem.head_dim, problem.dtype)
    except ConfigError as e:
        raise FlashscopeError(f"variant {name}={text}: {e}") from None
    return Variant(name, text, "flashscope", cfg)


def resolve_all(specs: dict, problem: Problem, **kw) -> list:
    """:func:`resolve` for every ``{name: spec}``, in order."""
    return [resolve(n, s, problem, **kw) for n, s in specs.items()]
