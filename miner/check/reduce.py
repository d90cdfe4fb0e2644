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

from miner.check.validate import Check, _compare

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


def check_case(cand, label: str, xs: list, scalars: list) -> Check:
    t0 = time.perf_counter()
    try:
        expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *scalars)
        outs = cand.kernel_module.launch(*xs, *scalars)
        ref = cand.pattern_module.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *scalars)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return Check("numerics", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0)
    worst_abs = worst_rel = 0.0
    for i, (o, r, e) in enumerate(zip(outs, ref, expect)):
        ok, a, rel, detail = _compare(o, r, e.dtype)
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
