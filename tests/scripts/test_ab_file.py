"""The kernel-file A/B's loader (scripts/gpu/ab_file.py): a copy of the sm90 kernel module,
or a folder of copies whose helper modules replace this tree's (no GPU)."""

import os
import shutil
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "scripts", "gpu")]

from ab_file import OLD_TAG, _module  # noqa: E402

KERNELS = os.path.join(ROOT, "src", "flashscope", "kernels")


def test_a_folder_brings_its_own_helper_modules(tmp_path):
    """The folder's sm90_sync (marked here) is the one the old kernel calls; its other
    helpers are the folder's copies too, and none of them replaces this tree's."""
    for name in os.listdir(KERNELS):
        if name.startswith(("sm90_", "attention_fwd_sm90")) and name.endswith(".py"):
            shutil.copy(os.path.join(KERNELS, name), tmp_path / name)
    sync = tmp_path / "sm90_sync.py"
    sync.write_text(sync.read_text() + "\nOLD_MARK = 1\n")
    mod = _module(str(tmp_path))
    assert mod._attn_fwd_sm90.fn.__module__ == OLD_TAG
    assert sys.modules[mod._next_slot.fn.__module__].OLD_MARK == 1
    for helper in ("sm90_sync", "sm90_softmax", "sm90_worklist"):
        assert f"{OLD_TAG}_{helper}" in sys.modules
    from flashscope.kernels import sm90_sync

    assert not hasattr(sm90_sync, "OLD_MARK")


def test_a_single_file_uses_this_trees_helpers(tmp_path):
    old = tmp_path / "old.py"
    shutil.copy(os.path.join(KERNELS, "attention_fwd_sm90.py"), old)
    mod = _module(str(old))
    assert mod._next_slot.fn.__module__ == "flashscope.kernels.sm90_sync"
