"""Worker processes that never outlive the command that started them.

Every pool flashscope starts (compiles, sweep points, per-GPU timing) runs
:func:`init_worker` in each worker first:

- ``PR_SET_PDEATHSIG`` (Linux, through ctypes): the kernel sends the worker SIGKILL when
  its parent dies, however it dies. A parent killed with SIGKILL runs no cleanup of its
  own, and a pool of compile workers (about 300 MB each) would otherwise live on, orphaned;
- SIGINT ignored: Ctrl-C reaches the whole process group, and the parent alone handles it
  (it stops the pool and ends with one line), instead of every worker printing a
  traceback of its own.

A worker whose parent died before the death signal was armed sees a different parent
process id and exits at once.
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _arm_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def init_worker(parent_pid: int) -> None:
    """Pool initializer: see the module docstring. ``parent_pid``: ``os.getpid()`` of the
    process that creates the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _arm_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def pool_args() -> dict:
    """``initializer``/``initargs`` for a ``ProcessPoolExecutor`` created here."""
    return {"initializer": init_worker, "initargs": (os.getpid(),)}


def stop_pool(pool) -> None:
    """Stop a pool at once (after an error or Ctrl-C): queued items are dropped and the
    workers are terminated, not waited for (a compile in flight takes seconds). The pool's
    manager thread is joined too: left running, it may close its wake-up pipe while
    Python's exit hook writes to it (unlocked in CPython 3.11), which prints a traceback
    after an interrupted command's one line."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    try:
        pool.shutdown(wait=False, cancel_futures=True)
    except Exception:  # noqa: BLE001  (a broken pool has nothing left to stop)
        pass
    for p in procs:
        try:
            p.terminate()
        except (OSError, AttributeError, ValueError):
            pass
    for p in procs:
        try:
            p.join(timeout=5)
        except (OSError, AttributeError, ValueError, AssertionError):
            pass
    try:  # the workers are gone: let the pool close its queues (no leaked semaphores)
        pool.shutdown(wait=True)
    except Exception:  # noqa: BLE001
        pass
    if manager is not None:
        manager.join(timeout=5)
