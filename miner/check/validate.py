"""``miner validate``: a candidate's numerics, and proof that its rewrite fires inside torch.compile.

Two kinds of checks, each a ``Check(kind, case, ok, detail, ...)``:

- ``numerics``: ``kernel.launch`` against ``pattern`` evaluated in float64 on the same inputs, for
  every observed (shape, dtype) (both kernel variants), plus odd cases derived from the first
  observed shape: a non-power-of-two row, a single row, a row longer than the one-pass limit
  (the looped kernel) and bf16/fp16 inputs (``miner.check.cases``). Tolerances per output dtype:
  ``miner.core.dtypes.ELEMENT_TOL``. On a CPU the Triton kernel runs in the interpreter, so
  shapes are shrunk to ``cases.CPU_MAX_ROWS`` rows.
- ``rewrite``: a zoo model the pattern was found in (tiny preset) compiled with the candidate's
  ``FusionPass``; the pass must match (count > 0) and the loss, logits and gradients must match
  eager (``miner.core.dtypes.MODEL_TOL``). Dropout draws the same numbers in both runs
  (``fallback_random``).
- ``captured``: the graphs the pattern was mined from (``captures/``, where the workspace still has
  them) rebuilt on the CPU at their captured sizes (``miner.core.fxnode.to_fx``) and run through the
  candidate's ``FusionPass``: it must match there (count > 0), or it can never fire where it was found
  (DeBERTa's attention region, H100 2026-12-06: a pattern traced with ``view`` where the graphs hold
  ``reshape``, 0 of 24; found on the GPU after two A/B calls, caught here in seconds). Not judged
  (``ok`` None) where no source graph is in the workspace or one cannot be rebuilt (symbolic sizes).
- ``stream`` (a dropout region drawing the four-per-call stream, ``RNG = "philox4"`` in kernel.py):
  the same mask, bit for bit, from one-pass and looped launches of several tile sizes
  (``check_tiling``), plus numerics with float32 inputs. Its ``rewrite`` check is
  ``miner.check.masks.check_model`` on ``device``: its masks differ from eager's and Inductor's, so the
  step is compared with an eager step into which the masks it drew are injected ("masks injected").

The records (``Check``, ``Validation``) and what every kind's validator shares are ``miner.check.checks``;
:func:`validate` runs a candidate's own kind's checks (``miner.check.upcast``, ``realize``, ``reduce``).

Results go to ``candidates/<id>/validation.json``, this stage's only file (with ``failure``: the
first failing check, and ``sources``: the digest of the pattern.py and kernel.py it checked); the
candidate's status follows from it (``miner.core.candidate.status``). ``miner promote`` refuses
anything not validated.
"""

from __future__ import annotations

import time

from miner import kinds
from miner.check.cases import numeric_cases
from miner.check.checks import Check, Validation, compare, line, model_step, models_build, outputs_check, pick_model
from miner.check.reduce import compare_bounded, float64_reference_by_rows
from miner.core import candidate as candidates
from miner.core.candidate import Candidate
from miner.core.dtypes import AUTOCAST_MODEL_TOL, MODEL_TOL
from miner.core.tensors import make_inputs
from miner.core.executor import one_line
from miner.core.workspace import Workspace, safe_name, write_json


# --------------------------------------------------------------------------- numerics

def check_numerics(cand: Candidate, label: str, entry: dict, variant: str | None, device: str) -> Check:
    t0 = time.perf_counter()
    xs = make_inputs(entry["inputs"], device=device, seed=0)
    cs = [float(s) for s in entry.get("scalars", [])]
    try:
        expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *cs)
        outs = cand.kernel_module.launch(*xs, *cs, variant=variant)
        # a kernel that draws random numbers is compared with its kernel.py reference, which draws the same ones
        random = getattr(cand.kernel_module, "RANDOM", False)
        ref_fn = cand.kernel_module.reference if random else cand.pattern_module.pattern
        ref = ref_fn(*[x.double() if x.is_floating_point() else x for x in xs], *cs)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return Check("numerics", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0)
    import torch

    check = outputs_check(label, outs, ref, expect, compare, t0)
    if check.ok or random or not any(o.dtype == torch.float32 for o in outs) or not sums(cand):
        return check
    try:  # a long float32 reduction: its own rounding may exceed a fixed element tolerance
        bounded = float64_reference_by_rows(cand.pattern_module.pattern, xs, cs)
    except Exception as e:  # noqa: BLE001 - no bound to judge by: the element tolerance's verdict stands
        check.detail += f" (no float32 rounding bound to judge by: {one_line(e)[:160]})"
        return check
    again = outputs_check(label, outs, bounded, expect, within_rounding, t0)
    if again.ok:
        again.detail = f"within float32 rounding (element tolerance: {check.detail})"
    return again


def sums(cand: Candidate) -> bool:
    """Whether the pattern sums (``sum``, ``mean``, ``var``): the rounding a long float32 sum accumulates is
    what :func:`within_rounding` admits; a pointwise pattern stays within the element tolerance."""
    ops = str(cand.meta.get("ops", ""))
    return any(op in ops.replace("->", " ").split() for op in ("sum", "mean", "var", "var_mean"))


def within_rounding(out, ref, expect_dtype) -> tuple[bool, float, float, str]:
    """One output against its float64 ``ref`` (``miner.check.reduce.Reference``): within the element
    tolerance (``compare``), or, for a float32 output, within the error a float32 evaluation of the
    pattern may make by rounding alone (``compare_bounded``: ``TOL_K * eps32 * sqrt(e2)`` per element,
    ``e2`` grown through every op; a sum over n terms carries n of them). A row of 128,100 products
    summed in float32 errs by ~5e-4 where the sum cancels to ~0: beyond rtol=atol=1e-5, within the
    bound; a kernel off by a scale of 1e-4 is beyond both."""
    import torch

    ok, a, rel, detail = compare(out, ref.value, expect_dtype)
    if ok or out.dtype != torch.float32 or expect_dtype != torch.float32:
        return ok, a, rel, detail
    ok_b, a_b, worst, detail_b = compare_bounded(out, ref, expect_dtype)
    return ok_b, a_b, rel, (f"{detail}, all within float32 rounding (worst {worst:.2g}x its bound)" if ok_b
                            else f"{detail}; and {detail_b}")


# --------------------------------------------------------------------------- the four-per-call random stream

def tilings(n_cols: int) -> list[tuple[str, tuple[int, int, int]]]:
    """(variant, (ROWS, BLOCK, num_warps)) launches that must draw the same mask: one-pass with one
    and several rows per program, looped with two chunk widths (whole groups of four per Philox call
    in the looped kernel; in the one-pass kernel only when ``n_cols % 4 == 0``, else one call per
    element: comparing them checks the fallback against the grouped draw)."""
    import triton

    block = triton.next_power_of_2(n_cols)
    out = [("one_pass", (1, block, 4)), ("one_pass", (4, block, 4)), ("looped", (1, 64, 4)), ("looped", (1, 256, 4))]
    return [(v, c) for v, c in out if v == "looped" or c[0] * c[1] <= 16384]


def _mask_of(outs) -> list:
    """What a dropout kernel's outputs say about its mask: bool outputs as they are, float
    per-element outputs as their zero pattern."""
    return [o if o.dtype.is_floating_point is False else (o == 0) for o in outs]


def check_tiling(cand: Candidate, label: str, entry: dict, device: str) -> Check:
    """The same mask (bitwise) from every launch of :func:`tilings` on the same inputs: an
    element's random number depends on (seed, its index) only, never on the tile or the kernel. Where the
    shape allows a bool output to be stored as bits (``launch(..., bits=...)``, what the backward saves:
    ``miner.rules.contract.bits_contract``), the bits of the default launch and of the first tiling of each kernel
    form (one-pass, looped) unpack to the default launch's mask too."""
    import torch

    from miner.rules.contract import bits_contract
    from miner.runtime import bits

    t0 = time.perf_counter()
    xs = make_inputs(entry["inputs"], device=device, seed=0)
    cs = [float(s) for s in entry.get("scalars", [])]
    from miner.check.cases import rows

    n_cols = rows(entry)[1]
    kernel = cand.kernel_module

    def failed(detail: str) -> Check:
        return Check("stream", label, False, detail, seconds=time.perf_counter() - t0)
    try:
        raw = kernel.launch(*xs, *cs)
        base = _mask_of(raw)
        packed = tuple(k for k, o in enumerate(raw) if o.dtype == torch.bool
                       and not bits_contract(tuple(o.shape), "bool", kernel.OUTPUT_KINDS[k]))
        stored: set = set()
        for variant, config in [(None, None)] + tilings(n_cols):
            got = _mask_of(kernel.launch(*xs, *cs, variant=variant, config=config)) if variant else base
            at = f"under {variant} ROWS={config[0]} BLOCK={config[1]}" if variant else "in the default launch"
            for i, (a, b) in enumerate(zip(base, got)):
                if not torch.equal(a, b):
                    return failed(f"output {i}: {int((a != b).sum())} mask element(s) differ {at} from the default "
                                  "launch")
            if packed and variant not in stored:  # the bits of each kernel form once (the interpreter is slow)
                stored.add(variant)
                as_bits = kernel.launch(*xs, *cs, variant=variant, config=config, bits=packed)
                for k in packed:
                    b = bits.unpack(as_bits[k], raw[k].shape)
                    if not torch.equal(b, raw[k]):
                        return failed(f"output {k} stored as bits: {int((b != raw[k]).sum())} mask element(s) "
                                      f"differ {at} from the bool mask")
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return failed(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    as_bits = f", stored as bits alike (output {', '.join(map(str, packed))})" if packed else ""
    return Check("stream", label, True, f"same mask in {len(tilings(n_cols)) + 1} tilings{as_bits}",
                 seconds=time.perf_counter() - t0)


def stream_cases(meta: dict) -> list[tuple[str, dict]]:
    """(label, entry) of the tiling checks of a four-per-call dropout kernel (``meta``: candidate.json or
    fusion.json): an observed row length and an odd one, 8 rows; none without an observed shape."""
    from miner.check import cases

    observed = [o for o in meta.get("observed", []) if o.get("outputs")]
    if not observed:
        return []
    first = cases.shrink(observed[0], 8)
    return [(f"tilings {cases.describe(e)}", e) for e in (first, cases.reshape(first, n_cols=cases.ODD_COLS))]


def stream_checks(cand: Candidate, device: str) -> list[Check]:
    """A four-per-call dropout candidate's own checks: the same mask under every tiling
    (:func:`stream_cases`) and numerics with float32 inputs (the numeric cases add bf16/fp16 ones;
    the reference draws from ``miner.runtime.philox``)."""
    from miner.check import cases

    tiled = stream_cases(cand.meta)
    if not tiled:
        return []
    out = [check_tiling(cand, label, e, device) for label, e in tiled]
    out.append(check_numerics(cand, "float32 inputs", cases.reshape(tiled[0][1], dtype="float32"), None, device))
    return out


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a region-kernel fusion's test table (``miner_testing.region_kernel``): ``(test, case id,
    arguments)``. The checks ``miner validate`` ran on the candidate, on the promoted fusion's files: every
    numeric case (shrunk as on the CPU), the tilings of a four-per-call stream, the zoo model's tiny step
    with the fusion's masks injected into eager (``masks.check_model``), and the registry's loud failure."""
    rows = [("test_kernel_matches_float64_reference", label, {"entry": e, "variant": v})
            for label, e, v in numeric_cases(meta, on_cpu=True)]
    if (meta.get("lowering") or {}).get("rng") == "philox4":
        rows += [("test_same_mask_in_every_tiling", label, {"entry": e}) for label, e in stream_cases(meta)]
    zoo = pick_model(meta)
    if zoo:
        rows.append(("test_step_with_its_masks_injected_matches_eager", "/".join(zoo),
                     {"model": zoo[0], "mode": zoo[1]}))
    return rows + [("test_registry_is_loud_about_unknown_names", "no_such_fusion", {"unknown": "no_such_fusion"})]


# --------------------------------------------------------------------------- rewrite in a model

def _parity(reference, got) -> tuple[list[str], float]:
    """Problems (the first pair beyond ``MODEL_TOL``) and the worst max abs difference of two
    ``model_step`` results: logits, loss, each gradient."""
    import torch

    (e_loss, e_logits, e_grads), (c_loss, c_logits, c_grads) = reference, got
    pairs = [("logits", e_logits, c_logits)]
    if e_loss is not None:
        pairs.append(("loss", torch.tensor(e_loss), None if c_loss is None else torch.tensor(c_loss)))
    pairs += [("grads", g, c_grads.get(k)) for k, g in e_grads.items() if g is not None]
    worst = 0.0
    for kind, a, b in pairs:
        if b is None:
            return [f"{kind}: missing in the compiled run"], worst
        a64, b64 = a.double(), b.double().to(a.device)
        rtol, atol = MODEL_TOL[kind]
        d = float((a64 - b64).abs().max()) if a.numel() else 0.0
        worst = max(worst, d)
        if not torch.allclose(a64, b64, rtol=rtol, atol=atol):
            return [f"{kind} differ (max abs {d:.3g}, rtol={rtol} atol={atol})"], worst
    return [], worst


def observed_low_precision(cand: Candidate) -> bool:
    """Whether the candidate was observed with a bf16/fp16 input or output (a step under autocast: its
    pattern holds the casts that only such a step has)."""
    return any(t.get("dtype") in ("bfloat16", "float16") for o in cand.meta.get("observed", ())
               for t in (*o.get("inputs", ()), *o.get("outputs", ())))


def check_rewrite(cand: Candidate, model_name: str, mode: str, device: str = "cpu",
                  autocast_device: str | None = None) -> Check:
    """Compile ``model_name`` (tiny) with only this candidate's pass; count > 0 and parity.

    Parity is against eager, with Inductor drawing the same dropout numbers as eager
    (``fallback_random``). That changes how dropout appears in the graph, so a pattern that holds
    a dropout mask may not fire there: then the model is compiled with Inductor's own random ops,
    and the reference is the same compile without the fusion (same seed, same random numbers).
    A pattern observed under bf16 autocast (its casts exist only there) that fired nowhere in float32
    is proven on ``autocast_device`` under autocast instead (:func:`check_rewrite_autocast`).
    """
    from miner.runtime import rewrite

    t0 = time.perf_counter()
    if autocast_device is not None and observed_low_precision(cand) and "convert_element_type" in str(
            cand.meta.get("ops", "")):  # its casts exist only under autocast: a float32 compile cannot fire it
        return check_rewrite_autocast(cand, model_name, mode, autocast_device, t0)
    label = f"{model_name}/tiny/{mode}"
    built = models_build(model_name, mode, device)
    eager = model_step(built, mode, device, compiled=False)
    reference_name = "eager"
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    try:
        got = model_step(built, mode, device, graph_pass, fallback_random=True)
        reference = eager
        if graph_pass.total() == 0 and mode == "train":
            reference_name = "inductor without the fusion (Inductor's random ops)"
            got = model_step(built, mode, device, graph_pass, fallback_random=False)
            reference = model_step(built, mode, device, None, fallback_random=False)
    except Exception as e:  # noqa: BLE001
        return Check("rewrite", label, False, f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     matches=graph_pass.total(), seconds=time.perf_counter() - t0)
    n = graph_pass.total()
    if n == 0 and autocast_device is not None and observed_low_precision(cand):
        return check_rewrite_autocast(cand, model_name, mode, autocast_device, t0)
    problems, worst = _parity(reference, got)
    if n == 0:
        problems.insert(0, "the rewrite did not fire (0 matches)")
    grads = sum(g is not None for g in eager[2].values())
    detail = "; ".join(problems) or f"{n} match(es); loss/logits/{grads} grads match {reference_name}"
    if problems and reference_name != "eager":
        detail += f" (reference: {reference_name})"
    return Check("rewrite", label, not problems, detail, max_abs=worst, matches=n, seconds=time.perf_counter() - t0)


def check_rewrite_autocast(cand: Candidate, model_name: str, mode: str, device: str, t0: float) -> Check:
    """The rewrite proven in ``model_name`` (tiny) under bf16 autocast on ``device``, as ``miner verify``
    runs a step: compiled with only this candidate's pass against the same compile without it (same
    seed, Inductor's random numbers both), relative norm differences within ``AUTOCAST_MODEL_TOL``."""
    from miner.runtime import rewrite

    label = f"{model_name}/tiny/{mode} (bf16 autocast, {device})"
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    try:
        built = models_build(model_name, mode, device)
        got = model_step(built, mode, device, graph_pass, autocast=True, fallback_random=False)
        reference = model_step(built, mode, device, None, autocast=True, fallback_random=False)
    except Exception as e:  # noqa: BLE001
        return Check("rewrite", label, False, f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     matches=graph_pass.total(), seconds=time.perf_counter() - t0, device=device)
    n = graph_pass.total()
    problems, worst = norm_parity(reference, got)
    if n == 0:
        problems.insert(0, "the rewrite did not fire (0 matches), in float32 nor under bf16 autocast")
    detail = "; ".join(problems) or (f"{n} match(es); loss/logits/grads within {AUTOCAST_MODEL_TOL} (relative "
                                     f"norm) of the compile without it")
    return Check("rewrite", label, not problems, detail, max_abs=worst, matches=n,
                 seconds=time.perf_counter() - t0, device=device)


def norm_parity(reference, got) -> tuple[list[str], float]:
    """Problems (the first quantity whose relative norm difference exceeds ``AUTOCAST_MODEL_TOL``) and the
    worst difference, for two ``model_step`` results under autocast: ``miner.check.verify.make_parity``'s
    direct differences (no float32 reference), logits, loss, the gradients together."""
    from miner.check.verify import make_parity

    (r_loss, r_logits, r_grads), (g_loss, g_logits, g_grads) = reference, got
    if (g_logits is None) != (r_logits is None) or (r_loss is None) != (g_loss is None):
        return ["logits, loss or gradients missing in the run with the rewrite"], 0.0
    p = make_parity(r_loss, g_loss, r_logits, g_logits, r_grads, g_grads)
    found = {q: v for q, v in (("logits", p.logits_rel), ("loss", p.loss_rel), ("grads", p.grads_rel))
             if v is not None}
    bad = [f"{q} differ (relative norm {v:.3g} > {AUTOCAST_MODEL_TOL[q]})" for q, v in found.items()
           if not v <= AUTOCAST_MODEL_TOL[q]]
    return bad[:1], max(found.values(), default=0.0)


# --------------------------------------------------------------------------- the stage

def validate(workspace: Workspace, cid: str, device: str | None = None, model: bool = True,
             log=lambda s: None) -> Validation:
    """Run every check of one candidate; writes validation.json (nothing else).

    The checks are the candidate's kind's (``miner.kinds``: :func:`validate_kernel` for a row or region
    kernel, ``miner.check.upcast.validate`` for an upcast, ...); the file has the same format for all.
    """
    import torch

    cand = candidates.load(workspace, cid)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return _finish(cand, kinds.kind_of(cand.meta).call("checks", cand, device, model, log))


def validate_kernel(cand: Candidate, device: str, model: bool = True, log=lambda s: None) -> Validation:
    """The checks of a Triton kernel candidate (a row or region kernel): numerics, stream, rewrite."""
    v = Validation(cand.id, True, device, model)
    for label, entry, variant in numeric_cases(cand.meta, on_cpu=device == "cpu"):
        c = check_numerics(cand, label, entry, variant, device)
        log(line(c))
        v.checks.append(c)
    if not v.checks:
        v.checks.append(Check("numerics", "observed shapes", False, "no observed shape to check"))
    if getattr(cand.kernel_module, "RNG", None) == "philox4":
        for c in stream_checks(cand, device):
            log(line(c))
            v.checks.append(c)
    if model:
        c = check_captured(cand)
        if c is not None:
            log(line(c))
            v.checks.append(c)
        pick = pick_model(cand.meta)
        if pick is None:
            v.checks.append(Check("rewrite", "model", False, "no model to prove the rewrite in"))
        else:
            if getattr(cand.kernel_module, "RNG", None) == "philox4":  # another stream: the masks injected
                from miner.check import masks

                c = masks.check_model(cand, *pick, device=device)
            else:
                c = check_rewrite(cand, *pick, device="cpu", autocast_device=device if device != "cpu" else None)
            log(line(c))
            v.checks.append(c)
    for c in v.checks:
        c.device = c.device or (device if c.kind in ("numerics", "stream") else "cpu")
    return v


def check_captured(cand: Candidate) -> Check | None:
    """The ``captured`` check (module docstring): matches of the candidate's rewrite in the captured graphs
    its occurrences came from, against how many occurrences were mined there. None when the candidate
    records no occurrence (nothing to look for)."""
    from collections import Counter

    from miner.core.fxnode import to_fx
    from miner.runtime import rewrite

    t0 = time.perf_counter()
    expected: Counter = Counter()
    for o in cand.meta.get("observed") or ():
        if o.get("model") and o.get("preset") and o.get("phase"):
            expected[(o["model"], o["preset"], o["phase"])] += int(o.get("count") or 1)
    if not expected:
        return None
    ws = Workspace(cand.path.parent.parent)
    files = [f for (model, preset, phase) in expected
             for f in sorted((ws.captures / safe_name(model) / preset).glob(f"*-{phase}-*.json"))]
    label = ", ".join(f"{m}/{pr} {ph}" for m, pr, ph in expected)
    if not files:
        return Check("captured", label, None, "not judged: the graphs it was mined from are not in this workspace",
                     seconds=time.perf_counter() - t0, device="cpu")
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)],
                                    match_only=True)
    try:
        for f in files:  # on the CPU: the pattern matcher re-traces a match with real tensors of its devices
            graph_pass(to_fx(ws.load_graph(f), device="cpu").graph)
    except Exception as e:  # a graph that cannot be rebuilt (symbolic sizes): the GPU's rewrite check decides
        return Check("captured", label, None, f"not judged: {type(e).__name__}: {one_line(e)}",
                     seconds=time.perf_counter() - t0, device="cpu")
    n, want = graph_pass.total(), sum(expected.values())
    where = f"in {len(files)} captured graph(s) rebuilt at their sizes"
    if n:
        return Check("captured", label, True, f"{n} match(es) of {want} occurrence(s) {where}", matches=n,
                     seconds=time.perf_counter() - t0, device="cpu")
    declined = "; ".join(f"{r} x{k}" for reasons in graph_pass.declined.values() for r, k in reasons.items())
    return Check("captured", label, False,
                 f"0 matches of {want} occurrence(s) {where}: it cannot fire where it was found"
                 + (f" (declined: {declined})" if declined else " (the pattern's structure differs from the graph's)"),
                 matches=0, seconds=time.perf_counter() - t0, device="cpu")


def _finish(cand: Candidate, v: Validation) -> Validation:
    """``v``'s verdict (a check that did not run fails nothing) written to the candidate's validation.json."""
    failed = [c for c in v.checks if c.ok is False]
    v.ok = not failed
    v.failure = f"{failed[0].kind} {failed[0].case}: {failed[0].detail}" if failed else None
    write_json(cand.path / "validation.json", {**v.to_json(), "sources": candidates.sources_digest(cand.path)})
    return v
