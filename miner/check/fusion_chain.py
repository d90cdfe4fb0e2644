"""A promoted kernel fusion compiled in a small model: what ``miner promote`` measures and its tests run.

:class:`FusionUnderTest` loads one fusion of a ``fusions/`` folder (its pattern.py and kernel.py) and
compiles :class:`ChainModel` (a projection feeding the fused chain, as in the models it was found in)
with that fusion alone. :func:`train_matches` counts its matches in the compiled training step on the
CPU, in a fresh interpreter process with ``TRITON_INTERPRET=1``: the number the fusion's training test
asserts (0 where backward keeps the chain's interior values). :func:`fusion_test_cases` is the row
kernel's table of tests (``miner_testing.row_kernel`` holds the tests). Importing this module sets
nothing and imports no test framework.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from miner.check.cases import fusion_cases
from miner.check.checks import pick_model
from miner.core.tensors import make_inputs
from miner.runtime.fusions import Fusions


class FusionUnderTest:
    """One fusion, loaded from a ``fusions/`` folder by name.

    Parameters
    ----------
    fusions_dir : Path
        The ``fusions/`` folder.
    name : str
        The fusion.
    """

    def __init__(self, fusions_dir: Path, name: str):
        self.fusions = Fusions(fusions_dir, interpret=True)  # a fusion's own tests run it on CPU tensors
        self.name = name
        self.pattern = self.fusions.load(name)
        self.kernel = self.pattern._kernel()
        self.input_kinds = list(self.pattern.INPUT_KINDS)

    def inputs(self, shapes, dtype: str, device: str) -> list:
        """Random inputs: floats in ``dtype``, bools where the pattern's ``INPUT_KINDS`` says so."""
        specs = [{"shape": s, "dtype": "bool" if k == "bool" else dtype} for s, k in zip(shapes, self.input_kinds)]
        return make_inputs(specs, device=device)

    def chain_model(self, shapes, scalars, device: str) -> "ChainModel":
        """:class:`ChainModel` for inputs of ``shapes``."""
        float_input = self.input_kinds.index("float")
        return ChainModel(self.pattern, float_input, shapes[float_input][-1], scalars).to(device)

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


def train_matches(fusions_dir: Path, name: str, shapes, scalars) -> int:
    """The matches of fusion ``name`` in :class:`ChainModel`'s compiled training step, on the CPU.

    Runs in a fresh Python process with ``TRITON_INTERPRET=1`` (the caller may have imported triton
    already, after which the interpreter can no longer be switched on).

    Parameters
    ----------
    fusions_dir : Path
        The ``fusions/`` folder holding ``name``.
    name : str
        The fusion.
    shapes, scalars : list
        The input shapes and scalars of the first test case.

    Returns
    -------
    int
        What the fusion's training test then asserts.

    Raises
    ------
    RuntimeError
        When the compile fails (its last output lines in the message).
    """
    import miner

    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(miner.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    args = [str(fusions_dir), name, json.dumps([list(shapes), list(scalars)])]
    proc = subprocess.run([sys.executable, "-m", "miner.check.fusion_chain", *args], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"measuring fusion {name}'s training matches failed:\n{tail}")
    return int(proc.stdout.strip().splitlines()[-1])


def _train_matches_here(fusions_dir: str, name: str, case: str) -> int:
    shapes, scalars = json.loads(case)
    f = FusionUnderTest(Path(fusions_dir), name)
    return f.compile_and_run(f.chain_model(shapes, scalars, "cpu"), f.inputs(shapes, "float32", "cpu"), train=True)[1]


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a row (or region) kernel fusion's test table: ``(test, case id, arguments)``.

    Every case of ``miner.check.cases.fusion_cases`` checks the kernel against float64; the first one
    also the looped kernel, the compiled chain and its training step (with the matches measured here,
    :func:`train_matches`); then the zoo model the pattern was found in and the registry's loud failure.
    """
    cases = [(label, {"shapes": shapes, "scalars": scalars}) for shapes, scalars, label in fusion_cases(meta)]
    first_id, first = cases[0]
    matches = train_matches(workspace.fusions, name, first["shapes"], first["scalars"])
    zoo = pick_model(meta)
    return ([("test_kernel_matches_float64_reference", label, case) for label, case in cases]
            + [("test_looped_kernel_matches_one_pass", first_id, first),
               ("test_torch_compile_uses_the_fusion_and_matches_eager", first_id, first),
               ("test_training_step_matches_eager_with_the_expected_matches", first_id, {**first, "matches": matches})]
            + ([("test_fusion_fires_in_its_zoo_model", "/".join(zoo), {"model": zoo[0], "mode": zoo[1]})]
               if zoo else [])
            + [("test_registry_is_loud_about_unknown_names", "no_such_fusion", {"unknown": "no_such_fusion"})])


__all__ = ["ChainModel", "FusionUnderTest", "fusion_test_cases", "train_matches"]

if __name__ == "__main__":  # python -m miner.check.fusion_chain FUSIONS_DIR NAME CASE_JSON
    print(_train_matches_here(*sys.argv[1:4]))
