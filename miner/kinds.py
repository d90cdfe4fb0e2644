"""The kinds of candidate: each declares in one place how it is generated, validated, promoted and tested.

A candidate's kind follows from its ``candidate.json`` (:func:`kind_of`): ``kind`` when the generator
wrote one (``upcast_matmul``, with ``demote: true`` the ``demote_matmul`` rule's; ``compute_once``;
``reduce_region``; ``gemm_epilogue``), else a Triton kernel from a mined pattern (``row_kernel``) or from a whole Inductor
kernel's region (``region_kernel``, ``source: {"regions": ...}``; ``--rng philox4`` candidates
``<id>_x4`` too). Every stage that differs by kind asks :data:`KINDS` and calls what the kind names:

- ``generator``: the function that writes ``candidates/<id>/`` (``command``: the verb that calls it);
- ``checks``: ``(cand, device, model, log) -> Validation``, the checks ``miner validate`` runs;
- ``fusion_files``: ``(folder, name, meta, head) -> [Path]``, the fusion's own files ``miner promote``
  renders (pattern.py, kernel.py); None: not promotable yet (``miner promote`` says so);
- ``test_cases``: ``(workspace, name, meta) -> [(test, case id, arguments)]``, the rows of the fusion's
  generated test module, and ``harness``: the ``miner_testing`` module (``tests/harness/``) whose tests
  they name (``miner.generate.fusion_test``: one shape of test module for every kind);
- ``bench``: None when ``miner bench`` times its kernel, else why it skips the candidate.

The callables are named ``"module:function"`` and imported when called, so this module imports no
stage. Adding a kind: docs/architecture.md, "Adding a kind".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from miner.core.errors import UsageError


@dataclass(frozen=True)
class Kind:
    """One kind of candidate: where each stage finds what it does for it (``"module:function"``)."""

    name: str
    about: str
    command: str
    generator: str
    checks: str
    fusion_files: str | None
    test_cases: str | None
    harness: str | None
    bench: str | None = None

    def call(self, role: str, *args, **kwargs):
        """Call the function this kind names for ``role`` (a field: ``checks``, ``fusion_files``, ...)."""
        ref = getattr(self, role)
        if ref is None:
            raise UsageError(f"candidates of kind {self.name} have no {role} yet ({self.about})")
        return resolve(ref)(*args, **kwargs)


def resolve(ref: str):
    """The function ``"module:function"`` names."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


_KERNEL = dict(checks="miner.check.validate:validate_kernel", generator="miner.generate.generate:generate_one")
_UPCAST = dict(command="miner generate --upcasts mined/upcasts.json", generator="miner.generate.upcast:generate",
               checks="miner.check.upcast:validate", test_cases="miner.check.upcast:fusion_test_cases",
               harness="upcast", bench="an aten rewrite with no kernel of its own: "
                                       "tests/test_upcast_matmul_gpu.py times its GEMM, `miner verify --ab` its step")
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("row_kernel", "a Triton kernel for a mined pattern of pointwise ops and last-dim reductions",
         command="miner generate [--top N | --only ID,...]", **_KERNEL,
         fusion_files="miner.generate.generate:render_fusion",
         test_cases="miner.check.fusion_chain:fusion_test_cases",
         harness="row_kernel"),
    Kind("region_kernel",
         "a Triton kernel for a whole Inductor kernel's region (dropout in-kernel; --rng philox4: <id>_x4)",
         command="miner generate --regions mined/regions.json --only ID,... [--rng philox4|inductor]", **_KERNEL,
         fusion_files="miner.generate.generate:render_fusion", test_cases="miner.check.validate:fusion_test_cases",
         harness="region_kernel"),
    Kind("reduce_region", "a region reducing over outer dims (split/tile/loop kernels)",
         command="miner generate --regions mined/regions.json --only ID,...",
         generator="miner.generate.reduce:generate_one",
         checks="miner.check.reduce:validate", fusion_files="miner.generate.reduce:render_fusion",
         test_cases="miner.check.reduce:fusion_test_cases", harness="reduce_region"),
    Kind("upcast_matmul", "an aten rewrite: a float32 bmm/mm of exact bf16/fp16 upcasts as a .dtype GEMM",
         fusion_files="miner.generate.upcast:render_fusion", **_UPCAST),
    Kind("demote_matmul", "an aten rewrite: one float32 operand rounded where the output is rounded anyway",
         fusion_files="miner.generate.upcast:render_demoted_fusion", **_UPCAST),
    Kind("gemm_epilogue", "an aten rewrite: an addmm read only by a tanh GELU or ReLU as one cuBLASLt GEMM with "
                          "the bias and activation in its epilogue (no kernel)",
         command="miner generate --epilogues mined/epilogues.json", generator="miner.generate.epilogue:generate",
         checks="miner.check.epilogue:validate", fusion_files="miner.generate.epilogue:render_fusion",
         test_cases="miner.check.epilogue:fusion_test_cases", harness="gemm_epilogue",
         bench="no kernel of its own (cuBLASLt through aten): `miner verify --ab` measures its step"),
    Kind("compute_once", "an identity after a small, expensive value Inductor recomputes per element of a "
                         "broadcast (no kernel)",
         command="miner generate --recomputed mined/recomputed.json", generator="miner.generate.realize:generate",
         checks="miner.check.realize:validate", fusion_files="miner.generate.realize:render_fusion",
         test_cases="miner.check.realize:fusion_test_cases", harness="compute_once",
         bench="no kernel of its own: `miner verify --ab` measures its step"),
)}


def get(name: str) -> Kind:
    """The kind called ``name``; ``UsageError`` naming the known kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise UsageError(f"unknown candidate kind {name!r}; known kinds: {', '.join(KINDS)}") from None


def kind_of(meta: dict) -> Kind:
    """The kind of the candidate whose ``candidate.json`` is ``meta``."""
    if meta.get("kind") == "upcast_matmul" and meta.get("demote"):
        return get("demote_matmul")
    if meta.get("kind"):
        return get(meta["kind"])
    return get("region_kernel" if "regions" in (meta.get("source") or {}) else "row_kernel")


__all__ = ["KINDS", "Kind", "get", "kind_of", "resolve"]
