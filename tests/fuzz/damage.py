"""Damage for the readers' fuzz tests: from a valid document, a seeded random generator
makes the classes of damage a file can suffer (wrong types, missing keys, deep nesting,
impossible values, truncation, binary junk), as the bytes a reader gets.

Every function takes a ``random.Random``: case ``i`` of a test is seed ``i``, so a failure
names the seed that reproduces it."""

import copy
import csv
import io
import json

#: Values of every JSON type, and the impossible ones: negative, zero, huge, not finite,
#: strings where numbers belong and numbers where strings belong.
JUNK = (None, True, False, 0, -1, -7.5, 1e308, -1e308, 2 ** 70, -(2 ** 70), 0.5,
        float("nan"), float("inf"), float("-inf"), "", "x", "-5", "nan", "inf", "1e400",
        "12ms", "\u00e9\u0000", [], {}, [1, "a"], {"a": {"b": []}}, [[[[]]]])

#: Text of a CSV cell gone wrong.
JUNK_CELLS = ("", "abc", "-5", "-0.5", "inf", "-inf", "nan", "1e400", "1,234,5", "n/a",
              '"', "\u00e9", "0x10", "  7  ", "99999999999999999999999", "-99999999999")

_NEST = "\u0001NEST\u0001"


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _dump(doc) -> str:
    return json.dumps(doc, allow_nan=True)


def damage_json(doc, rng) -> bytes:
    """``doc`` (any JSON-able value) with one to three kinds of damage, as bytes."""
    doc = copy.deepcopy(doc)
    text = None
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("retype", "retype", "drop", "impossible", "nest", "truncate",
                           "junk", "root", "grow"))
        paths = list(_paths(doc))
        path = rng.choice(paths)
        if kind == "retype":
            doc = _set(doc, path, copy.deepcopy(rng.choice(JUNK)))
        elif kind == "drop":
            dicts = [p for p in paths if isinstance(_get(doc, p), dict) and _get(doc, p)]
            if dicts:
                d = _get(doc, rng.choice(dicts))
                d.pop(rng.choice(list(d)))
        elif kind == "impossible":
            nums = [p for p in paths if isinstance(_get(doc, p), (int, float))
                    and not isinstance(_get(doc, p), bool)]
            if nums:
                doc = _set(doc, rng.choice(nums), rng.choice((-1, 0, -1e-9, 1e308, 2 ** 64,
                                                              float("nan"))))
        elif kind == "nest":
            doc = _set(doc, path, _NEST)
            depth = rng.choice((3, 60, 2000, 200000))
            text = _dump(doc).replace(json.dumps(_NEST), "[" * depth + "]" * depth)
            break
        elif kind == "grow":
            lists = [p for p in paths if isinstance(_get(doc, p), list) and _get(doc, p)]
            if lists:
                lst = _get(doc, rng.choice(lists))
                lst.extend(copy.deepcopy(rng.choice(lst)) for _ in range(rng.randint(1, 5)))
        elif kind == "root":
            doc = copy.deepcopy(rng.choice(JUNK))
        else:
            text = _dump(doc)
            return _bytes_damage(text.encode(), rng, kind)
    return (text if text is not None else _dump(doc)).encode()


def _bytes_damage(data: bytes, rng, kind: str) -> bytes:
    if kind == "truncate":
        return data[:rng.randrange(len(data) + 1)]
    choice = rng.randrange(4)
    if choice == 0:  # a file that is not text at all
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    if choice == 1:  # NUL bytes inside
        i = rng.randrange(len(data) + 1)
        return data[:i] + b"\x00" * rng.randint(1, 8) + data[i:]
    if choice == 2:  # bytes that are not UTF-8
        i = rng.randrange(len(data) + 1)
        return data[:i] + bytes([rng.choice((0x80, 0xc3, 0xff, 0xfe))]) + data[i:]
    return b"\xef\xbb\xbf" + data  # a byte-order mark (valid: readers take it)


def damage_csv(rows, rng, preamble: str = "") -> bytes:
    """``rows`` (lists of cells, header first) with one to three kinds of damage."""
    rows = [list(r) for r in rows]
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("cell", "cell", "cell", "drop_column", "ragged", "no_header",
                           "header_cell", "huge", "quote", "truncate", "junk", "rows"))
        if kind == "cell" and len(rows) > 1:
            r = rng.randrange(1, len(rows))
            if rows[r]:
                rows[r][rng.randrange(len(rows[r]))] = rng.choice(JUNK_CELLS)
        elif kind == "drop_column" and rows and rows[0]:
            j = rng.randrange(len(rows[0]))
            for r in rows:
                if j < len(r):
                    del r[j]
        elif kind == "ragged" and len(rows) > 1:
            r = rows[rng.randrange(1, len(rows))]
            if r and rng.random() < 0.5:
                r.pop()
            else:
                r.append(rng.choice(JUNK_CELLS))
        elif kind == "no_header":
            rows = rows[1:]
        elif kind == "header_cell" and rows and rows[0]:
            rows[0][rng.randrange(len(rows[0]))] = rng.choice(JUNK_CELLS)
        elif kind == "huge" and len(rows) > 1:
            r = rows[rng.randrange(1, len(rows))]
            if r:
                r[rng.randrange(len(r))] = "9" * 200_000  # past csv's field size limit
        elif kind == "rows":
            rows = rows[:rng.randrange(len(rows) + 1)]
        else:
            text = preamble + _csv_text(rows)
            if kind == "quote":
                i = rng.randrange(len(text) + 1)
                return (text[:i] + '"' + text[i:]).encode()
            return _bytes_damage(text.encode(), rng, kind)
    return (preamble + _csv_text(rows)).encode()


def _csv_text(rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows(rows)
    return buf.getvalue()


def read_csv_rows(path) -> list:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.reader(f))
