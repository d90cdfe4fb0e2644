"""What a :class:`~miner.runtime.rewrite.FusionPass` decided while it ran, and which pass is running.

A pass owns one :class:`DecisionLog`: every declined match with its reason (counted here and
nowhere else), every decision of the in-model gate, and every context a match was seen in. The
A/B harness and ``miner verify`` read the log of the pass they compiled with; two passes in one
process never share a count.

An ``extra_check`` is called by Inductor's matcher with the match only; it finds the pass applying
its patterns, and the fusion it applies, through :func:`applying` / :func:`current` (a
``contextvars.ContextVar`` set only while ``FusionPass.__call__`` applies one fusion's patterns,
and reset after: it holds no data of its own). Outside a pass (a test calling a check directly)
:func:`current` is None: nothing is logged and the gate is on.
"""

from __future__ import annotations

import contextlib
import logging
import contextvars
import weakref
from collections import Counter
from typing import Any, Iterator, Sequence

import torch

from miner.core import dtypes

_APPLYING: contextvars.ContextVar = contextvars.ContextVar("miner_applying", default=None)


class DecisionLog:
    """Per pass: declines, gate decisions and the contexts matches were seen in.

    Attributes are read through the views below; :meth:`decline`, :meth:`decided` and
    :meth:`saw` are the only writers.
    """

    def __init__(self) -> None:
        self._declines: Counter[tuple[str, str, str]] = Counter()  # (fusion, inputs label, reason)
        self._gate: Counter[tuple[str, str, bool, str, bool]] = Counter()  # (fusion, where, fire, reason, forced)
        self._seen: Counter[tuple[str, Any, bool]] = Counter()  # (fusion, Context, would fire)
        self._graphs: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()

    def first_time(self, graph: Any, node_name: str, fusion: str) -> bool:
        """True the first time a declined match (its output node) of ``fusion`` is seen in ``graph``: the
        pass runs in both post-grad slots, and the second run sees the same declined match again."""
        seen = self._graphs.setdefault(graph, set())
        if (node_name, fusion) in seen:
            return False
        seen.add((node_name, fusion))
        return True

    def decline(self, fusion: str, reason: str, label: str = "") -> None:
        """Count one declined match of ``fusion`` (``label``: its inputs' metas)."""
        self._declines[(fusion, label, reason)] += 1

    def decided(self, fusion: str, where: str, fire: bool, reason: str, *, forced: bool = False) -> None:
        """Count one decision of the in-model gate (``forced``: the gate was held open, so it fired anyway)."""
        self._gate[(fusion, where, fire, reason, forced)] += 1

    def saw(self, fusion: str, ctx: Any, fire: bool) -> None:
        """Count one match of ``fusion`` in context ``ctx`` (``fire``: what the gate would decide)."""
        self._seen[(fusion, ctx, fire)] += 1

    # ---- views
    @property
    def declined(self) -> dict[str, Counter[str]]:
        """fusion -> reason -> declined matches."""
        out: dict[str, Counter[str]] = {}
        for (fusion, _, reason), n in self._declines.items():
            out.setdefault(fusion, Counter())[reason] += n
        return out

    @property
    def lines(self) -> Counter[str]:
        """``"<fusion> fire|decline <where>: <reason>"`` -> matches: every gate decision and decline, in words."""
        out: Counter[str] = Counter()
        for (fusion, where, fire, reason, forced), n in self._gate.items():
            out[f"{fusion} {'fire' if fire else 'decline'} {where}: {reason}{' [gate forced open]' if forced else ''}"] += n
        for (fusion, label, reason), n in self._declines.items():
            out[f"{fusion} decline {label}: {reason}"] += n
        return out

    @property
    def contexts(self) -> dict[str, dict[Any, int]]:
        """fusion -> Context -> matches seen (whatever the gate decided)."""
        out: dict[str, dict[Any, int]] = {}
        for (fusion, ctx, _), n in self._seen.items():
            out.setdefault(fusion, {}).setdefault(ctx, 0)
            out[fusion][ctx] += n
        return out

    def seen(self, fusion: str) -> list[tuple[Any, bool]]:
        """(Context, would fire) of every match of ``fusion`` seen."""
        return [(ctx, fire) for (f, ctx, fire) in self._seen if f == fusion]


@contextlib.contextmanager
def applying(graph_pass: Any, fusion: str) -> Iterator[None]:
    """Inside the block, :func:`current` is ``(graph_pass, fusion)``."""
    token = _APPLYING.set((graph_pass, fusion))
    try:
        yield
    finally:
        _APPLYING.reset(token)


def current() -> tuple[Any, str] | None:
    """``(pass, fusion)`` applying its patterns now; None outside a pass."""
    return _APPLYING.get()




log = logging.getLogger("miner.runtime.rewrite")  # the name users configure
CPU_NOT_ASKED = ("device: CPU tensors: interpreted Triton kernels are for tests (~100x slower than "
                 "Inductor's C++); ask with install(..., interpret=True) or MINER_INTERPRET=1")


def match_vals(match, n_inputs: int) -> list[torch.Tensor] | None:
    """The ``meta["val"]`` tensors of the match's inputs ``x0..x{n-1}``; None when one is not a tensor."""
    vals = []
    for k in range(n_inputs):
        node = match.kwargs.get(f"x{k}")
        val = getattr(node, "meta", {}).get("val") if node is not None else None
        if not isinstance(val, torch.Tensor):
            return None
        vals.append(val)
    return vals


def record_decline(name: str, reason: str, label: str = "") -> None:
    """Count one declined match of fusion ``name`` in the applying pass's log (the one place a decline is
    counted; outside a pass it is only logged at debug level)."""
    now = current()
    if now is not None:
        p = now[0]
        p.log.decline(name, reason, label)
        if reason == CPU_NOT_ASKED and not p.warned:
            p.warned = True
            log.warning("miner fusions: not firing on CPU tensors (the Triton interpreter is for tests, "
                        "~100x slower); to run them anyway: install(..., interpret=True) or "
                        "MINER_INTERPRET=1 with TRITON_INTERPRET=1")
    log.debug("%s decline %s: %s", name, label, reason)


def record_declines(match, op_name: str, n_inputs: int, reasons: Sequence[str]) -> None:
    """Count each reason of a declined match (:func:`record_decline`), labelled by its inputs' metas.

    A match is counted once per graph: the pass runs in both post-grad slots (``inductor_options``),
    and the second run sees the same declined match again.
    """
    if reasons:
        node = match.output_node()
        now = current()
        if now is not None and not now[0].log.first_time(node.graph, node.name, op_name):
            return
        vals = match_vals(match, n_inputs) or ()
        # str() of a symbolic size reads it without specializing it (int() would add a guard)
        label = " ".join(f"{dtypes.name(v.dtype)}[{','.join(map(str, v.shape))}]" for v in vals)
        for r in reasons:
            record_decline(op_name.split("::")[-1], r, label)


__all__ = ["DecisionLog", "applying", "current", "CPU_NOT_ASKED", "match_vals", "record_decline", "record_declines"]
