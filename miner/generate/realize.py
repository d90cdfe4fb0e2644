"""``miner generate --recomputed``: the compute-once candidates from ``mined/recomputed.json``.

One candidate per family of ``miner.rules.recompute.FAMILIES`` with values the rule accepts (a small,
expensive value that Inductor would inline, and recompute per element, into its broadcast consumers):
``transcendental`` (llama's RoPE ``cos``/``sin``) and ``table`` (lookups, integer division, comparison
chains: t5's relative-position bias lookup). There is no kernel: the rewrite puts
``prims.inductor_force_stride_order`` (same strides: an identity) after the value, so Inductor computes it
into a buffer once and the consumers load it (``rewrite.realize_once``). The values are unchanged.

Files (``candidates/<id>/``, ``<id>`` = ``r`` + a hash of the family's constants):

- ``pattern.py``: ``register(pass_dict)`` puts one ``CallFunction`` per observed op, in the argument
  structure it was observed with (the input that carries the value's size is ``x0``, the rest ignored),
  into an Inductor ``PatternMatcherPass``; ``extra_check`` is the rule (declines counted with their
  reasons), the handler ``rewrite.realize_once``;
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


def pattern_of(found: dict) -> tuple:
    """``(target, positional arguments, keyword names, x0's position)`` of a ``recomputed.json`` entry: the
    argument structure its pattern matches (entries mined before it was recorded: one argument)."""
    return (found["target"], found.get("args", 1), tuple(found.get("kwargs", ())), found.get("key", 0))


def render_pattern(head: str, cid: str, patterns, fusion: str | None = None) -> str:
    """``pattern.py`` of candidate ``cid`` or, with ``fusion``, of the fusion promoted from it (decisions
    counted under ``miner::<fusion>``; ``extra_check`` = the rule and the in-model gate on ``WINS``);
    ``patterns``: :func:`pattern_of` tuples."""
    patterns = tuple(sorted(set(patterns)))
    ops = ", ".join(dict.fromkeys(t.split(".")[1] for t, *_ in patterns))
    return fill_template("compute_once_pattern.py.tmpl", header=head, id=cid, patterns=repr(patterns), ops=ops,
                         ratio=rule.RATIO, **gate_fields(cid, LABEL, fusion))


def render_fusion(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """pattern.py of the fusion ``name`` promoted from compute-once candidate ``meta`` (the rule and the
    in-model gate on ``WINS``; no kernel)."""
    patterns = [pattern_of(o) for o in meta["observed"]]
    return [write_text(folder / "pattern.py", render_pattern(head, meta["id"], patterns, fusion=name))]


def candidate_id(family: str = "transcendental") -> str:
    """``r`` + 10 hex digits of the family's constants (its ops, the broadcast ratio, the walk depth; for
    the table family also the chain length and the lookups' index positions). The transcendental
    family's id is the one it had before the rule knew other families."""
    ops = sorted(rule.FAMILIES[family])
    text = repr((ops, rule.RATIO, rule.MAX_DEPTH, rule.FORCE) if family == "transcendental" else
                (ops, rule.RATIO, rule.MAX_DEPTH, rule.FORCE, rule.CHAIN, sorted(rule.KEY_INPUT.items())))
    return "r" + hashlib.sha1(text.encode()).hexdigest()[:10]


def generate(workspace: Workspace, recomputed_path: str | Path, command: str) -> list[Generated]:
    """Write ``candidates/<id>/`` per family from a ``mined/recomputed.json``; the families where the rule
    took a value (none: an empty list)."""
    payload = recompute.load(Path(recomputed_path) if Path(recomputed_path).is_absolute()
                             else Path(workspace.root) / recomputed_path)
    out = []
    for fam in rule.FAMILIES:
        found = [f for f in payload["found"] if (f.get("family") or rule.family(f["target"])) == fam]
        g = _generate_family(workspace, fam, found, recomputed_path, command)
        if g is not None:
            out.append(g)
    return out


def _generate_family(workspace: Workspace, fam: str, found: list[dict], recomputed_path, command: str):
    ok = [f for f in found if f["ok"]]
    if not ok:
        return None
    cid = candidate_id(fam)
    folder = workspace.candidates / cid
    targets = tuple(sorted({f["target"] for f in ok}))
    ops = ", ".join(t.split(".")[1] for t in targets)
    write_text(folder / "pattern.py", render_pattern(header(cid, command, "search pattern, rewrite, extra check"),
                                                     cid, [pattern_of(f) for f in ok]))
    occ: dict[str, Counter] = {}
    for f in ok:
        occ.setdefault(f["model"], Counter())[f["phase"]] += 1
    keep = ("model", "preset", "phase", "graph", "node", "target", "shape", "consumer_numel", "args", "kwargs",
            "key", "predicted_us")
    declined = Counter((f["model"], f["phase"], f["target"], tuple(f["reasons"])) for f in found if not f["ok"])
    meta = {
        "id": cid, "miner_version": __version__, "regenerate": command, "op": rule.FORCE, "label": LABEL,
        "ops": f"{ops} (small, recomputed per element of a broadcast) => computed once, loaded by its consumers",
        "kind": "compute_once", "rule": "miner.mine.recompute.check",
        "family": fam,
        "observed": [dict({k: f[k] for k in keep if k in f}, kernels=len(f["kernels"])) for f in ok],
        "declined": [{"model": m, "phase": ph, "target": t, "reasons": list(rs), "count": n}
                     for (m, ph, t, rs), n in sorted(declined.items())],
        "occurrences": {m: dict(sorted(c.items())) for m, c in sorted(occ.items())},
        "counts": {"fired": len(ok), "declined": len(found) - len(ok)},
        "source": {"recomputed": str(recomputed_path)},
    }
    write_json(folder / "candidate.json", meta)
    return Generated(cid, LABEL, folder, len(ok))


__all__ = ["LABEL", "candidate_id", "generate", "pattern_of", "render_fusion", "render_pattern"]
