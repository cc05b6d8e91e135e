"""The ncu CSV reader: both page layouts, units, n/a, thousands separators, bad input."""

from pathlib import Path

import pytest

from flashscope.errors import ParseError
from flashscope.profile.metrics import to_base
from flashscope.profile.ncu_csv import parse_ncu_csv, read_ncu_csv

DATA = Path(__file__).parents[1] / "data" / "profile"
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def _row(kid, metric, unit, value, name="k"):
    return (f'"{kid}","1","python3","h","{name}","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


REAL = ("ncu_00_cudnn.csv", "ncu_01_flash.csv", "ncu_02_efficient.csv")


def test_real_h100_details_page():
    """ncu 2025.3.1 on an H100, --print-units base: units read ns, byte/s, byte/block."""
    (cudnn,) = read_ncu_csv(DATA / REAL[0])
    assert cudnn.name.startswith("cudnn_generated_fort_native_sdpa_sm90")
    assert cudnn.units["gpu__time_duration.sum"] == "ns"
    assert cudnn.get("duration") == 0.831968  # "831,968" ns -> ms
    assert cudnn.get("registers") == 168
    assert cudnn.get("smem_dynamic") == 232448  # "232,448" byte/block
    assert (cudnn.get("smem_static"), cudnn.get("smem_driver")) == (0, 1024)
    assert cudnn.get("dram_bandwidth") == 315173352821.26  # byte/s
    assert cudnn.get("achieved_occupancy") == 14.06 and cudnn.get("eligible_warps") == 0.55
    (flash,) = read_ncu_csv(DATA / REAL[1])
    assert "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128" in flash.name  # commas kept


def test_raw_page_gives_the_details_numbers():
    """ncu_raw_h100.csv lays the three real details files out as a raw page."""
    raw = read_ncu_csv(DATA / "ncu_raw_h100.csv")
    assert [k.id for k in raw] == [0, 1, 2]
    for k, fname in zip(raw, REAL):
        (d,) = read_ncu_csv(DATA / fname)
        assert k.name == d.name and k.as_dict() == {**d.as_dict(), "id": k.id}, fname


def test_not_applicable_values_read_none():
    text = "\n".join([HEADER, _row(0, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_"
                                       "sustained_active", "%", "n/a"),
                      _row(0, "gpu__time_duration.sum", "ns", "1,000")])
    (k,) = parse_ncu_csv(text)
    assert k.get("tensor_pipe") is None and k.get("duration") == 0.001


@pytest.mark.parametrize("value, unit, want, expect", [
    (1093280.0, "ns", "ms", 1.09328),  # ncu 2025 with --print-units base
    (1500.0, "usecond", "ms", 1.5),
    (1.25, "msecond", "ms", 1.25),
    (2.0, "s", "ms", 2000.0),
    (2.0, "Kbyte", "B", 2000.0),
    (1024.0, "byte/block", "B", 1024.0),
    (3.0, "Tbyte/second", "B/s", 3e12),
    (5.0, "Gbyte/s", "B/s", 5e9),
    (42.0, "%", "%", 42.0),
    (176.0, "register/thread", "count", 176.0),
])
def test_units_convert_to_ms_and_bytes(value, unit, want, expect):
    assert to_base(value, unit, want) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("unit, want", [("", "ms"), ("cycle", "ms"), ("byte", "ms"),
                                        ("ns", "B"), ("byte/s", "B")])
def test_a_unit_of_the_wrong_dimension_is_refused(unit, want):
    with pytest.raises(ValueError, match="not a"):
        to_base(1.0, unit, want)


def test_duration_in_an_unknown_unit_is_a_parse_error():
    (k,) = parse_ncu_csv("\n".join([HEADER, _row(0, "gpu__time_duration.sum", "cycle", "9")]))
    with pytest.raises(ParseError, match="gpu__time_duration.sum: unit 'cycle'"):
        k.get("duration")


def test_program_output_before_header_is_skipped():
    text = "\n".join(["hello from the program", "==PROF== Connected", HEADER,
                      _row(0, "gpu__time_duration.sum", "msecond", "1.25"),
                      "==PROF== Disconnected from process 1"])
    (k,) = parse_ncu_csv(text)
    assert k.get("duration") == 1.25


@pytest.mark.parametrize("text, msg", [
    ("", "empty"),
    ("==PROF== Connected\n==WARNING== No kernels were profiled.\n", "no ncu CSV header"),
    (HEADER + "\n", "no kernel rows"),
    (HEADER + "\n" + _row(0, "gpu__time_duration.sum", "nsecond", "12abc"), "expected a number"),
    (HEADER + "\n" + _row(0, "gpu__time_duration.sum", "nsecond", "9,00"), "expected a number"),
    (HEADER + '\n"0","1"', "2 columns"),
])
def test_malformed_text_raises_parse_error(text, msg):
    with pytest.raises(ParseError, match=msg):
        parse_ncu_csv(text)


@pytest.mark.parametrize("data, msg", [
    (b"", "empty"),
    (b"\x7fELF\x02\x01\x00\x00garbage", "binary"),
    ("ID,Kernel Name\n\u00e9".encode("latin-1"), "not UTF-8"),
])
def test_bad_files_raise_parse_error(tmp_path, data, msg):
    f = tmp_path / "x.csv"
    f.write_bytes(data)
    with pytest.raises(ParseError, match=msg):
        read_ncu_csv(f)
