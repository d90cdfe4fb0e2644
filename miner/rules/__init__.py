"""The rules: when one fused op may replace a match, applied alike by mining and by a user's compile.

Below both ``miner.mine`` (which records each rule's verdict on the captured graphs) and
``miner.runtime`` (whose ``extra_check``s apply the same rules to every match at compile time);
imports ``miner.core`` only (tests/test_layering.py):

- ``safety``: the safety rules (``RULES``: users, aliasing, mutation, meta, randomness, kernel),
  ``check`` on a mined occurrence, ``check_match`` on a compile-time match;
- ``contract``: the generated row kernel's shape contract (``shape_contract``), which the ``kernel``
  rule and the launcher both apply;
- ``upcast``: exact bf16/fp16 upcast matmuls and the demoting variant;
- ``recompute``: the compute-once rule (small transcendental values Inductor recomputes per kernel);
- ``epilogue``: an addmm read only by a tanh-GELU or ReLU, as one GEMM with that activation in cuBLASLt's
  epilogue (the ``gemm_epilogues`` knob, ``miner.runtime.epilogue``);
- ``graph``: the graph they read, ``node(name) -> NodeRecord``: a ``CapturedGraph`` when mining,
  ``FxNodes`` (the FX graph being compiled) at compile time.
"""

from __future__ import annotations

from pathlib import Path


def source_files() -> tuple[str, ...]:
    """Every module file of this package, sorted: the rule sources a compiled graph depends on
    (``miner.runtime.rewrite.RULE_FILES``, part of the pass's cache key)."""
    return tuple(sorted(str(p) for p in Path(__file__).resolve().parent.glob("*.py")))
