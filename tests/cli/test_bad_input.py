"""Every command, every kind of bad input: one line on stderr naming the argument (or file
and place) and what was expected, exit code 2, no traceback, and nothing written. None of
these cases compiles or runs a kernel: each is refused before any work starts."""

import json
from pathlib import Path

import pytest

from flashscope.cli import main

DATA = Path(__file__).parents[1] / "data"
NCU = str(DATA / "profile" / "ncu_raw_h100.csv")
ROC = str(DATA / "breakdown" / "rocprof_kernel_trace.csv")

#: area -> [(argv, what stderr must say)]; {tmp} is a fresh folder, {file} a file in it
#: holding "x", {deep}/{nan}/{junk}/{neg} JSON files with those defects.
CASES = {
    "numbers": [
        (["inspect", "--config", "BLOCK_M=1e400"], "BLOCK_M expects an integer, got '1e400'"),
        (["inspect", "--config", "BLOCK_M=nan"], "BLOCK_M"),
        (["inspect", "--jobs", "-1"], "argument --jobs: expected an integer >= 0"),
        (["roofline", "--peak-tflops", "nan", "--peak-bandwidth", "3"],
         "argument --peak-tflops: expected a finite number > 0, got 'nan'"),
        (["roofline", "--peak-tflops", "1e400", "--peak-bandwidth", "3"], "--peak-tflops"),
        (["roofline", "--peak-tflops", "100", "--peak-bandwidth", "-3"], "--peak-bandwidth"),
        (["roofline", "--nk", "0"], "argument --nk: expected an integer >= 1, got 0"),
        (["roofline", "--hkv", "0"], "argument --hkv"),
        (["roofline", "--hkv", "5"], "expected a divisor of H (16)"),
        (["roofline", "--time", "k=0"], "a finite time > 0"),
        (["roofline", "--time", "k=inf"], "a finite time > 0"),
        (["roofline", "--time", "k=-2"], "a finite time > 0"),
        (["roofline", "--shape", "4,16,99999999999,128"], "below 2^31"),
        (["bench", "--shape", "1,2,16,16", "--warmup-ms", "-1"], "argument --warmup-ms"),
        (["bench", "--shape", "1,2,16,16", "--rep-ms", "0"], "argument --rep-ms"),
        (["bench", "--shape", "1,2,16,16", "--rounds", "0"], "argument --rounds"),
        (["bench", "--shape", "1,2,0,16"], "positive integers"),
        (["bench", "--suite", "--lengths", "0"], "--lengths"),
        (["occupancy", "--target", "sm90", "--threads", "0", "--regs", "1"],
         "argument --threads: expected an integer >= 1"),
        (["occupancy", "--target", "sm90", "--threads", "64", "--regs", "-4"], "--regs"),
        (["occupancy", "--target", "sm90", "--threads", "64", "--smem", "1e9"], "--smem"),
        (["occupancy", "--target", "sm90", "--threads", "64", "--regs", "300"],
         "at most 255"),
        (["profile", "--ncu-csv", NCU, "--gate", "issue_active>=1e400"], "not a finite"),
        (["profile", "--ncu-csv", NCU, "--shape", "4,16,0,128"], "--shape"),
        (["sweep", "--jobs", "-2"], "argument --jobs"),
        (["sweep", "--budget", "-1"], "argument --budget"),
        (["breakdown", "--batch", "0"], "argument --batch: expected an integer >= 1"),
        (["breakdown", "--iters", "0"], "argument --iters"),
        (["breakdown", "--layers", "1.5"], "argument --layers"),
    ],
    "spellings": [
        (["inspect", "--target", "H10"], "did you mean H100 (sm90)?"),
        (["inspect", "--target", "sm9"], "did you mean"),
        (["inspect", "--dtype", "fp8"], "--dtype 'fp8': expected bf16 or fp16"),
        (["inspect", "--causal", "maybe"], "argument --causal: expected no, yes or both"),
        (["inspect", "--head-dim", "64,x"], "argument --head-dim/--head-dims"),
        (["report", "--dtype", "bf16,fp16"], "this command takes one dtype"),
        (["report", "--causal", "both"], "this command builds one mask"),
        (["roofline", "--dtype", "int8"], "expected bf16, fp16 or fp32"),
        (["profile", "--ncu-csv", NCU, "--causal", "both"], "builds one mask"),
        (["sweep", "--target", "sm91"], "unknown target 'sm91'"),
        (["sweep", "--dtype", "fp8"], "--dtype 'fp8'"),
        (["breakdown", "--rocprof", ROC, "--target", "gfx942,gfx1100"], "takes one target"),
        (["bench", "--shape", "1,2,16,16", "--mode", "back"], "--mode 'back'"),
        (["occupancy", "--target", "", "--threads", "64"], "no target given"),
        (["profile", "--ncu-csv", NCU, "--providers", "cudnn,xformers"], "unknown provider"),
        (["nosuchcommand"], "invalid choice"),
    ],
    "files read": [
        (["inspect", "--configs", "{tmp}/missing.json"], "--configs {tmp}/missing.json: no such"),
        (["inspect", "--configs", "{tmp}"], "is a folder, expected a file"),
        (["inspect", "--configs", "{deep}"], "nested too deeply"),
        (["inspect", "--configs", "{nan}"], "NaN is not a JSON number"),
        (["inspect", "--configs", "{junk}"], "binary data"),
        (["inspect", "--configs", "{neg}"], "entry 0"),
        (["report", "--configs", "{deep}"], "nested too deeply"),
        (["report", "--configs", "{file}"], "not valid JSON"),
        (["sweep", "--space", "{deep}"], "--space {deep}: JSON nested too deeply"),
        (["sweep", "--space", "{neg}"], "--space"),
        (["sweep", "--space", "{big}"], "more than a sweep can finish"),
        (["sweep", "--compare", "{file}", "{tmp}/none.jsonl"], "--compare"),
        (["sweep", "--compare", "{junk}", "{junk}"], "is not a JSON object"),
        (["sweep", "--search", "evolve", "--budget", "1", "--history", "{tmp}"], "--history"),
        (["profile", "--ncu-csv", "{tmp}"], "is a folder"),
        (["profile", "--ncu-csv", "{junk}"], "binary data"),
        (["profile", "--ncu-csv", "{negcsv}"], "impossible for a counter"),
        (["profile", "--ncu-csv", NCU, "--speed", "{deep}"], "nested too deeply"),
        (["profile", "--ncu-csv", NCU, "--speed", "{negspeed}"], "expected a finite number"),
        (["profile", "--from-csv", "{file}"], "not a directory"),
        (["roofline", "--counters", "{deep}"], "nested too deeply"),
        (["roofline", "--counters", "{negprofile}"], "kernels[0].duration is -1"),
        (["breakdown", "--trace", "{deep}"], "nested too deeply"),
        (["breakdown", "--trace", "{negtrace}"], "negative duration"),
        (["breakdown", "--trace", "{tmp}/none.json"], "no such file"),
        (["breakdown", "--rocprof", "{negroc}"], "impossible"),
        (["breakdown", "--stats", "{junk}"], "binary"),
        (["inspect", "{tmp}/nothing.cubin"], "no such file"),
        (["inspect", "{file}"], "not an ELF"),
    ],
    "files written": [
        (["roofline", "--plot", "{tmp}/x.jpg"], "unknown extension '.jpg'"),
        (["roofline", "--plot", "{tmp}/missing/x.png"], "does not exist"),
        (["roofline", "--plot", "{tmp}"], "--plot"),
        (["roofline", "--plot", "{file}.png"], None),  # made to exist below: refused
        (["occupancy", "--target", "sm90", "--threads", "64", "--regs", "32", "--plot",
          "{tmp}/s.gif"], "unknown extension"),
        (["targets", "--out", "{file}"], "exists and is not a folder"),
        (["targets", "--out", "{tmp}/a/b"], "its parent {tmp}/a does not exist"),
        (["version", "--out", "/proc/flashscope-out"], "cannot write"),
        (["report", "--out", "{file}"], "exists and is not a folder"),
        (["report", "--out", "{tmp}/no/such"], "does not exist"),
        (["bench", "--shape", "1,2,16,16", "--out", "{file}"], "not a folder"),
        (["sweep", "--out", "{file}"], "not a folder"),
        (["sweep", "--out", "{tmp}/no/such"], "does not exist"),
        (["profile", "--ncu-csv", NCU, "--out", "{file}"], "not a folder"),
        (["breakdown", "--rocprof", ROC, "--out", "{tmp}/no/such"], "does not exist"),
    ],
    "device": [
        (["bench", "--suite"], "--suite needs a GPU"),
        (["bench", "--suite", "--device", "cpu"], "--suite needs a GPU"),
        (["bench", "--shape", "1,2,16,16", "--device", "cuda"], "--device cuda: no CUDA"),
        (["selfcheck", "--device", "cuda"], "--device cuda: no CUDA"),
        (["roofline", "--measure"], "--measure: no CUDA"),
        (["breakdown", "--device", "cpu"], "about 83 minutes for lc0-encoder"),
        (["breakdown"], "--batch 11 finishes in 5 minutes"),
        (["breakdown", "--preset", "decoder-long"], "a shorter --seq or fewer --layers"),
        (["breakdown", "--device", "cuda"], "--device cuda: no CUDA"),
        (["sweep", "--gpu", "--shapes", "1,2,64,64"], "no CUDA/ROCm device"),
    ],
    "combinations": [
        (["inspect", "--diff", "BLOCK_M=64"], "expected 2 arguments"),
        (["inspect", "x.cubin", "--config", "BLOCK_M=64"], "exclude each other"),
        (["inspect", "--config", "triton-bwd:BLOCK_M1=32"],
         "a triton-bwd config builds one of its kernels; name it with --kernel (bwd_preprocess"),
        (["profile", "--ncu-csv", NCU, "--from-csv", "{tmp}"], "one or the other"),
        (["roofline", "--peak-tflops", "100"], "go together"),
        (["occupancy", "--target", "sm90,sm80", "--threads", "64", "--regs", "8", "--plot",
          "{tmp}/p.png"], "one target's staircase"),
        (["sweep", "--write-tuned"], "--write-tuned needs --gpu"),
        (["sweep", "--shapes", "4,32,4096,64"], "--shapes applies to GPU sweeps"),
        (["report", "--kernel", "bwd", "--configs", "{file}"], "--configs applies to"),
        (["bench"], "give --suite and/or --shape"),
        (["bench", "--shape", "1,2,16,16", "--hide-host", "--cuda-graph"], "one timer"),
        (["targets", "--json", "--csv"], "not allowed with argument"),
    ],
}

_FILES = {
    "deep": "[" * 100000 + "]" * 100000,
    "nan": '[{"BLOCK_M": NaN}]',
    "neg": '[{"BLOCK_M": [1]}]',
    "big": json.dumps({"targets": ["sm90"], "BLOCK_M": [16, 32, 64, 128, 256],
                       "BLOCK_N": [16, 32, 64, 128, 256], "num_warps": [1, 2, 4, 8, 16],
                       "num_stages": [1, 2, 3, 4, 5, 6, 7, 8], "maxnreg": list(range(16, 100)),
                       "head_dims": list(range(1, 50))}),
    "negspeed": '[{"config": "m64n64w4s3q1", "ms": -2}]',
    "negprofile": '{"kernels": [{"provider": "cudnn", "duration": -1}]}',
    "negtrace": '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, '
                '"dur": -5}]}',
    "negroc": "Kernel_Name,Start_Timestamp,End_Timestamp,VGPR_Count\nk,100,200,-8\n",
}


def _setup(tmp: Path) -> dict:
    paths = {"tmp": str(tmp), "file": str(tmp / "file")}
    (tmp / "file").write_text("x")
    (tmp / "file.png").write_text("not a plot, and not to be replaced")
    (tmp / "junk").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff")
    paths["junk"] = str(tmp / "junk")
    for name, text in _FILES.items():
        (tmp / f"{name}.json").write_text(text)
        paths[name] = str(tmp / f"{name}.json")
    (tmp / "negcsv.csv").write_text(_negative_ncu())
    paths["negcsv"] = str(tmp / "negcsv.csv")
    (tmp / "negroc.csv").write_text(_FILES["negroc"])
    paths["negroc"] = str(tmp / "negroc.csv")
    return paths


def _negative_ncu() -> str:
    """The recorded raw ncu page with one counter made negative."""
    lines = Path(NCU).read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith('"0"'))
    cells = lines[i].split('","')
    j = next(k for k in range(len(cells) - 1, 0, -1) if cells[k].replace(".", "").isdigit())
    cells[j] = "-" + cells[j]
    lines[i] = '","'.join(cells)
    return "\n".join(lines) + "\n"


def _snapshot(tmp: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in tmp.rglob("*")}


ALL = [(area, argv, needle) for area, cases in CASES.items() for argv, needle in cases]


@pytest.mark.parametrize("area, argv, needle", ALL,
                         ids=[f"{a}:{' '.join(v)[:60]}" for a, v, _ in ALL])
def test_bad_input_is_one_line_exit_2_nothing_written(area, argv, needle, tmp_path, capsys):
    if needle and ("no CUDA" in needle or needle == "--suite needs a GPU" and "cpu" not in
                   argv) and _gpu_visible():
        pytest.skip("checks the refusal where no GPU is visible")
    paths = _setup(tmp_path)
    argv = [a.format(**paths) for a in argv]
    needle = needle.format(**paths) if needle else "exists; pass --force"
    before = _snapshot(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("flashscope"), err
    assert needle in err, err
    assert out == ""
    assert _snapshot(tmp_path) == before  # nothing written, created or replaced


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def test_case_counts():
    """At least 80 cases over the six areas (the closing note counts them)."""
    assert sum(len(v) for v in CASES.values()) >= 80
    assert all(len(v) >= 9 for v in CASES.values())
