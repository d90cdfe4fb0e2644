"""The import layers of ``miner/`` (docs/architecture.md, "Layers"), read from the sources with ``ast``.

Every import counts: module-level ones and those inside functions (a lazy import still ties two
modules together), relative ones resolved against the importing module. From the bottom:

- ``miner.core`` (the nouns) imports no stage;
- ``miner.rules`` (the safety rules, the kernel shape contract, the upcast/demote and compute-once
  rules, the FX graph adapter) imports ``miner.core`` only;
- ``miner.runtime`` (what a user's compile imports, through the generated ``pattern.py`` files)
  imports ``miner.rules``, ``miner.core`` and itself only;
- no two stage packages import each other in a cycle, directly or through other modules.

The root package ``miner`` (``__version__``, the checkout finder) imports nothing of miner and may be
imported by anyone. The checker's functions are tested on small planted graphs below, so each
assertion is seen failing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "miner"
STAGES = frozenset({"scan", "mine", "generate", "check", "bench", "rank", "report", "runtime", "rules", "promote",
                    "commands", "cli"})
TOP_NAMES = ("miner", "miner_models", "miner_fusions")  # imports of these are edges; the rest is outside

# (importer, imported) pairs the runtime may keep for now, each with its reason.
ALLOWED = {
    # evidence reads the zoo's preset shapes (miner_models.base.SHAPES, a constant table) for records
    # written before they carried batch/seq; the zoo imports no stage, so this is no cycle.
    ("miner.runtime.evidence", "miner_models.base"),
}


def module_of(path: Path, root: Path) -> str:
    """``miner/core/ops.py`` -> ``miner.core.ops``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, *, is_package: bool, known: set[str]) -> set[str]:
    """The modules ``source`` (module ``module``) imports anywhere in its body, within :data:`TOP_NAMES`.

    ``from a.b import c`` is module ``a.b.c`` when that is a known module, else ``a.b``; relative
    imports resolve against ``module`` (its own name when ``is_package``).
    """
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in TOP_NAMES}
    return out


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules it imports, for every ``.py`` under ``root`` (self-imports left out)."""
    files = {module_of(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    graph = {}
    for mod, path in files.items():
        found = imports_of(path.read_text(), mod, is_package=path.name == "__init__.py", known=known)
        graph[mod] = found - {mod}
    return graph


def package_of(module: str) -> str:
    """The stage or layer a module belongs to: ``miner.check.ab`` -> ``check``, ``miner.cli`` and
    ``miner.__main__`` -> ``cli``, ``miner.promote`` -> ``promote``, ``miner`` -> ``""``; a module
    outside ``miner`` -> its top-level name (``miner_models``)."""
    parts = module.split(".")
    if parts[0] != "miner":
        return parts[0]
    if len(parts) == 1:
        return ""
    return "cli" if parts[1] == "__main__" else parts[1]


def stray_imports(graph: dict[str, set[str]], package: str, allowed: set[str],
                  exceptions: set[tuple[str, str]] = frozenset()) -> list[tuple[str, str]]:
    """(importer, imported) for each import by a module of ``package`` of a module whose package is
    neither ``package``, the root ``miner`` nor one of ``allowed``, bar ``exceptions``."""
    ok = set(allowed) | {package, ""}
    return sorted((m, t) for m, targets in graph.items() if package_of(m) == package
                  for t in targets if package_of(t) not in ok and (m, t) not in exceptions)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle of ``component`` that crosses packages, as a path ``[a, b, ..., a]`` (shortest from
    the first module whose edge leaves its package)."""
    members = set(component)
    for a in component:
        for b in sorted(graph.get(a, ())):
            if b in members and package_of(b) != package_of(a):
                paths = {b: [a, b]}
                todo = [b]
                while todo:
                    cur = todo.pop(0)
                    for nxt in sorted(graph.get(cur, ())):
                        if nxt == a:
                            return paths[cur] + [a]
                        if nxt in members and nxt not in paths:
                            paths[nxt] = paths[cur] + [nxt]
                            todo.append(nxt)
    return component + component[:1]


def cross_package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, ..., a]``) per strongly connected component spanning two or more packages."""
    return [cycle_through(graph, comp) for comp in strongly_connected(graph)
            if len({package_of(m) for m in comp}) > 1]


# --------------------------------------------------------------------------- the assertions on miner/

def test_the_module_graph_sees_lazy_and_relative_imports():
    graph = module_graph()
    assert {"miner.rules", "miner.runtime.rewrite", "miner.core.ops"} <= set(graph)
    assert "miner.core.workspace" in graph["miner.core.pattern"]  # imported inside a function
    assert STAGES <= {package_of(m) for m in graph} | {"cli"}


def test_rules_import_only_core():
    assert stray_imports(module_graph(), "rules", {"core"}) == []


def test_runtime_imports_only_rules_and_core():
    assert stray_imports(module_graph(), "runtime", {"rules", "core"}, ALLOWED) == []


def test_core_imports_no_stage():
    assert [(m, t) for m, t in stray_imports(module_graph(), "core", set()) if package_of(t) in STAGES] == []


def test_no_import_cycle_between_stage_packages():
    cycles = cross_package_cycles(module_graph())
    assert cycles == [], "import cycles across packages:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_inside_the_layers_below_the_stages():
    """rules and runtime (what a user's compile imports) read top to bottom: no module cycle inside them
    (``runtime.gate`` and ``runtime.rewrite`` were one until the decline log moved to ``runtime.decisions``)."""
    graph = module_graph()
    low = [c for c in strongly_connected(graph) if {package_of(m) for m in c} & {"rules", "runtime"}]
    assert low == [], "import cycles in rules/runtime:\n" + "\n".join(" -> ".join(c) for c in low)


def test_the_allowed_exceptions_still_exist():
    graph = module_graph()
    assert all(t in graph.get(m, ()) for m, t in ALLOWED), "an ALLOWED import is gone: drop it from ALLOWED"


# --------------------------------------------------------------------------- the checker, on planted violations

def test_imports_of_reads_function_bodies_and_relative_imports():
    src = "import os\nfrom . import launch\ndef f():\n    from ..mine import safety\n    import miner_models.base\n"
    known = {"miner.runtime.launch", "miner.mine.safety"}
    got = imports_of(src, "miner.runtime.rewrite", is_package=False, known=known)
    assert got == {"miner.runtime.launch", "miner.mine.safety", "miner_models.base"}
    assert imports_of("from .core import ops", "miner", is_package=True, known=set()) == {"miner.core"}


def test_stray_imports_finds_a_rule_importing_mining():
    graph = {"miner.rules.safety": {"miner.core.ops", "miner.mine.safety", "miner"},
             "miner.runtime.rewrite": {"miner.rules.safety", "miner.check.validate", "miner_models.base"},
             "miner.core.pattern": {"miner.runtime.rewrite", "miner.core.workspace", "miner_models"}}
    assert stray_imports(graph, "rules", {"core"}) == [("miner.rules.safety", "miner.mine.safety")]
    assert stray_imports(graph, "runtime", {"rules", "core"}, {("miner.runtime.rewrite", "miner_models.base")}) == [
        ("miner.runtime.rewrite", "miner.check.validate")]
    assert [t for _, t in stray_imports(graph, "core", set()) if package_of(t) in STAGES] == ["miner.runtime.rewrite"]


def test_cross_package_cycles_names_a_planted_cycle_and_ignores_one_inside_a_package():
    graph = {"miner.check.validate": {"miner.check.upcast"}, "miner.check.upcast": {"miner.check.validate"},
             "miner.rank.rank": {"miner.rank.read"}, "miner.rank.read": {"miner.bench.results"},
             "miner.bench.results": {"miner.check.verify"}, "miner.check.verify": {"miner.rank.rank"}}
    assert cross_package_cycles(graph) == [
        ["miner.bench.results", "miner.check.verify", "miner.rank.rank", "miner.rank.read", "miner.bench.results"]]
    assert [c for c in strongly_connected(graph) if "miner.check.upcast" in c] == [
        ["miner.check.upcast", "miner.check.validate"]]
    del graph["miner.check.verify"]
    assert cross_package_cycles(graph) == []


def test_package_of():
    assert [package_of(m) for m in ("miner", "miner.__main__", "miner.promote", "miner.check.ab", "miner_models.base")
            ] == ["", "cli", "promote", "check", "miner_models"]
