"""``flashscope inspect --lines``: the per-line view (:mod:`flashscope.isa.lines`) of every
kernel inspect read, beside its record. A kernel whose binary carries no line table, or a
code object without its amdgcn text, still gets its totals; the command then ends with
one line saying so and exit status 2."""

from __future__ import annotations

def _views(records, arts, path):
    """One KernelLines or FlashscopeError per record."""
    from ..errors import ArtifactError
    from ..isa import lines

    if arts is not None:
        return lines.lines_for_artifacts(arts)
    found = {}
    for source, got in lines.lines_for_path(path):
        if isinstance(got, Exception):
            found[source] = got
        else:
            for kl in got:
                found[(source, kl.kernel)] = kl
    return [found.get((r.source, r.kernel)) or found.get(r.source) or
            ArtifactError(f"{r.source}: kernel {r.kernel} not found in its line view")
            for r in records]


def _cliffs(rec):
    from ..errors import FlashscopeError
    from ..occupancy import occupancy_for_record

    try:
        return occupancy_for_record(rec).cliffs
    except FlashscopeError:
        return None


def show(args, records, arts, errors) -> int:
    from ..errors import FlashscopeError
    from . import common
    from .lines_view import csv_rows, print_tables

    views = _views(records, arts, args.path)
    pairs = [(r.label, v) for r, v in zip(records, views) if not isinstance(v, Exception)]
    problems = [str(v) for v in views if isinstance(v, Exception)]
    problems += [f"{v.source}: {v.note}" for _, v in pairs if not v.line_table]
    kernels = []
    for r, v in zip(records, views):
        d = r.as_dict()
        d["cliffs"] = _cliffs(r)
        d["lines"] = None if isinstance(v, Exception) else v.as_dict()
        kernels.append(d)

    def render(con):
        from .inspect import _table

        _table(con, records, errors, args.opcodes)
        print_tables(pairs, console=con, top=args.top)

    common.emit(args, {"kernels": kernels, "errors": errors}, rows=csv_rows(pairs),
                render=render)
    if problems:
        raise FlashscopeError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                   if len(problems) > 1 else ""))
    if errors:
        raise FlashscopeError(f"{len(errors)} of {len(errors) + len(records)} builds failed; "
                              f"first: {errors[0]['error']}")
    return 0
