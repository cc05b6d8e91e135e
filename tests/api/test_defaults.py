"""The default config of a call (``config=None``), remembered per geometry.

``flashscope.api._default_config`` keeps its answer by everything it reads: the tuned
file's stamp (an edited file takes effect within tuned.RESTAT_S), dtype, shapes, strides,
alignment, mask and the scale's sign. Offline: the target is pinned to sm90 and the
tuned files come from a temporary folder.
"""

import json

import torch

from flashscope import api, tuned
from flashscope.families import Problem
from flashscope.families.sm90_fwd import Sm90FwdConfig
from flashscope.masks import Mask

G = Sm90FwdConfig(BLOCK_M=128, num_stages=2, Q_IN_REGS=False, EARLY_Q=False)


def _write(tmp_path, cfg):
    entry = {"kernel": "sm90-fwd", "dtype": "bfloat16", "head_dim": 64, "causal": True,
             "seq_class": "le1k", "config": cfg.diff()}
    (tmp_path / "sm90.json").write_text(json.dumps(
        {"format": tuned.FORMAT, "target": "sm90", "entries": [entry]}, indent=1))


def test_default_is_remembered_and_follows_the_tuned_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "DATA_DIR", tmp_path)
    monkeypatch.setattr(tuned, "_STAMPS", {})
    monkeypatch.setattr(tuned, "RESTAT_S", 0.0)  # an edit by hand counts at once
    monkeypatch.setattr(api, "device_target", lambda device: "sm90")
    monkeypatch.setattr(api, "_DEFAULTS", {})
    chosen = []
    choose = api._choose_default
    monkeypatch.setattr(api, "_choose_default",
                        lambda *a: chosen.append(a[3]) or choose(*a))
    causal, full = Mask.of(True), Mask()
    q, k, v = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    _write(tmp_path, G)
    assert api._default_config(q, k, v, causal, 0.125) == G
    q2, k2, v2 = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    assert api._default_config(q2, k2, v2, causal, 0.125) == G and chosen == [causal]
    _write(tmp_path, G.replace(OUT_RCP=False, EARLY_Q=True, K_EARLY=False))  # another size
    assert api._default_config(q2, k2, v2, causal, 0.125) == G.replace(
        OUT_RCP=False, EARLY_Q=True, K_EARLY=False)
    assert len(chosen) == 2
    # the other mask (the rule), a scale <= 0 and a misaligned view (the portable kernel),
    # a window (the portable kernel): each chosen anew
    assert api._default_config(q, k, v, full, 0.125).KERNEL == "sm90-fwd"
    assert api._default_config(q, k, v, causal, -0.5).KERNEL == "triton-fwd"
    odd = torch.randn(2, 4, 100, 72, dtype=torch.bfloat16)[..., 4:68]
    assert api._default_config(odd, k, v, causal, 0.125).KERNEL == "triton-fwd"
    assert api._default_config(q, k, v, Mask.of(True, (8, 0)), 0.125).KERNEL == "triton-fwd"
    assert len(chosen) == 6


def test_the_file_is_stat_at_most_once_a_restat_interval(tmp_path, monkeypatch):
    """A default-config call asks for the file's stamp every time; the file system is
    asked once per RESTAT_S, and the one writer makes its own write count at once."""
    monkeypatch.setattr(tuned, "_STAMPS", {})
    monkeypatch.setattr(tuned, "RESTAT_S", 3600.0)
    stats = []
    real = tuned.os.stat
    monkeypatch.setattr(tuned.os, "stat", lambda p, *a, **kw: stats.append(p) or real(p))
    _write(tmp_path, G)
    first = tuned.file_stamp("sm90", tmp_path)
    for _ in range(5):
        assert tuned.file_stamp("sm90", tmp_path) == first
    assert len(stats) == 1
    entry = tuned.make_entry(G.replace(OUT_RCP=False), "bfloat16", 64, True, "le1k",
                             source="test")
    tuned.write_entries("sm90", [entry], tmp_path)
    assert tuned.file_stamp("sm90", tmp_path) != first
    assert tuned.lookup(Problem("sm90", "bfloat16", 64, True, 100, 100), "sm90-fwd",
                        tmp_path)[0] == G.replace(OUT_RCP=False)


def test_fp16_takes_the_bf16_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "DATA_DIR", tmp_path)
    monkeypatch.setattr(api, "device_target", lambda device: "sm90")
    monkeypatch.setattr(api, "_DEFAULTS", {})
    _write(tmp_path, G)
    q, k, v = (torch.randn(2, 4, 100, 64, dtype=torch.float16) for _ in range(3))
    assert api._default_config(q, k, v, Mask.of(True), 0.125) == G
