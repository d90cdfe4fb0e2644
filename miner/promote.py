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

An upcast-matmul candidate (``kind: upcast_matmul``, an aten rewrite with no Triton kernel) is
rendered by ``miner.generate.upcast`` instead: its pattern.py is the candidate's rule and rewrite with
the in-model gate added to ``extra_check`` (``rewrite.wins_gate`` on ``WINS``), its kernel.py the GEMM,
its test ``miner.check.upcast``'s checks. Its validation must have proven the rewrite in a model on
CUDA, and the same in-model promotion rule applies.
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

from miner import __version__
from miner.generate import fusion_test, lower
from miner.runtime import rewrite
from miner.core import candidate as candidates
from miner.core.candidate import Candidate
from miner.core.errors import UsageError
from miner.generate.generate import (KERNEL_IMPORT, example_shapes, header, render_kernel_py,
                                     render_pattern_py,
                            spec_from_pattern)
from miner.check.cases import fusion_cases
from miner.check.promotion import carry_into, require_in_model_win
from miner.check.validate import pick_model
from miner.generate import upcast as gen_upcast
from miner.mine import upcast as upcast_rule
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
    if not any(c["kind"] == "rewrite" and c["ok"] for c in validation.get("checks", [])):
        why = next((c.get("detail") for c in validation.get("checks", []) if c["kind"] == "rewrite" and c["ok"] is None),
                   None)  # a check recorded as not run where it was asked to (an upcast candidate on a CPU)
        raise UsageError(f"candidate {cand.id} was validated without proving the rewrite in a model "
                         + (f"({why})" if why else f"(--no-model); run `miner validate {cand.id}`"))
    return cand, validation


def promote(workspace: Workspace, cid: str, name: str, root: Path | None = None) -> Promoted:
    """Write fusions/<name>/ and tests/fusions/test_<name>.py (``root``: repo root for tests, default workspace)."""
    if not NAME_RE.match(name) or keyword.iskeyword(name):
        raise UsageError(f"fusion name {name!r}: use lower_snake_case (e.g. softmax_like)")
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
    what = f"fusion {name}, promoted from a validated candidate"
    kind = meta.get("kind")
    head, test_head = header(meta["id"], command, what), header(meta["id"], command, f"test of fusion {name}")
    if kind == "compute_once":  # an identity put after a value (no kernel): miner.generate.realize renders it
        from miner.generate import realize

        files = [write_text(folder / "pattern.py", realize.render_pattern(
            head, meta["id"], sorted({o["target"] for o in meta["observed"]}), fusion=name))]
        test = realize.render_fusion_test(test_head, name, meta, pick_model(meta))
    elif kind == upcast_rule.LABEL:  # an aten rewrite (no Triton kernel): its own renderer
        files = _upcast_sources(folder, name, meta, head)
        test = gen_upcast.render_fusion_test(test_head, name, meta, pick_model(meta))
    else:
        files = _sources(folder, name, meta, head)
        test = None  # rendered once the fusion's folder is complete: it compiles the fusion (render_test)
    files += [
        write_json(folder / "fusion.json", {
            "name": name, "pattern_id": meta["id"], "ops": meta["ops"], "miner_version": __version__,
            "promoted_by": command, "observed": meta["observed"], "occurrences": meta["occurrences"],
            "validation": validation}),
    ]
    wins = write_wins(workspace, folder, meta["id"])
    files += [wins] if wins else []
    carried = carry_into(folder / rewrite.WINS_FILE, name, evidence)  # the gate's in-model evidence
    files += [] if wins else [carried]
    files.append(write_registry(workspace))
    test = test if test is not None else render_test(workspace, name, meta, command)
    files.append(write_text(tests_root / f"test_{name}.py", test))
    if not any((d / "conftest.py").exists() for d in (tests_root, tests_root.parent)):
        # a user's workspace has no conftest: without one the GPU cases fail on a CPU instead of skipping
        files.append(write_text(tests_root / "conftest.py", CONFTEST.format(version=__version__)))
    return Promoted(name, meta["id"], tuple(files))


def _sources(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """kernel.py and pattern.py of a fusion, rendered from the candidate's pattern by the Triton generator."""
    from miner.core.pattern import pattern_from_json

    spec = spec_from_pattern(pattern_from_json(meta["pattern"]))
    prog = lower.lower(spec)
    return [write_text(folder / "kernel.py", render_kernel_py(prog, head)),
            write_text(folder / "pattern.py", render_pattern_py(
                prog, head, f"miner::{name}", KERNEL_IMPORT, example_shapes(meta["observed"], spec.n_inputs),
                f"Fusion {name}: {meta['ops']}.", gated=True))]


def _upcast_sources(folder: Path, name: str, meta: dict, head: str) -> list[Path]:
    """kernel.py (the GEMM) and pattern.py (the rule, the rewrite and the in-model gate) of an upcast fusion."""
    targets = sorted({o["target"] for o in meta["observed"]} | set(upcast_rule.MATMULS))
    if meta.get("demote"):  # the demoting rule's candidate (d...): its own templates
        pattern, kernel = gen_upcast.render_demoted(head, meta["id"], targets, fusion=name)
        return [write_text(folder / "kernel.py", kernel), write_text(folder / "pattern.py", pattern)]
    return [write_text(folder / "kernel.py", gen_upcast.render_kernel(head, meta["id"])),
            write_text(folder / "pattern.py", gen_upcast.render_pattern(head, meta["id"], targets, fusion=name))]


CONFTEST = '''# Written by miner {version} (`miner promote`) where no conftest.py was: the fusion tests' markers.
"""``gpu`` tests skip without CUDA; ``slow`` ones (a zoo model compiled with the fusion) run with ``-m slow``."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line("markers", "slow: compiles a zoo model; run with -m slow")


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("-m") or ""
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        elif "slow" in item.keywords and "slow" not in wanted:
            item.add_marker(pytest.mark.skip(reason="slow: run with -m slow"))
'''


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
    return write_text(workspace.fusions / "__init__.py", REGISTRY_TEMPLATE.format(version=__version__))


REGISTRY_TEMPLATE = '''# Written by miner {version} (`miner promote`); the same in every workspace.
"""Promoted fusions: Inductor pattern rewrites whose replacement is a generated Triton kernel.

Load them into torch.compile by path, with any ``mode``::

    import miner.runtime.fusions
    miner.runtime.fusions.install("path/to/workspace")      # every later torch.compile uses them
    model = torch.compile(model, mode="max-autotune")

or, for one compile, ``torch.compile(model, options=miner.runtime.fusions.inductor_options("path/to/workspace"))``.
This folder imported as a package (the repository's own is installed as ``miner_fusions``) offers
the same functions bound to it: ``names()``, ``load(name)``, ``graph_pass(names)``,
``inductor_options(names)``, ``install(names)``. ``graph_pass().counts`` says how often each
fusion matched. Each fusion ``<name>/`` has ``pattern.py`` (search pattern in aten ops,
replacement by the custom op ``miner::<name>``, extra check), ``kernel.py`` (the Triton kernel and
its launcher) and ``wins.json``: its in-model A/B records (on CUDA the extra check fires only
where they measured the model's step faster; an isolated benchmark never enables it alone) and its
isolated GPU timings. Kernels run on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (elsewhere the extra check declines and the graph is left as it was).
"""

from pathlib import Path as _Path

from miner.runtime.fusions import Fusions as _Fusions

_FUSIONS = _Fusions(_Path(__file__).resolve().parent)
names, load, graph_pass = _FUSIONS.names, _FUSIONS.load, _FUSIONS.graph_pass
inductor_options, install = _FUSIONS.inductor_options, _FUSIONS.install
'''


def render_test(workspace: Workspace, name: str, meta: dict, command: str) -> str:
    """tests/fusions/test_<name>.py: the fusion's cases table (``miner.generate.fusion_test``), with the
    training step's matches measured here on the CPU (``miner.check.fusion_harness.train_matches``)."""
    from miner.check import fusion_harness

    cases = fusion_cases(meta)
    matches = fusion_harness.train_matches(workspace.fusions, name, meta["signature"]["input_kinds"], cases[0][:2])
    return fusion_test.render(name, meta, header(meta["id"], command, f"test of fusion {name}"), matches,
                              pick_model(meta))
