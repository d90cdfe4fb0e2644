"""``miner generate --recomputed``: the compute-once candidate from ``mined/recomputed.json``.

One candidate for the values ``miner.mine.recompute.check`` accepts (a small transcendental value that
Inductor would inline, and recompute per element, into each of its broadcast consumers: llama's RoPE
``cos``/``sin``). There is no kernel: the rewrite puts ``prims.inductor_force_stride_order`` (same
strides: an identity) after the value, so Inductor computes it into a buffer once and the consumers load
it (``rewrite.realize_once``). The values are unchanged, bit for bit.

Files (``candidates/<id>/``, ``<id>`` = ``r`` + a hash of the rule's constants):

- ``pattern.py``: ``register(pass_dict)`` puts ``CallFunction(<each observed transcendental>, x0)`` into
  an Inductor ``PatternMatcherPass``; ``extra_check`` is the rule (declines counted with their reasons),
  the handler ``rewrite.realize_once``;
- ``candidate.json``: where the rule took a value and where it declined (with reasons), per model and
  graph, the kernel call sites each was recomputed in, and ``source: {"recomputed": path}``.
"""

from __future__ import annotations

import hashlib
import string
from collections import Counter
from pathlib import Path

from miner import __version__
from miner.core.workspace import Workspace, write_json, write_text
from miner.generate.generate import Generated, gate_fields, header
from miner.mine import recompute

LABEL = "compute_once"

PATTERN_PY = string.Template('''${header}"""${title}: a small transcendental value computed once, not in each kernel that reads it.

``extra_check`` is ``miner.mine.recompute.check``, the rule mining applied: the value (${ops}) has a
static size and at least two pointwise consumers with ${ratio} times its elements or more, into each of
which Inductor would inline it and recompute it per element. The rewrite (``rewrite.realize_once``) puts
``prims.inductor_force_stride_order`` after it with its own strides (an identity): Inductor computes it
into a buffer once and the consumers load it. The values are unchanged. A declined match counts its
reasons and never raises.
${gate_doc}"""

${imports}from miner.runtime import rewrite

PATTERN_ID = "${id}"
OP_NAME = "miner::${op_name}"  # the name decisions are counted under (no custom op)
LABEL = "compute_once"
N_INPUTS = 1  # x0: the transcendental's input
TARGETS = ${targets}
${wins}

def decision(match):
    """``miner.mine.recompute.check`` on the matched value (a ``Decision``: ok, reasons, consumers)."""
    return rewrite.recompute_decision(match.output_node())


def extra_check(match):
    d = decision(match)
    if d.applies:  # a value already computed once (the pass's second slot) is no candidate
        rewrite.record_declines(match, OP_NAME, N_INPUTS, d.reasons)
    return d.ok${gate}


def replacement(match, x0):
    """Compute the value once: its consumers read it through ``prims.inductor_force_stride_order``."""
    rewrite.realize_once(match.output_node())


def register(pass_dict):
    import torch
    from torch._inductor.pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

    for target in TARGETS:
        aten_op = getattr(torch.ops.aten, target.split(".")[1]).default
        register_graph_pattern(CallFunction(aten_op, KeywordArg("x0")), extra_check=extra_check,
                               pass_dict=pass_dict)(replacement)
''')


def render_pattern(head: str, cid: str, targets, fusion: str | None = None) -> str:
    """``pattern.py`` of candidate ``cid`` or, with ``fusion``, of the fusion promoted from it (decisions
    counted under ``miner::<fusion>``; ``extra_check`` = the rule and the in-model gate on ``WINS``)."""
    ops = ", ".join(t.split(".")[1] for t in targets)
    return PATTERN_PY.substitute(header=head, id=cid, targets=repr(tuple(targets)), ops=ops, ratio=recompute.RATIO,
                                 **gate_fields(cid, LABEL, fusion))


FUSION_TEST_PY = string.Template('''${header}"""Fusion ${name} (compute_once, promoted from candidate ${id}): its tests, ``miner.check.realize``'s checks.

CPU: the pass on a traced three-layer RoPE chain (both tables computed once, a second run takes
nothing); with ``-m slow`` the chain compiled by Inductor with and without it (equal outputs, the
table's kernel runs once). CUDA (``-m "gpu and slow"``): the fusion inside ``torch.compile`` of the
tiny zoo model (gate held open: the tiny shapes are not the measured ones).
"""

from pathlib import Path

import pytest
import torch

from miner.check import realize as checks
from miner.runtime import fusions

FUSION = "${name}"
ROOT = Path(__file__).resolve().parents[2]  # the workspace holding fusions/${name}/
ZOO = ${zoo}  # (model, mode) it was found in
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _module():
    return fusions.load(ROOT, FUSION)


def test_computes_the_shared_tables_once_in_the_traced_chain():
    c = checks.check_graph(_module(), FUSION, "cpu")
    assert c.ok, c.detail


@pytest.mark.slow
def test_compiled_chain_is_unchanged_and_runs_the_table_kernel_once():
    c = checks.check_compiled(_module(), FUSION, "cpu")
    assert c.ok, c.detail


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_fires_in_its_zoo_model():
    c = checks.check_model(_module(), FUSION, *ZOO, "cuda", gate_open=True)
    assert c.ok, c.detail
''')


def render_fusion_test(head: str, name: str, meta: dict, zoo: tuple[str, str] | None) -> str:
    """``tests/fusions/test_<name>.py`` of the fusion promoted from compute-once candidate ``meta``."""
    return FUSION_TEST_PY.substitute(header=head, name=name, id=meta["id"], zoo=repr(zoo))


def candidate_id() -> str:
    """``r`` + 10 hex digits of the rule's constants (its ops, the broadcast ratio, the walk depth)."""
    text = repr((sorted(recompute.HEAVY), recompute.RATIO, recompute.MAX_DEPTH, recompute.FORCE))
    return "r" + hashlib.sha1(text.encode()).hexdigest()[:10]


def generate(workspace: Workspace, recomputed_path: str | Path, command: str) -> Generated | None:
    """Write ``candidates/<id>/`` from a ``mined/recomputed.json``; None when the rule took no value there."""
    payload = recompute.load(Path(recomputed_path) if Path(recomputed_path).is_absolute()
                             else Path(workspace.root) / recomputed_path)
    found = payload["found"]
    ok = [f for f in found if f["ok"]]
    if not ok:
        return None
    cid = candidate_id()
    folder = workspace.candidates / cid
    targets = tuple(sorted({f["target"] for f in ok}))
    ops = ", ".join(t.split(".")[1] for t in targets)
    write_text(folder / "pattern.py", render_pattern(header(cid, command, "search pattern, rewrite, extra check"),
                                                     cid, targets))
    occ: dict[str, Counter] = {}
    for f in ok:
        occ.setdefault(f["model"], Counter())[f["phase"]] += 1
    keep = ("model", "preset", "phase", "graph", "node", "target", "shape", "consumer_numel")
    declined = Counter((f["model"], f["phase"], f["target"], tuple(f["reasons"])) for f in found if not f["ok"])
    meta = {
        "id": cid, "miner_version": __version__, "regenerate": command, "op": recompute.FORCE, "label": LABEL,
        "ops": f"{ops} (small, broadcast into several kernels) => computed once, loaded by its consumers",
        "kind": "compute_once", "rule": "miner.mine.recompute.check",
        "observed": [dict({k: f[k] for k in keep}, kernels=len(f["kernels"])) for f in ok],
        "declined": [{"model": m, "phase": ph, "target": t, "reasons": list(rs), "count": n}
                     for (m, ph, t, rs), n in sorted(declined.items())],
        "occurrences": {m: dict(sorted(c.items())) for m, c in sorted(occ.items())},
        "counts": {"fired": len(ok), "declined": len(found) - len(ok)},
        "source": {"recomputed": str(recomputed_path)},
    }
    write_json(folder / "candidate.json", meta)
    return Generated(cid, LABEL, folder, len(ok))


__all__ = ["FUSION_TEST_PY", "LABEL", "PATTERN_PY", "candidate_id", "generate", "render_fusion_test", "render_pattern"]
