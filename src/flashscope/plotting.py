"""What every flashscope plot shares: matplotlib without a display (Agg), and point labels
placed so that no two overlap.

:func:`place_labels` tries, for each label, rings of offsets around its point (nearest
first) and keeps the first whose box overlaps neither a label placed before it nor a
marker and stays inside the axes; failing that, farther rings anywhere on the figure (with
a leader line). Only a figure with no free spot left gets an overlapping label. Call it
after the figure's layout is final (``tight_layout``), since it measures the labels where
they will be drawn.
"""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _offsets(step: float = 7.0, rings: int = 7) -> list:
    out = [(4, 4), (-4, 4), (4, -4), (-4, -4)]
    for k in range(1, rings + 1):
        r = step * k
        out += [(4, r), (-4, r), (4, -r), (-4, -r), (r, 0), (-r, 0),
                (r, r), (-r, r), (r, -r), (-r, -r)]
    return out


def place_labels(ax, anchors, texts, fontsize: float = 6, marker_px: float = 3.0) -> list:
    """Annotate ``anchors`` (data coordinates) with ``texts`` without overlaps; returns
    the annotations."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    pts = [ax.transData.transform(a) for a in anchors]
    taken = [Bbox.from_extents(x - marker_px, y - marker_px, x + marker_px, y + marker_px)
             for x, y in pts]
    if ax.get_legend() is not None:
        taken.append(ax.get_legend().get_window_extent(renderer))
    page = fig.bbox
    out = []
    for (x, y), anchor, text in sorted(zip(pts, anchors, texts), key=lambda t: (t[0][0],
                                                                               -t[0][1])):
        best = None
        # inside the axes, near the point; then anywhere on the figure, farther out
        for bound, rings in ((frame, 7), (page, 40)):
            for dx, dy in _offsets(rings=rings):
                arrow = {"arrowstyle": "-", "lw": 0.5, "color": "0.5"} \
                    if max(abs(dx), abs(dy)) > 15 else None
                ann = ax.annotate(text, anchor, xytext=(dx, dy), textcoords="offset points",
                                  fontsize=fontsize, ha="left" if dx >= 0 else "right",
                                  va="bottom" if dy >= 0 else "top", arrowprops=arrow,
                                  annotation_clip=False)
                box = _text_box(ann, renderer).expanded(1.04, 1.08)
                inside = (box.x0 >= bound.x0 and box.x1 <= bound.x1 and box.y0 >= bound.y0
                          and box.y1 <= bound.y1)
                if inside and not any(box.overlaps(t) for t in taken):
                    best = (ann, box)
                    break
                ann.remove()
            if best is not None:
                break
        if best is None:  # no free spot on the figure: the last resort may overlap
            ann = ax.annotate(text, anchor, xytext=(4, 4), textcoords="offset points",
                              fontsize=fontsize)
            best = (ann, _text_box(ann, renderer))
        taken.append(best[1])
        out.append(best[0])
    return out


def _text_box(ann, renderer):
    """The box of an annotation's text alone (its extent would include the leader line,
    which reaches back to the point)."""
    from matplotlib.text import Text

    ann.update_positions(renderer)
    return Text.get_window_extent(ann, renderer)


def overlaps(texts, renderer) -> list:
    """Pairs of texts whose drawn boxes overlap (what :func:`place_labels` avoids); for
    tests."""
    boxes = [_text_box(t, renderer) for t in texts]
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if boxes[i].overlaps(boxes[j])]
