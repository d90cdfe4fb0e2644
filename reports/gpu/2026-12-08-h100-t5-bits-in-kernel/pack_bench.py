"""Probe: t5's three dropout regions (the promoted fusions' kernels, base shapes) storing their mask as bool, as bool
then packed by a compiled ``bits.pack`` pass (what the step ran before), and as bits by the kernel itself
(``launch(..., bits=(k,))``). CUDA-graph replays (triton.testing.do_bench_cudagraph), us per call; the bits checked
equal to ``pack`` of the bool mask first."""
import json
import sys
from pathlib import Path

import torch
import triton

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
sys.path.insert(0, str(REPO))
from miner.bench.cases import cases_from_meta  # noqa: E402
from miner.bench.run import inputs_of  # noqa: E402
from miner.runtime import bits, fusions, rewrite  # noqa: E402

names = ["relu_dropout", "dropout_residual_rms_norm", "attention_mask_softmax_dropout"]
fusions.graph_pass(REPO, names, interpret=False)
pack = torch.compile(bits.pack, dynamic=False)
for name in names:
    meta = json.loads((REPO / "fusions" / name / "fusion.json").read_text())
    case = next(c for c in cases_from_meta(meta) if c.preset == "base")
    kmod = rewrite.load_module(REPO / "fusions" / name / "kernel.py", f"{name}_probe")
    args = inputs_of(case, "cuda")
    plain = kmod.launch(*args)
    k = next(i for i, o in enumerate(plain) if o.dtype == torch.bool)
    packed = kmod.launch(*args, bits=(k,))
    ok = torch.equal(packed[k], pack(plain[k])) and all(torch.equal(a, b) for i, (a, b) in enumerate(zip(plain, packed)) if i != k)
    t_bool = triton.testing.do_bench_cudagraph(lambda: kmod.launch(*args), rep=200)
    t_pack = triton.testing.do_bench_cudagraph(lambda: pack(plain[k]), rep=200)
    t_bits = triton.testing.do_bench_cudagraph(lambda: kmod.launch(*args, bits=(k,)), rep=200)
    moved = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    moved += sum(o.numel() * o.element_size() for i, o in enumerate(plain) if i != k)
    n = plain[k].numel()
    print(f"{name} {[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}: bits == pack(bool) {ok}; "
          f"bool {t_bool * 1e3:.1f} us, + pack {t_pack * 1e3:.1f} us = {(t_bool + t_pack) * 1e3:.1f} us; "
          f"bits in the kernel {t_bits * 1e3:.1f} us; floor at 3.35 TB/s: bool {(moved + n) / 3.35e6:.1f} us, "
          f"bits {(moved + n / 8) / 3.35e6:.1f} us")
