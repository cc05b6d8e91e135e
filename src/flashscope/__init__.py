"""flashscope: a tunable FlashAttention in Triton, and the instruments to see inside it."""

__version__ = "0.1.0"

from .config import AttentionConfig, check_config, select_config  # noqa: E402
from .errors import FlashscopeError  # noqa: E402


def __getattr__(name):
    # The torch-facing API is imported on first use, so that analysis commands and
    # ``TRITON_INTERPRET=1`` set after ``import flashscope`` keep working.
    if name == "attention":
        from .api import attention

        return attention
    raise AttributeError(f"module 'flashscope' has no attribute {name!r}")


__all__ = ["AttentionConfig", "FlashscopeError", "attention", "check_config", "select_config",
           "__version__"]
