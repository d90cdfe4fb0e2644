"""Builders of small captured graphs for the mining, canon and safety tests (and their own tests).

``fx_graph(fn, *example_inputs)`` traces ``fn`` with ``make_fx`` and Inductor's decomposition
table, so softmax / layer norm / GELU come out as the same aten ops as in post-grad graphs,
and summarizes it with ``miner.scan.capture.summarize`` (the capture stage's own code).
``shuffled(graph, seed)`` renames every node and re-orders the nodes in another topological
order: mining must not notice.
"""

from __future__ import annotations

import random
from dataclasses import replace
from functools import lru_cache

import torch

from miner.core.records import CapturedGraph, GraphKey, KernelRef, NodeRecord


@lru_cache(maxsize=1)
def _decompositions():
    from torch._inductor.decomposition import select_decomp_table
    return select_decomp_table()


def fx_graph(fn, *inputs, model: str = "m", mode: str = "train", phase: str = "forward", index: int = 0
             ) -> CapturedGraph:
    """Trace ``fn(*inputs)`` to an aten graph and record it as a ``CapturedGraph``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.scan.capture import summarize

    gm = make_fx(fn, decomposition_table=_decompositions())(*inputs)
    return CapturedGraph(key=GraphKey(model, "tiny", mode, phase, index), nodes=tuple(summarize(gm.graph)))


def rekey(graph: CapturedGraph, **key) -> CapturedGraph:
    return replace(graph, key=replace(graph.key, **key))


def with_kernels(graph: CapturedGraph, kernels: dict[str, list[str]], kind: str = "pointwise") -> CapturedGraph:
    """Attach kernel names to nodes: ``{"exp": ["k1"], "sum_1": ["k1", "k2"]}``."""
    nodes = tuple(replace(n, kernels=tuple(KernelRef(k, kind) for k in kernels.get(n.name, ()))) for n in graph.nodes)
    return replace(graph, nodes=nodes)


def shuffled(graph: CapturedGraph, seed: int) -> CapturedGraph:
    """Rename every node (random names) and list them in a random topological order."""
    rng = random.Random(seed)
    names = [n.name for n in graph.nodes]
    fresh = [f"v{i}_{rng.randrange(10**6)}" for i in range(len(names))]
    rng.shuffle(fresh)
    rename = dict(zip(names, fresh))

    def ren(v):
        if isinstance(v, dict) and set(v) == {"node"}:
            return {"node": rename[v["node"]]}
        if isinstance(v, (list, tuple)):
            return type(v)(ren(x) for x in v)
        return v

    by_name = {n.name: n for n in graph.nodes}
    preds = {n.name: {p for _, p in n.inputs()} for n in graph.nodes}
    # Random topological order: repeatedly pick a random ready node.
    done: set[str] = set()
    order: list[str] = []
    ready = [n for n in names if not preds[n]]
    while ready:
        i = rng.randrange(len(ready))
        n = ready.pop(i)
        order.append(n)
        done.add(n)
        for u in by_name[n].users:
            if u not in done and u not in ready and preds[u] <= done:
                ready.append(u)
    assert len(order) == len(names)
    new_nodes = []
    for n in order:
        r = by_name[n]
        users = [rename[u] for u in r.users]
        rng.shuffle(users)
        new_nodes.append(NodeRecord(name=rename[n], op=r.op, target=rename[n] if r.op == "placeholder" else r.target,
                                    category=r.category, args=ren(r.args),
                                    kwargs={k: ren(v) for k, v in r.kwargs.items()}, users=tuple(users),
                                    meta=r.meta, module=r.module, kernels=r.kernels))
    return replace(graph, nodes=tuple(new_nodes))


# --------------------------------------------------------------------------- model-like blocks


def softmax_fn(x, w):
    return torch.softmax(x @ w, dim=-1) @ w


def layer_norm_fn(x, w, g, b):
    return torch.nn.functional.layer_norm(x @ w, (x.shape[-1],), g, b) @ w


def rms_norm_fn(x, w, g):
    h = x @ w
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * g) @ w


def gelu_erf_fn(x, w):
    return torch.nn.functional.gelu(x @ w) @ w


def gelu_tanh_fn(x, w):
    # GPT-2's NewGELUActivation (pow(x, 3): 8 ops, where F.gelu(approximate="tanh") gives 9)
    h = x @ w
    return (0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))) @ w


def silu_mul_fn(x, w1, w2):
    return (torch.nn.functional.silu(x @ w1) * (x @ w2)) @ w1


# --------------------------------------------------------------------------- the builders' own tests


def test_fx_graph_records_post_grad_like_ops():
    g = fx_graph(softmax_fn, torch.randn(4, 8), torch.randn(8, 8))
    targets = [n.target for n in g.nodes if n.op == "call_function"]
    assert "aten.amax.default" in targets and "aten.exp.default" in targets
    assert all(n.meta for n in g.nodes if n.op == "call_function")


def test_shuffled_is_a_renamed_topological_reordering():
    g = fx_graph(layer_norm_fn, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(8))
    s = shuffled(g, 3)
    assert len(s.nodes) == len(g.nodes)
    assert not {n.name for n in s.nodes} & {n.name for n in g.nodes}
    seen = set()
    for n in s.nodes:
        assert all(p in seen for _, p in n.inputs())
        seen.add(n.name)
    assert sorted(n.target for n in s.nodes if n.op == "call_function") == \
        sorted(n.target for n in g.nodes if n.op == "call_function")


def test_stored_occurrences_put_safe_ones_first():
    # generation takes a candidate's shapes from stored *safe* occurrences: a pattern whose first
    # occurrences in each graph are unsafe must still store its safe ones
    from miner.mine.mine import _sample
    from miner.core.pattern import Occurrence, Verdict

    bad = Verdict(ok=False, reasons=("users: escapes",))
    occs = [Occurrence(GraphKey(m, "tiny", "train", "forward", 0), (f"{m}{i}",), verdict=bad if i < 2 else Verdict(ok=True))
            for m in ("bert", "gpt2") for i in range(3)]
    picked = _sample(occs, 2)
    assert [o.verdict.ok for o in picked[:2]] == [True, True]
    assert {o.graph.model for o in picked[:2]} == {"bert", "gpt2"}  # still spread over graphs
    assert any(not o.verdict.ok for o in picked)  # one example of the rejection reason is kept
