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

from miner.check.checks import Check, Validation, line, outputs_check

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


ROW_CHUNK_ELEMENTS = 1 << 25  # elements of the largest input per chunk: its float64 temporaries ~256 MiB each


def float64_reference_by_rows(fn, xs: list, scalars: list,
                              chunk_elements: int = ROW_CHUNK_ELEMENTS) -> list[Reference]:
    """:func:`float64_reference`, a chunk of leading rows at a time where that gives the same result, so
    its float64 values and error scales never hold more than ``chunk_elements`` rows' worth at once
    (DebertaV2's ``mul -> sum`` over ``[8192, 128100]``: about ten float64 temporaries of 8.4 GB each at
    once on an 80 GB H100, and the fixed element tolerance's verdict stood).

    Cut: every input of the largest input's rank whose first dim is that input's (``n`` rows); others
    (broadcast weights, scalars) are kept whole. Only when the pattern, run on meta tensors, gives every
    output ``n`` leading rows from ``n`` and ``c`` from ``c`` with the same other dims (no output reduces
    over, or mixes, the rows); otherwise the whole reference at once."""
    import torch

    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    big = max(tensors, key=lambda x: x.numel(), default=None)
    if big is None or big.dim() < 2:
        return float64_reference(fn, xs, scalars)
    n, per_row = big.shape[0], big.numel() // max(big.shape[0], 1)
    c = max(1, chunk_elements // max(per_row, 1))
    if c >= n:
        return float64_reference(fn, xs, scalars)
    cut = [isinstance(x, torch.Tensor) and x.dim() == big.dim() and x.shape[0] == n for x in xs]

    def rows(lo: int, hi: int) -> list:
        return [x[lo:hi] if k else x for x, k in zip(xs, cut)]

    def shapes(k: int) -> list:
        outs = fn(*[x.to("meta") if isinstance(x, torch.Tensor) else x for x in rows(0, k)], *scalars)
        return [tuple(o.shape) for o in (outs if isinstance(outs, (tuple, list)) else (outs,))]

    full, part = shapes(n), shapes(c)
    if not all(len(f) and f[0] == n and len(p) == len(f) and p[0] == c and p[1:] == f[1:]
               for f, p in zip(full, part)):
        return float64_reference(fn, xs, scalars)
    chunks = [float64_reference(fn, rows(lo, lo + c), scalars) for lo in range(0, n, c)]
    return [Reference(torch.cat([ch[j].value for ch in chunks]), torch.cat([ch[j].e2 for ch in chunks]))
            for j in range(len(chunks[0]))]


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

    (v, kw), (e, _) = pick(0), pick(1)
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
    return outputs_check(label, outs, refs, expect, compare_bounded, t0)


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


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a reduction-region fusion's test table (``miner_testing.reduce_region``): the numeric
    cases :func:`numeric_checks` runs (each observed entry at the CPU's stand-in sizes, at odd sizes, and with
    bf16 inputs), the rewrite in the region module (:func:`rewrite_check`) and the registry's loud failure."""
    rows = []
    for i, entry in enumerate(meta["observed"]):
        for label, primes, dtype in (("small sizes", "SMALL", None), ("odd sizes", "ODD", None),
                                     ("bfloat16 inputs", "ODD", "bfloat16")):
            rows.append(("test_kernel_matches_float64_reference", f"observed {i}: {label}",
                         {"entry": i, "primes": primes, "dtype": dtype}))
    return rows + [("test_rewrite_fires_and_equals_eager_in_the_region_module", "region module", {}),
                   ("test_registry_is_loud_about_unknown_names", "no_such_fusion", {"unknown": "no_such_fusion"})]


def validate(cand, device: str, model: bool, log):
    """The checks of a reduce_region candidate, as ``miner.check.checks.Validation``."""
    v = Validation(cand.id, True, device, model)
    for c in numeric_checks(cand, device) + ([rewrite_check(cand)] if model else []):
        c.device = c.device or (device if c.kind == "numerics" else "cpu")
        log(line(c))
        v.checks.append(c)
    return v


def device_us(fn, device: str = "cuda", reps: int = 15, warmup: int = 2) -> float:
    """The median of ``reps`` calls of ``fn``, each timed alone (CUDA events; on the CPU the wall
    clock, for the plumbing only), in microseconds."""
    import torch

    cpu = device == "cpu"
    for _ in range(0 if cpu else warmup):
        fn()
    times = []
    for _ in range(1 if cpu else reps):
        if cpu:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


@dataclass
class Bench:
    """One candidate on the GPU at its observed shape: inputs, float64 references, the floor."""

    cand: Any
    xs: list
    cs: list
    refs: list
    expect: list
    nbytes: int
    floor_us: float
    device: str

    def us(self, fn) -> float:
        return device_us(fn, self.device)

    def line(self, label: str, us: float, outs=None, inductor_us: float | None = None) -> tuple[str, bool]:
        """``label  us  TB/s  share of roofline  [speedup]  [float64 check]`` (fits 100 columns), and
        whether the check passed (True without ``outs``)."""
        text = f"  {label:<26}{us:9.0f} us {self.nbytes / us / 1e6:6.2f} TB/s {self.floor_us / us:5.0%}"
        if inductor_us:
            text += f" {inductor_us / us:5.2f}x"
        if outs is not None:
            checks = [compare_bounded(o, r, e.dtype) for o, r, e in zip(outs, self.refs, self.expect)]
            bad = [c[3] for c in checks if not c[0]]
            text += f"  check {'ok' if not bad else 'FAILED'} ({max(c[2] for c in checks):.2g} of bound)"
            text += f": {bad[0][:60]}" if bad else ""
            return text, not bad
        return text, True


def bench_setup(cand, device: str = "cuda", primes: tuple[int, ...] | None = None) -> tuple[Bench, str]:
    """Inputs at the observed shape (``primes``: mapped small, for the CPU), float64 references, bytes
    moved and the floor at the measured copy bandwidth; and the header line."""
    import torch

    entry = cand.meta["observed"][0]
    xs = inputs_for(entry, primes, table_rows(cand.meta), device)
    cs = [float(s) for s in entry["scalars"]]
    t0 = time.perf_counter()
    refs = float64_reference(cand.pattern_module.pattern, xs, cs)
    ref_s = time.perf_counter() - t0
    expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *cs)
    nbytes = sum(x.numel() * x.element_size() for x in xs) + sum(o.numel() * o.element_size() for o in expect)
    big = torch.empty(2 ** (30 if device == "cuda" else 20) // 4, device=device)
    bw = 2 * big.numel() * 4 / (device_us(lambda: big.clone(), device) * 1e-6)
    del big
    b = Bench(cand, xs, cs, refs, expect, nbytes, nbytes / bw * 1e6, device)
    return b, (f"{cand.id}: {nbytes / 1e9:.2f} GB moved, floor {b.floor_us:.0f} us at {bw / 1e12:.2f} TB/s (copy); "
               f"float64 reference {ref_s:.1f} s")


def time_candidate(cand, variants: list[str], configs: dict, log, device: str = "cuda",
                   primes: tuple[int, ...] | None = None, inductor: bool = True) -> dict:
    """Time Inductor's compile of the pattern (unless not ``inductor``), then every variant x config
    (``configs``: variant -> list), the scatter alone, and the default launch (tuned once, then in a
    CUDA graph); ``log`` each line. Returns variant -> (us, config) of the fastest config that passed
    the float64 check. ``device="cpu"`` (with ``primes``) runs the plumbing under the interpreter."""
    import torch

    from miner.runtime import launch as _launch

    b, head = bench_setup(cand, device, primes)
    log(head)
    ind_us = None
    if inductor:
        fn = cand.pattern_module.pattern
        compiled = torch.compile(lambda *xs: fn(*xs, *b.cs), dynamic=False)
        outs = compiled(*b.xs)
        ind_us = b.us(lambda: compiled(*b.xs))
        log(b.line("inductor (region alone)", ind_us, outs)[0])
    best: dict = {}
    for v in variants:
        for cfg in configs[v]:
            run = lambda: cand.kernel_module.launch(*b.xs, *b.cs, variant=v, config=cfg)  # noqa: E731
            try:
                outs = run()
                us = b.us(run)
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses is reported, not fatal
                log(f"  {v} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:60]}")
                continue
            text, ok = b.line(f"{v} {cfg}", us, outs, ind_us)
            log(text)
            if ok and us < best.get(v, (float("inf"), None))[0]:
                best[v] = (us, cfg)
    log(_scatter_line(b))
    tuned_before = len(_launch.TUNED)
    first = time.perf_counter()
    outs = cand.kernel_module.launch(*b.xs, *b.cs)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - first
    us = b.us(lambda: cand.kernel_module.launch(*b.xs, *b.cs))
    keys = len(_launch.TUNED) - tuned_before
    log(b.line(f"default {cand.kernel_module.VARIANT} (tuned)", us, outs, ind_us)[0])
    log(f"    (its first call {first:.1f} s, tuning {keys} key(s); later calls reuse the tile)")
    if device == "cuda":
        log(_graph_line(b, ind_us))
    log("  best: " + " | ".join(f"{v} {cfg} {us:.0f} us" for v, (us, cfg) in sorted(best.items(), key=lambda x: x[1])))
    return best


def _scatter_line(b: Bench) -> str:
    """The scatter of the region's index_put outputs alone: ``index_put_acc`` and torch's ``index_put_``
    on the arguments one launch passes."""
    from miner.runtime import reduce as _reduce

    calls, real = [], _reduce.index_put_acc
    _reduce.index_put_acc = lambda t, i, v: (calls.append((t.clone(), i, v.clone())), real(t, i, v))[1]
    try:
        b.cand.kernel_module.launch(*b.xs, *b.cs)
    finally:
        _reduce.index_put_acc = real
    if not calls:
        return "  (no index_put in this region)"
    t, i, v = calls[0]
    ours = b.us(lambda: real(t.clone(), i, v))
    torch_us = b.us(lambda: t.clone().index_put_([i], v, accumulate=True))
    return (f"  scatter alone: index_put_acc {ours:.0f} us, torch index_put_ {torch_us:.0f} us "
            f"(values {list(v.shape)} into {list(t.shape)})")


def _graph_line(b: Bench, ind_us: float) -> str:
    """The default launch captured in a CUDA graph (after tuning) and replayed."""
    import torch

    try:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = b.cand.kernel_module.launch(*b.xs, *b.cs)
        g.replay()
        return b.line("default, CUDA graph replay", b.us(g.replay), outs, ind_us)[0]
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"  CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:60]}"


def main(argv=None) -> int:
    """``python3 -m miner.check.reduce [--variants all|V,V] [--configs all|first] ID...`` (needs CUDA).

    Per candidate: Inductor's kernel for the region, each variant x config of ``CONFIGS`` (``first``:
    only each variant's first), the scatter alone, the default launch (tuned, then a CUDA graph), each
    with its time, bandwidth, share of the roofline, speedup over Inductor and float64 check. After the
    first candidate, a candidate whose kernels have the same variants runs only each variant's fastest
    config of the ones before (its shapes are the same in t5's encoder and decoder)."""
    import argparse

    from miner.core import candidate
    from miner.core.workspace import Workspace
    from miner.runtime import reduce as _reduce

    ap = argparse.ArgumentParser(prog="python3 -m miner.check.reduce")
    ap.add_argument("ids", nargs="+")
    ap.add_argument("--variants", default="all", help="all, or a comma list of loop,tile,split")
    ap.add_argument("--configs", choices=("all", "first"), default="all")
    a = ap.parse_args(argv)
    variants = sorted(_reduce.CONFIGS) if a.variants == "all" else a.variants.split(",")
    unknown = [v for v in variants if v not in _reduce.CONFIGS]
    if unknown:
        print(f"error: unknown variant(s) {unknown}; expected {sorted(_reduce.CONFIGS)}")
        return 2
    configs = {v: list(_reduce.CONFIGS[v][:1] if a.configs == "first" else _reduce.CONFIGS[v]) for v in variants}
    for cid in a.ids:
        best = time_candidate(candidate.load(Workspace("."), cid), variants, configs, lambda s: print(s, flush=True))
        configs = {v: [best[v][1]] if v in best else configs[v] for v in variants}
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["time_candidate", "bench_setup", "device_us", "float64_reference", "compare_bounded",
           "Reference", "check_case", "validate", "inputs_for", "numeric_checks", "rewrite_check", "SMALL", "ODD"]
