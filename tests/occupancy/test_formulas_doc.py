"""Each line of docs/occupancy.md, checked."""

from flashscope.occupancy import occupancy


def test_cdna_old_formula():
    assert 65536 // (192 * 64) == 5
    o = occupancy("gfx942", threads=64, vgprs=192)
    assert (o.active_warps, o.waves_per_simd, o.occupancy) == (8, 2, 0.25)
    assert 65536 // (128 * 64) == 8
    o = occupancy("gfx942", threads=64, vgprs=128)
    assert (o.active_warps, o.waves_per_simd, o.occupancy) == (16, 4, 0.5)


def test_rdna_512_per_wave():
    assert 512 // 8 == 64
    o = occupancy("gfx1100", threads=32, vgprs=8)
    assert (o.waves_per_simd, o.active_warps) == (16, 64)
    assert occupancy("gfx1100", threads=32, vgprs=192).waves_per_simd == 8


def test_nvidia_naive_registers():
    assert 65536 // (104 * 32) == 19
    assert occupancy("sm90", threads=32, regs=104).active_blocks == 16
    assert 65536 // (96 * 32) == 21
    assert occupancy("sm90", threads=32, regs=96).active_blocks == 20
    o = occupancy("sm90", threads=1024, regs=255)
    assert o.active_blocks == 0 and o.reason


def test_nvidia_smem_carveout():
    assert 228 * 1024 // 52224 == 4
    o = occupancy("sm90", threads=256, regs=128, smem=52224)
    assert o.limits["shared_mem"] == 4 and o.active_blocks == 2
    assert o.details["smem_per_block"] == 53248
    assert o.details["launch_carveout"] == 132 * 1024
    assert o.details["launch_shared_mem_limit"] == 2
