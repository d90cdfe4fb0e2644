"""``miner validate`` for a GEMM-epilogue candidate (``miner.rules.epilogue``, ``miner.generate.epilogue``).

The rewrite calls cuBLASLt (``aten._addmm_activation``) instead of Inductor's GEMM + pointwise kernel, so what
needs proof is that it takes exactly the chains the rule identifies, wires the epilogue's output where the chain's
was, and computes values as accurate as Inductor's. One chain serves every check (:func:`mlp`): four GEMMs, two the
rule takes (gpt2's tanh GELU, a ReLU) and two it declines (bert's erf GELU: another function; a pre-activation
returned beside its GELU, as a training graph saves it for the backward). Checks, each a
``miner.check.checks.Check``:

- ``graph`` (any machine): the chain traced on fake CUDA tensors: the pass must leave exactly two
  ``_addmm_activation`` (``use_gelu`` True, then False), no ``tanh`` or ``relu``, decline the other two GEMMs with
  the rule's reasons, and take nothing on a second run (the pass runs in both post-grad slots);
- ``rewrite`` (any machine): that rewritten graph run on CPU tensors with the epilogue emulated in float32 (the
  CPU's own ``_addmm_activation`` applies the erf GELU) equals the original chain within bf16 roundings;
- ``rewrite`` (CUDA): the chain compiled by Inductor with and without the pass, bf16: two matches, and an error
  against float64 at most :data:`REF_SLACK` times Inductor's own plus one bf16 rounding of the largest output;
- ``rewrite`` (the model, CUDA): the tiny zoo model it was found in, one step compiled with only this pass
  against the same compile without it (``miner.check.upcast.model_check``). On the CPU the rule declines every
  GEMM (its device reason), so the two CUDA checks say "not run" there.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from miner.check.checks import Check, Validation, line, pick_model

SIZES = (48, 32, 64)  # rows, input features, hidden features of the chain
REF_SLACK = 2.0  # the rewrite's error vs float64 may be at most this times Inductor's own ...
BF16_EPS = 2.0 ** -8  # ... plus one bf16 rounding of the largest output
CPU_ONLY_REASON = ("not run on cpu: the epilogue is cuBLASLt's (the rule declines every CPU GEMM: the CPU's "
                   "_addmm_activation applies the erf GELU); run on a CUDA machine")
# the emulated rewrite against the chain: the chain rounds the GEMM's output and each of its ~8 ops to bf16, the
# epilogue rounds once; seen 7.3e-03 (relative to |ref| + 1) at seed 0, with use_gelu inverted 0.23
EMULATED_TOL = 2.0 ** -6
TAKEN = (True, False)  # the use_gelu of the _addmm_activation nodes the pass must leave, in graph order


def gelu_new(h):
    """HF's NewGELUActivation (gpt2): the tanh GELU the epilogue applies."""
    import torch

    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


def mlp(x, *layers):
    """The validation chain: ``x`` through four ``addmm`` (``layers``: bias, weight of each): tanh GELU (taken),
    ReLU (taken), erf GELU (declined: not the epilogue's function), tanh GELU whose pre-activation is also
    returned (declined: read outside)."""
    import torch

    b1, w1, b2, w2, b3, w3, b4, w4 = layers
    h = gelu_new(torch.addmm(b1, x, w1))
    h = torch.relu(torch.addmm(b2, h, w2))
    h3 = torch.addmm(b3, h, w3)
    h = 0.5 * h3 * (1.0 + torch.erf(h3 / math.sqrt(2.0)))
    pre = torch.addmm(b4, h, w4)
    return gelu_new(pre), pre


def inputs(device: str, dtype=None, seed: int = 0) -> list:
    """``mlp``'s arguments: ``x``, then each layer's bias and weight (scaled to keep activations near 1)."""
    import torch

    dtype = dtype or torch.bfloat16
    rows, d, hidden = SIZES
    g = torch.Generator().manual_seed(seed)
    shapes = [((hidden,), (d, hidden)), ((d,), (hidden, d)), ((hidden,), (d, hidden)), ((d,), (hidden, d))]
    out = [torch.randn(rows, d, generator=g)]
    for b, w in shapes:
        out += [torch.randn(*b, generator=g) * 0.1, torch.randn(*w, generator=g) / math.sqrt(w[0])]
    return [t.to(device=device, dtype=dtype) for t in out]


def _pass(module, name: str, gate: str = "on"):
    from miner.runtime import rewrite

    return rewrite.FusionPass([rewrite.entry_for(module.__file__, name, module)], gate=gate)


def traced(device: str = "cuda"):
    """``mlp`` traced with ``make_fx`` on fake ``device`` bf16 tensors (any machine)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = [torch.empty(*t.shape, dtype=t.dtype, device=device) for t in inputs("cpu")]
    return make_fx(mlp, tracing_mode="fake")(*fake)


def _fused(gm) -> list:
    import torch

    return [n for n in gm.graph.nodes if n.target is torch.ops.aten._addmm_activation.default]


def check_graph(module, name: str, *, gate_open: bool = False):
    """The pass on :func:`mlp` traced on fake CUDA tensors: two ``_addmm_activation`` (:data:`TAKEN`), their chains
    gone, the other two GEMMs declined with reasons, nothing taken by a second run. Returns (Check, the graph)."""
    t0 = time.perf_counter()
    label = "mlp: tanh GELU, ReLU, erf GELU, GELU beside its pre-activation (fake cuda tensors)"
    gm = traced("cuda")
    gate = "open" if gate_open else "on"
    p = _pass(module, name, gate)
    p(gm.graph)
    again = _pass(module, name, gate)
    again(gm.graph)
    gm.recompile()
    fused = _fused(gm)
    left = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    problems = []
    got = tuple(bool(n.kwargs.get("use_gelu")) for n in fused)
    if p.counts[name] != len(TAKEN) or got != TAKEN:
        problems.append(f"{p.counts[name]} matches, _addmm_activation use_gelu {list(got)}, expected {list(TAKEN)}")
    if "aten.relu.default" in left or left.count("aten.tanh.default") != 1:  # the declined GELU keeps its tanh
        problems.append(f"chains left behind: {left.count('aten.tanh.default')} tanh, "
                        f"{left.count('aten.relu.default')} relu (expected 1 tanh, 0 relu)")
    reasons = sorted(p.declined.get(name, {}))
    want = ("computes none of", "read outside the chain")
    if sum(p.declined.get(name, {}).values()) != 2 or not all(any(w in r for r in reasons) for w in want):
        problems.append(f"declined {dict(p.declined.get(name, {}))}, expected the erf GELU ('computes none of') "
                        f"and the pre-activation ('read outside the chain')")
    if again.counts[name]:
        problems.append(f"a second run of the pass matched {again.counts[name]} more")
    detail = "; ".join(problems) or ("tanh GELU and ReLU as _addmm_activation (use_gelu True, False), their chains "
                                     "erased; declined: " + "; ".join(r.split(":")[0] for r in reasons)
                                     + "; a second run takes nothing")
    return Check("graph", label, not problems, detail, matches=p.counts[name], seconds=time.perf_counter() - t0,
                 device="cpu (fake cuda tensors)"), gm


def emulate_epilogue(bias, x, w, use_gelu=False):
    """What cuBLASLt's epilogue computes, emulated in float32: addmm, then the tanh GELU or the ReLU, rounded once."""
    import torch

    h = torch.addmm(bias.float(), x.float(), w.float())
    return (torch.nn.functional.gelu(h, approximate="tanh") if use_gelu else h.relu()).to(x.dtype)


def check_emulated(module, name: str, *, gate_open: bool = False, rewritten=None) -> Check:
    """The graph :func:`check_graph` rewrote, run on CPU tensors with the epilogue emulated: equal to :func:`mlp`
    within :data:`EMULATED_TOL` (the epilogue rounds once where the chain rounded the GEMM and each op).
    ``rewritten``: what :func:`check_graph` returned already (None: it runs here)."""
    t0 = time.perf_counter()
    label = "mlp rewritten, run on cpu with the epilogue emulated in float32"
    graph_check, gm = rewritten or check_graph(module, name, gate_open=gate_open)
    if not graph_check.matches:
        return Check("rewrite", label, False, "the rewrite did not fire on the traced chain", matches=0,
                     seconds=time.perf_counter() - t0, device="cpu")
    for n in _fused(gm):
        n.target = emulate_epilogue
    gm.recompile()
    xs = inputs("cpu")
    got, want = gm(*xs), mlp(*xs)
    worst = max(float(((g.float() - r.float()).abs() / (r.float().abs() + 1)).max()) for g, r in zip(got, want))
    ok = worst <= EMULATED_TOL and all(g.dtype == r.dtype and g.shape == r.shape for g, r in zip(got, want))
    detail = (f"outputs equal the chain's within bf16 roundings (max |diff| / (|ref| + 1) {worst:.2e}, bound "
              f"{EMULATED_TOL:.2e})" if ok else f"outputs differ from the chain's: max |diff| / (|ref| + 1) {worst:.2e} "
                                             f"> {EMULATED_TOL:.2e}, or another dtype or shape")
    return Check("rewrite", label, ok, detail, max_rel=worst, matches=graph_check.matches,
                 seconds=time.perf_counter() - t0, device="cpu")


def check_compiled(module, name: str, device: str, *, gate_open: bool = False) -> Check:
    """Inductor with and without the pass on :func:`mlp` in bf16 (CUDA): two matches, and the error against
    float64 at most :data:`REF_SLACK` times Inductor's own plus one bf16 rounding of the largest output."""
    import torch

    from miner.runtime import rewrite

    label = f"mlp compiled by Inductor ({device})"
    if device != "cuda":
        return Check("rewrite", label, None, CPU_ONLY_REASON, device=device)
    t0 = time.perf_counter()
    xs = inputs(device)
    outs, n = {}, 0
    try:
        for with_pass in (False, True):
            torch._dynamo.reset()
            p = _pass(module, name, "open" if gate_open else "on") if with_pass else None
            opts = rewrite.inductor_options(p) if p is not None else None
            with torch._inductor.config.patch(force_disable_caches=True):
                outs[with_pass] = torch.compile(mlp, options=opts, dynamic=False)(*xs)
            n = p.counts[name] if p is not None else n
    except Exception as e:  # noqa: BLE001 - a compile failure is a failed check
        return Check("rewrite", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0, device=device)
    finally:
        torch._dynamo.reset()
    ref = mlp(*(t.double() for t in xs))
    err = {w: max(float((o.double() - r).abs().max()) for o, r in zip(outs[w], ref)) for w in (False, True)}
    bound = REF_SLACK * err[False] + BF16_EPS * max(float(r.abs().max()) for r in ref)
    problems = [] if n == len(TAKEN) else [f"{n} matches, expected {len(TAKEN)}"]
    if err[True] > bound:
        problems.append(f"max error vs float64 {err[True]:.2e} with the pass, {err[False]:.2e} without "
                        f"(bound {bound:.2e})")
    detail = "; ".join(problems) or (f"{n} matches; max error vs float64 {err[True]:.2e} with the pass, "
                                     f"{err[False]:.2e} without (bound {bound:.2e})")
    return Check("rewrite", label, not problems, detail, err[True], matches=n, seconds=time.perf_counter() - t0,
                 device=device)


def check_model(module, name: str, model: str, mode: str, device: str, *, gate_open: bool = False) -> Check:
    """The pass inside ``torch.compile`` of the tiny zoo ``model`` (CUDA; ``miner.check.upcast.model_check``)."""
    from miner.check.upcast import model_check

    if device != "cuda":
        return Check("rewrite", f"{model}/tiny/{mode} ({device})", None, CPU_ONLY_REASON, device=device)
    return model_check(module, name, model, mode, device, gate_open=gate_open)


def validate(cand, device: str, model: bool = True, log: Callable[[str], None] = lambda s: None) -> Validation:
    """Every check of GEMM-epilogue candidate ``cand`` on ``device``; ``validation.json`` is written by the caller."""
    v = Validation(cand.id, True, device, model)
    rewritten = check_graph(cand.pattern_module, cand.id)
    checks = [rewritten[0], check_emulated(cand.pattern_module, cand.id, rewritten=rewritten),
              check_compiled(cand.pattern_module, cand.id, device)]
    if model:
        pick = pick_model(cand.meta)
        checks.append(Check("rewrite", "model", False, "no model to prove the rewrite in", device=device)
                      if pick is None else check_model(cand.pattern_module, cand.id, *pick, device=device))
    for c in checks:
        log(line(c))
    v.checks = checks
    v.model = model and any(c.kind == "rewrite" and "/tiny/" in c.case and c.ok is not None for c in checks)
    return v


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a GEMM-epilogue fusion's test table (``miner_testing.gemm_epilogue``): ``(test, case id,
    arguments)``: the chain traced and rewritten (any machine), compiled (CUDA), the zoo model (CUDA)."""
    zoo = pick_model(meta)
    return ([("test_takes_the_tanh_gelu_and_relu_and_declines_the_rest", "mlp", {}),
             ("test_rewritten_chain_equals_the_original_on_cpu", "mlp", {}),
             ("test_compiled_chain_is_as_accurate_as_inductor", "mlp", {})]
            + ([("test_fires_in_its_zoo_model", "/".join(zoo), {"model": zoo[0], "mode": zoo[1]})] if zoo else []))


__all__ = ["CPU_ONLY_REASON", "EMULATED_TOL", "REF_SLACK", "SIZES", "TAKEN", "check_compiled", "check_emulated", "check_graph",
           "check_model", "emulate_epilogue", "fusion_test_cases", "gelu_new", "inputs", "mlp", "traced", "validate"]
