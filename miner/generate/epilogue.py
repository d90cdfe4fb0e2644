"""``miner generate --epilogues``: the GEMM-epilogue candidate from ``mined/epilogues.json``.

One candidate for every ``addmm`` + activation chain that ``miner.rules.epilogue.check`` takes: the GEMM and the
chain become one ``aten._addmm_activation(bias, x, w, use_gelu=...)``, which cuBLASLt runs as one GEMM adding the
bias and applying the tanh GELU or the ReLU before it writes (Inductor has no lowering for it and calls the aten op).
There is no Triton kernel: the rewrite is ``miner.runtime.epilogue.replace``, the one the ``gemm_epilogues`` knob
applies ungated.

Files (``candidates/<id>/``, ``<id>`` = ``e`` + a hash of the rule's constants, so the id changes with the rule):

- ``pattern.py``: ``register(pass_dict)`` puts ``CallFunction(aten.addmm.default, x0, x1, x2)`` into an Inductor
  ``PatternMatcherPass``; ``extra_check`` is the rule (declines counted with their reasons), the handler
  ``epilogue.replace``;
- ``candidate.json``: where the rule took a GEMM + activation and where it declined (with reasons), per model,
  mode and graph, with the bytes each rewrite spares, and ``source: {"epilogues": path}``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from miner import __version__
from miner.core.workspace import Workspace, write_json, write_text
from miner.generate.emit import fill_template
from miner.generate.generate import Generated, gate_fields, header
from miner.mine import epilogue as mined
from miner.rules import epilogue as rule

LABEL = "gemm_epilogue"


def candidate_id() -> str:
    """``e`` + 10 hex digits of the rule's constants (the ops a chain may hold, the activations, the samples and
    the tolerance it is identified by)."""
    text = repr((sorted(rule.CHAIN_OPS), sorted(rule.ACTIVATIONS), rule.SAMPLES, rule.RTOL, rule.MAX_CHAIN,
                 rule.DTYPES))
    return "e" + hashlib.sha1(text.encode()).hexdigest()[:10]


def render_pattern(head: str, cid: str, activations, fusion: str | None = None) -> str:
    """``pattern.py`` of candidate ``cid`` or, with ``fusion``, of the fusion promoted from it (decisions counted
    under ``miner::<fusion>``; ``extra_check`` = the rule and the in-model gate on ``WINS``)."""
    return fill_template("epilogue_pattern.py.tmpl", header=head, id=cid, samples=rule.SAMPLES, rtol=rule.RTOL,
                         activations=repr(tuple(sorted(set(activations)))), **gate_fields(cid, LABEL, fusion))


def render_fusion(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """pattern.py of the fusion ``name`` promoted from GEMM-epilogue candidate ``meta`` (the rule and the in-model
    gate on ``WINS``; no kernel)."""
    acts = [o["activation"] for o in meta["observed"]]
    return [write_text(folder / "pattern.py", render_pattern(head, meta["id"], acts, fusion=name))]


def generate(workspace: Workspace, epilogues_path: str | Path, command: str) -> Generated | None:
    """Write ``candidates/<id>/`` from a ``mined/epilogues.json``; None when the rule took no GEMM there."""
    path = Path(epilogues_path)
    payload = mined.load(path if path.is_absolute() else Path(workspace.root) / path)
    found = payload["found"]
    ok = [f for f in found if f["ok"]]
    if not ok:
        return None
    cid = candidate_id()
    folder = workspace.candidates / cid
    acts = sorted({f["activation"] for f in ok})
    write_text(folder / "pattern.py", render_pattern(header(cid, command, "search pattern, rewrite, extra check"),
                                                     cid, acts))
    occ: dict[str, Counter] = {}
    for f in ok:
        occ.setdefault(f["model"], Counter())[f["phase"]] += 1
    keep = ("model", "preset", "mode", "phase", "graph", "node", "shape", "dtype", "activation", "chain",
            "spared_bytes", "module")
    declined = Counter((f["model"], f["mode"], f["phase"], tuple(f["reasons"])) for f in found if not f["ok"])
    meta = {
        "id": cid, "miner_version": __version__, "regenerate": command, "op": "aten._addmm_activation.default",
        "label": LABEL,
        "ops": f"addmm -> {' | '.join(acts)} (elementwise chain) => _addmm_activation (cuBLASLt bias + activation "
               f"epilogue)",
        "kind": LABEL, "rule": "miner.rules.epilogue.check",
        "observed": [{k: f[k] for k in keep if k in f} for f in ok],
        "declined": [{"model": m, "mode": mode, "phase": ph, "reasons": list(rs), "count": n}
                     for (m, mode, ph, rs), n in sorted(declined.items())],
        "occurrences": {m: dict(sorted(c.items())) for m, c in sorted(occ.items())},
        "counts": {"fired": len(ok), "declined": len(found) - len(ok),
                   "spared_bytes": sum(f["spared_bytes"] for f in ok)},
        "source": {"epilogues": str(epilogues_path)},
    }
    write_json(folder / "candidate.json", meta)
    return Generated(cid, LABEL, folder, len(ok))


__all__ = ["LABEL", "candidate_id", "generate", "render_fusion", "render_pattern"]
