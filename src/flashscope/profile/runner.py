"""Run Nsight Compute on flashscope's forward kernel and SDPA's backends (GPU only).

One ncu process per (provider, config): ``ncu --clock-control none --print-units base
--csv --metrics <METRICS> -k regex:<kernel> --launch-skip 1 --launch-count 1 python -m
flashscope.profile.child ...``. ``--clock-control none`` keeps the GPU's own clocks (ncu
otherwise locks them to base, which slows tensor-core kernels and skews durations);
the kernel filter and launch skip pick the second launch of the attention kernel only.
Speed is FLOPs / ncu's ``gpu__time_duration`` (TFLOP/s), fwd FLOPs = 4 B H N^2 D
(x 0.5 causal).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..errors import FlashscopeError, ParseError
from .metrics import ncu_metric_list
from .ncu_csv import parse_ncu_csv


@dataclass(frozen=True)
class Provider:
    name: str
    kernel_regex: str  # ncu -k regex over the kernel's function name
    doc: str


PROVIDERS = (
    Provider("flashscope", "_attn_fwd", "flashscope's Triton forward"),
    Provider("cudnn", "cudnn|sdpa", "SDPA CUDNN_ATTENTION (cuDNN fused flash fprop)"),
    Provider("flash", "flash_fwd", "SDPA FLASH_ATTENTION (FlashAttention-2)"),
    Provider("efficient", "fmha_cutlassF|AttentionKernel", "SDPA EFFICIENT_ATTENTION (CUTLASS)"),
)
_BY_NAME = {p.name: p for p in PROVIDERS}


def get_provider(name: str) -> Provider:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise FlashscopeError(f"--providers: unknown provider {name!r}; expected some of "
                              f"{', '.join(_BY_NAME)}") from None


def fwd_flops(B, H, N, D, causal) -> float:
    return 4.0 * B * H * N * N * D * (0.5 if causal else 1.0)


def ncu_command(provider: str, shape, dtype: str, causal: bool, config: str = "",
                ncu: str = "ncu", python: str = sys.executable) -> list:
    p = get_provider(provider)
    cmd = [ncu, "--clock-control", "none", "--print-units", "base", "--csv",
           "--metrics", ncu_metric_list(), "-k", f"regex:{p.kernel_regex}",
           "--launch-skip", "1", "--launch-count", "1",
           python, "-m", "flashscope.profile.child", p.name, ",".join(map(str, shape)), dtype,
           "1" if causal else "0"]
    if config:
        cmd.append(config)
    return cmd


def find_ncu(ncu: str = "ncu") -> str:
    path = shutil.which(ncu)
    if path is None:
        raise FlashscopeError(f"--ncu: {ncu!r} not found on PATH (Nsight Compute is needed to "
                              "profile; use --ncu-csv FILE to read an existing ncu CSV)")
    return path


def profile_one(provider: str, shape, dtype: str, causal: bool, config: str = "",
                ncu: str = "ncu", timeout: float = 300.0):
    """Run ncu once; return (KernelCounters, ncu's stdout text)."""
    cmd = ncu_command(provider, shape, dtype, causal, config, find_ncu(ncu))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    label = provider + (f" [{config}]" if config else "")
    try:
        kernels = parse_ncu_csv(proc.stdout, source=f"ncu on {label}")
    except ParseError as e:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FlashscopeError(f"{e} (exit {proc.returncode}; last output: "
                              f"{' | '.join(tail)})") from None
    return kernels[-1], proc.stdout


def row_for(k, provider: str, config: str, shape, causal: bool) -> dict:
    """One kernel's counters as a flat row with TFLOP/s from its duration."""
    d = k.as_dict()
    d.update(provider=provider, config=config)
    ms = d.get("duration")
    d["tflops"] = fwd_flops(*shape, causal) / (ms * 1e-3) / 1e12 if ms else None
    return d
