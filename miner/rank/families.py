"""Group near-identical patterns into families, so that a review shows one row per idea.

Two patterns are near-identical when their *core* op multisets (ops without dtype casts and
views) are equal, or differ by a single op and both have at least three ops. Clustering is leader-based, not transitive: patterns
are visited best first, and each joins the first family whose leader is near-identical to it, or
leads a new family. So a chain of one-op differences (a, a+b, a+b+c, ...) does not collapse into
one family, and the family's leader is its best member.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

MIN_OPS_FOR_ONE_OFF = 3  # below this, one op more or less is a different idea (mul>mul vs mul>mul>add)
CAST_OPS = {"prims.convert_element_type.default", "aten._to_copy.default", "aten.to.dtype",
            "aten.clone.default"}


@dataclass(frozen=True)
class Family:
    """Candidates that compute the same thing (same ops up to casts and views), best member first."""

    id: str  # the leader's id
    name: str  # the leader's core op chain, e.g. "exp > sum > div"
    members: tuple[str, ...]  # leader first, then in the order given


def short_op(target: str) -> str:
    """``aten.exp.default`` -> ``exp``; ``prims.convert_element_type.default`` -> ``convert``."""
    parts = target.split(".")
    name = parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims", "operator", "torch") else parts[0]
    return {"convert_element_type": "convert", "_to_copy": "to_copy"}.get(name, name)


def core_ops(ops: Sequence[str], categories: Sequence[str] | None = None) -> Counter:
    """The multiset of compute ops, without casts and views."""
    cats = categories or [""] * len(ops)
    return Counter(short_op(o) for o, c in zip(ops, cats) if o not in CAST_OPS and c != "view")


def near_identical(a: Counter, b: Counter) -> bool:
    """Equal core multisets, or one op more or less when both have at least ``MIN_OPS_FOR_ONE_OFF`` ops."""
    diff = (a - b) + (b - a)
    n = sum(diff.values())
    return n == 0 or (n == 1 and min(sum(a.values()), sum(b.values())) >= MIN_OPS_FOR_ONE_OFF)


def _key(c: Counter) -> tuple:
    return tuple(sorted(c.elements()))


def _minus_one(key: tuple) -> set[tuple]:
    return {key[:i] + key[i + 1:] for i in range(len(key))}


def cluster(patterns: Sequence[tuple[str, Sequence[str], Sequence[str] | None]]) -> list[Family]:
    """Families of ``(id, op targets, categories)`` given best first.

    Each pattern joins the first (best) leader near-identical to it. Leaders are indexed by their
    core multiset and by every multiset one op smaller, so a lookup costs O(ops), not O(leaders).
    """
    leaders: list[tuple[str, list[str], str]] = []
    exact: dict[tuple, int] = {}
    smaller: dict[tuple, int] = {}  # a leader's multiset minus one op -> the first such leader
    for pid, ops, cats in patterns:
        cats = list(cats or [""] * len(ops))
        key = _key(core_ops(ops, cats))
        found = [exact.get(key)]
        if len(key) >= MIN_OPS_FOR_ONE_OFF:
            found += [exact.get(k) for k in _minus_one(key) if len(k) >= MIN_OPS_FOR_ONE_OFF]
            found.append(smaller.get(key))
        found = [i for i in found if i is not None]
        if found:
            leaders[min(found)][1].append(pid)
            continue
        i = len(leaders)
        chain = [short_op(o) for o, c in zip(ops, cats) if o not in CAST_OPS and c != "view"] or [short_op(o) for o in ops]
        leaders.append((pid, [pid], " > ".join(chain)))
        exact.setdefault(key, i)
        if len(key) > MIN_OPS_FOR_ONE_OFF:
            for k in _minus_one(key):
                smaller.setdefault(k, i)
    return [Family(pid, name, tuple(members)) for pid, members, name in leaders]
