"""``miner generate --upcasts``: the upcast-matmul candidate from ``mined/upcasts.json``.

One candidate for every matmul that ``miner.mine.upcast.check`` accepts: a float32 ``bmm``/``mm``
whose operands are exact upcasts of bf16 (or fp16) values becomes ``aten.bmm.dtype`` /
``aten.mm.dtype`` on the low-precision sources (a tensor-core GEMM with float32 output). Unlike a
fusion candidate there is no Triton kernel: the rewrite calls cuBLAS through aten, and Inductor
lowers the ``.dtype`` overload itself (``tuned_bmm(..., out_dtype)``, ``tuned_mm``).

Files (``candidates/<id>/``, ``<id>`` = ``u`` + a hash of the rule's op sets, so the id changes with
the rule):

- ``pattern.py``: ``register(pass_dict)`` puts ``CallFunction(aten.bmm.default | aten.mm.default,
  x0, x1)`` into an Inductor ``PatternMatcherPass``; ``extra_check`` is the rule mining applied
  (declines counted with their reasons, ``rewrite.record_declines``); the handler replays each
  operand's layout chain on its bf16/fp16 source and calls the ``.dtype`` overload through
  ``match.replace_by_example`` (old nodes nobody reads any more go in the pass's dead-code pass;
  those with other users, e.g. saved for backward, stay).
- ``kernel.py``: ``launch(x0, x1)`` (the ``.dtype`` GEMM on low-precision operands, CUDA) and
  ``reference(x0, x1)`` (the float32 matmul it replaces), for ``miner bench``-style timing.
- ``candidate.json``: where the rule fired and where it declined (with reasons), per model, graph
  and shapes, and ``source: {"upcasts": path}`` (what the golden test regenerates from).
"""

from __future__ import annotations

import hashlib
import string
from collections import Counter
from pathlib import Path

from miner import __version__
from miner.core.workspace import Workspace, write_json, write_text
from miner.generate.generate import Generated, gate_fields, header
from miner.mine import upcast

PATTERN_PY = string.Template('''${header}"""${title}: ${summary}

${rule_doc}

A declined match counts its reasons (``FusionPass.declined``, ``rewrite.GATE_DECISIONS``) and never
raises.
${gate_doc}"""

${imports}from miner.runtime import rewrite

PATTERN_ID = "${id}"
OP_NAME = "miner::${op_name}"  # the name decisions are counted under (no custom op: the rewrite calls aten)
LABEL = "${label}"
N_INPUTS = 2  # x0, x1: the float32 operands of the matmul
TARGETS = ${targets}
${wins}

def decision(match):
    """${decision_doc} on the match's matmul (a ``Decision``: ok, reasons, operands)."""
    return rewrite.upcast_decision(match.output_node()${demote_arg})


def extra_check(match):
    d = decision(match)
    if d.applies:  # ${applies}: not counted as declined
        rewrite.record_declines(match, OP_NAME, N_INPUTS, d.reasons)
    return d.ok${gate}


def replacement(match, x0, x1):
    """${replacement_doc}"""
    d = decision(match)
    if d.ok:  # extra_check declined it otherwise; never reached through the matcher
        rewrite.upcast_replace(match, d)


def register(pass_dict):
    import torch
    from torch._inductor.pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

    for target in TARGETS:
        aten_op = getattr(torch.ops.aten, target.split(".")[1]).default
        register_graph_pattern(CallFunction(aten_op, KeywordArg("x0"), KeywordArg("x1")),
                               extra_check=extra_check, pass_dict=pass_dict)(replacement)
''')

# what differs between the exact rule's pattern.py and the demoting rule's (one template, PATTERN_PY)
RULE_TEXT = {
    False: dict(
        label=upcast.LABEL, demote_arg="", decision_doc="``miner.mine.upcast.check``",
        summary="a float32 bmm/mm of exact bf16/fp16 upcasts as a low-precision GEMM.",
        rule_doc="""``extra_check`` is ``miner.mine.upcast.check``, the rule mining applied: both operands are float32
upcasts of bf16 (or both of fp16) values through layout ops and multiplications by exactly 1.0, the
output is float32 on CUDA, and torch has the ``.dtype`` overload. The rewrite
(``rewrite.upcast_replace``) replays each operand's layout ops on its low-precision source and calls
``aten.bmm.dtype`` / ``aten.mm.dtype`` with ``torch.float32``: the products of two bf16 (fp16)
numbers are exact in float32, so only the order of the float32 sums differs from the FFMA GEMM it
replaces.""",
        applies="a bf16 matmul is no candidate",
        replacement_doc="Replace the matmul by the ``.dtype`` overload on the operands' low-precision sources."),
    True: dict(
        label="demote_matmul", demote_arg=", demote=True", decision_doc="The demoting rule",
        summary="a float32 bmm/mm of one exact bf16/fp16 upcast and one float32 value whose output is only "
                "seen rounded, as a low-precision GEMM.",
        rule_doc="""``extra_check`` is ``miner.mine.upcast.check(..., demote=True)``, the rule mining applied: one
operand is a float32 upcast of bf16 values through layout ops, the other a float32 value, and every
use of the float32 output (through layout ops) converts it to that bf16. The rewrite
(``rewrite.upcast_replace``) rounds the float32 operand to bf16 and calls ``aten.bmm.dtype`` /
``aten.mm.dtype`` with ``torch.float32``: each product gains at most one bf16 rounding before the
float32 sum, and the output is rounded to bf16 as before (SDPA's fused bf16 kernels compute PV this
way).""",
        applies="a matmul of two exact upcasts (or of none) is no candidate",
        replacement_doc="Round the float32 operand, replay the other's layout ops on its source, call the "
                        "``.dtype`` GEMM."),
}

KERNEL_PY = string.Template('''${header}"""Candidate ${id} (upcast_matmul): the GEMM the rewrite calls, for timing and numerics.

``launch(x0, x1)``: ``aten.bmm.dtype`` (3-d) or ``aten.mm.dtype`` (2-d) of two bf16/fp16 tensors with a
float32 output (CUDA only: torch has no CPU kernel for it). ``reference(x0, x1)``: the float32 matmul
of the upcasts, what the rewrite replaces.
"""

import torch


def _op(x):
    return torch.ops.aten.bmm if x.dim() == 3 else torch.ops.aten.mm


def launch(x0, x1, *, variant=None, config=None):
    if x0.device.type != "cuda":
        raise RuntimeError(f"upcast_matmul needs CUDA tensors (got {x0.device}): aten.bmm.dtype has no CPU kernel")
    if x0.dtype != x1.dtype or x0.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"upcast_matmul takes two bf16 or two fp16 operands, got {x0.dtype} and {x1.dtype}")
    return (_op(x0).dtype(x0, x1, torch.float32),)


def reference(x0, x1):
    return (_op(x0).default(x0.float(), x1.float()),)
''')


def render_pattern(head: str, cid: str, targets, fusion: str | None = None, demote: bool = False) -> str:
    """``pattern.py`` of the candidate ``cid`` (``demote``: the demoting rule's) or, with ``fusion``, of the
    fusion promoted from it (its decisions counted under ``miner::<fusion>``, its ``extra_check`` = the
    rule and the in-model gate)."""
    text = RULE_TEXT[demote]
    return PATTERN_PY.substitute(header=head, id=cid, targets=repr(tuple(targets)), **text,
                                 **gate_fields(cid, text["label"], fusion))


DEMOTE_KERNEL_PY = string.Template('''${header}"""Candidate ${id} (demote_matmul): the GEMM the rewrite calls, for timing and numerics.

``launch(x0, x1)``: the float32 operand rounded to the other's bf16/fp16, then ``aten.bmm.dtype``
(3-d) or ``aten.mm.dtype`` (2-d) with a float32 output (CUDA only). ``reference(x0, x1)``: the
float32 matmul it replaces (the low-precision operand upcast).
"""

import torch


def _op(x):
    return torch.ops.aten.bmm if x.dim() == 3 else torch.ops.aten.mm


def launch(x0, x1, *, variant=None, config=None):
    if x0.device.type != "cuda":
        raise RuntimeError(f"demote_matmul needs CUDA tensors (got {x0.device}): aten.bmm.dtype has no CPU kernel")
    low = x1.dtype if x0.dtype == torch.float32 else x0.dtype
    if low not in (torch.bfloat16, torch.float16) or {x0.dtype, x1.dtype} != {torch.float32, low}:
        raise ValueError(f"demote_matmul takes one float32 and one bf16/fp16 operand, got {x0.dtype} and {x1.dtype}")
    return (_op(x0).dtype(x0.to(low), x1.to(low), torch.float32),)


def reference(x0, x1):
    return (_op(x0).default(x0.float(), x1.float()),)
''')


def render_demoted(head: str, cid: str, targets, fusion: str | None = None, kernel_head: str | None = None
                   ) -> tuple[str, str]:
    """(pattern.py, kernel.py) of the demoting candidate ``cid`` (or, with ``fusion``, the fusion promoted
    from it); ``kernel_head``: kernel.py's header when it differs from pattern.py's."""
    return (render_pattern(head, cid, targets, fusion, demote=True),
            DEMOTE_KERNEL_PY.substitute(header=kernel_head or head, id=cid))


def render_kernel(head: str, cid: str) -> str:
    """``kernel.py``: the GEMM the rewrite calls (``launch``) and the float32 one it replaces (``reference``)."""
    return KERNEL_PY.substitute(header=head, id=cid)


FUSION_TEST_PY = string.Template('''${header}"""Fusion ${name} (${label}, promoted from candidate ${id}): its tests, ``miner.check.upcast``'s checks.

CPU: t5's attention chain at each observed shape, traced on fake CUDA tensors: with the in-model gate
held open the fusion rewrites QK^T into the ``.dtype`` GEMM and declines PV (a dropout's scale is no
exact upcast); with the gate on, it fires exactly where ``miner.runtime.evidence.decide`` says
for its ``wins.json``; the rewritten chain run on the CPU (the GEMM emulated) equals the original.
CUDA (``-m gpu``): the GEMM against float64 per observed shape; with ``-m "gpu and slow"`` the fusion
inside ``torch.compile`` of the tiny zoo model (gate held open: the tiny shapes are not the measured ones).
"""

from pathlib import Path

import pytest
import torch

from miner.check import upcast as checks
from miner.runtime import evidence, fusions, gate, rewrite

FUSION = "${name}"
ROOT = Path(__file__).resolve().parents[2]  # the workspace holding fusions/${name}/
OBSERVED = ${observed}  # what the rule accepted where it was mined (candidate.json ``observed``)
ZOO = ${zoo}  # (model, mode) it was found in
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _module():
    return fusions.load(ROOT, FUSION)


@pytest.mark.parametrize("entry", OBSERVED)
def test_rewrites_the_mined_chain_and_declines_pv(entry):
    c = checks.check_graph(_module(), FUSION, entry, gate_open=True)
    assert c.ok, c.detail


@pytest.mark.parametrize("entry", OBSERVED)
def test_the_gate_decides_from_its_in_model_evidence(entry):
    module = _module()
    _, graph_pass, _, _ = checks.rewrite_chain(module, FUSION, entry)
    seen = graph_pass.log.seen(FUSION)
    assert len(seen) == 1, seen  # QK^T reaches the gate; PV was declined by the rule before it
    ctx, fire = seen[0]
    assert fire == evidence.decide(ctx, gate.in_model_records(module.WINS), evidence.isolated_rows(module.WINS))[0]
    assert graph_pass.counts[FUSION] == int(fire)


@pytest.mark.parametrize("entry", OBSERVED[:1])
def test_rewritten_chain_equals_the_original_on_cpu(entry):
    c = checks.check_emulated(_module(), FUSION, entry, gate_open=True)
    assert c.ok, c.detail


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("label, entry", checks.numeric_entries({"observed": OBSERVED}))
def test_gemm_matches_float64(label, entry):
    path = ROOT / "fusions" / FUSION / "kernel.py"
    c = checks.check_numerics(rewrite.load_module(path, rewrite.module_name(path, "kernel")), label, entry, "cuda")
    assert c.ok, c.detail


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_fires_in_its_zoo_model():
    c = checks.check_model(_module(), FUSION, *ZOO, "cuda", gate_open=True)
    assert c.ok, c.detail
''')


def render_fusion_test(head: str, name: str, meta: dict, zoo: tuple[str, str] | None) -> str:
    """``tests/fusions/test_<name>.py`` of the fusion promoted from upcast candidate ``meta``; ``zoo``: the
    (model, mode) its in-model test compiles."""
    keep = ("model", "preset", "phase", "target", "inputs", "float32_inputs", "sources")
    observed = [{k: o[k] for k in keep if k in o} for o in meta["observed"]]
    return FUSION_TEST_PY.substitute(header=head, name=name, label=upcast.LABEL, id=meta["id"],
                                     observed=_literal(observed), zoo=repr(zoo))


def _literal(value: list) -> str:
    """``value`` as a Python list literal, one entry per line."""
    return "[\n" + "".join(f"    {v!r},\n" for v in value) + "]"


def candidate_id(demote: bool = False) -> str:
    """``u`` (``d`` for the demoting rule) + 10 hex digits of the rule's op sets (targets, layout ops,
    unit multiplications, converts)."""
    text = repr((sorted(upcast.MATMULS.items()), sorted(upcast.LAYOUT), sorted(upcast.UNIT_MULS),
                 sorted(upcast.CONVERTS), upcast.LOW) + (("demote",) if demote else ()))
    return ("d" if demote else "u") + hashlib.sha1(text.encode()).hexdigest()[:10]


def _sig(f: dict) -> tuple:
    return (f["model"], f["preset"], f["phase"], f["target"],
            tuple((tuple(i["shape"]), tuple(i["stride"])) for i in f["inputs"]),
            tuple(None if s is None else (tuple(s["shape"]), s["dtype"]) for s in f["sources"]))


def as_demoted(found: list[dict]) -> list[dict]:
    """``found`` as the demoting rule decided it (entries where it applies, its ok/reasons/sources)."""
    return [dict(f, ok=f["demote"]["ok"], reasons=f["demote"]["reasons"], sources=f["demote"]["sources"])
            for f in found if f.get("demote")]


def observed(found: list[dict]) -> list[dict]:
    """One entry per distinct (model, preset, phase, target, operand shapes and sources) the rule accepted."""
    groups: dict[tuple, list[dict]] = {}
    for f in found:
        if f["ok"]:
            groups.setdefault(_sig(f), []).append(f)
    out = []
    for fs in groups.values():
        f = fs[0]
        out.append({"model": f["model"], "preset": f["preset"], "phase": f["phase"], "target": f["target"],
                    "count": len(fs), "graphs": sorted({x["graph"] for x in fs}),
                    # what the GEMM receives after the rewrite: the float32 operands' layout in the source dtype
                    "inputs": [dict(i, dtype=s["dtype"]) for i, s in zip(f["inputs"], f["sources"])],
                    **({"demote": [s.get("demote") for s in f["sources"]]}
                       if any(s.get("demote") for s in f["sources"]) else {}),
                    "float32_inputs": f["inputs"], "outputs": [f["output"]],
                    "sources": [{"shape": s["shape"], "dtype": s["dtype"], **({"demote": s["demote"]} if s.get("demote") else {})}
                                for s in f["sources"]],
                    "nodes": [x["node"] for x in fs]})
    return out


def declined(found: list[dict]) -> list[dict]:
    """One entry per (model, preset, phase, target, reasons) the rule refused, with its nodes."""
    groups: dict[tuple, list[dict]] = {}
    for f in found:
        if not f["ok"]:
            groups.setdefault((f["model"], f["preset"], f["phase"], f["target"], tuple(f["reasons"])), []).append(f)
    return [{"model": m, "preset": p, "phase": ph, "target": t, "reasons": list(rs), "count": len(fs),
             "inputs": fs[0]["inputs"], "nodes": [x["node"] for x in fs]}
            for (m, p, ph, t, rs), fs in groups.items()]


def generate(workspace: Workspace, upcasts_path: str | Path, command: str, *, demote: bool = False) -> Generated | None:
    """Write ``candidates/<id>/`` from a ``mined/upcasts.json``; None when the rule accepted no matmul there.

    Parameters
    ----------
    workspace : Workspace
        Where ``candidates/`` is.
    upcasts_path : str or Path
        The ``mined/upcasts.json`` (``miner mine --upcasts``); recorded in candidate.json as given.
    command : str
        The regenerating command, written into every file's header.
    demote : bool
        The demoting rule's candidate (``d...``, from each entry's ``demote`` decision) instead of the exact one.
    """
    payload = upcast.load(Path(upcasts_path) if Path(upcasts_path).is_absolute()
                          else Path(workspace.root) / upcasts_path)
    found = as_demoted(payload["found"]) if demote else payload["found"]
    fired = observed(found)
    if not fired:
        return None
    cid = candidate_id(demote)
    folder = workspace.candidates / cid
    targets = tuple(sorted({f["target"] for f in found if f["ok"]} | {"aten.bmm.default", "aten.mm.default"}))
    head, khead = header(cid, command, "search pattern, rewrite, extra check"), header(cid, command,
                                                                                       "the GEMM the rewrite calls")
    pattern, kernel = render_demoted(head, cid, targets, kernel_head=khead) if demote else \
        (render_pattern(head, cid, targets), render_kernel(khead, cid))
    write_text(folder / "pattern.py", pattern)
    write_text(folder / "kernel.py", kernel)
    occ: dict[str, Counter] = {}
    for f in found:
        if f["ok"]:
            occ.setdefault(f["model"], Counter())[f["phase"]] += 1
    rejected = Counter(r for f in found if not f["ok"] for r in f["reasons"])
    meta = {
        "id": cid, "miner_version": __version__, "regenerate": command, "op": "aten.bmm.dtype|aten.mm.dtype",
        "label": "demote_matmul" if demote else upcast.LABEL,
        "ops": ("upcast x float32 -> bmm/mm (float32) -> bf16/fp16 => bmm/mm.dtype (float32 operand rounded)"
                if demote else "upcast -> bmm/mm (float32) => bmm/mm.dtype (bf16/fp16 in, float32 out)"),
        "kind": "upcast_matmul", "rule": "miner.mine.upcast.check" + ("(demote=True)" if demote else ""),
        **({"demote": True} if demote else {}),
        "signature": {"inputs": 2, "scalars": 0, "outputs": 1, "input_kinds": ["float", "float"],
                      "output_kinds": ["vec"]},
        "observed": fired,
        "declined": declined(found),
        "occurrences": {m: dict(sorted(c.items())) for m, c in sorted(occ.items())},
        "counts": ({"fired": sum(f["ok"] for f in found), "declined": sum(not f["ok"] for f in found)}
                   if demote else {k: payload["counts"][k] for k in ("fired", "declined")}),
        "safety": ({"ok": sum(f["ok"] for f in found), "rejected": sum(not f["ok"] for f in found),
                    "reasons": dict(sorted(rejected.items()))} if demote else
                   {"ok": payload["counts"]["fired"], "rejected": payload["counts"]["declined"],
                    "reasons": dict(payload["reasons"])}),
        "source": {"upcasts": str(upcasts_path)},
    }
    write_json(folder / "candidate.json", meta)
    return Generated(cid, meta["label"], folder, len(fired))


__all__ = ["as_demoted", "candidate_id", "declined", "generate", "observed", "render_demoted", "render_fusion_test",
           "render_kernel", "render_pattern"]
