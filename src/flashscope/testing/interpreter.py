"""A fix for Triton's CPU interpreter (3.6 through 3.9) on bf16 matrix products.

The interpreter keeps bf16 tensors as their raw uint16 bit patterns (numpy has no
bfloat16), and its ``create_dot`` converts only fp8 operands before ``np.matmul``. A bf16
``tl.dot`` therefore multiplies the bit patterns as integers and returns garbage (errors of
1e9 on unit-normal inputs), while loads, stores and casts are right. The kernels are not at
fault: the same kernels are exact on the GPU. :func:`patch_bf16_dot` decodes bf16 operands
to float32 first (bf16 is the top half of an IEEE float32, so the decode is exact); the test
suite applies it so bf16 can be checked on CPU too.
"""

from __future__ import annotations

_PATCHED = False


def _bf16_bits_to_f32(data):
    import numpy as np

    return (data.astype(np.uint32) << 16).view(np.float32)


def patch_bf16_dot() -> bool:
    """Make the interpreter's ``tl.dot`` decode bf16 operands. Idempotent; returns True
    once patched (False if this Triton has no interpreter builder to patch)."""
    global _PATCHED
    if _PATCHED:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "create_dot"):  # pragma: no cover
        return False
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype == tl.bfloat16 or b.dtype == tl.bfloat16:
            a = interpreter.TensorHandle(_bf16_bits_to_f32(a.data), tl.float32) \
                if a.dtype == tl.bfloat16 else a
            b = interpreter.TensorHandle(_bf16_bits_to_f32(b.data), tl.float32) \
                if b.dtype == tl.bfloat16 else b
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    _PATCHED = True
    return True


def choose_device(requested=None, flag: str = "--device cuda") -> str:
    """"cpu" (Triton's interpreter, bf16 fix applied) or "cuda" for a command's
    ``--device``; None picks the GPU when one is visible and the interpreter is not forced.
    Sets TRITON_INTERPRET before the kernels are built, which the CPU path needs. Asking
    for "cuda" where torch sees no GPU is an error naming ``flag``."""
    import os

    from ..errors import FlashscopeError

    if requested not in (None, "cpu", "cuda"):
        raise FlashscopeError(f"--device {requested!r}: expected cpu or cuda")
    if requested == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    device = requested
    if device is None:
        device = "cuda" if torch.cuda.is_available() and os.environ.get(
            "TRITON_INTERPRET", "0") in ("", "0") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise FlashscopeError(f"{flag}: no CUDA or ROCm GPU is visible here "
                              "(torch.cuda.is_available() is False)"
                              + ("; use --device cpu" if flag.startswith("--device") else ""))
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        patch_bf16_dot()
    return device
