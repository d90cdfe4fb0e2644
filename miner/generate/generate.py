"""``miner generate``: mined patterns -> fusion candidates under ``candidates/<id>/``.

``generate(pattern)`` lowers a pattern (``miner.generate.lower.lower``) and renders three files:

- ``pattern.py``: ``pattern`` (the subgraph in aten ops, the eager reference), ``replacement``
  (the custom op ``miner::c<id>``), ``extra_check`` and ``register(pass_dict)``;
- ``kernel.py``: the generated Triton kernels (one-pass and looped) and ``launch``;
- ``candidate.json``: the pattern, where it was observed (shapes, dtypes, scalars, counts), the
  safety summary and the bytes moved unfused / fused / as Inductor split it.

A pattern outside the generator's class is *skipped* with the reason (``Skipped``); ``miner
generate`` prints those and saves them in ``candidates/index.json``. The Candidate API (what the
files export, candidate.json's fields) is documented in docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from miner import __version__
from miner.generate import emit, lower, region
from miner.generate.emit import render_kernel_py
from miner.generate.lower import PatternSpec, Program, Unsupported
from miner.core import dtypes, source
from miner.core.executor import one_line
from miner.core.pattern import canonical_nodes, pattern_from_json
from miner.core.source import literal_value
from miner.rules.contract import row_shape
from miner.runtime.launch import LOOP_BLOCK, ONE_PASS_MAX
from miner.core.workspace import Workspace, write_json, write_text


@dataclass(frozen=True)
class Generated:
    """A pattern written as ``candidates/<id>/``."""

    id: str
    label: str
    path: Path
    observed: int  # distinct observed signatures


@dataclass(frozen=True)
class Skipped:
    """A pattern not generated, and why."""

    id: str
    ops: str
    reason: str


# --------------------------------------------------------------------------- pattern -> spec

def spec_from_pattern(pattern) -> PatternSpec:
    """The codegen view of a ``miner.core.pattern.Pattern``: nodes, slots, outputs, observed dtypes, rank."""
    ok = [o for o in pattern.occurrences if o.verdict.ok] or list(pattern.occurrences)
    seen: list[set[str]] = [set() for _ in range(pattern.n_inputs)]
    rank, input_ranks = None, [None] * pattern.n_inputs
    for occ in ok:
        for k, m in enumerate(occ.input_meta[:pattern.n_inputs]):
            input_ranks[k] = len(m.shape) if m is not None and input_ranks[k] is None else input_ranks[k]
        shapes = []
        for k, m in enumerate(occ.input_meta[:pattern.n_inputs]):
            if m is not None:
                seen[k].add(m.dtype)
                shapes.append(len(m.shape))
        if shapes:
            rank = max(shapes) if rank is None else max(rank, max(shapes))
    return PatternSpec(id=pattern.id, nodes=canonical_nodes(pattern.nodes, input_ranks), n_inputs=pattern.n_inputs, n_consts=pattern.n_consts,
                       outputs=tuple(pattern.all_outputs), input_dtypes=tuple(tuple(sorted(d)) for d in seen),
                       rank=rank)


def label_for(ops: str) -> str:
    """A readable name guess from the op summary (``"amax -> sub -> exp -> sum -> div"``)."""
    s = [o.strip() for o in ops.split("->")]
    has = set(s)
    if "inductor_random" in has:  # a region with dropout: "dropout_" + what the rest computes
        rest = [o for o in s if o not in ("inductor_lookup_seed", "inductor_random")]
        return "dropout_" + label_for(" -> ".join(rest)).removeprefix("fused_")
    if "relu" in has and not has & {"amax", "sum", "mean", "var_mean"}:
        return "relu"
    if {"amax", "exp", "sum", "log"} <= has:
        return "log_softmax"
    if {"amax", "exp", "sum", "div"} <= has or s[:3] == ["exp", "sum", "div"]:
        return "softmax_like"
    if "var_mean" in has and "rsqrt" in has:
        return "layer_norm"
    if {"pow", "mean", "rsqrt"} <= has:
        return "rms_norm"
    if "erf" in has:
        return "gelu_erf"
    if "tanh" in has:
        return "gelu_tanh"
    if s[:4] == ["neg", "exp", "add", "div"]:
        return "silu_mul" if "mul" in s[4:] else "silu"
    if "sigmoid" in has:
        return "silu_mul" if "mul" in has else "silu"
    return "fused_" + "_".join(dict.fromkeys(s))[:40]


# --------------------------------------------------------------------------- observed shapes and bytes

def _shape_of(meta) -> list:
    return list(meta.shape)


def observed_entries(pattern, spec: PatternSpec, same_kernel: tuple[int, ...] = ()) -> list[dict]:
    """Distinct (model, phase, input metas, scalars) of the safe occurrences, with counts and bytes.

    ``same_kernel``: const slots whose value does not change what the kernel computes (a dropout
    seed's index: every layer draws from its own seed): they split no entry (the first is kept).
    """
    groups: dict[tuple, dict] = {}
    counts: Counter = Counter()
    for occ in pattern.occurrences:
        if not occ.verdict.ok or any(m is None for m in occ.input_meta):
            continue
        inputs = [{"shape": _shape_of(m), "dtype": m.dtype,
                   "stride": list(m.stride) if m.stride is not None else None} for m in occ.input_meta]
        scalars = [literal_value(s) for s in occ.scalars]
        keyed = [s for c, s in enumerate(scalars) if c not in same_kernel]
        key = (occ.graph.model, occ.graph.preset, occ.phase, repr(inputs), repr(keyed))
        counts[key] += 1
        if key not in groups:
            groups[key] = {"model": occ.graph.model, "preset": occ.graph.preset, "phase": occ.phase,
                           "inputs": inputs, "scalars": scalars, "occurrence": occ}
    out = []
    for key, g in groups.items():
        occ = g.pop("occurrence")
        try:
            metas = node_metas(spec, g["inputs"], g["scalars"])
        except Exception as e:  # noqa: BLE001 - a shape the pattern cannot run on is reported, not fatal
            g.update(count=counts[key], outputs=None, bytes=None, error=f"{type(e).__name__}: {e}")
            out.append(g)
            continue
        outs = [metas[o] for o in spec.outputs]
        g["count"] = counts[key]
        g["outputs"] = [{"shape": list(s), "dtype": d} for s, d in outs]
        g["bytes"] = bytes_moved(spec, g["inputs"], metas, occ.node_kernels)
        g["inductor_kernels"] = len(occ.kernels) if occ.kernels else None
        out.append(g)
    return out


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtypes.size(dtype, default=4)


def node_metas(spec: PatternSpec, inputs: list[dict], scalars: list) -> list[tuple[tuple, str] | None]:
    """(shape, dtype) of every pattern node for these inputs, from a run on meta tensors."""
    import torch

    fn = reference_function(spec, all_nodes=True)
    xs = [torch.empty(i["shape"], dtype=getattr(torch, i["dtype"]), device="meta") for i in inputs]
    vals = fn(*xs, *[float(s) for s in scalars])
    return [(tuple(v.shape), dtypes.name(v.dtype)) if isinstance(v, torch.Tensor) else None for v in vals]


def bytes_moved(spec: PatternSpec, inputs: list[dict], metas: list, node_kernels: tuple = ()) -> dict:
    """Bytes moved by the pattern: op by op (eager), fused (inputs once, outputs once), Inductor's split.

    ``inductor``: for each Inductor kernel the occurrence's nodes landed in, the inputs and
    pattern values it reads from memory plus the values it writes for another kernel or as an
    output (None without a kernel map).
    """
    in_bytes = [_nbytes(i["shape"], i["dtype"]) for i in inputs]
    node_bytes = [(_nbytes(*m) if m is not None else 0) for m in metas]
    unfused = 0
    for j, node in enumerate(spec.nodes):
        if node.target == "operator.getitem":
            continue
        for kind, idx in _refs(node.args, node.kwargs):
            unfused += in_bytes[idx] if kind == "input" else node_bytes[idx]
        unfused += node_bytes[j]
    fused = sum(in_bytes) + sum(node_bytes[o] for o in spec.outputs)
    return {"unfused": unfused, "fused": fused, "inductor": _inductor_bytes(spec, in_bytes, node_bytes, node_kernels)}


def _refs(args, kwargs) -> list[tuple[str, int]]:
    out = []

    def walk(v):
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("input", "node"):
            out.append((next(iter(v)), next(iter(v.values()))))
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk(list(args))
    walk(list(kwargs.values()))
    return out


def _inductor_bytes(spec, in_bytes, node_bytes, node_kernels) -> int | None:
    if not node_kernels or not any(node_kernels):
        return None
    kernels = [set(k) for k in node_kernels]
    for j, node in enumerate(spec.nodes):  # views/getitem live where their producer lives
        if not kernels[j]:
            kernels[j] = set().union(*(kernels[i] for kind, i in _refs(node.args, node.kwargs) if kind == "node"))
    reads: set[tuple] = set()
    writes: set[int] = set(spec.outputs)
    for j, node in enumerate(spec.nodes):
        for kind, i in _refs(node.args, node.kwargs):
            for k in kernels[j]:
                if kind == "input":
                    reads.add(("input", i, k))
                elif k not in kernels[i]:
                    reads.add(("node", i, k))
                    writes.add(i)
    total = sum(in_bytes[i] if kind == "input" else node_bytes[i] for kind, i, _ in reads)
    return total + sum(node_bytes[i] for i in writes)


def safety_summary(pattern) -> dict:
    """candidate.json's ``safety``: safe and rejected occurrence counts and the reasons."""
    return {"ok": pattern.counts.safe, "rejected": pattern.counts.non_overlapping - pattern.counts.safe,
            "reasons": dict(pattern.rejections)}


def occurrences_by_model(pattern) -> dict[str, dict[str, int]]:
    """candidate.json's ``occurrences``: ``{model: {phase: count}}``."""
    out: dict[str, Counter] = {}
    for occ in pattern.occurrences:
        out.setdefault(occ.graph.model, Counter())[occ.phase] += 1
    return {m: dict(c) for m, c in out.items()}


# --------------------------------------------------------------------------- rendering

def header(pattern_id: str, command: str, what: str) -> str:
    """The two comment lines every generated file starts with (miner version, pattern, the regenerating command)."""
    return (f"# Generated by miner {__version__} from pattern {pattern_id}: {what}.\n"
            f"# Do not edit; regenerate with: {command}\n")


# what the pattern.py of a fusion promoted from an aten-rewrite candidate (upcast, compute_once) adds: the
# in-model gate (``miner.runtime.gate``) reading its wins.json
GATE_DOC = """
``WINS`` is ``wins.json`` beside this file (the in-model A/B records ``miner verify --ab --record`` and
``miner promote`` put there); on CUDA ``extra_check`` fires only in a context (input shapes and dtypes,
neighbourhood, compile mode) that a record measured as a step win beyond noise and none as a loss, or
between such wins (the bracket rule); an isolated benchmark never enables it alone
(``miner.runtime.evidence.RULE``); an unmeasured context declines.
"""
WINS_LINE = 'WINS = rewrite.load_wins(Path(__file__).with_name("wins.json"))  # the gate\'s evidence; None: unmeasured\n'


def gate_fields(cid: str, label: str, fusion: str | None) -> dict[str, str]:
    """The fields of an aten-rewrite pattern.py template (``title``, ``gate_doc``, ``imports``, ``op_name``,
    ``wins``, ``gate``) for candidate ``cid`` or, with ``fusion``, for the gated fusion promoted from it."""
    if fusion is None:
        return dict(title=f"Candidate {cid} ({label})", gate_doc="", imports="", op_name=cid, wins="", gate="")
    return dict(title=f"Fusion {fusion}, promoted from candidate {cid} ({label})", gate_doc=GATE_DOC,
                imports="from pathlib import Path\n\n", op_name=fusion, wins=WINS_LINE,
                gate=" and rewrite.wins_gate(match, WINS, N_INPUTS)")


def reference_function(spec: PatternSpec, all_nodes: bool = False):
    """``pattern`` as a Python function (``all_nodes``: return every node's value, for metas)."""
    outputs = range(len(spec.nodes)) if all_nodes else spec.outputs
    return source.compile_function(source.render(spec.nodes, spec.n_inputs, spec.n_consts, outputs, "fn"), "fn",
                                   f"<pattern {spec.id}>")


SEED_TRACE_LEN, SEED_TRACE_INDEX = 64, 37  # a seed vector's stand-in and the index traced for its slot


def example_shapes(observed: list[dict], n_inputs: int, seeds: tuple[int, ...] = ()) -> list[tuple[list[int], str]]:
    """Small stand-ins for the initial pattern trace: same rank and broadcast (1) dims, sizes 2/4
    (a seed vector: ``SEED_TRACE_LEN`` int64 seeds, so the traced index is inside it)."""
    if not observed:
        return [([4, 8], "float32")] * n_inputs
    out = []
    for k, i in enumerate(observed[0]["inputs"]):
        if k in seeds:
            out.append(([SEED_TRACE_LEN], "int64"))
            continue
        shape = [1 if s == 1 else 2 for s in i["shape"]]
        if shape and i["shape"][-1] != 1:
            shape[-1] = 8
        out.append((shape, i["dtype"]))
    for g in observed[0].get("gathers", ()):  # an embedding's table and index follow the dims they land on
        gathered = (g["table"], g["index"])
        full = row_shape([s for k, (s, _) in enumerate(out) if k not in seeds and k not in gathered])
        index = observed[0]["inputs"][g["index"]]["shape"]
        if full is None or not all(-len(full) <= d < len(full) for d in (g["column_dim"], *g["index_dims"])):
            raise Unsupported(f"an embedding whose table or index lands outside the rows' dims {list(full or ())}")
        out[g["table"]] = ([2, full[g["column_dim"]]], out[g["table"]][1])
        out[g["index"]] = ([1 if n == 1 else full[d] for n, d in zip(index, g["index_dims"])], out[g["index"]][1])
    return out


def render_pattern_py(prog: Program, head: str, op_name: str, kernel_import: str, examples, doc: str,
                      gated: bool = False) -> str:
    """pattern.py of a candidate, or of a fusion (``gated``: ``extra_check`` also asks the measured-wins gate).

    A gated module loads ``wins.json`` beside it at import (absent: None, unmeasured) as ``WINS``
    and ANDs ``rewrite.wins_gate`` into its extra check, so on CUDA it fires only where in-model A/B
    evidence says the step is faster (``miner.runtime.evidence.RULE``). Candidates are not gated:
    they are what gets measured.
    """
    spec = prog.spec
    params = lower.signature_params(spec)
    n_out = len(spec.outputs)
    kinds = tuple("seed" if k in prog.seed_inputs else "bool" if b else "float"
                  for k, b in enumerate(prog.input_is_bool))
    ret_search = "pattern({0})[0]" if n_out == 1 else "pattern({0})"
    p = ", ".join(params)
    op_attr = op_name.split("::")[1]
    gate_doc, gate_import, wins, check = "", "", "", "rewrite.match_ok(match, OP_NAME, N_INPUTS, INPUT_KINDS)"
    trace_values = "rewrite.scalar_trace_values(N_SCALARS)"
    if prog.random or prog.seed_inputs:
        # the kernel draws the random numbers itself: the safety rules then check that nothing
        # else reads them (``randomness`` with ``random=True``); a seed index is an int slot; only
        # region patterns hold random ops, and they compute in float32 as the kernel they replace
        check = "rewrite.match_ok(match, OP_NAME, N_INPUTS, INPUT_KINDS, random=True, region=True)"
        ints = ", ".join(f'"c{c}": {SEED_TRACE_INDEX}' for c in prog.seed_consts)
        trace_values = f"{{**{trace_values}, {ints}}}" if ints else trace_values
    if gated:
        from miner.runtime.rewrite import WINS_FILE

        gate_doc = (f"\n``WINS`` is ``{WINS_FILE}`` beside this file (None: unmeasured): its in-model A/B records"
                    "\n(``miner verify --ab --record``) decide; on CUDA ``extra_check`` fires only where one measured"
                    "\nthe model's step faster beyond noise and none slower, or between such wins (the bracket rule,"
                    "\nwhere its isolated ``miner bench`` rows may keep it off); an isolated benchmark never enables"
                    "\nit alone (``miner.runtime.evidence.RULE``).\n")
        gate_import = "from pathlib import Path\n\n"
        wins = f'\nWINS = rewrite.load_wins(Path(__file__).with_name("{WINS_FILE}"))  # None: unmeasured'
        check = f"({check}\n            and rewrite.wins_gate(match, WINS, N_INPUTS))"
    return emit.fill_template(
        "pattern.py.tmpl", head=head, doc=doc, op_name=op_name, gate_doc=gate_doc, gate_import=gate_import,
        id=spec.id, n_inputs=spec.n_inputs, n_consts=spec.n_consts, n_outputs=n_out, input_kinds=repr(kinds),
        rank=repr(spec.rank if any(v.reduce for v in prog.values.values()) else None), examples=repr(examples),
        wins=wins, trace_values=trace_values, reference=emit.reference_source(spec, name="pattern"),
        kernel_import=kernel_import,
        params=p, search=search_source(spec, ret_search.format(p)), replacement=replacement_source(spec, op_attr), check=check,
        # an embedding's index must be a valid row while the pattern is traced: zeros, not garbage
        example_fill="zeros" if prog.gathers else "empty",
        example_note="  # zeros: valid embedding indices" if prog.gathers else "")


SHARED_DOC = """# Nodes another Inductor kernel also reads (it recomputes them): ``search`` returns them too, so
# the matcher accepts their readers outside the region, and ``replacement`` recomputes them from the
# region's inputs, outside the kernel, with the ops that computed them (``miner.generate.region.shared_outputs``).
"""


def search_order(spec: PatternSpec) -> tuple[int, ...]:
    """The order ``search`` returns the pattern's outputs and shared nodes in: ``spec.outputs`` then
    ``spec.shared``, unless the matcher could not find an output from the ones before it.

    ``register_replacement`` matches a multi-output pattern from its first output, then finds each
    next output from the graph nodes matched so far (``MultiOutputPattern``: users of a matched
    node); an output none of whose nodes was matched before is never found ("no anchor found").
    The attention regions' first output, the dropout mask, shares no node with the softmax: then
    the output that depends on the most pattern nodes comes first, the others after it in order.
    """
    order = tuple(spec.outputs) + tuple(spec.shared)
    if _anchored(spec.nodes, order):
        return order
    first = max(order, key=lambda o: (len(region.recomputed_nodes(spec.nodes, [o])), o))
    return (first,) + tuple(o for o in order if o != first)


def _anchored(nodes, order: tuple[int, ...]) -> bool:
    """Whether each output after the first depends on a pattern node an earlier output depends on."""
    matched: set[int] = set()
    for k, o in enumerate(order):
        below = set(region.recomputed_nodes(nodes, [o]))
        if k and not below & matched:
            return False
        matched |= below
    return True


def search_source(spec: PatternSpec, returned: str) -> str:
    """``search``: the pattern (``returned``), or with shared nodes (``spec.shared``) or outputs in
    another order (:func:`search_order`) the pattern's nodes returning them in that order."""
    params = ", ".join(lower.signature_params(spec))
    order = search_order(spec)
    if order == tuple(spec.outputs):
        return f"def search({params}):\n    return {returned}\n"
    doc = SHARED_DOC if spec.shared else ""
    return doc + source.render(spec.nodes, spec.n_inputs, spec.n_consts, order, "search")


def replacement_source(spec: PatternSpec, op_attr: str) -> str:
    """``replacement``: the custom op's call, its outputs in ``search``'s order, then (``spec.shared``)
    the shared nodes recomputed by ``shared``, a function of the region's inputs computing only them
    and what they depend on."""
    params = ", ".join(lower.signature_params(spec))
    call = f"torch.ops.miner.{op_attr}({params})"
    order = search_order(spec)
    if order == tuple(spec.outputs):
        return f"def replacement({params}):\n    return {call}\n"
    returned = [f"out[{spec.outputs.index(o)}]" if len(spec.outputs) > 1 else "out"
                for o in order if o in spec.outputs]
    text = f"\n\ndef replacement({params}):\n    out = {call}\n    return ({', '.join(returned)}, "
    if not spec.shared:
        return text.lstrip() + ")\n"
    only = region.recomputed_nodes(spec.nodes, spec.shared)
    return (source.render(spec.nodes, spec.n_inputs, spec.n_consts, spec.shared, "shared", only=only)
            + text + f"*shared({params}))\n")


KERNEL_IMPORT = '''_KERNEL = None


def _kernel():
    """kernel.py next to this file, imported once."""
    global _KERNEL
    if _KERNEL is None:
        from pathlib import Path

        _KERNEL = rewrite.load_module(Path(__file__).with_name("kernel.py"), rewrite.module_name(__file__, "kernel"))
    return _KERNEL'''


# --------------------------------------------------------------------------- the stage

def generate_one(pattern, workspace: Workspace, command: str, source: dict | None = None) -> Generated | Skipped:
    """Write ``candidates/<id>/`` for one pattern, or say why it is outside the class.

    A region pattern (``mined/regions.json``) is prepared first (``miner.generate.region.prepare``);
    ``source`` goes into candidate.json as is (where the pattern was read, for regeneration); its
    ``rng`` (``miner.generate.lower.RNGS``; absent: "inductor") is the stream a random op draws.
    """
    if not any(o.verdict.ok for o in pattern.occurrences):
        return Skipped(pattern.id, pattern.ops, no_safe_reason(pattern))
    rng = (source or {}).get("rng", "inductor")
    try:
        spec = spec_from_pattern(pattern)
        if region.is_region(pattern):
            from miner.generate import reduce  # reductions over outer dims: a kind of its own (issue 30)

            if reduce.wants(pattern):
                return reduce.generate_one(pattern, workspace, command, source)
            if why := region.nothing_to_fuse(pattern):
                raise Unsupported(why)
            shared = region.shared_outputs(pattern)
            pattern = region.prepare(pattern)
            spec = replace(spec_from_pattern(pattern), column_inputs=region.column_inputs(pattern), rng=rng,
                           shared=shared)
        prog = lower.lower(spec)
    except Unsupported as e:
        return Skipped(pattern.id, pattern.ops, f"not generated: {e}")
    cid = candidate_id(pattern.id, prog)
    if cid != spec.id:
        prog.spec = spec = replace(spec, id=cid)
    observed = observed_entries(pattern, spec, prog.seed_consts)
    for o in observed if prog.gathers else ():  # where each embedding's index and table land (miner.check.cases)
        o["gathers"] = emit.gather_dims(prog, o["inputs"])
    if not any(o.get("outputs") for o in observed):
        return Skipped(pattern.id, pattern.ops, "not generated: no observed shape the pattern runs on")
    label = label_for(pattern.ops)
    folder = workspace.candidates / cid
    cmd = f"{command}"
    try:  # every text before any file: a pattern refused here leaves no half-written candidate
        kernel_py = render_kernel_py(prog, header(pattern.id, cmd, "Triton kernels + launcher"))
        pattern_py = render_pattern_py(
            prog, header(pattern.id, cmd, "search pattern, replacement, extra check"), f"miner::c{cid}",
            KERNEL_IMPORT, example_shapes(observed, spec.n_inputs, prog.seed_inputs),
            f"Fusion candidate {cid} ({label}): {pattern.ops}.")
    except Unsupported as e:
        return Skipped(pattern.id, pattern.ops, f"not generated: {e}")
    write_text(folder / "kernel.py", kernel_py)
    write_text(folder / "pattern.py", pattern_py)
    from miner.core.pattern import to_json as pattern_json

    old = folder / "candidate.json"
    meta = {
        "id": cid, "miner_version": __version__, "regenerate": cmd, "op": f"miner::c{cid}",
        "label": label, "ops": pattern.ops,
        "signature": {"inputs": spec.n_inputs, "scalars": spec.n_consts, "outputs": len(spec.outputs),
                      "input_kinds": ["bool" if b else "float" for b in prog.input_is_bool],
                      "output_kinds": list(prog.output_kinds)},
        "kernel": {"one_pass_max": ONE_PASS_MAX, "loop_block": LOOP_BLOCK, "levels": prog.levels,
                   "online_softmax": prog.online_softmax},
        "observed": observed,
        "occurrences": occurrences_by_model(pattern),
        "counts": {"non_overlapping": pattern.counts.non_overlapping, "safe": pattern.counts.safe,
                   "by_phase": dict(pattern.counts.by_phase)},
        "safety": safety_summary(pattern),
        "inductor": {"kernels_hist": dict(pattern.inductor.kernels_hist),
                     "missed_fusion": pattern.inductor.missed_fusion, "splits": dict(pattern.inductor.splits)},
        "pattern": pattern_json(pattern),
    }
    if source:
        meta["source"] = source
    if prog.rand4:
        meta["rng"] = RNG_NOTE
    write_json(old, meta)  # written once, here: later stages write files of their own
    return Generated(cid, label, folder, len(observed))


def render_fusion(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """kernel.py and pattern.py of the fusion ``name`` promoted from row-kernel candidate ``meta``, rendered
    again from its pattern (the same generator: the validated kernel) with the fusion's names and gate."""
    spec = spec_from_pattern(pattern_from_json(meta["pattern"]))
    prog = lower.lower(spec)
    return [write_text(folder / "kernel.py", render_kernel_py(prog, head)),
            write_text(folder / "pattern.py", render_pattern_py(
                prog, head, f"miner::{name}", KERNEL_IMPORT, example_shapes(meta["observed"], spec.n_inputs),
                f"Fusion {name}: {meta['ops']}.", gated=True))]


RNG_SUFFIX = "_x4"  # a candidate drawing the four-per-call stream: <pattern id>_x4 (Inductor's stream: <pattern id>)
RNG_NOTE = {"stream": "philox4", "u(L)": "word L % 4 of Philox4x32-10(seed, counter L // 4)",
            "reference": "miner.runtime.philox", "differs_from_inductor": True}


def candidate_id(pattern_id: str, prog: Program) -> str:
    """The candidate's id: the pattern's, with ``RNG_SUFFIX`` when it draws the four-per-call stream
    (its mask differs from Inductor's, so it is another candidate than the one drawing Inductor's)."""
    return pattern_id + RNG_SUFFIX if prog.rand4 else pattern_id


def no_safe_reason(pattern) -> str:
    """Why a pattern without a safe stored occurrence gets no candidate (shapes come from those)."""
    if pattern.counts.safe:
        return (f"{pattern.counts.safe} safe occurrence(s), but none among the {len(pattern.occurrences)} stored "
                "(shapes come from stored ones: re-run `miner mine` storing more occurrences)")
    return "no safe occurrence"


def supported(pattern) -> str | None:
    """None if the generator supports the pattern, else the reason it does not."""
    if not any(o.verdict.ok for o in pattern.occurrences):
        return no_safe_reason(pattern)
    try:
        lower.lower(spec_from_pattern(region.prepare(pattern) if region.is_region(pattern) else pattern))
    except Unsupported as e:
        return f"not generated: {e}"
    return None


def refusal(pattern) -> str | None:
    """Why ``miner generate`` will never make a candidate of ``pattern`` (None: it will).

    Unsupported (:func:`supported`), or not worth it: no reduction inside and fewer than three
    compute ops (Inductor always fuses a chain of two pointwise ops itself).
    """
    why = supported(pattern)
    if why is None and not any(n.category == "reduction" for n in pattern.nodes) and pattern.n_compute < 3:
        why = "not generated: fewer than 3 pointwise ops and no reduction (Inductor fuses those)"
    return why


def select(patterns: Iterable, top: int | None) -> tuple[list, list[Skipped]]:
    """The patterns worth a candidate, best first (``top``: how many), and the rest with their reasons.

    Order: the one ranking every listing uses (``miner.rank.rank.pattern_order``: estimated time
    saved per step); patterns the generator refuses (:func:`refusal`) are skipped with the reason.
    """
    from miner.rank.rank import pattern_order

    chosen, skipped = [], []
    for p in patterns:
        why = refusal(p)
        if why:
            skipped.append(Skipped(p.id, p.ops, why))
        else:
            chosen.append(p)
    chosen, kept = pattern_order(chosen), []
    for p in chosen:  # best first, until ``top`` pass the kernel's contract (checked only for those)
        if top and len(kept) == top:
            skipped.append(Skipped(p.id, p.ops, f"below --top {top}"))
            continue
        why = contract_refusal(p)
        if why:
            skipped.append(Skipped(p.id, p.ops, why))
        else:
            kept.append(p)
    return kept, skipped


def contract_refusal(pattern) -> str | None:
    """Why the row kernel of ``pattern`` could not compute a shape its safe occurrences were seen at.

    Each occurrence passed the kernel's shape contract with its own outputs, but the pattern returns
    every output some occurrence needs (``Pattern.all_outputs``): a value one occurrence reads
    outside may be one the kernel cannot store (a per-element value of a per-row shape, e.g.
    ``where(mask[N, 1], a, b)`` beside a row sum). The launcher would raise ``ContractError`` on
    every call, so no candidate is made (the same :func:`miner.runtime.launch.traced_contract` on each
    observed entry). Regions and embeddings are checked by their own validation instead.
    """
    from miner.runtime import launch

    if region.is_region(pattern) or not any(o.verdict.ok for o in pattern.occurrences):
        return None
    try:
        spec = spec_from_pattern(pattern)
        prog = lower.lower(spec)
    except Unsupported:
        return None  # refusal() says why
    if prog.gathers:
        return None
    ref = reference_function(spec)
    for o in observed_entries(pattern, spec, prog.seed_consts):
        if not o.get("outputs"):
            continue
        reasons = launch.traced_contract(ref, tuple(tuple(i["shape"]) for i in o["inputs"]),
                                         tuple(i["dtype"] for i in o["inputs"]), tuple(map(float, o["scalars"])),
                                         tuple(prog.output_kinds), tuple(prog.seed_inputs))
        if reasons:
            return f"not generated: the kernel cannot compute {o['model']} {o['phase']}'s shapes: {reasons[0]}"
    return None


def generate(workspace: Workspace, patterns: Iterable, command: str = "miner generate",
             pre_skipped: Iterable[Skipped] = (), source: dict | None = None) -> tuple[list, list]:
    """Generate every pattern; writes ``candidates/index.json``. Returns (generated, skipped).

    ``source`` (region patterns: ``{"regions": path}``): recorded in each candidate.json; the
    index then keeps the entries of the candidates generated from elsewhere.
    """
    done, skipped = [], list(pre_skipped)
    for p in patterns:
        try:
            r = generate_one(p, workspace, command, source)
        except Exception as e:  # noqa: BLE001 - one pattern the generator breaks on never stops the others
            r = Skipped(p.id, getattr(p, "ops", ""), f"not generated: the generator failed ({one_line(e)}): a miner bug")
        (done if isinstance(r, Generated) else skipped).append(r)
    if source:
        return done, skipped
    index = {"miner_version": __version__, "command": command,
             "generated": [{"id": g.id, "label": g.label} for g in done],
             "skipped": [{"id": s.id, "ops": s.ops, "reason": s.reason} for s in skipped]}
    write_json(workspace.candidates / "index.json", index)
    return done, skipped


def remove_stale(workspace: Workspace, keep: Iterable[str]) -> list[str]:
    """Delete candidate folders whose pattern is gone; returns their ids. Candidates generated from
    elsewhere (``source`` in candidate.json: region patterns, ``miner generate --regions``) stay."""
    import json

    keep = set(keep)
    gone = []
    for d in sorted(workspace.candidates.glob("p*/")):
        meta = d / "candidate.json"
        if d.name not in keep and meta.exists() and "source" not in json.loads(meta.read_text()):
            shutil.rmtree(d)
            gone.append(d.name)
    return gone


def describe(r: Generated | Skipped, root: Path | None = None) -> str:
    """One line of ``miner generate``'s output for a generated or skipped pattern (``root``: paths
    relative to this workspace root)."""
    if isinstance(r, Generated):
        path = r.path
        if root is not None:
            with contextlib.suppress(ValueError):
                path = Path(r.path).resolve().relative_to(Path(root).resolve())
        return f"{r.id}  {r.label:<14} {r.observed} observed shape(s) -> {path}"
    return f"{r.id}  skipped: {r.reason}  [{r.ops}]"

