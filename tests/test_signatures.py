"""No function in miner/ takes more than 8 parameters: options that travel together are one record.

A run's options are a frozen dataclass beside the stage that owns them (``ABOptions``, ``ABRun``,
``VerifyOptions``, ``ScanOptions``, ``MineOptions``, ``BenchOptions``, ``launch.KernelSpec``), built once
from the command line in ``miner/commands/``. The functions are read with ``ast`` (nested ones too).
"""

from __future__ import annotations

import ast
from pathlib import Path

MINER = Path(__file__).resolve().parents[1] / "miner"
MAX_PARAMETERS = 8


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of ``fn``: positional, keyword-only, ``*args`` and ``**kwargs`` one each; not ``self`` / ``cls``."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    bound = 1 if names and names[0] in ("self", "cls") else 0
    return len(names) - bound + (a.vararg is not None) + (a.kwarg is not None)


def _jit(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated ``@triton.jit`` / ``@jit``: exempt, a Triton kernel's parameters are its pointers,
    sizes, strides and constexpr flags, which Triton requires one by one."""
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def too_long(source: str, filename: str = "<source>") -> list[str]:
    """``file:line name (n parameters)`` of each function in ``source`` over :data:`MAX_PARAMETERS`."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _jit(node):
            n = parameter_count(node)
            if n > MAX_PARAMETERS:
                out.append(f"{filename}:{node.lineno} {node.name} ({n} parameters)")
    return out


def test_no_function_in_miner_takes_more_than_eight_parameters():
    found = [hit for path in sorted(MINER.rglob("*.py"))
             for hit in too_long(path.read_text(), str(path.relative_to(MINER.parent)))]
    assert not found, "bundle the options into a dataclass (see this file's docstring):\n" + "\n".join(found)


def test_the_checker_names_a_planted_nine_parameter_function():
    planted = "def f(a, b, c, d, e, g, h, *, i, j=1):\n    pass\n"
    assert too_long(planted, "planted.py") == ["planted.py:1 f (9 parameters)"]
    assert too_long("class C:\n    def m(self, a, b, c, d, e, g, h, i):\n        pass\n") == []  # self: not counted
    assert too_long("def f(a, b, c, d, e, g, h, *args, **kwargs):\n    pass\n") == ["<source>:1 f (9 parameters)"]
    nested = "def outer():\n    def inner(a, b, c, d, e, f, g, h, i):\n        pass\n"
    assert too_long(nested) == ["<source>:2 inner (9 parameters)"]


def test_triton_kernels_are_exempt():
    params = ", ".join(f"p{k}" for k in range(12))
    assert too_long(f"@triton.jit\ndef k({params}):\n    pass\n") == []
    assert too_long(f"@jit\ndef k({params}):\n    pass\n") == []
    assert too_long(f"@triton.autotune(configs=[])\ndef k({params}):\n    pass\n")  # only jit is exempt
