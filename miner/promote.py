"""``miner promote``: a validated candidate -> ``fusions/<name>/`` and ``tests/fusions/test_<name>.py``.

The fusion's files are rendered again from the candidate's pattern (the same generator, so the
kernel is the validated one) with the fusion's own names: the op is ``miner::<name>``, the kernel
is imported as ``fusions.<name>.kernel``. ``fusions/__init__.py`` (the registry) is rewritten
from the folders under ``fusions/``. A candidate that is not validated is refused.

``fusions/<name>/wins.json`` holds the candidate's GPU verdicts (``miner.bench.results.wins_table`` of
its latest run in ``candidates/<id>/bench.json``); the fusion's extra check reads it
(``miner.runtime.rewrite.wins_gate``) so that on CUDA it fires only where it was measured to win.
Without a bench.json there is no wins.json and the fusion fires as unmeasured;
``miner promote`` again refreshes it (``miner bench --import`` says when).
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

from miner import __version__
from miner.generate import codegen
from miner.runtime import rewrite
from miner.core import candidate as candidates
from miner.core.candidate import Candidate
from miner.core.errors import UsageError
from miner.generate.generate import (KERNEL_IMPORT, example_shapes, header, render_kernel_py,
                                     render_pattern_py,
                            spec_from_pattern)
from miner.check.cases import fusion_cases
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
        raise UsageError(f"candidate {cand.id} was validated without proving the rewrite in a model "
                         f"(--no-model); run `miner validate {cand.id}`")
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
    meta = cand.meta
    from miner.core.pattern import pattern_from_json

    pattern = pattern_from_json(meta["pattern"])
    spec = spec_from_pattern(pattern)
    prog = codegen.lower(spec)
    command = f"miner promote {meta['id']} --name {name}"
    folder = workspace.fusions / name
    what = f"fusion {name}, promoted from a validated candidate"
    files = [
        write_text(folder / "kernel.py", render_kernel_py(prog, header(meta["id"], command, what))),
        write_text(folder / "pattern.py", render_pattern_py(
            prog, header(meta["id"], command, what), f"miner::{name}", KERNEL_IMPORT,
            example_shapes(meta["observed"], spec.n_inputs), f"Fusion {name}: {meta['ops']}.", gated=True)),
        write_json(folder / "fusion.json", {
            "name": name, "pattern_id": meta["id"], "ops": meta["ops"], "miner_version": __version__,
            "promoted_by": command, "observed": meta["observed"], "occurrences": meta["occurrences"],
            "validation": validation}),
    ]
    wins = write_wins(workspace, folder, meta["id"])
    files += [wins] if wins else []
    files.append(write_registry(workspace))
    tests_root = (root or workspace.root) / "tests" / "fusions"
    files.append(write_text(tests_root / f"test_{name}.py", render_test(name, meta, spec, command)))
    if not any((d / "conftest.py").exists() for d in (tests_root, tests_root.parent)):
        # a user's workspace has no conftest: without one the GPU cases fail on a CPU instead of skipping
        files.append(write_text(tests_root / "conftest.py", CONFTEST.format(version=__version__)))
    return Promoted(name, meta["id"], tuple(files))


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
its launcher) and, once timed on a GPU, ``wins.json`` (where it beats Inductor: on CUDA the
extra check fires only there). Kernels run on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (elsewhere the extra check declines and the graph is left as it was).
"""

from pathlib import Path as _Path

from miner.runtime.fusions import Fusions as _Fusions

_FUSIONS = _Fusions(_Path(__file__).resolve().parent)
names, load, graph_pass = _FUSIONS.names, _FUSIONS.load, _FUSIONS.graph_pass
inductor_options, install = _FUSIONS.inductor_options, _FUSIONS.install
'''


def render_test(name: str, meta: dict, spec, command: str) -> str:
    cases = fusion_cases(meta)
    kinds = meta["signature"]["input_kinds"]
    case_lines = "".join(f"    pytest.param({shapes!r}, {scalars!r}, id={label!r}),\n" for shapes, scalars, label in cases)
    first_shapes, first_scalars, _ = cases[0]
    zoo_test = render_zoo_test(name, meta)
    return f'''{header(meta["id"], command, f"test of fusion {name}")}"""Fusion {name} ({meta["ops"]}): kernel vs float64 reference, and the rewrite inside torch.compile.

Shapes: the ones the scan observed (shrunk for the interpreter) and odd ones (a row length that
is no power of two, one row, a row longer than the one-pass limit). CPU tests run the kernel in
the Triton interpreter; ``-m gpu`` runs it natively on CUDA.
"""

import os

import pytest
import torch  # does not import triton, so the switch below still takes effect

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

from pathlib import Path  # noqa: E402

from miner.runtime.fusions import Fusions  # noqa: E402

fusions = Fusions(Path(__file__).resolve().parents[2] / "fusions")
pattern = fusions.load("{name}")
kernel = pattern._kernel()

CASES = [
{case_lines}]
FIRST_SHAPES, FIRST_SCALARS = {first_shapes!r}, {first_scalars!r}
INPUT_KINDS = {kinds!r}
FLOAT_INPUT = INPUT_KINDS.index("float")  # the input a projection feeds in ChainModel
TOL = {{torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}}  # (rtol, atol)


def make_inputs(shapes, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = []
    for shape, kind in zip(shapes, INPUT_KINDS):
        if kind == "bool":
            xs.append((torch.rand(tuple(shape), generator=g) < 0.5).to(device))
        else:
            xs.append(torch.randn(tuple(shape), generator=g).to(dtype).to(device))
    return xs


def check_against_float64(shapes, scalars, dtype, device):
    xs = make_inputs(shapes, dtype, device)
    outs = kernel.launch(*xs, *scalars)
    expected = pattern.pattern(*xs, *scalars)
    ref = pattern.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *scalars)
    assert len(outs) == len(ref) == pattern.N_OUTPUTS
    for out, exp, r in zip(outs, expected, ref):
        assert out.shape == exp.shape and out.dtype == exp.dtype
        if out.dtype == torch.bool:
            assert torch.equal(out, r)
            continue
        rtol, atol = TOL[out.dtype]
        torch.testing.assert_close(out.double(), r.double(), rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shapes, scalars", CASES)
def test_kernel_matches_float64_reference_cpu(shapes, scalars, dtype):
    check_against_float64(shapes, scalars, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shapes, scalars", CASES)
def test_kernel_matches_float64_reference_cuda(shapes, scalars, dtype):
    check_against_float64(shapes, scalars, dtype, "cuda")


def test_looped_kernel_matches_one_pass():
    xs = make_inputs(FIRST_SHAPES, torch.float32, "cpu")
    for a, b in zip(kernel.launch(*xs, *FIRST_SCALARS, variant="looped"), kernel.launch(*xs, *FIRST_SCALARS)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class ChainModel(torch.nn.Module):
    """A projection feeding the fused chain, as in the models it was found in."""

    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)

    def forward(self, *xs):
        xs = list(xs)
        xs[FLOAT_INPUT] = self.proj(xs[FLOAT_INPUT])
        return pattern.pattern(*xs, *FIRST_SCALARS)


def compile_and_run(model, xs, train):
    graph_pass = fusions.graph_pass(["{name}"])
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(model, options=fusions.inductor_options(graph_pass_=graph_pass), dynamic=False)
        with torch.set_grad_enabled(train):
            got = compiled(*xs)
            if train:
                sum(o.float().sum() for o in got if o.is_floating_point()).backward()
    torch._dynamo.reset()
    return got, graph_pass.counts["{name}"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_compile_uses_the_fusion_and_matches_eager(device, monkeypatch):
    # The rewrite itself, ungated: on CUDA the measured-wins gate (tests/test_gate.py) may
    # rightly decline these small shapes.
    monkeypatch.setattr(pattern, "WINS", None)
    xs = make_inputs(FIRST_SHAPES, torch.float32, device)
    model = ChainModel(FIRST_SHAPES[FLOAT_INPUT][-1]).to(device)
    got, matches = compile_and_run(model, xs, train=False)
    assert matches > 0, "the fusion did not fire"
    with torch.no_grad():
        expected = model(*xs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_training_step_with_the_fusion_matches_eager(device):
    # In a training graph the chain's interior values may be saved for backward (extra users), in
    # which case the matcher leaves it alone; either way gradients must equal eager's.
    xs = make_inputs(FIRST_SHAPES, torch.float32, device)
    model = ChainModel(FIRST_SHAPES[FLOAT_INPUT][-1]).to(device)
    got, _ = compile_and_run(model, xs, train=True)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(*xs)
    sum(o.float().sum() for o in expected if o.is_floating_point()).backward()
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, p in zip(grads, model.parameters()):
        # a weight gradient sums over every row with cancellation: Inductor's reduction order alone
        # moves single elements by ~1e-5 of the gradient's scale, so compare as a whole (norm-wise)
        assert (a - p.grad).norm() <= 1e-5 * p.grad.norm() + 1e-6, ((a - p.grad).norm(), p.grad.norm())
{zoo_test}

def test_registry_is_loud_about_unknown_names():
    from miner.core.errors import UsageError

    assert "{name}" in fusions.names()
    with pytest.raises(UsageError, match="{name}"):
        fusions.load("no_such_fusion")
'''


def render_zoo_test(name: str, meta: dict) -> str:
    """A slow test: the zoo model the pattern was found in, compiled with the fusion (count > 0, parity)."""
    from miner.check.validate import pick_model

    pick = pick_model(meta)
    if pick is None:
        return ""
    model, mode = pick
    return f'''

@pytest.mark.slow
def test_fusion_fires_in_{model}_{mode}_and_matches_eager():
    import miner_models as models

    built = models.resolve("{model}").build("tiny", "{mode}", "cpu")
    eager = built.model
    import copy

    model = copy.deepcopy(eager)
    graph_pass = fusions.graph_pass(["{name}"])

    def step(m, fn):
        torch.manual_seed(0)
        out = fn(**built.inputs)
        if "{mode}" == "train":
            built.loss(out).backward()
        return out["logits"], {{n: p.grad for n, p in m.named_parameters() if p.grad is not None}}

    e_logits, e_grads = step(eager, eager)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True, fallback_random=True):
        c_logits, c_grads = step(model, torch.compile(model, options=fusions.inductor_options(graph_pass_=graph_pass),
                                                      dynamic=False))
    torch._dynamo.reset()
    assert graph_pass.counts["{name}"] > 0
    torch.testing.assert_close(c_logits, e_logits, rtol=1e-4, atol=1e-4)
    for k, g in e_grads.items():
        torch.testing.assert_close(c_grads[k], g, rtol=1e-3, atol=1e-4)
'''
