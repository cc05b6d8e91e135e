"""The default config of a call (``config=None``), remembered per geometry.

``flashscope.api._default_config`` keeps its answer by everything it reads: the tuned
file's stamp (an edited file takes effect on the next call), dtype, shapes, strides,
alignment, mask and the scale's sign. Offline: the target is pinned to sm90 and the
tuned files come from a temporary folder.
"""

import json

import torch

from flashscope import AttentionConfig, api, tuned

G = AttentionConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, Q_IN_REGS=False,
                    TMA=True, GLUON=True, PERSISTENT=True)


def _write(tmp_path, cfg):
    entry = {"dtype": "bfloat16", "head_dim": 64, "causal": True, "seq_class": "le1k",
             "config": cfg.as_dict()}
    (tmp_path / "sm90.json").write_text(json.dumps(
        {"format": tuned.FORMAT, "target": "sm90", "entries": [entry]}, indent=1))


def test_default_is_remembered_and_follows_the_tuned_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "DATA_DIR", tmp_path)
    monkeypatch.setattr(api, "device_target", lambda device: "sm90")
    monkeypatch.setattr(api, "_DEFAULTS", {})
    chosen = []
    choose = api._choose_default
    monkeypatch.setattr(api, "_choose_default",
                        lambda *a: chosen.append(a[3]) or choose(*a))
    q, k, v = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    _write(tmp_path, G)
    assert api._default_config(q, k, v, True) == G
    q2, k2, v2 = (torch.randn(2, 4, 100, 64, dtype=torch.bfloat16) for _ in range(3))
    assert api._default_config(q2, k2, v2, True) == G and chosen == [True]
    _write(tmp_path, G.replace(OUT_RCP=True, EARLY_Q=True, K_EARLY=True))  # another size
    assert api._default_config(q2, k2, v2, True) == G.replace(OUT_RCP=True, EARLY_Q=True,
                                                               K_EARLY=True)
    assert len(chosen) == 2
    # the other mask, a scale <= 0 (no Gluon), a misaligned view: each chosen anew
    assert not api._default_config(q, k, v, False).GLUON  # no entry: built-in default
    assert not api._default_config(q, k, v, True, -0.5).GLUON
    odd = torch.randn(2, 4, 100, 72, dtype=torch.bfloat16)[..., 4:68]
    assert not api._default_config(odd, k, v, True).GLUON
    assert len(chosen) == 5
