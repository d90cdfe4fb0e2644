"""Validation of a ``reduce_region`` candidate (``miner.generate.reduce``): the checks ``miner validate`` runs.

- numerics: the kernel against the pattern in float64 on the same inputs, at the observed shape
  (on the CPU its sizes mapped to small primes, ``SMALL``: 16 -> 3, 512 -> 37, so no size divides a
  block), at another small shape (``ODD``), and with every float input in bfloat16;
  index inputs are drawn in ``[-1, rows)`` of the table they index (-1: the padding row).
- rewrite: the pattern as a module (``RegionModule``: its forward is the pattern, so its post-grad graph
  holds the region's ops) compiled with only this candidate's pass: at least one match, outputs
  equal to eager's within float32 tolerance.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from miner.check.validate import Check

SMALL = (3, 2, 37, 5, 7, 11, 13)  # the CPU's stand-in sizes, in the order of the observed sizes' first use
ODD = (2, 3, 19, 5, 7, 11, 13)


def inputs_for(entry: dict, primes: tuple[int, ...] | None, rows: int, device: str, seed: int = 0,
               float_dtype: str | None = None) -> list:
    """Random inputs of an observed entry (sizes mapped by ``miner.generate.reduce.small_sizes`` when
    ``primes``), index inputs in ``[-1, rows)``."""
    import torch

    from miner.generate.reduce import small_sizes

    shapes = [i["shape"] for i in entry["inputs"]]
    sizes = small_sizes(shapes, primes) if primes else None
    g = torch.Generator().manual_seed(seed)
    xs = []
    for i in entry["inputs"]:
        shape = [sizes[s] for s in i["shape"]] if sizes else i["shape"]
        dt = getattr(torch, float_dtype if float_dtype and i["dtype"] in ("float32", "bfloat16", "float16")
                     else i["dtype"])
        if dt == torch.bool:
            x = torch.rand(shape, generator=g) > 0.3
        elif dt in (torch.int64, torch.int32):
            x = torch.randint(-1, rows, shape, generator=g, dtype=dt)
        else:
            x = torch.randn(shape, generator=g).to(dt)
        xs.append(x.to(device))
    return xs


def table_rows(meta: dict) -> int:
    """The rows of the region's index_put table (its output's first dim), else 1."""
    outs = meta["observed"][0].get("outputs") or [{"shape": [1]}]
    return int(outs[0]["shape"][0]) if any(meta["kernel"].get("scatter", [])) else 1


EPS32 = 2.0 ** -23  # float32 machine epsilon
TOL_K = 2.0  # the bound, in eps32 times the error scale (see Reference.bound)
_SAME = {"clone", "view", "_unsafe_view", "reshape", "expand", "permute", "squeeze", "unsqueeze", "contiguous",
         "alias", "t", "transpose", "convert_element_type", "_to_copy", "slice", "select"}  # exact: e2 follows
_CONST = {"full", "scalar_tensor", "zeros", "ones", "full_like", "zeros_like", "ones_like"}


@dataclass
class Reference:
    """A float64 output and ``e2``, its error scale squared: the sum of the squares of every rounding a
    float32 evaluation makes on the way, each counted as ``eps32 * |the rounded result|``."""

    value: Any
    e2: Any

    def bound(self):
        """``TOL_K * eps32 * sqrt(e2)``. A rounding to nearest errs by at most ``eps32 / 2`` of its result,
        uniformly (RMS ``eps32 / sqrt(12)``), independently of the others, so the total error is close
        to normal with RMS ``eps32 * sqrt(e2 / 12)``: the bound is ~7 of those."""
        return TOL_K * EPS32 * self.e2.sqrt()


def float64_reference(fn, xs: list, scalars: list) -> list[Reference]:
    """``fn(*xs, *scalars)`` evaluated in float64 throughout, with each output's error scale.

    The pattern is traced (fake tensors) and its graph interpreted with every floating dtype argument
    made float64 (the pattern's own ``sum(..., dtype=float32)`` and ``full(..., dtype=float32)`` would
    otherwise sum in float32), beside ``e2`` per element (:class:`Reference`), propagated by forward
    error analysis: inputs and constants are exact; ``add``/``sub``/``mul``/``fma`` carry their operands'
    errors (scaled by the other factor) plus one rounding of the result; a ``sum`` of ``n`` elements,
    or an accumulating ``index_put`` of ``n`` values into a slot, adds ``n * (result^2 + sum of the
    terms^2)``, the rounding of every partial sum of a sequential summation (whose partial sums are
    bounded by the result's drift and the terms' random walk); views and ``where`` apply to ``e2`` as
    to the values; any other float op one rounding plus its operands' relative errors."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda *xs: fn(*xs, *scalars), tracing_mode="fake")(*xs)
    last = {}
    for n in gm.graph.nodes:
        for a in n.all_input_nodes:
            last[a] = n
    env: dict = {}
    it = iter(xs)
    outs = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            x = next(it)
            env[n] = (x.double(), torch.zeros_like(x, dtype=torch.float64)) if x.is_floating_point() else (x, None)
        elif n.op == "call_function":
            env[n] = _step(n, env)
        elif n.op == "output":
            outs = [env[a] for a in torch.utils._pytree.tree_leaves(n.args[0])]
        for a in n.all_input_nodes:
            if last.get(a) is n and n.op != "output":
                env.pop(a, None)
    return [Reference(*o) for o in outs]


def _step(n, env) -> tuple:
    """(value, e2) of one node (``e2`` None for a bool or integer value)."""
    import torch

    def f64(a):
        return torch.float64 if isinstance(a, torch.dtype) and a.is_floating_point else a

    def pick(i):  # 0: values, 1: e2 (a node without it, and a python number: 0)
        def get(a):
            if isinstance(a, torch.fx.Node):
                return env[a][i] if i == 0 or env[a][1] is not None else 0.0
            return 0.0 if i == 1 and isinstance(a, (int, float)) and not isinstance(a, bool) else f64(a)
        return torch.fx.node.map_aggregate(n.args, get), torch.fx.node.map_aggregate(n.kwargs, get)

    (v, kw), (e, ekw) = pick(0), pick(1)
    value = n.target(*v, **kw)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return (value, None)
    name = n.target.overloadpacket.__name__ if hasattr(n.target, "overloadpacket") else str(n.target)
    if name in _CONST:
        return (value, torch.zeros_like(value))
    v2, zero = value * value, torch.zeros_like(value)
    if name == "neg":
        return (value, zero + e[0])
    if name in _SAME:
        return (value, n.target(e[0], *v[1:], **kw) + zero if isinstance(e[0], torch.Tensor) else zero)
    sq = [x * x if isinstance(x, (torch.Tensor, int, float)) and not isinstance(x, bool) else x for x in v]
    if name in ("add", "sub"):
        return (value, e[0] + e[1] + v2)
    if name == "mul":
        return (value, e[0] * sq[1] + e[1] * sq[0] + v2)
    if name == "fma":
        return (value, e[0] * sq[1] + e[1] * sq[0] + e[2] + v2)
    if name == "where":
        return (value, torch.where(v[0], zero + e[1], zero + e[2]))
    if name in ("sum", "mean"):
        dims, rest = v[1] if len(v) > 1 else None, {k: x for k, x in kw.items() if k != "dtype"}
        keep = v[2] if len(v) > 2 else rest.pop("keepdim", False)
        def red(t):
            return t.sum(dims, keepdim=keep) if dims is not None else t.sum()
        cnt = v[0].numel() / max(value.numel(), 1)
        total = value * cnt if name == "mean" else value
        e2 = red(e[0] + torch.zeros_like(v[0])) + cnt * (total * total + red(v[0] * v[0]))
        return (value, e2 / (cnt * cnt) if name == "mean" else e2)
    if name in ("index_put", "index_put_"):
        table, idx, vals = v[0], v[1], v[2]
        if not (len(v) > 3 and v[3]):
            return (value, torch.zeros_like(table).index_put(idx, e[2] * torch.ones_like(vals)) + e[0])
        acc = [torch.zeros_like(table).index_put(idx, t, True)
               for t in (torch.ones_like(vals), e[2] + torch.zeros_like(vals), vals * vals)]
        return (value, e[0] + acc[1] + acc[0] * v2 + acc[2])
    rel = sum((ei / x.clamp_min(1e-300)) for ei, x in zip(e, sq) if isinstance(ei, torch.Tensor)
              and isinstance(x, torch.Tensor))
    return (value, v2 * (1 + rel))


def compare_bounded(out, ref: Reference, expect_dtype) -> tuple[bool, float, float, str]:
    """``out`` against ``ref`` within :meth:`Reference.bound` per element: (ok, max |error|, max
    |error| / bound, detail). Other dtypes and shapes than expected, or NaN where the reference has
    none (or none where it has), fail."""
    import torch

    if out.dtype != expect_dtype or tuple(out.shape) != tuple(ref.value.shape):
        return False, math.inf, math.inf, f"{out.dtype}{list(out.shape)}, expected {expect_dtype}{list(ref.value.shape)}"
    o, r = out.double(), ref.value.to(out.device)
    nan = torch.isnan(r)
    if not torch.equal(torch.isnan(o), nan):
        return False, math.inf, math.inf, "NaN positions differ from the reference"
    err = (o - r).abs()[~nan]
    bound = ref.bound().to(out.device)[~nan]
    if not err.numel():
        return True, 0.0, 0.0, ""
    ratio = torch.where(err == 0, 0.0, err / bound)  # 0 / 0: exact where the bound is 0
    bad = int((ratio > 1).sum())
    worst = float(ratio.max())
    detail = "" if not bad else (f"{bad} of {err.numel()} elements beyond {TOL_K:g}*eps32*sqrt(e2) "
                                 f"(worst {worst:.3g}x the bound, |error| {float(err.max()):.3g})")
    return not bad, float(err.max()), worst, detail


def check_case(cand, label: str, xs: list, scalars: list, variant: str | None = None,
               config: tuple | None = None, refs: list | None = None) -> Check:
    """The kernel (``variant``, ``config``) on ``xs`` against :func:`float64_reference` (``refs``:
    precomputed). ``max_rel`` is the worst error's share of its element's bound (ok: at most 1)."""
    t0 = time.perf_counter()
    try:
        expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *scalars)
        outs = cand.kernel_module.launch(*xs, *scalars, variant=variant, config=config)
        refs = refs or float64_reference(cand.pattern_module.pattern, xs, scalars)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return Check("numerics", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0)
    worst_abs = worst_rel = 0.0
    for i, (o, r, e) in enumerate(zip(outs, refs, expect)):
        ok, a, rel, detail = compare_bounded(o, r, e.dtype)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rel)
        if not ok:
            return Check("numerics", label, False, f"output {i}: {detail}", a, rel, seconds=time.perf_counter() - t0)
    return Check("numerics", label, True, "", worst_abs, worst_rel, seconds=time.perf_counter() - t0)


def numeric_checks(cand, device: str) -> list[Check]:
    rows = table_rows(cand.meta)
    out = []
    for entry in cand.meta["observed"]:
        cs = [float(s) for s in entry["scalars"]]
        shape = "x".join(map(str, max((i["shape"] for i in entry["inputs"]), key=lambda s: (len(s), math.prod(s)))))
        primes = SMALL if device == "cpu" else None
        cases = [(f"observed {shape}" + (" (sizes mapped small)" if primes else ""), primes, None),
                 ("odd sizes", ODD, None), ("bfloat16 inputs", ODD, "bfloat16")]
        for label, p, dt in cases:
            out.append(check_case(cand, label, inputs_for(entry, p, rows, device, float_dtype=dt), cs))
    return out


def rewrite_check(cand) -> Check:
    """The pattern compiled as a module with only this candidate's pass (CPU, Triton interpreted)."""
    import torch

    from miner.runtime import rewrite

    t0 = time.perf_counter()
    entry = cand.meta["observed"][0]
    xs = inputs_for(entry, ODD, table_rows(cand.meta), "cpu", seed=1)
    cs = [float(s) for s in entry["scalars"]]
    fn = cand.pattern_module.pattern

    class RegionModule(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs, *cs)

    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    torch._dynamo.reset()
    try:
        opts = {"post_grad_custom_pre_pass": graph_pass, "post_grad_custom_post_pass": graph_pass}
        with torch._inductor.config.patch(force_disable_caches=True):
            got = torch.compile(RegionModule(), options=opts, dynamic=False)(*xs)
        want = RegionModule()(*xs)
    except Exception as e:  # noqa: BLE001
        return Check("rewrite", "region module", False, f"compile failed: {type(e).__name__}: {str(e)[:300]}",
                     seconds=time.perf_counter() - t0)
    n = graph_pass.total()
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if not torch.allclose(a.double(), b.double(), rtol=1e-4,
                                                                            atol=1e-4)]
    problems = (["the rewrite did not fire (0 matches)"] if n == 0 else []) + [f"output {i} differs" for i in bad]
    detail = "; ".join(problems) or f"{n} match(es); outputs equal eager's (rtol=atol=1e-4)"
    return Check("rewrite", "region module", not problems, detail, matches=n, seconds=time.perf_counter() - t0)


def validate(cand, device: str, model: bool, log):
    """The checks of a reduce_region candidate, as ``miner.check.validate.Validation``."""
    from miner.check.validate import Validation, _line

    v = Validation(cand.id, True, device, model)
    for c in numeric_checks(cand, device) + ([rewrite_check(cand)] if model else []):
        c.device = c.device or (device if c.kind == "numerics" else "cpu")
        log(_line(c))
        v.checks.append(c)
    return v


def time_vs_inductor(cand, device: str = "cuda") -> str:
    """One line: the kernel and Inductor's compile of the same pattern at the observed shape (GPU), each
    with its share of the memory roofline (bytes read and written / measured copy bandwidth)."""
    import torch
    from triton.testing import do_bench

    entry = cand.meta["observed"][0]
    xs = inputs_for(entry, None, table_rows(cand.meta), device)
    cs = [float(s) for s in entry["scalars"]]
    fn = cand.pattern_module.pattern
    inductor = torch.compile(lambda *xs: fn(*xs, *cs), dynamic=False)
    outs = inductor(*xs)
    nbytes = sum(x.numel() * x.element_size() for x in xs) + sum(o.numel() * o.element_size() for o in outs)
    big = torch.empty(2 ** 30 // 4, device=device)
    copy_ms = do_bench(lambda: big.clone())
    bw = 2 * big.numel() * 4 / (copy_ms * 1e-3)
    floor_us = nbytes / bw * 1e6
    ours = do_bench(lambda: cand.kernel_module.launch(*xs, *cs)) * 1e3
    theirs = do_bench(lambda: inductor(*xs)) * 1e3
    ok = check_case(cand, "observed", xs, cs)
    return (f"{cand.id}: {nbytes / 1e9:.2f} GB, floor {floor_us:.0f} us at {bw / 1e12:.2f} TB/s; kernel {ours:.0f} us "
            f"({floor_us / ours:.0%} of roofline), inductor {theirs:.0f} us ({floor_us / theirs:.0%}); "
            f"{theirs / ours:.2f}x; float64 check {'ok' if ok.ok else 'FAILED ' + ok.detail}")


def main(argv=None) -> int:
    """``python3 -m miner.check.reduce ID...``: :func:`time_vs_inductor` per candidate (needs CUDA)."""
    import sys

    from miner.core import candidate
    from miner.core.workspace import Workspace

    ids = sys.argv[1:] if argv is None else argv
    for cid in ids:
        print(time_vs_inductor(candidate.load(Workspace("."), cid)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["time_vs_inductor", "validate", "inputs_for", "numeric_checks", "rewrite_check", "SMALL", "ODD"]
