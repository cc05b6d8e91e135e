"""Offline builds that a test module's tests compile, compiled before any of them runs,
and what a Triton release's builds do not meet.

A process running Triton's interpreter builds each config in a clean compiler process of
its own (:func:`flashscope.compile.run_clean`), imports included: about 3 s of a build's
5 on 2 cores. A module that registers its tests' builds (:class:`Builds`) and calls
:func:`prebuild` from a module fixture has them all compiled at once by one pool of
worker processes (one per core) into the session's cache, where the tests' own builds
then find them. A build that fails here fails again, with its message, in its test.
Under pytest-xdist (``--dist loadfile``, as configured) a module's tests all run on one
worker, which prebuilds for them alone.
"""

import os

import pytest

from flashscope import compile as fcompile
from flashscope.compat import triton_version


class Builds(dict):
    """test name -> function of the test's parameters -> {variant: (config, target,
    build keywords)}, or (config, build keywords) for :func:`prebuild`'s ``target``: the
    builds it compiles."""

    def of(self, test_name):
        def register(fn):
            self[test_name] = fn
            return fn
        return register


def prebuild(request, builds: Builds, target: str = "sm90") -> None:
    """Compile the builds of every selected test of ``request``'s module."""
    specs = {}
    for item in request.session.items:
        fn = builds.get(getattr(item, "originalname", None))
        if item.module is not request.module or fn is None:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for spec in fn(**params).values():
            cfg, tgt, kw = spec if len(spec) == 3 else (spec[0], target, spec[1])
            specs[(cfg, tgt, tuple(sorted(kw.items())))] = (cfg, tgt, kw)
    if len(specs) > 1:
        fcompile.run_clean(fcompile._build_task, list(specs.values()), jobs=os.cpu_count() or 1)


def mark_release_difference(request, differences: dict) -> None:
    """Mark the running test as failing, strictly, under this Triton release where
    ``differences`` ({(major, minor): {test id: what its build does}}, measured by running
    the module under that release) names it: the pins are 3.6's binaries (the schedules
    and tuned entries were chosen with them), and a release that meets one again shows
    up as an unexpected pass."""
    release = triton_version()
    why = differences.get(release, {}).get(request.node.name)
    if why:
        request.node.add_marker(pytest.mark.xfail(
            reason=f"Triton {release[0]}.{release[1]}: {why}", strict=True))
