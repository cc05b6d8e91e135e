"""Offline builds that a test module's tests compile, compiled before any of them runs.

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

from flashscope import compile as fcompile


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
