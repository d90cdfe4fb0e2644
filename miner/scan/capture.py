"""Capture Inductor's post-grad FX graphs, with node metadata and the kernel each node ended up in.

How (verified on torch 2.11 and 2.13; see docs/torch-internals.md):

* a ``CustomGraphPass`` in ``torch._inductor.config.post_grad_custom_post_pass`` sees every
  post-grad graph (forward, backward, inference) right before lowering; it summarizes the
  graph into ``NodeRecord``s on the spot, since later passes keep mutating it;
* Inductor's caches are disabled for the whole step (forward *and* backward): a cache hit
  skips custom passes entirely;
* with provenance tracking on, Inductor fills
  ``torch._inductor.debug._inductor_triton_kernel_to_post_grad_node_info`` while it generates
  code; we wrap ``GraphLowering.compile_to_module`` to snapshot the entries each graph added;
* except for mix-order reductions (a row and a column reduction in one kernel: layer-norm and
  RMS-norm backward), whose codegen (``SIMDScheduling._codegen_mix_order_reduction``) calls
  ``codegen_comment(node_schedule, None)``, so Inductor records no entry for them: we record them
  ourselves (``track_mix_order_reductions``).

``PRIVATE_SURFACE`` lists every private Inductor name this module relies on;
``tests/test_capture.py::test_private_surface`` fails loudly when a torch upgrade moves one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from miner.core.fxnode import node_record
from miner.core.records import CapturedGraph, GraphKey, KernelRef, NodeRecord

PRIVATE_SURFACE = (
    "torch._inductor.custom_graph_pass.CustomGraphPass",
    "torch._inductor.config.post_grad_custom_post_pass",
    "torch._inductor.config.force_disable_caches",
    "torch._inductor.config.trace.provenance_tracking_level",
    "torch._inductor.config.benchmark_kernel",
    "torch._inductor.graph.GraphLowering.compile_to_module",
    "torch._inductor.debug._inductor_triton_kernel_to_post_grad_node_info",
    "torch._dynamo.utils.counters",
    "torch._inductor.codegen.simd.SIMDScheduling._codegen_mix_order_reduction",
    "torch._inductor.codegen.triton.TritonScheduling.define_kernel",
    "torch._inductor.debug.set_kernel_post_grad_provenance_tracing",
)


# --------------------------------------------------------------------------- node summaries

def summarize(graph: torch.fx.Graph) -> list[NodeRecord]:
    """NodeRecords for every node of ``graph`` (kernels filled in later; ``miner.core.fxnode.node_record``,
    the records the rules read at compile time too)."""
    return [node_record(n) for n in graph.nodes]


def phase_of(graph: torch.fx.Graph, mode: str) -> str:
    if mode == "infer":
        return "inference"
    tangents = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
    return "backward" if tangents else "forward"


# --------------------------------------------------------------------------- kernel map

def kernel_kind(name: str, node_categories: list[str]) -> str:
    """Kind of a generated kernel from its name (GPU) or, for C++ kernels, the nodes it holds."""
    base = name.rsplit(":", 1)[0]
    for prefix, kind in (("triton_poi_", "pointwise"), ("triton_red_", "reduction"),
                         ("triton_per_", "persistent_reduction"), ("triton_tem_", "template"),
                         ("triton_for_", "foreach")):
        if base.startswith(prefix):
            return kind
    if base.startswith("extern_kernels.") or "fused" not in base:
        return "template" if "template" in base.lower() else "extern"
    if base.startswith("cpp_fused_"):
        return "reduction" if "reduction" in node_categories else "pointwise"
    return "other"


def attach_kernels(records: list[NodeRecord], kernel_nodes: dict[str, list[str]]) -> tuple[list[NodeRecord], list[KernelRef]]:
    """Fill each record's ``kernels`` from Inductor's ``{"kernel:handle": [fx names]}`` map."""
    category = {r.name: r.category for r in records}
    by_node: dict[str, list[KernelRef]] = {}
    kernels = []
    for kname, names in kernel_nodes.items():
        ref = KernelRef(kname, kernel_kind(kname, [category.get(n, "other") for n in names]))
        kernels.append(ref)
        for n in names:
            by_node.setdefault(n, []).append(ref)
    out = [dataclasses.replace(r, kernels=tuple(by_node.get(r.name, ()))) for r in records]
    return out, kernels


# --------------------------------------------------------------------------- the capture itself

@dataclass
class _Pending:
    graph: torch.fx.Graph  # held so that id() stays unique until the kernel map arrives
    phase: str
    records: list[NodeRecord]
    kernels: dict[str, list[str]] | None = None
    module: Any = None  # the compiled wrapper module (its globals hold the kernels: miner.scan.profile reads their meta)


class CapturePass(CustomGraphPass):
    """The post-grad custom pass: records each graph it sees. Chains to an ``inner`` pass first."""

    def __init__(self, mode: str, inner: Callable | None = None):
        self.mode = mode
        self.inner = inner
        self.pending: list[_Pending] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.inner is not None:
            self.inner(graph)
        self.pending.append(_Pending(graph, phase_of(graph, self.mode), summarize(graph)))

    def uuid(self) -> None:
        return None  # never cache: a cache hit would skip this pass

    def __deepcopy__(self, memo):  # torch.compile deep-copies the inductor config
        return self


@contextlib.contextmanager
def track_mix_order_reductions() -> Iterator[list[str]]:
    """Within this block, each mix-order reduction kernel Inductor defines gets a provenance entry.

    Inductor's ``SIMDScheduling._codegen_mix_order_reduction`` (torch 2.13's source; the H200 run on 2.11
    shows the same) defines the kernel
    and then calls ``codegen_comment(node_schedule, None)``: with no kernel name, nothing is added to
    ``_inductor_triton_kernel_to_post_grad_node_info``, so these kernels (layer-norm / RMS-norm
    backward, often the largest Triton kernels of a training step) are in no kernel map. While that
    method runs, we call ``set_kernel_post_grad_provenance_tracing(node_schedule, name)`` after its
    ``TritonScheduling.define_kernel`` (the first one: node2's pointwise epilogue is defined after it
    through the ordinary path, which traces itself), as Inductor does for every other kernel (one
    ``name:handle`` per call site). Yields the entries added. Does nothing on a torch without them.
    """
    added: list[str] = []
    try:
        import torch._inductor.debug as inductor_debug
        from torch._inductor.codegen.simd import SIMDScheduling
        from torch._inductor.codegen.triton import TritonScheduling
    except ImportError:
        yield added
        return
    mix = getattr(SIMDScheduling, "_codegen_mix_order_reduction", None)
    define = getattr(TritonScheduling, "define_kernel", None)
    trace = getattr(inductor_debug, "set_kernel_post_grad_provenance_tracing", None)
    if mix is None or define is None or trace is None:
        yield added
        return
    pending: list[bool] = []  # per running mix-order codegen: its kernel is not defined yet

    def codegen_mix(self, *args, **kwargs):
        pending.append(True)
        try:
            return mix(self, *args, **kwargs)
        finally:
            pending.pop()

    def define_kernel(self, src_code, node_schedule, kernel):
        name = define(self, src_code, node_schedule, kernel)
        if pending and pending[-1] and name:  # the mix-order kernel itself, not the epilogue
            pending[-1] = False                # kernels defined after it (Inductor traces those)
            handle = trace(node_schedule, name)
            if handle is not None:
                added.append(f"{name}:{handle}")
        return name

    SIMDScheduling._codegen_mix_order_reduction = codegen_mix
    TritonScheduling.define_kernel = define_kernel
    try:
        yield added
    finally:
        SIMDScheduling._codegen_mix_order_reduction = mix
        TritonScheduling.define_kernel = define


@contextlib.contextmanager
def capturing(mode: str, *, kernel_bytes: bool = False) -> Iterator[CapturePass]:
    """Within this block, every Inductor compile is captured (caches off, provenance on).

    ``kernel_bytes``: also set ``benchmark_kernel`` so that each Triton kernel's ``inductor_meta``
    holds Inductor's own byte count (``kernel_num_gb``; run-time behaviour unchanged).
    """
    import torch._inductor.config as inductor_config
    import torch._inductor.debug as inductor_debug
    from torch._inductor.graph import GraphLowering

    cap = CapturePass(mode, inner=inductor_config.post_grad_custom_post_pass)
    original = GraphLowering.compile_to_module

    def compile_to_module(self):
        before = set(inductor_debug._inductor_triton_kernel_to_post_grad_node_info)
        module = original(self)
        info = inductor_debug._inductor_triton_kernel_to_post_grad_node_info
        for p in cap.pending:
            if p.graph is self.module.graph and p.kernels is None:
                p.kernels = {k: list(v) for k, v in info.items() if k not in before}
                p.module = module
        return module

    GraphLowering.compile_to_module = compile_to_module
    try:
        patch = {"post_grad_custom_post_pass": cap, "force_disable_caches": True,
                 "trace.provenance_tracking_level": 1}
        if kernel_bytes:
            patch["benchmark_kernel"] = True
        with inductor_config.patch(patch), track_mix_order_reductions():
            yield cap
    finally:
        GraphLowering.compile_to_module = original


def captured_graphs(cap: CapturePass, model: str, preset: str, mode: str, provenance: dict) -> list[CapturedGraph]:
    graphs, index = [], Counter()
    for p in cap.pending:
        records, kernels = attach_kernels(p.records, p.kernels or {})
        key = GraphKey(model, preset, mode, p.phase, index[p.phase])
        index[p.phase] += 1
        graphs.append(CapturedGraph(key, tuple(records), tuple(kernels),
                                    {**provenance, "kernel_map": p.kernels is not None}))
    return graphs


@dataclass
class StepOutcome:
    graphs: list[CapturedGraph]
    graph_breaks: int
    seconds: float
    phase_seconds: dict[str, float] = field(default_factory=dict)
    profile: Any = None  # miner.scan.profile.StepProfile when asked for


def versions() -> dict[str, str]:
    import platform

    import transformers
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def capture_step(built, *, name: str, preset: str, mode: str, device: str, autocast_dtype: torch.dtype | None = None,
                 progress: Callable[[str], None] = lambda s: None, profile: bool = False) -> StepOutcome:
    """Compile ``built.model`` (a ``miner_models.Built``) with Inductor and run one step (train:
    ``built.loss(model(**built.inputs))`` + backward), capturing graphs.

    ``profile``: then, with the same compiled model (so the profiled kernel names are the captured
    ones), time and profile further steps (``miner.scan.profile.measure``) and join the kernel table
    to the graphs' kernel maps: ``StepOutcome.profile``. Training steps set ``grad = None`` first.
    ``name`` ``<model>@<knob>`` (``miner.check.knobs.of_label``): the knob's Inductor options go to
    ``torch.compile``, its context holds over the compile and every step, and the provenance names it.
    """
    from torch._dynamo.utils import counters

    from miner.check import knobs

    knob = knobs.of_label(name)
    model, inputs, loss_fn = built.model, built.inputs, built.loss
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="inductor", dynamic=False,
                             options=dict(knob.options) if knob is not None and knob.options else None)
    amp = (torch.autocast(device_type=device.split(":")[0], dtype=autocast_dtype)
           if autocast_dtype is not None else contextlib.nullcontext())
    phase_seconds = {}
    t0 = time.perf_counter()

    def step() -> None:  # one more step of the compiled model, as the first one
        if mode == "train":
            for p in model.parameters():
                p.grad = None
            with amp:
                out = loss_fn(compiled(**inputs))
            out.backward()
        else:
            with torch.no_grad(), amp:
                compiled(**inputs)

    raw = None
    with capturing(mode, kernel_bytes=profile) as cap, knobs.holding(knob):
        if mode == "train":
            progress("compiling forward")
            with amp:
                loss = loss_fn(compiled(**inputs))
            phase_seconds["forward"] = time.perf_counter() - t0
            progress(f"compiling backward (forward took {phase_seconds['forward']:.1f}s)")
            loss.backward()
            phase_seconds["backward"] = time.perf_counter() - t0 - phase_seconds["forward"]
        else:
            progress("compiling inference")
            with torch.no_grad(), amp:
                compiled(**inputs)
            phase_seconds["inference"] = time.perf_counter() - t0
        if profile:
            from miner.scan.profile import measure
            compiled_graphs = len(cap.pending)
            progress(f"profiling (compile took {time.perf_counter() - t0:.1f}s)")
            t1 = time.perf_counter()
            raw = measure(step, lambda: [p.module for p in cap.pending], device)
            raw.recompiled = len(cap.pending) - compiled_graphs
            phase_seconds["profile"] = time.perf_counter() - t1
    seconds = time.perf_counter() - t0 - phase_seconds.get("profile", 0.0)
    breaks = sum(counters["graph_break"].values())
    provenance = {**versions(), "device": device, "date": time.strftime("%Y-%m-%d"),
                  "autocast": str(autocast_dtype).removeprefix("torch.") if autocast_dtype else None,
                  **({"knob": knob.name} if knob is not None else {})}
    if device.startswith("cuda"):
        provenance["gpu"] = torch.cuda.get_device_name()
    graphs = captured_graphs(cap, name, preset, mode, provenance)
    if not graphs:
        raise RuntimeError("no post-grad graph was captured (was the compile served from a cache?)")
    step_profile = None
    if raw is not None:
        from miner.scan.profile import build
        step_profile = build(raw, graphs, model=name, preset=preset, mode=mode, device=device, provenance=provenance)
    return StepOutcome(graphs, breaks, seconds, phase_seconds, step_profile)
