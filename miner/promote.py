"""``miner promote``: a validated candidate -> ``fusions/<name>/`` and ``tests/fusions/test_<name>.py``.

The fusion's files are rendered again from the candidate's pattern (the same generator, so the
kernel is the validated one) with the fusion's own names: the op is ``miner::<name>``, the kernel
is imported as ``fusions.<name>.kernel``. ``fusions/__init__.py`` (the registry) is rewritten
from the folders under ``fusions/``. A candidate that is not validated is refused.

``fusions/<name>/wins.json`` holds the candidate's isolated GPU timings (``miner.bench.results.wins_table``
of its latest run in ``candidates/<id>/bench.json``) and, carried over from the candidate, the in-model
A/B records promotion required (``in_model``). The fusion's extra check reads it
(``miner.runtime.rewrite.wins_gate``): on CUDA it fires only where in-model records measured the step
faster (``miner.runtime.evidence.RULE``); an isolated row never enables a firing alone, it can only
keep a bracketed shape off. Without in-model records the fusion declines every CUDA match;
``miner promote`` again refreshes the file (``miner bench --import`` says when).

The candidate's kind (``miner.kinds``) renders the fusion's own files (``fusion_files``: a Triton
kernel's pattern.py and kernel.py from the row generator; an upcast's rule, rewrite and GEMM; a
compute-once rule) and the rows of its test module (``test_cases``, for the kind's ``harness``); a kind
with no ``fusion_files`` is refused. The same in-model promotion rule applies to every kind.
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

from miner import __version__, kinds
from miner.generate import fusion_test
from miner.generate.emit import fill_template
from miner.runtime import rewrite
from miner.core import candidate as candidates
from miner.core.candidate import Candidate
from miner.core.errors import UsageError
from miner.generate.generate import header
from miner.check.promotion import carry_into, records_for, require_in_model_win
from miner.core.workspace import Workspace, read_json, write_json, write_text

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Promoted:
    name: str
    id: str
    files: tuple[Path, ...]


def check_promotable(workspace: Workspace, cid: str) -> tuple[Candidate, dict]:
    """The candidate and its validation; ``UsageError`` unless it was validated with the rewrite proven."""
    cand = candidates.load(workspace, cid)
    validation = candidates.validation(cand.path)
    if validation is None:
        stale = " (its validation.json checked older sources)" if (cand.path / "validation.json").exists() else ""
        raise UsageError(f"candidate {cand.id} is not validated (status generated){stale}; "
                         f"run `miner validate {cand.id}` first")
    if not validation.get("ok"):
        raise UsageError(f"candidate {cand.id} is not validated (status failed: {validation.get('failure')}); "
                         f"fix it and run `miner validate {cand.id}`")
    if not any(c["kind"] == "rewrite" and c["ok"] for c in validation.get("checks", [])) and not fired_in_model(
            workspace, cand.id):
        why = next((c.get("detail") for c in validation.get("checks", []) if c["kind"] == "rewrite" and c["ok"] is None),
                   None)  # a check recorded as not run where it was asked to (an upcast candidate on a CPU)
        raise UsageError(f"candidate {cand.id} was validated without proving the rewrite in a model "
                         + (f"({why})" if why else f"(--no-model); run `miner validate {cand.id}`"))
    return cand, validation


def fired_in_model(workspace: Workspace, cid: str) -> bool:
    """Whether an in-model A/B on a GPU proved the rewrite instead of the validation's tiny step: a record of
    ``cid`` alone that matched and won with its parity judged (a win is never a failed or unjudged parity).
    t5's attention regions match only at the profiled shape (0 times in the tiny CPU step, 12 and 24 times
    in the H200 A/B, 2026-12-06)."""
    return any(r.matches and r.verdict == "win" for r in records_for(workspace, cid))


def promote(workspace: Workspace, cid: str, name: str, root: Path | None = None) -> Promoted:
    """Write fusions/<name>/ and tests/fusions/test_<name>.py (``root``: repo root for tests, default workspace)."""
    if not NAME_RE.match(name) or keyword.iskeyword(name):
        raise UsageError(f"fusion name {name!r}: use lower_snake_case (e.g. softmax_like)")
    kind = kinds.kind_of(candidates.load(workspace, cid).meta)
    if kind.fusion_files is None:
        raise UsageError(f"candidate {cid} is a {kind.name} ({kind.about}): `miner promote` cannot render its "
                         f"fusion yet")
    cand, validation = check_promotable(workspace, cid)
    existing = candidates.promoted_as(workspace, cand.id)
    if existing is not None and existing != name:  # one candidate, one fusion: two would both rewrite the graph
        raise UsageError(f"candidate {cand.id} is already promoted as fusions/{existing}/; refresh it with "
                         f"`miner promote {cand.id} --name {existing}`, or remove that folder first")
    evidence = require_in_model_win(workspace, cand.id)  # a measured in-model step win, or a refusal
    tests_root = (root or workspace.root) / "tests" / "fusions"
    clash = sorted(p for p in tests_root.parent.rglob(f"test_{name}.py") if p != tests_root / f"test_{name}.py")
    if clash:  # pytest (rootdir imports) refuses two test modules of one basename: the whole suite would not collect
        raise UsageError(f"fusion {name!r}: its test tests/fusions/test_{name}.py would share its module name with "
                         f"{clash[0]}; choose another --name or rename that file")
    meta = cand.meta
    command = f"miner promote {meta['id']} --name {name}"
    folder = workspace.fusions / name
    head = header(meta["id"], command, f"fusion {name}, promoted from a validated candidate")
    files = kind.call("fusion_files", folder, name, meta, head)
    files += [
        write_json(folder / "fusion.json", {
            "name": name, "pattern_id": meta["id"], "ops": meta["ops"], "miner_version": __version__,
            "promoted_by": command, "observed": meta["observed"], "occurrences": meta["occurrences"],
            "validation": validation,
            # what the files were rendered from (a region's masks are found from its pattern's nodes:
            # ``miner.check.masks``), so the fusion's own tests and judge need no candidate folder
            **{k: meta[k] for k in ("pattern", "lowering", "rng", "source", "kind", "kernel", "sizes") if k in meta}}),
    ]
    wins = write_wins(workspace, folder, meta["id"])
    files += [wins] if wins else []
    carried = carry_into(folder / rewrite.WINS_FILE, name, evidence)  # the gate's in-model evidence
    files += [] if wins else [carried]
    files.append(write_registry(workspace))
    files.append(write_text(tests_root / f"test_{name}.py", render_test(workspace, kind, name, meta, command)))
    if not any((d / "conftest.py").exists() for d in (tests_root, tests_root.parent)):
        # a user's workspace has no conftest: without one the GPU cases fail on a CPU instead of skipping
        files.append(write_text(tests_root / "conftest.py", fill_template("conftest.py.tmpl", version=__version__)))
    return Promoted(name, meta["id"], tuple(files))


def measured_wins(workspace: Workspace, cid: str) -> dict | None:
    """A fusion's wins.json from ``candidates/<cid>/bench.json``; None when it has no timed row.

    The latest run (by date) decides: a bench.json keeps one run per GPU and the gate cannot tell
    which GPU the model will run on, so the newest measurement stands. The payload is that run's
    ``wins_table`` entry plus the run's GPU, torch, triton and date and the bench file's path.
    """
    from miner import bench

    path = workspace.candidates / cid / "bench.json"
    if not path.exists():
        return None
    runs = [r for r in read_json(path).get("runs", []) if r.get("rows")]
    if not runs:
        return None
    run = max(runs, key=lambda r: r["env"].get("date", ""))
    entry = bench.wins_table([bench.row_from_json(r) for r in run["rows"]]).get(cid)
    if entry is None:
        return None
    env = run["env"]
    return {"schema": rewrite.WINS_SCHEMA, "kind": rewrite.WINS_KIND, "candidate": cid, **entry,
            "gpu": env.get("gpu"), "torch": env.get("torch"), "triton": env.get("triton"), "date": env.get("date"),
            "source": Path(os.path.relpath(path, workspace.root)).as_posix()}


def write_wins(workspace: Workspace, folder: Path, cid: str) -> Path | None:
    """Write ``folder/wins.json`` from the candidate's measurements, or remove a stale one if there are none."""
    target = folder / rewrite.WINS_FILE
    wins = measured_wins(workspace, cid)
    if wins is None:
        target.unlink(missing_ok=True)
        return None
    # named after the fusion (the gate's decisions are reported under this name), not the candidate label
    return write_json(target, {**wins, "name": folder.name, "candidate_label": wins.get("name")})


def write_registry(workspace: Workspace) -> Path:
    """Write ``fusions/__init__.py``: the folder as a package (the same file in every workspace)."""
    return write_text(workspace.fusions / "__init__.py", fill_template("fusions_init.py.tmpl", version=__version__))


def render_test(workspace: Workspace, kind: kinds.Kind, name: str, meta: dict, command: str) -> str:
    """tests/fusions/test_<name>.py: the fusion's cases table (``miner.generate.fusion_test``), its rows the
    kind's ``test_cases`` (a kernel fusion's training matches measured here, on the CPU); called once the
    fusion's folder is complete, since they may compile it."""
    rows = kind.call("test_cases", workspace, name, meta)
    return fusion_test.render(name=name, ops=meta["ops"], harness=kind.harness, rows=rows,
                              head=header(meta["id"], command, f"test of fusion {name}"))
