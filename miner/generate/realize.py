"""``miner generate --recomputed``: the compute-once candidate from ``mined/recomputed.json``.

One candidate for the values ``miner.rules.recompute.check`` accepts (a small transcendental value that
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
from collections import Counter
from pathlib import Path

from miner import __version__
from miner.core.workspace import Workspace, write_json, write_text
from miner.generate.emit import fill_template
from miner.generate.generate import Generated, gate_fields, header
from miner.mine import recompute
from miner.rules import recompute as rule

LABEL = "compute_once"


def render_pattern(head: str, cid: str, targets, fusion: str | None = None) -> str:
    """``pattern.py`` of candidate ``cid`` or, with ``fusion``, of the fusion promoted from it (decisions
    counted under ``miner::<fusion>``; ``extra_check`` = the rule and the in-model gate on ``WINS``)."""
    ops = ", ".join(t.split(".")[1] for t in targets)
    return fill_template("compute_once_pattern.py.tmpl", header=head, id=cid, targets=repr(tuple(targets)), ops=ops,
                         ratio=rule.RATIO, **gate_fields(cid, LABEL, fusion))


def render_fusion(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """pattern.py of the fusion ``name`` promoted from compute-once candidate ``meta`` (the rule and the
    in-model gate on ``WINS``; no kernel)."""
    targets = sorted({o["target"] for o in meta["observed"]})
    return [write_text(folder / "pattern.py", render_pattern(head, meta["id"], targets, fusion=name))]


def candidate_id() -> str:
    """``r`` + 10 hex digits of the rule's constants (its ops, the broadcast ratio, the walk depth)."""
    text = repr((sorted(rule.HEAVY), rule.RATIO, rule.MAX_DEPTH, rule.FORCE))
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
        "id": cid, "miner_version": __version__, "regenerate": command, "op": rule.FORCE, "label": LABEL,
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


__all__ = ["LABEL", "candidate_id", "generate", "render_fusion", "render_pattern"]
