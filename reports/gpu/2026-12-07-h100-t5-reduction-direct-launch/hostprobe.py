"""Host cost of one call of a promoted region (dropout_residual_layer_norm), split into its parts.
Small shapes so the GPU never bounds the loop; per call us over N calls (sync every 200)."""
import os, sys, time, json
import torch
sys.path.insert(0, os.getcwd())
from miner.runtime import fusions, launch as L
from miner.core.tensors import make_inputs

dev = "cuda" if torch.cuda.is_available() else "cpu"
N = int(os.environ.get("N", 3000 if dev == "cuda" else 30))
pm = fusions.load("fusions", "dropout_residual_layer_norm")
km = pm._kernel()
shape = [2, 64, 768]
specs = [{"shape": [25], "dtype": "int64", "stride": [1]}, {"shape": shape, "dtype": "bfloat16"}, {"shape": shape, "dtype": "float32"}] + \
        [{"shape": [768], "dtype": "float32"}] * 4
xs = make_inputs(specs, device=dev, seed=0)
xs[0] = torch.randint(0, 2**31, (25,), device=dev)
cs = (3, 0.1, 1.1111, 1e-12, 768.0)
scal = (int(cs[0]), float(cs[1]), float(cs[2]), float(cs[3]), float(cs[4]))

def t(name, f, n=N):
    for _ in range(20): f()
    if dev == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        f()
        if dev == "cuda" and i % 200 == 199: torch.cuda.synchronize()
    if dev == "cuda": torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    print(f"{name:32s} {us:8.1f} us/call", flush=True)
    return us

res = {}
res["op (torch.ops.miner...)"] = t("op (torch.ops.miner...)", lambda: pm.OP(*xs, *cs))
res["kernel.launch"] = t("kernel.launch", lambda: km.launch(*xs, *cs))
from miner.runtime import direct as D
_h = D.hooked
D.hooked = lambda: True
res["kernel.launch (Triton's launch)"] = t("kernel.launch (Triton's launch)", lambda: km.launch(*xs, *cs))
res["op (Triton's launch)"] = t("op (Triton's launch)", lambda: pm.OP(*xs, *cs))
D.hooked = _h
res["launch.run"] = t("launch.run", lambda: L.run(km.KERNEL, xs, scal))
key = (km.KERNEL.pattern_id, id(km.KERNEL.one_pass_kernel), None, None, km.KERNEL.levels, tuple(km.KERNEL.seeds),
       tuple(km.KERNEL.columns), km.KERNEL.rand4, xs[0].device, tuple((x.shape, x.stride(), x.dtype) for x in xs),
       tuple(s for s in scal if not isinstance(s, int)))
plan = L.PLANS[key]
res["plan key"] = t("plan key", lambda: (km.KERNEL.pattern_id, id(km.KERNEL.one_pass_kernel), None, None, km.KERNEL.levels, tuple(km.KERNEL.seeds),
       tuple(km.KERNEL.columns), km.KERNEL.rand4, xs[0].device, tuple((x.shape, x.stride(), x.dtype) for x in xs),
       tuple(s for s in scal if not isinstance(s, int))))
res["outputs alloc"] = t("outputs alloc", lambda: tuple(torch.empty(s, dtype=d, device=dev) for s, d in plan.metas))
outs = tuple(torch.empty(s, dtype=d, device=dev) for s, d in plan.metas)
rows = [xs[k] for k in plan.rows]
seeds = [xs[k] for k in plan.seeds]
def tri():
    return plan.kernel[plan.grid](*seeds, *rows, *outs, *scal, *plan.sizes, *plan.strides, **plan.constexprs)
res["triton kernel[grid](...)"] = t("triton kernel[grid](...)", tri)
ck = tri()
print("compiled:", type(ck).__name__, flush=True)
if dev == "cuda" and ck is not None:
    try:
        import triton
        from triton.runtime import driver
        caches = plan.kernel.device_caches[torch.cuda.current_device()]
        binder = caches[-1]
        bound, _, _ = binder(*seeds, *rows, *outs, *scal, *plan.sizes, *plan.strides, **plan.constexprs)
        vals = list(bound.values())
        g = tuple(plan.grid) + (1,) * (3 - len(plan.grid))
        stream = driver.active.get_current_stream(torch.cuda.current_device())
        run, fn, md = ck.run, ck.function, ck.packed_metadata
        def direct():
            run(g[0], g[1], g[2], stream, fn, md, None, None, None, *vals)
        res["CompiledKernel.run direct"] = t("CompiledKernel.run direct", direct)
        o1 = tri(); torch.cuda.synchronize(); a = [o.clone() for o in outs]
        direct(); torch.cuda.synchronize(); b = [o.clone() for o in outs]
        print("direct == jit:", all(torch.equal(p, q) for p, q in zip(a, b)), flush=True)
        def direct_alloc():
            o = tuple(torch.empty(s, dtype=d, device=dev) for s, d in plan.metas)
            run(g[0], g[1], g[2], stream, fn, md, None, None, None, *[*seeds, *rows, *o, *vals[len(seeds)+len(rows)+len(o):]])
            return o
        res["alloc + direct"] = t("alloc + direct", direct_alloc)
        print("nargs", len(vals), flush=True)
    except Exception as e:
        print("direct path failed:", type(e).__name__, e, flush=True)
a, b = torch.randn(64, 768, device=dev), torch.randn(64, 768, device=dev)
res["torch.add (reference)"] = t("torch.add (reference)", lambda: torch.add(a, b))
if dev == "cuda":
    c = torch.compile(lambda x, y: (x * y + 1).relu(), dynamic=False)
    c(a, b)
    res["compiled 1-kernel fn"] = t("compiled 1-kernel fn", lambda: c(a, b))
out = os.environ.get("OUT")
if out:
    json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
               "us_per_call": res}, open(os.path.join(out, "hostprobe.json"), "w"), indent=1)
