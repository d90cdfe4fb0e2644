"""The shapes a kernel is checked on: what the scan observed, shrunk for the interpreter, plus odd ones.

An *entry* is an observed signature as ``candidate.json`` holds it: ``{"inputs": [{"shape",
"dtype", "stride"}], "scalars": [...], ...}``. Rows are the last dim of the inputs' broadcast
shape. ``miner validate`` checks :func:`numeric_cases`; a promoted fusion's test checks
:func:`fusion_cases` (the same odd shapes, fewer observed ones).
"""

from __future__ import annotations

import math

from miner.core import dtypes

CPU_MAX_ROWS = 256  # rows per numeric case on the interpreter (~1 ms per program)
LOOPED_MAX_ROWS = 16  # rows per looped-kernel case on the interpreter (one program per row)
TEST_MAX_ROWS = 64  # rows per observed shape in a fusion's test
ODD_COLS = 37  # a row length that is no power of two
ONE_PASS_MAX = 8192  # the default row limit of the one-pass kernel (candidate.json's kernel.one_pass_max)


def _is_seeds(i: dict) -> bool:
    """A dropout seed vector (int64, read at one index, never per element): no part of the rows."""
    return i["dtype"] == "int64"


def _gathered(entry: dict) -> dict[int, dict]:
    """Input -> its embedding record (``entry["gathers"]``, ``miner.generate.emit.gather_dims``): a
    table and an index are no part of the rows' broadcast; they follow the rows' dims they land on."""
    return {k: g for g in entry.get("gathers", ()) for k in (g["table"], g["index"])}


def broadcast_shape(entry: dict) -> list[int]:
    """The broadcast shape of the entry's inputs (seed vectors, embedding tables and indices aside)."""
    gathered = _gathered(entry)
    shapes = [i["shape"] for k, i in enumerate(entry["inputs"]) if not _is_seeds(i) and k not in gathered]
    rank = max(len(s) for s in shapes)
    return [max((s[d - rank + len(s)] if d - rank + len(s) >= 0 else 1) for s in shapes) for d in range(rank)]


def rows(entry: dict) -> tuple[list[int], int]:
    """(leading dims, row length) of the entry's broadcast shape."""
    full = broadcast_shape(entry)
    return full[:-1], (full[-1] if full else 1)


def reshape(entry: dict, lead: list[int] | None = None, n_cols: int | None = None, dtype: str | None = None) -> dict:
    """The entry with new leading dims / row length / float dtype (broadcast dims kept at 1, strides dropped)."""
    full = broadcast_shape(entry)
    rank = len(full)
    new_full = list(full)
    if lead is not None:
        new_full[:-1] = lead
    if n_cols is not None:
        new_full[-1] = n_cols
    inputs = []
    gathered = _gathered(entry)
    for k, i in enumerate(entry["inputs"]):
        if k in gathered:
            inputs.append(_gathered_input(k, i, gathered[k], full, new_full, dtype))
            continue
        if _is_seeds(i):
            inputs.append({**i, "stride": None})
            continue
        s = i["shape"]
        off = rank - len(s)
        shape = [1 if s[d] == 1 and full[d + off] != 1 else new_full[d + off] for d in range(len(s))]
        dt = dtype if dtype and i["dtype"] in dtypes.ELEMENT_TOL else i["dtype"]
        inputs.append({"shape": shape, "dtype": dt, "stride": None})
    return {**entry, "inputs": inputs}


def _gathered_input(k: int, i: dict, g: dict, full: list[int], new_full: list[int], dtype: str | None) -> dict:
    """An embedding's table or index in a reshaped entry: the table keeps its rows and takes the size
    of the rows' dim its column lands on; each index dim the size of its rows' dim (1 stays 1)."""
    if k == g["table"]:
        dt = dtype if dtype and i["dtype"] in dtypes.ELEMENT_TOL else i["dtype"]
        return {"shape": [i["shape"][0], new_full[g["column_dim"]]], "dtype": dt, "stride": None}
    shape = [1 if s == 1 and full[d] != 1 else new_full[d] for s, d in zip(i["shape"], g["index_dims"])]
    return {"shape": shape, "dtype": i["dtype"], "stride": None}


def shrink(entry: dict, max_rows: int) -> dict:
    """The entry with at most ``max_rows`` rows (outer dims halved first, kept >= 2 where possible)."""
    lead, _ = rows(entry)
    if math.prod(lead) <= max_rows:
        return entry
    new = list(lead)
    for d in range(len(new)):
        while math.prod(new) > max_rows and new[d] > 2:
            new[d] = max(2, new[d] // 2)
    return reshape(entry, lead=new)


def describe(entry: dict) -> str:
    """``(2, 64):float32 (2, 1):bool``: the entry's inputs in a line."""
    return " ".join(f"{tuple(i['shape'])}:{i['dtype']}" for i in entry["inputs"])


def odd_cases(first: dict, one_pass_max: int = ONE_PASS_MAX) -> list[tuple[str, dict]]:
    """(label, entry): a row length that is no power of two, one row, a row longer than the one-pass limit."""
    lead, _ = rows(first)
    return [(f"odd row length {ODD_COLS}", reshape(first, n_cols=ODD_COLS)),
            ("one row", reshape(first, lead=[1] * len(lead))),
            (f"long row {one_pass_max + ODD_COLS} (looped kernel)",
             reshape(first, lead=[1] * len(lead), n_cols=one_pass_max + ODD_COLS))]


def numeric_cases(meta: dict, on_cpu: bool) -> list[tuple[str, dict, str | None]]:
    """(label, entry, variant) for every numeric check of a candidate (``meta``: candidate.json).

    Every observed signature (shrunk on the CPU) with the default kernel and the looped one, the
    odd cases of :func:`odd_cases` (the odd row length also looped), and bf16/fp16 inputs.
    """
    observed = [o for o in meta.get("observed", []) if o.get("outputs")]
    if not observed:
        return []
    cases, seen = [], set()
    for o in observed:
        e = shrink(o, CPU_MAX_ROWS) if on_cpu else o
        key = repr((e["inputs"], e["scalars"]))
        if key in seen:
            continue
        seen.add(key)
        shrunk = " (shrunk)" if e is not o else ""
        cases.append((f"observed {o['model']}/{o['phase']} {describe(e)}{shrunk}", e, None))
        small = shrink(o, LOOPED_MAX_ROWS) if on_cpu else o  # one program per row in the looped kernel
        cases.append((f"observed {o['model']}/{o['phase']} {describe(small)} looped", small, "looped"))
    first = shrink(observed[0], 16)
    odd = odd_cases(first, meta.get("kernel", {}).get("one_pass_max", ONE_PASS_MAX))
    cases.append((odd[0][0], odd[0][1], None))
    cases.append((f"{odd[0][0]} looped", odd[0][1], "looped"))
    cases += [(label, e, None) for label, e in odd[1:]]
    cases += [(f"{dt} inputs", reshape(first, dtype=dt), None)
              for dt in low_dtypes(first.get("scalars", ()), literal_dtypes(meta.get("pattern", {})))]
    return cases


FLOAT16_MAX = 65504.0


def low_dtypes(scalars, literals: frozenset = frozenset()) -> tuple[str, ...]:
    """The low-precision input dtypes to check a pattern with: bf16 and fp16, less the cases that would
    test a model that does not exist: fp16 where a constant lies beyond fp16's range (a masked fill of
    bf16's lowest, -3.39e38: a float16 model fills with its own -65504) or where the pattern casts to
    bf16 itself (an autocast-bf16 graph: with fp16 inputs its float32 output would carry a bf16 rounding
    that the kernel, eliding intermediate casts as Inductor does, never makes), and bf16 where it casts
    to fp16."""
    wide = any(isinstance(c, (int, float)) and math.isfinite(c) and abs(c) > FLOAT16_MAX for c in scalars)
    out = ("bfloat16",) if "float16" not in literals else ()
    return out + (("float16",) if not wide and "bfloat16" not in literals else ())


def literal_dtypes(pattern_json) -> frozenset:
    """The dtypes a pattern (its JSON in candidate.json) names as literals (casts, ``full``'s dtype)."""
    found = set()

    def walk(v):
        if isinstance(v, dict):
            if isinstance(v.get("dtype"), str) and len(v) == 1:
                found.add(v["dtype"])
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk(pattern_json)
    return frozenset(found)


def fusion_cases(meta: dict) -> list[tuple[list[list[int]], list[float], str]]:
    """(input shapes, scalars, label) for a fusion's test: each observed shape (shrunk), then the odd ones."""
    observed = [o for o in meta["observed"] if o.get("outputs")]
    out, seen = [], set()
    for o in observed:
        e = shrink(o, TEST_MAX_ROWS)
        shapes = [i["shape"] for i in e["inputs"]]
        if repr(shapes) not in seen:
            seen.add(repr(shapes))
            out.append((shapes, list(e["scalars"]), f"{o['model']}/{o['phase']}"))
    first = shrink(observed[0], 16)
    labels = (f"cols{ODD_COLS}", "one_row", "long_row")
    for label, (_, e) in zip(labels, odd_cases(first, meta.get("kernel", {}).get("one_pass_max", ONE_PASS_MAX))):
        out.append(([i["shape"] for i in e["inputs"]], list(first["scalars"]), label))
    return out
