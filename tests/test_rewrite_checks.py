"""The compile-time half of the one rule set: canonical dims, declines with reasons, dynamic shapes."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from miner.core.pattern import PatternNode, canonical_dims, canonical_nodes
from miner.runtime import decisions, fusions, rewrite
import torch._inductor.config

from tests.safety_harness import FUSIONS, Run, check, compiled_run, eager_run, fx_run

RMS = fusions.load(FUSIONS, "rms_norm").pattern


def rms(w, x):
    return RMS(w, x, 2.0, 1e-6)


@pytest.mark.parametrize("dims, ndim, want", [
    (1, 2, -1), ([1], 2, [-1]), ([2], 3, [-1]), ([0, 2], 3, [-3, -1]), (-1, 2, -1), ([1], None, [1]),
    (True, 2, True), (None, 2, None),
])
def test_canonical_dims_is_one_rule(dims, ndim, want):
    assert canonical_dims(dims, ndim) == want


def test_canonical_nodes_propagate_ranks_through_the_pattern():
    nodes = [PatternNode("aten.amax.default", "reduction", ({"input": 0}, (1,), True)),
             PatternNode("aten.sub.Tensor", "pointwise", ({"input": 0}, {"node": 0})),
             PatternNode("aten.sum.dim_IntList", "reduction", ({"node": 1}, (1,), True))]
    out = canonical_nodes(nodes, [2])
    assert out[0].args[1] == (-1,) and out[2].args[1] == (-1,) and out[1] == nodes[1]


def test_graph_dims_are_canonicalized_before_matching():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.aten.amax.default(x, [1], True), tracing_mode="fake")(torch.randn(3, 4))
    assert rewrite.canonicalize_dims(gm.graph) == 1
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert node.args[1] == [-1] or tuple(node.args[1]) == (-1,)
    assert rewrite.canonicalize_dims(gm.graph) == 0  # idempotent


def test_declines_are_counted_per_fusion_and_reason_and_reported_with_the_gate():
    fn = lambda w, x: rms(w, x.t())  # noqa: E731  # rms over a transposed (non-contiguous) input
    run = fx_run(fn, (torch.randn(8), torch.randn(8, 6)), FUSIONS, "rms_norm")
    assert run.fired("rms_norm") == 0
    (reason, n), = [(r, n) for r, n in run.declined["rms_norm"].items()]
    assert n == 1 and reason.startswith("meta: in1 is not contiguous")
    assert any(k.startswith("rms_norm decline ") and "not contiguous" in k for k in run.lines), run.lines


def test_match_check_never_raises():
    broken = SimpleNamespace(kwargs={"x0": SimpleNamespace(meta={"val": torch.randn(2, 3)}, name="x0")},
                             graph=None, nodes=[], output_nodes=lambda: [])
    reasons = rewrite.match_reasons(broken, 1, ("float",))
    assert reasons and reasons[0].startswith("error:")  # declined with its reason, not raised
    assert rewrite.match_reasons(SimpleNamespace(kwargs={}), 1, ("float",)) == ["meta: an input is not a tensor"]


@pytest.mark.parametrize("name, fn, shapes", [
    ("log_softmax", lambda x: F.log_softmax(x, dim=-1), [[(4, 10)], [(7, 3)], [(2, 33)]]),
    ("rms_norm", rms, [[(16,), (2, 3, 16)], [(5,), (3, 4, 5)], [(40,), (1, 2, 40)]]),
])
def test_dynamic_shapes_fire_with_the_size_generic_kernel(name, fn, shapes):
    """dynamic=True: the contract holds for the symbols (a symbol is never 1), so the fusion fires
    once and the same compiled graph runs every later size, equal to eager; nothing raises."""
    torch._dynamo.reset()
    gp = fusions.graph_pass(FUSIONS, [name])
    compiled = torch.compile(fn, options=fusions.inductor_options(FUSIONS, graph_pass_=gp), dynamic=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        for sh in shapes:
            args = [torch.randn(s) for s in sh]
            got = compiled(*args)
            check(Run(got if isinstance(got, tuple) else (got,), dict(gp.counts), {}), eager_run(fn, args), name)
    assert gp.counts[name] >= 1, gp.declined
    assert sum(gp.declined.get(name, {}).values()) == 0, gp.declined


def test_dynamic_shapes_still_decline_what_the_contract_refuses():
    """A size-1 dim is specialized even under dynamic=True: the issue's class-1 case still declines."""
    sm = fusions.load(FUSIONS, "softmax_like").pattern
    args = (torch.randn(2, 5, 16), torch.zeros(2, 5, 16), torch.randn(2, 5, 1))
    fn = lambda m, f, s: sm(m > 0, f, s)  # noqa: E731
    run = compiled_run(fn, args, FUSIONS, "softmax_like", backward=False, dynamic=True)
    check(run, eager_run(fn, args), "softmax_like", expect="decline")
    assert "broadcast copies" in " ".join(run.all_reasons()), run.declined


def test_a_declined_match_counts_once_per_graph():
    """The pass runs in both post-grad slots: the second run over the same graph sees the same
    declined match again and must not count it twice; the same match in another graph counts."""

    class Match:
        def __init__(self, node):
            self.node, self.kwargs = node, {}

        def output_node(self):
            return self.node

    def graph():
        g = torch.fx.Graph()
        g.output(g.call_function(torch.relu, (g.placeholder("x"),)))
        return g

    p = rewrite.FusionPass([])

    def counted(g, times):
        before = Counter(p.log.lines)
        node = next(n for n in g.nodes if n.op == "call_function")
        with decisions.applying(p, "once_test"):
            for _ in range(times):
                rewrite.record_declines(Match(node), "miner::once_test", 0, ["a reason"])
        return sum((Counter(p.log.lines) - before).values())

    g = graph()
    assert counted(g, 2) == 1
    assert counted(g, 1) == 0
    assert counted(graph(), 1) == 1
    assert p.declined == {"once_test": {"a reason": 2}}


def test_regions_sharing_constants_each_match_and_compute_the_same():
    # t5's encoder and decoder position-bias gradients accumulate into one shared `full([32, H], 0)`
    # and fill their `where`s from one shared `full([], 0)` (26 users): a pattern's inner node with a
    # user outside the match never matches, so neither region fired on the GPU. Constants may have
    # users outside (free_constants): both match, and the graph still computes what it did.
    from pathlib import Path

    from torch.fx.experimental.proxy_tensor import make_fx

    root = Path(__file__).resolve().parents[1] / "candidates" / "p86f4808f37"
    if not root.exists():
        pytest.skip("candidate p86f4808f37 not in this checkout")
    entry = rewrite.entry_for(root / "pattern.py", "p86f4808f37")
    mod = entry.module

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        out = []
        for shape, dtype in mod.EXAMPLE_INPUTS:
            if dtype == "int64":
                out.append(torch.randint(0, 32, shape, generator=g))
            elif dtype == "bool":
                out.append(torch.rand(shape, generator=g) > 0.1)
            else:
                out.append(torch.randn(shape, generator=g).to(getattr(torch, dtype)))
        return out

    xs, ys = make(0), make(1)
    n = len(xs)

    def both(*a):
        p, q = mod.pattern(*a[:n], 0.0, -1, 0.0), mod.pattern(*a[n:], 0.0, -1, 0.0)
        return (p[0] if isinstance(p, tuple) else p), (q[0] if isinstance(q, tuple) else q)

    def shared_graph():
        """``both`` as Inductor's graph has it: one node per distinct constant, shared."""
        gm = make_fx(both, tracing_mode="fake")(*xs, *ys)
        first: dict = {}
        for node in list(gm.graph.nodes):
            if node.target is torch.ops.aten.full.default:
                key = (repr(node.args), repr(sorted(node.kwargs.items())))
                if key in first:
                    node.replace_all_uses_with(first[key])
                    gm.graph.erase_node(node)
                else:
                    first[key] = node
        assert len(first) == 2 and all(len(x.users) > 1 for x in first.values())
        gm.recompile()
        return gm

    gm = shared_graph()
    want = gm(*xs, *ys)
    gp = rewrite.FusionPass([entry])
    gp(gm.graph)
    assert gp.counts["p86f4808f37"] == 2, (gp.counts, gp.declined)
    gm.graph.lint()
    gm.recompile()
    got = gm(*xs, *ys)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(want, got))

    # the traced pattern as it is (constants not freed): what the H100 runs saw, neither region fires
    import contextlib

    strict = rewrite.FusionPass([entry])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rewrite, "constants_free", contextlib.nullcontext)
        strict(shared_graph().graph)
    assert strict.counts["p86f4808f37"] == 0
