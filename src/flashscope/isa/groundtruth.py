"""Offline numbers against the GPU: compare what inspect read from the binaries with what a
real launch reports (Triton's ``n_regs`` / ``metadata.shared``, the driver's function
attributes) and with Nsight Compute's launch metrics. Pure functions over the JSON/CSV that
``scripts/gpu/inspect_groundtruth.py`` writes, so recorded runs replay as CPU tests.

Equalities checked per config (sm90):
  registers             == n_regs == CU_FUNC_ATTRIBUTE_NUM_REGS == launch__registers_per_thread
  static_shared_bytes   == launch__shared_mem_per_block_static
                           (and CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, when recorded)
  dynamic_shared_bytes  == metadata.shared == launch__shared_mem_per_block_dynamic
  reserved_shared_bytes == launch__shared_mem_per_block_driver
                           == CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
  threads               == launch__block_size
  local_bytes           == 4 * n_spills (Triton's n_spills is local bytes / 4)
                           == CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
Probes a recording may lack (the driver attributes and the driver-shared metric were added
after the first H100 run) give rows with ``equal: None``: not checked, never a pass.
"""

from __future__ import annotations

#: ncu metric -> record field; all required in a recording.
NCU_METRICS = {
    "launch__registers_per_thread": "registers",
    "launch__shared_mem_per_block_static": "static_shared_bytes",
    "launch__shared_mem_per_block_dynamic": "dynamic_shared_bytes",
    "launch__block_size": "threads",
}
#: ncu metrics compared when the recording has them.
NCU_OPTIONAL = {"launch__shared_mem_per_block_driver": "reserved_shared_bytes"}

#: launched-kernel key -> (record field, factor applied to the launched value); keys
#: after the first three are optional (driver attributes read with cuFuncGetAttribute /
#: cuDeviceGetAttribute).
LAUNCH_FIELDS = (
    ("n_regs", "registers", 1),
    ("shared", "dynamic_shared_bytes", 1),
    ("n_spills", "local_bytes", 4),
    ("func_num_regs", "registers", 1),
    ("func_shared_size_bytes", "static_shared_bytes", 1),
    ("func_local_size_bytes", "local_bytes", 1),
    ("device_reserved_shared_per_block", "reserved_shared_bytes", 1),
)
_REQUIRED_LAUNCH = 3

KERNEL_NAME = "_attn_fwd"


def _row(config, field, source, offline, measured):
    return {"config": config, "field": field, "source": source, "offline": offline,
            "measured": measured,
            "equal": None if measured is None or offline is None else offline == measured}


def compare_launch(doc: dict) -> list:
    """Rows {config, field, source, offline, measured, equal} from the launch-mode JSON
    (``{"rows": [{"config", "offline": {...}, "launched": {n_regs, n_spills, shared, ...}}]}``).
    A required launch value that is missing compares unequal; an optional one gives
    ``equal: None``."""
    out = []
    for row in doc["rows"]:
        off, run = row["offline"], row["launched"]
        for i, (key, field, factor) in enumerate(LAUNCH_FIELDS):
            if i >= _REQUIRED_LAUNCH and key not in run:
                continue
            v = run.get(key)
            r = _row(row["config"], field, key, off.get(field),
                     None if v is None else factor * int(v))
            if i < _REQUIRED_LAUNCH and r["equal"] is None:
                r["equal"] = False
            out.append(r)
    return out


def compare_ncu(order: dict, csv_text: str, source: str = "ncu csv") -> list:
    """Rows {config, field, source, offline, measured, equal}: the i-th ``_attn_fwd`` launch
    in the ncu CSV is the i-th config of ``order`` (``{"rows": [{"config", "offline"}]}``).
    A required metric ncu did not report compares unequal; an optional one gives None."""
    from ..errors import ParseError
    from ..profile.ncu_csv import parse_ncu_csv

    launches = [k for k in parse_ncu_csv(csv_text, source) if KERNEL_NAME in k.name]
    rows = order["rows"]
    if len(launches) != len(rows):
        raise ParseError(f"{source}: {len(launches)} {KERNEL_NAME} launches, expected "
                         f"{len(rows)} (one per config)")
    out = []
    for row, k in zip(rows, launches):
        for metric, field in {**NCU_METRICS, **NCU_OPTIONAL}.items():
            v = k.get(metric)
            r = _row(row["config"], field, metric, row["offline"].get(field),
                     None if v is None else int(round(v)))
            if metric in NCU_METRICS and r["equal"] is None:
                r["equal"] = False
            out.append(r)
    return out


def with_offline(doc: dict, offline: dict) -> dict:
    """``doc`` with each row's ``offline`` values replaced by ``offline[config]`` (records
    re-read now from the recorded binaries), so a reader fix replays against old runs."""
    rows = [{**r, "offline": {**r["offline"], **offline[r["config"], r["head_dim"],
                                                      r["causal"]]}} for r in doc["rows"]]
    return {**doc, "rows": rows}


#: A kernel with 256 bytes of its own static shared memory (plus dynamic shared): on sm_90+
#: ptxas puts it after the 1 KB system window (``.nv.shared.probe`` = 1280 bytes), on sm_80
#: at offset 0 (256 bytes). The reader must report 256 static bytes on both; the driver's
#: CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES of the loaded probe says which count it uses.
PROBE_STATIC_BYTES = 256
PROBE_PTX = """.version 8.0
.target {arch}
.address_size 64
.shared .align 16 .b8 probe_static[256];
.extern .shared .align 16 .b8 probe_dynamic[];
.visible .entry probe(.param .u64 out)
{{
 .reg .b32 %r<3>;
 .reg .b64 %rd<2>;
 ld.param.u64 %rd1, [out];
 mov.u32 %r1, %tid.x;
 st.shared.u32 [probe_static+4], %r1;
 st.shared.u32 [probe_dynamic], %r1;
 bar.sync 0;
 ld.shared.u32 %r2, [probe_static+8];
 st.global.u32 [%rd1], %r2;
 ret;
}}
"""


def probe_cubin(arch: str = "sm_90a") -> bytes:
    """Assemble :data:`PROBE_PTX` for ``arch`` with the ptxas of Triton's wheel."""
    import subprocess
    import tempfile
    from pathlib import Path

    from ..errors import ArtifactError
    from .nvidia import tool

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "probe.ptx", Path(d) / "probe.cubin"
        src.write_text(PROBE_PTX.format(arch=arch))
        p = subprocess.run([tool("ptxas"), f"-arch={arch}", str(src), "-o", str(dst)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise ArtifactError(f"ptxas -arch={arch} on the probe: {p.stderr.strip()}")
        return dst.read_bytes()
