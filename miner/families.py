"""Group near-identical patterns into families, so that a review shows one row per idea.

Two patterns are near-identical when their *core* op multisets (ops without dtype casts and
views) are equal, or differ by a single op. Clustering is leader-based, not transitive: patterns
are visited best first, and each joins the first family whose leader is near-identical to it, or
leads a new family. So a chain of one-op differences (a, a+b, a+b+c, ...) does not collapse into
one family, and the family's leader is its best member.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

CAST_OPS = {"prims.convert_element_type.default", "aten._to_copy.default", "aten.to.dtype",
            "aten.clone.default"}


@dataclass(frozen=True)
class Family:
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
    diff = (a - b) + (b - a)
    return sum(diff.values()) <= 1 and (sum(a.values()) > 1 or sum(b.values()) > 1)


def cluster(patterns: Sequence[tuple[str, Sequence[str], Sequence[str] | None]]) -> list[Family]:
    """Families of ``(id, op targets, categories)`` given best first."""
    leaders: list[tuple[str, Counter, list[str], str]] = []
    for pid, ops, cats in patterns:
        core = core_ops(ops, cats)
        for leader in leaders:
            if near_identical(leader[1], core):
                leader[2].append(pid)
                break
        else:
            chain = [short_op(o) for o, c in zip(ops, cats or [""] * len(ops))
                     if o not in CAST_OPS and c != "view"] or [short_op(o) for o in ops]
            leaders.append((pid, core, [pid], " > ".join(chain)))
    return [Family(pid, name, tuple(members)) for pid, _, members, name in leaders]
