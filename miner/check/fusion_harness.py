"""The tests every promoted fusion runs; ``tests/fusions/test_<name>.py`` holds only its cases.

A fusion's test module (written by ``miner promote``) defines its table and star-imports this
module, so pytest collects the ``test_*`` functions below in it and :func:`pytest_generate_tests`
parametrizes them from the module's table:

- ``FUSION``: the fusion's name (``fusions/<FUSION>/`` two folders above the test file);
- ``INPUT_KINDS``: ``"float"`` or ``"bool"`` per input;
- ``CASES``: ``(input shapes, scalars, id)``; the first is the one the compile tests use;
- ``TRAIN_MATCHES``: the matches expected in the training step of :class:`ChainModel` (measured by
  ``miner promote`` with :func:`train_matches`; 0 where backward keeps the chain's interior values,
  so the matcher must leave it alone);
- ``ZOO``: ``(model, mode)`` the pattern was found in (the slow in-model test), or None.

Kernels run on CPU tensors through the Triton interpreter (``TRITON_INTERPRET=1`` is set here,
before triton is imported, when there is no CUDA); CUDA cases are marked ``gpu`` and skip cleanly
without a CUDA device. Tolerances: ``miner.core.dtypes.ELEMENT_TOL`` against float64.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch  # does not import triton, so the switch below still takes effect

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

from miner.core import dtypes  # noqa: E402
from miner.core.errors import UsageError  # noqa: E402
from miner.core.tensors import make_inputs  # noqa: E402
from miner.runtime.fusions import Fusions  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA device")])
DEVICES = ("cpu", CUDA)

__all__ = ["pytest_generate_tests", "fusion", "test_kernel_matches_float64_reference",
           "test_looped_kernel_matches_one_pass", "test_torch_compile_uses_the_fusion_and_matches_eager",
           "test_training_step_matches_eager_with_the_expected_matches", "test_fusion_fires_in_its_zoo_model",
           "test_registry_is_loud_about_unknown_names"]


class FusionUnderTest:
    """One fusion, loaded from ``fusions`` by name, with its test table.

    Parameters
    ----------
    fusions_dir : Path
        The ``fusions/`` folder.
    name : str
        The fusion.
    input_kinds : sequence of str
        ``"float"`` or ``"bool"`` per input.
    first : tuple
        ``(shapes, scalars)`` of the case the compile tests use.
    """

    def __init__(self, fusions_dir: Path, name: str, input_kinds, first):
        self.fusions = Fusions(fusions_dir, interpret=True)  # a fusion's own tests run it on CPU tensors
        self.name = name
        self.pattern = self.fusions.load(name)
        self.kernel = self.pattern._kernel()
        self.input_kinds = list(input_kinds)
        self.shapes, self.scalars = first
        self.train_matches: int | None = None  # the table's TRAIN_MATCHES

    @classmethod
    def of(cls, module) -> "FusionUnderTest":
        """The fusion a test module's table names (``fusions/`` two folders above the module)."""
        shapes, scalars, _ = module.CASES[0]
        f = cls(Path(module.__file__).resolve().parents[2] / "fusions", module.FUSION, module.INPUT_KINDS,
                (shapes, scalars))
        f.train_matches = module.TRAIN_MATCHES
        return f

    def inputs(self, shapes, dtype: str, device: str) -> list:
        """Random inputs: floats in ``dtype``, bools where ``INPUT_KINDS`` says so."""
        specs = [{"shape": s, "dtype": "bool" if k == "bool" else dtype} for s, k in zip(shapes, self.input_kinds)]
        return make_inputs(specs, device=device)

    def chain_model(self, device: str) -> "ChainModel":
        """:class:`ChainModel` for the first case."""
        float_input = self.input_kinds.index("float")
        return ChainModel(self.pattern, float_input, self.shapes[float_input][-1], self.scalars).to(device)

    def compile_and_run(self, model, xs, train: bool, gate: str = "on"):
        """``model(*xs)`` compiled with this fusion alone (one backward when ``train``; ``gate``: the
        pass's, ``"open"`` holds the in-model gate open): (outputs, matches)."""
        graph_pass = self.fusions.graph_pass([self.name], gate=gate)
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True):
            compiled = torch.compile(model, options=self.fusions.inductor_options(graph_pass_=graph_pass),
                                     dynamic=False)
            with torch.set_grad_enabled(train):
                got = compiled(*xs)
                if train:
                    sum(o.float().sum() for o in got if o.is_floating_point()).backward()
        torch._dynamo.reset()
        return got, graph_pass.counts[self.name]


class ChainModel(torch.nn.Module):
    """A projection feeding the fused chain, as in the models it was found in."""

    def __init__(self, pattern, float_input: int, n: int, scalars):
        super().__init__()
        self.pattern, self.float_input, self.scalars = pattern, float_input, list(scalars)
        self.proj = torch.nn.Linear(n, n)

    def forward(self, *xs):
        xs = list(xs)
        xs[self.float_input] = self.proj(xs[self.float_input])
        return self.pattern.pattern(*xs, *self.scalars)


def train_matches(fusions_dir: Path, name: str, input_kinds, first) -> int:
    """The matches of fusion ``name`` in :class:`ChainModel`'s compiled training step, on the CPU.

    Runs in a fresh Python process with ``TRITON_INTERPRET=1`` (the caller may have imported triton
    already, after which the interpreter can no longer be switched on).

    Parameters
    ----------
    fusions_dir : Path
        The ``fusions/`` folder holding ``name``.
    name : str
        The fusion.
    input_kinds : sequence of str
        ``"float"`` or ``"bool"`` per input.
    first : tuple
        ``(shapes, scalars)`` of the first test case.

    Returns
    -------
    int
        What the fusion's training test then asserts (``TRAIN_MATCHES``).

    Raises
    ------
    RuntimeError
        When the compile fails (its last output lines in the message).
    """
    import json
    import subprocess
    import sys

    import miner

    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(miner.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    args = [str(fusions_dir), name, json.dumps(list(input_kinds)), json.dumps([list(first[0]), list(first[1])])]
    proc = subprocess.run([sys.executable, "-m", "miner.check.fusion_harness", *args], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"measuring fusion {name}'s training matches failed:\n{tail}")
    return int(proc.stdout.strip().splitlines()[-1])


def _train_matches_here(fusions_dir: str, name: str, input_kinds: str, first: str) -> int:
    import json

    shapes, scalars = json.loads(first)
    f = FusionUnderTest(Path(fusions_dir), name, json.loads(input_kinds), (shapes, scalars))
    return f.compile_and_run(f.chain_model("cpu"), f.inputs(f.shapes, "float32", "cpu"), train=True)[1]


def pytest_generate_tests(metafunc):
    """Parametrize the harness's tests from the module's ``CASES``, the dtypes and the devices."""
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", [pytest.param(c, id=c[2]) for c in metafunc.module.CASES])
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", DTYPES)
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)


@pytest.fixture(scope="module")
def fusion(request) -> FusionUnderTest:
    """The fusion the requesting test module's table names."""
    return FusionUnderTest.of(request.module)


def test_kernel_matches_float64_reference(fusion, case, dtype, device):
    shapes, scalars, _ = case
    xs = fusion.inputs(shapes, dtype, device)
    outs = fusion.kernel.launch(*xs, *scalars)
    expected = fusion.pattern.pattern(*xs, *scalars)
    ref = fusion.pattern.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *scalars)
    assert len(outs) == len(ref) == fusion.pattern.N_OUTPUTS
    for out, exp, r in zip(outs, expected, ref):
        assert out.shape == exp.shape and out.dtype == exp.dtype
        if out.dtype == torch.bool:
            assert torch.equal(out, r)
            continue
        rtol, atol = dtypes.ELEMENT_TOL[dtypes.name(out.dtype)]
        torch.testing.assert_close(out.double(), r.double(), rtol=rtol, atol=atol, equal_nan=True)


def test_looped_kernel_matches_one_pass(fusion):
    xs = fusion.inputs(fusion.shapes, "float32", "cpu")
    looped = fusion.kernel.launch(*xs, *fusion.scalars, variant="looped")
    for a, b in zip(looped, fusion.kernel.launch(*xs, *fusion.scalars)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_torch_compile_uses_the_fusion_and_matches_eager(fusion, device):
    # The rewrite itself, gate held open: on CUDA the in-model gate (tests/test_gate.py) declines
    # every context no in-model A/B measured, these small shapes included.
    xs = fusion.inputs(fusion.shapes, "float32", device)
    model = fusion.chain_model(device)
    got, matches = fusion.compile_and_run(model, xs, train=False, gate="open")
    assert matches == 1, f"the chain appears once; the fusion matched {matches} times"
    with torch.no_grad():
        expected = model(*xs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_training_step_matches_eager_with_the_expected_matches(fusion, device):
    # In a training graph the chain's interior values may be saved for backward (extra users); then
    # the matcher must leave it alone (TRAIN_MATCHES = 0), else it must fire. Gradients equal eager's.
    module_expected = fusion.train_matches
    xs = fusion.inputs(fusion.shapes, "float32", device)
    model = fusion.chain_model(device)
    got, matches = fusion.compile_and_run(model, xs, train=True, gate="open")
    assert matches == module_expected, f"expected {module_expected} matches in the training step, got {matches}"
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


@pytest.mark.slow
def test_fusion_fires_in_its_zoo_model(fusion, request):
    zoo = getattr(request.module, "ZOO", None)
    if zoo is None:
        pytest.skip("the fusion names no zoo model")
    import miner_models as models

    model_name, mode = zoo
    built = models.resolve(model_name).build("tiny", mode, "cpu")
    eager = built.model
    model = copy.deepcopy(eager)
    graph_pass = fusion.fusions.graph_pass([fusion.name])

    def step(m, fn):
        torch.manual_seed(0)
        out = fn(**built.inputs)
        if mode == "train":
            built.loss(out).backward()
        return out["logits"], {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    e_logits, e_grads = step(eager, eager)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True, fallback_random=True):
        compiled = torch.compile(model, options=fusion.fusions.inductor_options(graph_pass_=graph_pass), dynamic=False)
        c_logits, c_grads = step(model, compiled)
    torch._dynamo.reset()
    assert graph_pass.counts[fusion.name] > 0
    torch.testing.assert_close(c_logits, e_logits, rtol=1e-4, atol=1e-4)
    for k, g in e_grads.items():
        torch.testing.assert_close(c_grads[k], g, rtol=1e-3, atol=1e-4)


def test_registry_is_loud_about_unknown_names(fusion):
    assert fusion.name in fusion.fusions.names()
    with pytest.raises(UsageError, match=fusion.name):
        fusion.fusions.load("no_such_fusion")


if __name__ == "__main__":  # python -m miner.check.fusion_harness FUSIONS_DIR NAME KINDS_JSON FIRST_JSON
    import sys

    print(_train_matches_here(*sys.argv[1:5]))
