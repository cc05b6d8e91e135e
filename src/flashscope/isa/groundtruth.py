"""Offline numbers against the GPU: compare what inspect read from the binaries with what a
real launch reports (Triton's ``n_regs`` / ``metadata.shared``) and with Nsight Compute's
launch metrics. Pure functions over the JSON/CSV that ``scripts/gpu/inspect_groundtruth.py``
writes, so recorded runs replay as CPU tests.

Equalities checked per config (sm90):
  registers            == n_regs == launch__registers_per_thread
  static_shared_bytes  == launch__shared_mem_per_block_static
  dynamic_shared_bytes == metadata.shared == launch__shared_mem_per_block_dynamic
  threads              == launch__block_size
  local_bytes          == 4 * n_spills (Triton's n_spills is local bytes / 4)
"""

from __future__ import annotations

NCU_METRICS = {
    "launch__registers_per_thread": "registers",
    "launch__shared_mem_per_block_static": "static_shared_bytes",
    "launch__shared_mem_per_block_dynamic": "dynamic_shared_bytes",
    "launch__block_size": "threads",
}

KERNEL_NAME = "_attn_fwd"


def compare_launch(doc: dict) -> list:
    """Rows {config, field, offline, launched, equal} from the launch-mode JSON
    (``{"rows": [{"config", "offline": {...}, "launched": {n_regs, n_spills, shared}}]}``)."""
    out = []
    for row in doc["rows"]:
        off, run = row["offline"], row["launched"]
        pairs = (("registers", off["registers"], run["n_regs"]),
                 ("dynamic_shared_bytes", off["dynamic_shared_bytes"], run["shared"]),
                 ("local_bytes", off["local_bytes"], 4 * run["n_spills"]))
        out += [{"config": row["config"], "field": f, "offline": a, "launched": b,
                 "equal": a == b} for f, a, b in pairs]
    return out


def compare_ncu(order: dict, csv_text: str, source: str = "ncu csv") -> list:
    """Rows {config, field, offline, ncu, equal}: the i-th ``_attn_fwd`` launch in the ncu
    CSV is the i-th config of ``order`` (``{"rows": [{"config", "offline"}]}``)."""
    from ..errors import ParseError
    from ..profile.ncu_csv import parse_ncu_csv

    launches = [k for k in parse_ncu_csv(csv_text, source) if KERNEL_NAME in k.name]
    rows = order["rows"]
    if len(launches) != len(rows):
        raise ParseError(f"{source}: {len(launches)} {KERNEL_NAME} launches, expected "
                         f"{len(rows)} (one per config)")
    out = []
    for row, k in zip(rows, launches):
        for metric, field in NCU_METRICS.items():
            v = k.get(metric)
            want = row["offline"][field]
            out.append({"config": row["config"], "field": field, "offline": want,
                        "ncu": None if v is None else int(round(v)),
                        "equal": v is not None and int(round(v)) == want})
    return out
