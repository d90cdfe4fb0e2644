"""Text formatting shared by the terminal listings (``listings``) and the HTML page (``html``): the
legend, percentages, cut strings, counts, op chains, validation rows.

Renderers only format what ``miner.rank.rank`` computed. Predicted numbers carry a leading ``~``.
"""

from __future__ import annotations

import math

from miner.rank.records import PREDICTED_MARK, Ranked

VARIANTS = ("eager", "inductor", "max-autotune", "candidate")  # the timed variants, in table order
LEGEND = (f"{PREDICTED_MARK} = predicted (not measured): by the cost model, or by the analytical roofline "
          "model when there is no benchmark data; numbers without it were measured on a GPU by `miner bench` "
          "(the pattern's subgraph compiled alone by Inductor vs the candidate's kernel).")


def pct(x: float | None) -> str:
    """``0.25`` -> ``25%``; ``-`` for None or nan."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def cut(s: str, n: int) -> str:
    """``s`` cut to ``n`` characters, an ellipsis marking the cut."""
    return s if len(s) <= n else s[: n - 1] + "…"


def ops_chain(r: Ranked) -> str:
    """The pattern's ops, views left out, as ``amax>sub>exp>sum>div``."""
    from miner.rank.families import short_op
    return ">".join(short_op(n.target) for n in r.pattern.nodes if n.category != "view")


def num(x: float | None, spec: str = ".2f") -> str:
    """``x`` formatted with ``spec``; ``-`` for None."""
    return "-" if x is None else f"{x:{spec}}"


def count(n: float) -> str:
    """An occurrence count: integral ones without decimals."""
    return str(int(n)) if float(n).is_integer() else f"{n:.1f}"


def validation_rows(v: dict) -> list[tuple[str, bool | None, str]]:
    """(what, ok, detail) for each check of a validation.json (``miner.check.checks.Validation.to_json``)."""
    out = []
    for c in v.get("checks", ()) or ():
        if not isinstance(c, dict):
            continue
        detail = [str(c.get("detail") or "")]
        detail += [f"{k}={_short(c[k])}" for k in ("max_abs", "max_rel", "matches") if c.get(k) is not None]
        out.append((f"{c.get('kind', '?')}: {c.get('case', '')}".strip(), c.get("ok"), ", ".join(d for d in detail if d)))
    return out


def _short(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)[:80]
