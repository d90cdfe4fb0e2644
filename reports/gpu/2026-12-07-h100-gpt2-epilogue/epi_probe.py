"""GEMM + bias + tanh-GELU at gpt2's feed-forward shape: Inductor's compiled chain vs cuBLASLt's epilogue.

CUDA-graph replays (triton.testing.do_bench_cudagraph), numerics against float64 first.
"""
import math, torch, triton
from triton.testing import do_bench_cudagraph

torch.manual_seed(0)
BF16 = torch.bfloat16


def gelu_new(h):  # HF's NewGELUActivation, as gpt2 runs it
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


def chain(b, x, w):
    return gelu_new(torch.addmm(b, x, w))


def epilogue(b, x, w):
    return torch._addmm_activation(b, x, w, use_gelu=True)


compiled = torch.compile(chain, dynamic=False)
compiled_epi = torch.compile(epilogue, dynamic=False)
for m, k, n in ((8192, 768, 3072), (2048, 768, 3072)):
    sets = [tuple(torch.randn(*s, device="cuda").to(BF16) * 0.5 for s in ((n,), (m, k), (k, n))) for _ in range(4)]
    b, x, w = sets[0]
    ref = gelu_new(torch.addmm(b.double(), x.double(), w.double()))
    errs = {name: ((f(b, x, w).double() - ref).abs().max().item())
            for name, f in (("inductor", compiled), ("epilogue", epilogue), ("epilogue_compiled", compiled_epi))}
    i = [0]

    def rot(f):
        def g():
            s = sets[i[0] % 4]
            i[0] += 1
            return f(*s)
        return g
    gemm = do_bench_cudagraph(lambda: torch.addmm(b, x, w), rep=200)
    t_ind = do_bench_cudagraph(lambda: compiled(b, x, w), rep=200)
    t_epi = do_bench_cudagraph(lambda: epilogue(b, x, w), rep=200)
    t_epic = do_bench_cudagraph(lambda: compiled_epi(b, x, w), rep=200)
    out_bytes = m * n * 2
    print(f"{m}x{k}x{n} bf16: addmm alone {gemm*1e3:.1f} us; inductor chain {t_ind*1e3:.1f} us; "
          f"_addmm_activation {t_epi*1e3:.1f} us (compiled {t_epic*1e3:.1f} us); "
          f"chain/epilogue {t_ind/t_epi:.3f}x; max|err| vs float64: " +
          ", ".join(f"{k_} {v:.3g}" for k_, v in errs.items()) + f"; output {out_bytes/1e6:.0f} MB")
