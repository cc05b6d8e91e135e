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


@pytest.mark.parametrize("fname", ["ncu_details_h100.csv", "ncu_raw_h100.csv"])
def test_both_layouts_give_the_same_numbers(fname):
    ks = read_ncu_csv(DATA / fname)
    assert [k.id for k in ks] == [0, 1, 2]
    cudnn = ks[0]
    assert cudnn.name.startswith("cudnn_generated_fort_native_sdpa_sm90")
    assert cudnn.get("registers") == 168
    assert cudnn.get("smem_dynamic") == 232448  # "232,448"
    assert cudnn.get("achieved_occupancy") == pytest.approx(14.1)
    assert cudnn.get("duration") == pytest.approx(0.830112)  # ns -> ms
    assert ks[2].get("tensor_pipe") is None  # n/a
    assert "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128" in ks[1].name  # commas kept


def test_units_convert_to_ms_and_bytes():
    assert to_base(1500.0, "usecond") == pytest.approx(1.5)
    assert to_base(2.0, "Kbyte") == 2000.0
    assert to_base(3.0, "Tbyte/second") == 3e12
    assert to_base(42.0, "%") == 42.0


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
