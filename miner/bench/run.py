"""``miner bench``: every variant checked against float64 on the same inputs, then timed.

For each candidate and each (shape, dtype) it occurs with, four variants run on the same inputs:

* ``eager``        the original subgraph (the candidate's pattern function) in PyTorch eager;
* ``inductor``     that subgraph compiled by Inductor for this one shape (``dynamic=False``,
                   default mode, a fresh Dynamo cache per shape: a reused dynamic compile is
                   not a fair baseline);
* ``max-autotune`` the same with ``mode="max-autotune-no-cudagraphs"``;
* ``candidate``    the generated Triton kernel through its launcher.

Every variant's outputs are checked against a float64 evaluation of the subgraph on the same
inputs *before* it is timed (``miner.core.dtypes.NORM_TOL``); a variant that fails the check is
not timed. A dropout candidate drawing its own stream (``RNG = "philox4"``) is checked against its
kernel.py ``reference`` (its stream), each baseline against the pattern drawing that baseline's
stream (:func:`baseline_references`): the same computation, other random numbers. Bytes moved count each input read once and each output written once; the roofline
share divides that by the device-to-device copy bandwidth measured in the same run.
docs/benchmarking.md explains the method.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from miner.bench import roofline as rl
from miner.bench.cases import BenchCase, plan_cases
from miner.bench.results import COPY, VARIANTS, BenchRow, VariantResult, env_header
from miner.bench.timing import Env, environment, gpu_timing_lock, sync, time_copy, time_cuda_graph, time_host
from miner.core import dtypes
from miner.core.candidate import Candidate
from miner.core.errors import MinerError, UsageError
from miner.core.tensors import TensorSpec, make_inputs

EXTRA_VARIANTS = ("candidate-looped",)  # the candidate's looped kernel forced (launch(..., variant="looped"))


def as_tuple(out) -> tuple:
    import torch
    if torch.is_tensor(out):
        return (out,)
    if isinstance(out, (tuple, list)):
        return tuple(t for t in out if torch.is_tensor(t))
    raise TypeError(f"expected tensor outputs, got {type(out).__name__}")


def upcast(args: Sequence) -> list:
    import torch
    return [a.to(torch.float64) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]


def _float64_mode():
    """A dispatch mode that turns every floating dtype an op asks for into float64.

    Patterns captured under autocast convert bf16 inputs to float32 and back
    (``prims.convert_element_type``); run plainly on float64 inputs they would still round to
    float32 and bf16 on the way. Under this mode the whole chain stays in float64.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def widen(v):
        if isinstance(v, torch.dtype) and v.is_floating_point:
            return torch.float64
        if isinstance(v, (list, tuple)):
            return type(v)(widen(x) for x in v)
        return v

    class Float64(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*widen(tuple(args)), **{k: widen(v) for k, v in (kwargs or {}).items()})

    return Float64()


def reference64(fn: Callable, args: Sequence) -> tuple:
    """``fn`` evaluated in float64 on float64 copies of ``args`` (the numerics reference)."""
    import torch

    with torch.no_grad(), _float64_mode():
        return as_tuple(fn(*upcast(args)))


EAGER_SEED = 20261204  # the global RNG seed eager's dropout draws from when checked and timed


def stream_reference(fn: Callable, args: Sequence, rand: Callable, *, round_casts: bool = False) -> tuple:
    """``fn`` in float64 (:func:`reference64`) with each ``prims.inductor_random(size, seed, mode)``
    drawn by ``rand(size, seed, mode)``: the pattern's reference with another random stream than the
    candidate's own. The random numbers and their comparison stay in their own dtype (float32: the
    mask is the baseline's, bit for bit); a cast of them to a narrower dtype is elided (as Inductor
    computes it) or, with ``round_casts``, applied (as eager computes it)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    widen = _float64_mode()
    drawn: set[int] = set()

    class Stream(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.prims.inductor_random.default:
                out = rand(*args, **(kwargs or {}))
                drawn.add(id(out))
                return out
            if any(id(a) in drawn for a in args if torch.is_tensor(a)):  # the random numbers' own dtype
                if func is torch.ops.prims.convert_element_type.default:
                    out = args[0].to(args[1]) if round_casts else args[0]
                    drawn.add(id(out))
                    return out
                return func(*args, **(kwargs or {}))  # dropout's comparison, as the baseline makes it
            with widen:
                return func(*args, **(kwargs or {}))

    with torch.no_grad(), Stream():
        return as_tuple(fn(*upcast(args)))


def baseline_references(cand: Candidate, args: Sequence) -> dict[str, tuple]:
    """For a candidate whose kernel draws another stream than Inductor's (``RNG = "philox4"``): each
    baseline's own reference. ``inductor`` / ``max-autotune``: the pattern with Inductor's stream
    (``miner.check.masks.inductor_uniform``: its Triton kernels' ``tl.rand`` on CUDA, its C++
    kernels' on the CPU); ``eager``: the prim's eager implementation (the global generator, seeded
    with ``EAGER_SEED`` before the reference and before eager's check), its bf16 cast applied."""
    import torch

    from miner.check.masks import inductor_uniform

    def inductor_rand(size, seed, mode, **_):
        if mode != "rand":
            raise MinerError(f"{cand.id}: inductor_random {mode!r}: only 'rand' is reproduced")
        return inductor_uniform(int(seed), math.prod(size), seed.device.type).reshape(tuple(size)).to(seed.device)

    def eager_rand(size, seed, mode, **kwargs):  # the prim's own eager implementation (global generator)
        return torch.ops.prims.inductor_random.default(size, seed, mode, **kwargs)

    pattern = cand.pattern_module.pattern
    inductor = stream_reference(pattern, args, inductor_rand)
    torch.manual_seed(EAGER_SEED)
    eager = stream_reference(pattern, args, eager_rand, round_casts=True)
    return {"eager": eager, "inductor": inductor, "max-autotune": inductor}


def compare(outs: Sequence, refs: Sequence) -> tuple[float, float, bool]:
    """(relative norm error, max abs error, ok) of ``outs`` against float64 ``refs``.

    NaN/inf must sit where the reference has them; the errors are taken over finite elements.
    ``ok`` uses ``TOLERANCE`` of each output's dtype.
    """
    import torch

    if len(outs) != len(refs):
        return float("inf"), float("inf"), False
    num = den = 0.0
    max_abs, ok = 0.0, True
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            return float("inf"), float("inf"), False
        o64, r64 = o.detach().to(torch.float64), r.detach().to(torch.float64)
        if o.dtype == torch.bool or not o.is_floating_point():
            bad = (o64 != r64).sum().item()
            ok &= bad == 0
            num += float(bad)
            den += float(o.numel())
            continue
        fin = torch.isfinite(r64)
        if not torch.equal(torch.isfinite(o64), fin) or not torch.equal(torch.isnan(o64), torch.isnan(r64)):
            ok = False
        d = (o64 - r64)[fin & torch.isfinite(o64)]
        e = d.norm().item()
        rn = r64[fin].norm().item()
        num += e * e
        den += rn * rn
        if d.numel():
            max_abs = max(max_abs, d.abs().max().item())
        rel = e / rn if rn > 0 else e
        ok &= rel <= dtypes.NORM_TOL.get(dtypes.name(o.dtype), 1e-4)
    rel = math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)
    return rel, max_abs, bool(ok)



def compile_variant(fn: Callable, mode: str | None):
    """``fn`` compiled by Inductor for static shapes, with a clean Dynamo cache and no custom passes."""
    import torch

    torch._dynamo.reset()  # a previous shape's compile must not be reused (nor count toward the recompile limit)
    options = {"post_grad_custom_pre_pass": None, "post_grad_custom_post_pass": None}
    if mode is None:
        return torch.compile(fn, dynamic=False, fullgraph=True, options=options)
    # mode and options are exclusive in torch.compile: apply the mode's options explicitly
    opts = dict(torch._inductor.list_mode_options(mode))
    opts.update(options)
    return torch.compile(fn, dynamic=False, fullgraph=True, options=opts)


def build_variant(name: str, cand: Candidate) -> Callable:
    """The callable timed as variant ``name``: the pattern (eager, compiled) or the candidate's launcher."""
    reference = cand.pattern_module.pattern  # the original subgraph: eager reference and Inductor's input
    if name == "eager":
        return reference
    if name == "inductor":
        return compile_variant(reference, None)
    if name == "max-autotune":
        return compile_variant(reference, "max-autotune-no-cudagraphs")
    launch = cand.kernel_module.launch  # the generated Triton kernel: same arguments, same outputs
    if name == "candidate":
        return launch
    if name == "candidate-looped":
        return lambda *args: launch(*args, variant="looped")
    raise UsageError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS + EXTRA_VARIANTS)}")


def inputs_of(case: BenchCase, device: str, seed: int = 0) -> list:
    """Random inputs of the case's shapes, dtypes and strides (``miner.core.tensors.make_inputs``), then its scalars."""
    return make_inputs(case.inputs, device, seed) + list(case.scalars)



def bench_case(cand: Candidate, case: BenchCase, env: Env, *, variants: Sequence[str] = VARIANTS,
               replays: int = 25, max_sets: int = 1024, log: Callable[[str], None] = lambda s: None) -> BenchRow:
    """Check every variant's numerics on one case, then time those that pass."""
    import torch

    device = env.device
    reference = cand.pattern_module.pattern
    first = inputs_of(case, device, seed=0)
    with torch.no_grad():
        if getattr(cand.kernel_module, "RANDOM", False):  # draws Inductor's random numbers: its reference draws them too
            ref = as_tuple(cand.kernel_module.reference(*upcast(first)))
        else:
            ref = reference64(reference, first)
        meta_out = as_tuple(reference(*first))
        own = baseline_references(cand, first) if getattr(cand.kernel_module, "RNG", None) == "philox4" else {}
    outputs = tuple(TensorSpec(tuple(o.shape), str(o.dtype).removeprefix("torch."),
                               None if o.is_contiguous() else tuple(o.stride())) for o in meta_out)
    del meta_out
    nbytes = rl.bytes_moved([(s.shape, s.dtype, s.stride) for s in case.inputs],
                            [(s.shape, s.dtype, s.stride) for s in outputs])
    k = rl.rotation_count(nbytes, env.l2_bytes, max_sets=max_sets) if device.startswith("cuda") else 1
    arg_sets = [first] + [inputs_of(case, device, seed=i) for i in range(1, k)]
    results = []
    for name in variants:
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), gpu_timing_lock():
                fn = build_variant(name, cand)
                if name == "eager" and own:
                    torch.manual_seed(EAGER_SEED)  # the numbers its reference drew
                out = as_tuple(fn(*first))  # compiles, for the compiled variants
                sync(device)
                compile_s = time.perf_counter() - t0
                rel, mx, ok = compare(out, own.get(name, ref))
                del out
                if not ok:
                    results.append(VariantResult(name, None, rel, mx, False,
                                                 f"numerics: rel err {rel:.3g} over tolerance; not timed", compile_s))
                    log(f"  {name:13s} numerics FAILED (rel err {rel:.3g})")
                    continue
                timing = (time_cuda_graph(fn, arg_sets, replays=replays) if device.startswith("cuda")
                          else time_host(fn, arg_sets, replays=min(replays, 5)))
            results.append(VariantResult(name, timing, rel, mx, True, None, compile_s))
            log(f"  {name:13s} {timing.median_ms * 1e3:10.2f} us  (rel err {rel:.2g})")
        except MinerError:
            raise
        except Exception as e:  # one variant failing must not lose the others' numbers
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            results.append(VariantResult(name, error=msg, compile_s=time.perf_counter() - t0))
            log(f"  {name:13s} ERROR {msg}")
        finally:
            if name in ("inductor", "max-autotune"):
                torch._dynamo.reset()
    del arg_sets, first, ref, own
    if device.startswith("cuda"):
        try:
            with gpu_timing_lock():
                results.append(VariantResult(COPY, time_copy(nbytes, env, replays=replays)))
        except Exception as e:
            results.append(VariantResult(COPY, error=f"{type(e).__name__}: {e}"[:300]))
        torch.cuda.empty_cache()
    return BenchRow(candidate=cand.id, name=cand.label, case=case, outputs=outputs, bytes_moved=nbytes,
                    roofline_ms=rl.roofline_ms(nbytes, env.copy_gbps), rotation=k, variants=tuple(results), env=env)


def plan_all(cands: Sequence[Candidate], shapes: str, models: Sequence[str] | None, casts: Sequence[str],
             log: Callable[[str], None] = print) -> list[tuple[Candidate, BenchCase]]:
    """Every (candidate, case) to time, in timing order: base-size cases first, then by ``casts``."""
    plan = []
    for cand in cands:
        cases = plan_cases(cand.meta, shapes, models, casts)
        if not cases:
            log(f"{cand.id} ({cand.label}): no observed shapes to time")
        plan += [(cand, c) for c in cases]
    order = {d: i for i, d in enumerate(casts)}
    # stable: base-size cases first, then in the order of ``casts``; candidates keep their order
    plan.sort(key=lambda cc: (0 if cc[1].preset == "base" else 1, order.get(cc[1].cast or "captured", 0)))
    return plan


@dataclass(frozen=True)
class BenchOptions:
    """What ``miner bench`` times and how: built once from the command line (``miner.commands.bench``)."""

    device: str
    variants: tuple[str, ...] = VARIANTS
    shapes: str = "all"  # which cases: all, captured, derived (``plan_cases``)
    models: tuple[str, ...] | None = None  # only shapes observed in these models (None: all)
    replays: int = 25  # CUDA-graph replays per timing
    casts: tuple[str, ...] = ("captured",)  # the dtypes to time each shape at (captured: as observed)
    copy_gbps: float | None = None  # the roofline's bandwidth; None: measured on this device


def run_bench(cands: Sequence[Candidate], options: BenchOptions, *, time_budget_s: float | None = None,
              on_row: Callable[[BenchRow], None] | None = None,
              log: Callable[[str], None] = print) -> tuple[Env, list[BenchRow]]:
    """Time every planned case of every candidate; returns the environment and the rows.

    Base-size cases (derived or captured on the base preset) of all candidates go first, the
    tiny captured ones after: with ``time_budget_s`` no new case starts once that many seconds
    have passed, and the cases left out are listed in the log.
    """
    env = environment(options.device, options.copy_gbps)
    log(env_header(env))
    t0 = time.perf_counter()
    rows, skipped = [], []
    for cand, case in plan_all(cands, options.shapes, options.models, options.casts, log):
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            skipped.append((cand, case))
            continue
        log(f"{cand.label} ({cand.id}) [{','.join(case.models)}] {case.label} ({case.source})")
        row = bench_case(cand, case, env, variants=options.variants, replays=options.replays, log=log)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    for cand, case in skipped:
        log(f"not timed (time budget): {cand.label} ({cand.id}) [{','.join(case.models)}] {case.label} ({case.source})")
    return env, rows

