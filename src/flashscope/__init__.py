"""flashscope: a tunable FlashAttention in Triton, and the instruments to see inside it."""

__version__ = "0.1.0"

from .errors import FlashscopeError  # noqa: E402
from .families import Problem, default_config, family  # noqa: E402
from .families.sm90_fwd import Sm90FwdConfig  # noqa: E402
from .families.triton_bwd import TritonBwdConfig  # noqa: E402
from .families.triton_decode import TritonDecodeConfig  # noqa: E402
from .families.triton_fwd import TritonFwdConfig  # noqa: E402


def __getattr__(name):
    # The torch-facing API is imported on first use, so that analysis commands and
    # ``TRITON_INTERPRET=1`` set after ``import flashscope`` keep working.
    if name == "attention":
        from .api import attention

        return attention
    if name in ("attention_with_kvcache", "check_kvcache"):
        from . import kvcache

        return getattr(kvcache, name)
    if name == "attention_varlen":
        from .varlen import attention_varlen

        return attention_varlen
    raise AttributeError(f"module 'flashscope' has no attribute {name!r}")


__all__ = ["FlashscopeError", "Problem", "Sm90FwdConfig", "TritonBwdConfig",
           "TritonDecodeConfig", "TritonFwdConfig", "attention", "attention_varlen",
           "attention_with_kvcache", "check_kvcache", "default_config", "family",
           "__version__"]
