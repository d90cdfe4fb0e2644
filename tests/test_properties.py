"""Property-based tests (hypothesis): every promoted fusion and every candidate kind, on random
small shapes, size-1 dims, broadcasts, strided / sliced / expanded inputs, dtypes and in-place
contexts around the chain. The property (issue 12): the fusion fires and equals eager within the
output dtype's tolerance, or it declines with a reason; nothing raises.

Reproducible and bounded: ``derandomize=True``, no example database, no deadline. Profiles
(``HYPOTHESIS_PROFILE``): ``ci`` (default; 8 examples per fusion and 4 per candidate through the
``make_fx`` path, 1 compiled forward+backward example per fusion under ``-m slow``), ``slow``
(100 / 50 / 6). ``tests/test_properties.py::test_zz_report`` prints how many cases ran and how many
fired or declined (run with ``-s``).

On a GPU: ``MINER_PROPERTY_DEVICE=cuda pytest tests/test_properties.py -m "slow or not slow" -s`` draws
the same cases on CUDA tensors (native Triton kernels; the harness holds the in-model gate open, so
the kernels run where a promoted fusion's gate would decline an unmeasured context).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miner.runtime import fusions, rewrite
from tests.safety_harness import CANDIDATES, FUSIONS, check, compiled_run, eager_run, fx_run

_COMMON = dict(derandomize=True, database=None, deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=8, **_COMMON)
settings.register_profile("slow", max_examples=100, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE if PROFILE in ("ci", "slow") else "ci")
DEVICE = os.environ.get("MINER_PROPERTY_DEVICE", "cpu")
EXAMPLES = {"ci": {"fusion": 8, "candidate": 4, "compiled": 1}, "slow": {"fusion": 100, "candidate": 50, "compiled": 6}}[PROFILE]


def _random(folder) -> bool:
    """Whether the kernel beside ``folder``'s pattern.py draws random numbers (a region with dropout)."""
    kernel = folder / "kernel.py"
    return kernel.is_file() and "\nRANDOM = True" in kernel.read_text()


# candidates and fusions whose kernel draws random numbers (region kernels with dropout) are not deterministic
# functions of their inputs: their properties are tests/test_region.py's (masks, keep rate, the rule) and a
# region fusion's own tests (tests/harness/region_kernel.py: its kernel against its random reference, one mask
# under every tiling, its tiny step with the masks injected)
# chain fusions (an upcast-matmul fusion is an aten rewrite with no chain: tests/fusions/test_<name>.py tests it)
# a reduce_region kernel takes an int64 index and fixed ranks this harness does not draw: its own tests
# (tests/test_reduce*.py: odd sizes, masked tails, bf16, the region compiled; a promoted one's
# tests/fusions/test_<name>.py through tests/harness/reduce_region.py) cover it


def _reduce_region(folder) -> bool:
    kernel = folder / "kernel.py"
    return kernel.is_file() and '\nKIND = "reduce_region"' in kernel.read_text()


FUSION_NAMES = [n for n in fusions.names(FUSIONS) if hasattr(fusions.load(FUSIONS, n), "EXAMPLE_INPUTS")
                and not _random(FUSIONS / n) and not _reduce_region(FUSIONS / n)]
CANDIDATE_IDS = sorted(p.parent.name for p in CANDIDATES.glob("p*/pattern.py")
                       if not _random(p.parent) and not _reduce_region(p.parent))
TALLY: Counter = Counter()


def _module(where, name):
    if where == "fusion":
        return fusions.load(FUSIONS, name)
    path = CANDIDATES / name / "pattern.py"
    return rewrite.load_module(path, rewrite.module_name(path, "pattern"))


def _scalars(where, name):
    """The scalar values the chain was observed with (pow exponents, eps, GELU constants)."""
    folder = (FUSIONS if where == "fusion" else CANDIDATES) / name
    meta = json.loads((folder / ("fusion.json" if where == "fusion" else "candidate.json")).read_text())
    return [float(s) if not isinstance(s, dict) else float(s["float"]) for s in meta["observed"][0]["scalars"]]


DTYPES = [torch.float32, torch.float32, torch.bfloat16, torch.float16]


@st.composite
def cases(draw, where, name):
    """(fn, args, description): the chain of ``name`` on drawn inputs, wrapped in drawn views and contexts."""
    m = _module(where, name)
    scalars = _scalars(where, name)
    rank = max(len(s) for s, _ in m.EXAMPLE_INPUTS)
    lead = draw(st.lists(st.integers(1, 4), min_size=rank - 1, max_size=rank - 1))
    # the row length: hypothesis starts from (and shrinks towards) the first value, so it is a real row;
    # rows of one element (declined by the kernel's contract) stay among the draws
    n = draw(st.sampled_from([8, 13, 5, 3, 2, 1]))
    dtype = draw(st.sampled_from(DTYPES))
    mixed = draw(st.sampled_from([False] * 5 + [True]))
    shapes, layouts, dts = [], [], []
    for k, (ex, kind) in enumerate(m.EXAMPLE_INPUTS):
        shape = list(lead[len(lead) - (len(ex) - 1):] if len(ex) > 1 else []) + [n if ex[-1] != 1 else 1]
        change = draw(st.sampled_from(["as is"] * 4 + ["lead 1", "last 1", "drop lead"]))
        if change == "lead 1" and len(shape) > 1:
            shape[draw(st.integers(0, len(shape) - 2))] = 1
        elif change == "last 1":
            shape[-1] = 1
        elif change == "drop lead" and len(shape) > 1:
            shape = shape[1:]
        shapes.append(tuple(shape))
        layouts.append(draw(st.sampled_from(["contiguous"] * 3 + ["transposed", "sliced", "expanded"])))
        dts.append(torch.bool if kind == "bool" else
                   (draw(st.sampled_from(DTYPES)) if mixed else dtype))
    context = draw(st.sampled_from(["none"] * 4 + ["copy_ after", "add_ before"]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)

    args, views = [], []
    for shape, layout, dt in zip(shapes, layouts, dts):
        if layout == "transposed" and len(shape) >= 2:
            base = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g)
            view = lambda t: t.transpose(-1, -2)
        elif layout == "sliced":
            base = torch.randn(*shape[:-1], shape[-1] + 2, generator=g)
            view = lambda t, n=shape[-1]: t[..., 1:n + 1]
        elif layout == "expanded" and any(s > 1 for s in shape):
            small = [1 if (i == 0 and s > 1) else s for i, s in enumerate(shape)]
            base = torch.randn(*small, generator=g)
            view = lambda t, shape=shape: t.expand(*shape)
        else:
            base = torch.randn(*shape, generator=g)
            view = lambda t: t
        args.append((base > 0 if dt == torch.bool else base.to(dt)).to(DEVICE))
        views.append(view)

    first_float = next((k for k, dt in enumerate(dts) if dt != torch.bool), None)

    def fn(*xs):
        xs = [v(x) for v, x in zip(views, xs)]
        if context == "add_ before" and first_float is not None:
            xs[first_float] = xs[first_float].add_(0.5)
        outs = m.pattern(*xs, *scalars)
        if context == "copy_ after" and first_float is not None:
            xs[first_float].copy_(torch.zeros_like(xs[first_float]))
        return outs

    what = f"{name}: shapes {shapes} layouts {layouts} dtypes {[str(d)[6:] for d in dts]} context {context}"
    return fn, args, what


def _broadcastable(args, fn) -> bool:
    try:
        eager_run(fn, args)
        return True
    except RuntimeError:  # the drawn shapes do not broadcast: not a case
        return False


def _property(where, name, data):
    fn, args, what = data.draw(cases(where, name))
    if not _broadcastable(args, fn):
        TALLY["not broadcastable (skipped)"] += 1
        return
    run = fx_run(fn, args, FUSIONS if where == "fusion" else CANDIDATES, name)
    outcome = check(run, eager_run(fn, args), name)
    if outcome == "declined" and run.declined:
        assert all(r.split(":")[0] for c in run.declined.values() for r in c), run.declined  # a named reason
    TALLY[f"{where} {outcome}"] += 1
    TALLY["cases"] += 1


@pytest.mark.parametrize("name", FUSION_NAMES)
@settings(max_examples=EXAMPLES["fusion"], **_COMMON)
@given(data=st.data())
def test_fusion_fires_equal_to_eager_or_declines(name, data):
    _property("fusion", name, data)


@pytest.mark.parametrize("cid", CANDIDATE_IDS)
@settings(max_examples=EXAMPLES["candidate"], **_COMMON)
@given(data=st.data())
def test_candidate_fires_equal_to_eager_or_declines(cid, data):
    _property("candidate", cid, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSION_NAMES)
@settings(max_examples=EXAMPLES["compiled"], **_COMMON)
@given(data=st.data())
def test_compiled_forward_and_backward_equal_to_eager_or_declined(name, data):
    fn, args, what = data.draw(cases("fusion", name))
    if not _broadcastable(args, fn):
        return
    backward = what.endswith("context none")  # in-place ops on leaves that need grad are errors in eager too
    run = compiled_run(fn, args, FUSIONS, name, backward=backward)
    check(run, eager_run(fn, args, backward=backward), name, declined_parity=False)
    TALLY[f"compiled {'fired' if run.fired(name) else 'declined'}"] += 1
    TALLY["cases"] += 1


def test_zz_report():
    """Not a check: prints the tally of the cases above (``pytest -s``)."""
    print(f"\nproperty cases ({PROFILE} profile, {DEVICE}): {dict(TALLY)}")
