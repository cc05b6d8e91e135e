"""Every target of :mod:`flashscope.targets`, built offline by the running Triton: the
portable forward's default config for each (head dim 64, bf16), read back by the ISA readers and
given an occupancy. CI runs it on the oldest and the newest supported Triton."""

from flashscope import compile as fcompile
from flashscope.isa import attach_occupancy, record_for
from flashscope.targets import ALL_TARGETS


def test_every_target_builds_reads_and_has_an_occupancy():
    assert len(ALL_TARGETS) == 11
    items = [(fcompile.default_config("triton-fwd", t, 64), t.name, dict(head_dim=64))
             for t in ALL_TARGETS]
    built = fcompile.run_clean(fcompile._build_task, items, jobs=2)
    failed = {t.name: str(a) for t, a in zip(ALL_TARGETS, built) if isinstance(a, Exception)}
    assert not failed, failed
    for t, (cfg, _, _), art in zip(ALL_TARGETS, items, built):
        rec = attach_occupancy(record_for(art))
        assert (rec.target, rec.vendor) == (t.name, t.vendor)
        assert rec.threads == cfg.num_warps * t.warp_size == art.metadata["num_warps"] * t.warp_size
        assert 0 < rec.registers <= (t.max_regs_per_thread if t.vendor == "nvidia" else 512)
        mma = rec.mix["mma"] if t.vendor == "nvidia" else rec.mix["mfma"] + rec.mix["wmma"]
        assert mma > 0, (t.name, rec.mix)
        assert rec.shared_bytes > 0 and 0 < rec.occupancy <= 1, (t.name, rec.occupancy)
