"""Statistics of a dropout random stream: keep rate, independence, scaling (``miner.runtime.philox``).

A *keep source* is a function ``keep(seed, shape, p) -> bool tensor`` (True: the element is kept,
``u > p``); an *apply* function ``apply(x, seed, p) -> y`` is a whole dropout (``y = keep * x / (1 - p)``
as the kernel computes it). Sources: :func:`torch_keep` (the pure-torch Philox, fast on a CPU),
:func:`triton_keep` (the ``miner.runtime.jit`` helpers a generated kernel inlines; on CUDA, or
under ``TRITON_INTERPRET=1``), :func:`bits_keep` (``miner::philox4_keep_bits``, the
``philox4_dropout_bits`` knob's kernel, its bits unpacked) and :func:`candidate_keep` / :func:`candidate_apply` (a
generated dropout candidate's own kernel). Every check returns a :class:`Stat`; a z-score beyond
``Z_LIMIT`` (4 sigma) fails:

- ``keep_rate``: the fraction kept, against ``1 - p`` (binomial standard error);
- ``neighbours``: correlation of the keep masks of adjacent elements along each dim of a 4-D
  ``[B, H, S, S]`` tensor (columns, rows, heads, batch; ``z = r sqrt(n)``);
- ``words``: correlation between the four elements one Philox call draws (``L = 4 g + w``),
  every pair of words;
- ``layers``: correlation between the masks of different seeds of one step (each layer draws
  from its own ``inductor_lookup_seed(seeds, i)``), and between consecutive integer seeds;
- ``steps``: correlation between the masks of one layer in consecutive steps, their seeds drawn
  as Inductor draws them (``inductor_seeds``: ``torch.randint(2**63 - 1, [count])`` per step);
- ``scale``: ``y == x * (1 / (1 - p))`` bit for bit where kept (the float32 product, rounded to
  ``y``'s dtype), ``y == 0`` where dropped.

``python3 -m miner.check.random_stats --device cuda --draws 1e8`` prints them for the kernel's
stream at full size (``tests/test_random_stats.py`` runs them small on the CPU, and each check
against a deliberately broken stream).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from miner.runtime import philox

Z_LIMIT = 4.0
Keep = Callable[[int, Sequence[int], float], torch.Tensor]
Apply = Callable[[torch.Tensor, int, float], torch.Tensor]


@dataclass(frozen=True)
class Stat:
    """One statistic: ``value`` (a z-score, or a count for ``scale``) against ``limit``."""

    name: str
    value: float
    limit: float
    ok: bool
    detail: str = ""

    def line(self) -> str:
        """One line of the report (fits 100 columns)."""
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name:<34} {self.value:>10.3g} (limit {self.limit:g}) {self.detail}"[:100]


# --------------------------------------------------------------------------- sources

def torch_keep(seed: int, shape: Sequence[int], p: float, device: str = "cpu") -> torch.Tensor:
    """The keep mask of the four-per-call stream from the pure-torch Philox."""
    n = math.prod(shape)
    return (philox.uniform(seed, torch.arange(n, device=device)) > p).reshape(tuple(shape))


def triton_keep(seed: int, shape: Sequence[int], p: float, device: str = "cpu", per_group: bool = True) -> torch.Tensor:
    """The keep mask drawn by ``miner.runtime.jit.fill_uniform4`` (``uniform_tile4`` or ``uniform_at``)."""
    import triton

    from miner.runtime.jit import fill_uniform4

    n = math.prod(shape)
    out = torch.empty(n, dtype=torch.float32, device=device)
    block = 1024
    fill_uniform4[(triton.cdiv(n, block),)](torch.tensor([seed], device=device), out, n, 0,
                                            PER_GROUP=per_group, BLOCK=block)
    return (out > p).reshape(tuple(shape))


def bits_keep(seed: int, shape: Sequence[int], p: float, device: str = "cpu") -> torch.Tensor:
    """The keep mask ``miner::philox4_keep_bits`` writes as bits (``miner.runtime.keep_bits``), unpacked."""
    from miner.runtime import bits, keep_bits

    n = math.prod(shape)
    packed = keep_bits.op()(torch.tensor([seed], dtype=torch.int64, device=device), 0, n, p)
    return bits.unpack(packed, tuple(shape))


def candidate_keep(launch: Callable, seed: int, shape: Sequence[int], p: float, device: str = "cpu") -> torch.Tensor:
    """The keep mask of a generated relu + dropout candidate (``pf4693d7449_x4``'s ``launch(seeds, x,
    index, p, scale)``; output 0 is the mask), its seed at index 0 of the seed vector."""
    x = torch.ones(tuple(shape), dtype=torch.bfloat16, device=device)
    return launch(torch.tensor([seed], device=device), x, 0, p, 1.0 / (1.0 - p))[0]


def candidate_apply(launch: Callable, x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """A generated relu + dropout candidate's output on ``x >= 0`` (relu is then the identity)."""
    return launch(torch.tensor([seed], device=x.device), x, 0, p, 1.0 / (1.0 - p))[1]


def reference_apply(x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """Dropout as Inductor's region computes it, with the stream's mask: ``(keep * x) * scale`` in
    float32, scale = ``1 / (1 - p)`` rounded to float32, the result rounded to ``x``'s dtype."""
    keep = torch_keep(seed, x.shape, p, device=str(x.device))
    return ((keep * x.float()) * torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)).to(x.dtype)


# --------------------------------------------------------------------------- checks

def _corr_z(a: torch.Tensor, b: torch.Tensor) -> float:
    """``r * sqrt(n)`` of the Pearson correlation of two equally shaped tensors (N(0, 1) when independent)."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    r = float((a * b).sum()) / den if den > 0 else 1.0
    return r * math.sqrt(a.numel())


def keep_rate(keep: Keep, p: float, n: int, seed: int = 1) -> Stat:
    """The kept fraction of ``n`` draws against ``1 - p``, in binomial standard errors."""
    kept = float(keep(seed, [n], p).sum())
    sigma = math.sqrt(p * (1 - p) / n)
    z = (kept / n - (1 - p)) / sigma
    return Stat(f"keep rate p={p}", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT, f"kept {kept / n:.6f} of {n:.3g}")


DIM_NAMES = ("batch", "heads", "rows", "columns")


def neighbours(keep: Keep, shape: Sequence[int], p: float = 0.5, seed: int = 2) -> list[Stat]:
    """Correlation of adjacent elements' masks along each dim of a 4-D ``[B, H, S, S]`` draw."""
    m = keep(seed, shape, p)
    out = []
    for d, name in enumerate(DIM_NAMES[-len(shape):]):
        n = m.shape[d]
        z = _corr_z(m.narrow(d, 0, n - 1), m.narrow(d, 1, n - 1))
        out.append(Stat(f"neighbours along {name}", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT, f"{list(shape)}"))
    return out


def words(keep: Keep, n_groups: int, p: float = 0.5, seed: int = 3) -> list[Stat]:
    """Correlation between the masks of words ``a`` and ``b`` of one Philox call, every pair."""
    m = keep(seed, [n_groups, 4], p)
    out = []
    for a in range(4):
        for b in range(a + 1, 4):
            z = _corr_z(m[:, a], m[:, b])
            out.append(Stat(f"words {a},{b} of one call", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT, f"{n_groups:.3g} calls"))
    return out


def inductor_seeds(step: int, count: int, base: int = 0) -> list[int]:
    """The seed vector of ``step`` as Inductor draws one per step (``inductor_seeds``:
    ``torch.randint(2**63 - 1, [count])``) from a generator seeded with ``base``."""
    g = torch.Generator().manual_seed(base)
    for _ in range(step):
        torch.randint(2**63 - 1, [count], generator=g)
    return [int(s) for s in torch.randint(2**63 - 1, [count], generator=g)]


def layers(keep: Keep, n: int, n_layers: int = 4, p: float = 0.5, step: int = 0,
           lookup: Callable[[list, int], int] = lambda seeds, i: seeds[i]) -> list[Stat]:
    """Correlation of the masks of layers ``i < j`` of one step (layer ``i``'s seed
    ``lookup(seeds, i)``: ``inductor_lookup_seed``), and of consecutive integer seeds ``s, s + 1``
    (a key that drops a low bit makes them collide)."""
    seeds = inductor_seeds(step, n_layers)
    masks = [keep(lookup(seeds, i), [n], p) for i in range(n_layers)]
    out = []
    for i in range(n_layers):
        for j in range(i + 1, n_layers):
            z = _corr_z(masks[i], masks[j])
            out.append(Stat(f"layers {i},{j} of one step", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT))
    for s in (0, 1000, 2**32 - 1):
        z = _corr_z(keep(s, [n], p), keep(s + 1, [n], p))
        out.append(Stat(f"seeds {s},{s}+1", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT))
    return out


def steps(keep: Keep, n: int, n_steps: int = 3, layer: int = 2, p: float = 0.5,
          seeds_of: Callable[[int, int], list[int]] = inductor_seeds) -> list[Stat]:
    """Correlation of one layer's masks in consecutive steps (step ``t``'s seed vector
    ``seeds_of(t, count)``: :func:`inductor_seeds`)."""
    seeds = [seeds_of(t, layer + 1)[layer] for t in range(n_steps)]
    masks = [keep(s, [n], p) for s in seeds]
    out = []
    for t in range(n_steps - 1):
        z = _corr_z(masks[t], masks[t + 1])
        out.append(Stat(f"steps {t},{t + 1} of layer {layer}", abs(z), Z_LIMIT, abs(z) <= Z_LIMIT))
    return out


def scale(apply: Apply, p: float, n: int, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
          seed: int = 5) -> Stat:
    """``y == x * (1 / (1 - p))`` bit for bit where kept and ``y == 0`` where dropped (``x > 0``).

    ``x`` is positive (no element is 0 by itself), so ``y == 0`` says dropped; a kept element must
    be the float32 product of ``x`` and ``float32(1 / (1 - p))`` rounded to ``dtype``: a scale of
    ``1 / p``, of 1, or one rounded to bf16 first shows as mismatching elements.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.rand(n, generator=g, device=device) * 4 + 0.25).to(dtype)
    y = apply(x, seed, p)
    kept = y != 0
    want = (x.float() * torch.tensor(1.0 / (1.0 - p), dtype=torch.float32, device=device)).to(dtype)
    bad = int((y[kept] != want[kept]).sum())
    rate = float(kept.float().mean())
    return Stat(f"scale 1/(1-p) exact p={p}", bad, 0, bad == 0,
                f"{bad} kept element(s) != x/(1-p); kept {rate:.4f}")


def all_stats(keep: Keep, apply: Apply | None, draws: int, ps: Sequence[float] = (0.1, 0.5, 0.9),
              device: str = "cpu", log: Callable[[str], None] = lambda s: None) -> list[Stat]:
    """Every check at about ``draws`` draws per case (4-D shape ``[B, H, S, 2 S]`` of that size)."""
    s = max(4, int(round((draws / 32) ** 0.5)))  # 4 * 4 * s * 2 s = draws
    shape = [4, 4, s, 2 * s]
    out = []
    for p in ps:
        out.append(keep_rate(keep, p, draws))
        log(out[-1].line())
    for group in (neighbours(keep, shape), words(keep, draws // 4), layers(keep, draws), steps(keep, draws)):
        for st in group:
            log(st.line())
        out += group
    if apply is not None:
        for p in ps:
            out.append(scale(apply, p, min(draws, 1 << 24), device=device))
            log(out[-1].line())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m miner.check.random_stats``: the statistics of the kernels' stream; exit 1 on a failure."""
    ap = argparse.ArgumentParser(prog="python3 -m miner.check.random_stats", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--draws", type=float, default=1e8, help="draws per case (default 1e8)")
    ap.add_argument("--source", choices=("triton", "torch", "bits", "candidate"), default="triton",
                    help="the jit helpers (default), the pure-torch Philox, the philox4_dropout_bits knob's kernel, "
                         "or candidates/pf4693d7449_x4's kernel")
    args = ap.parse_args(argv)
    draws = int(args.draws)
    if draws < 1000:
        print("--draws must be at least 1000", file=sys.stderr)
        return 2
    if args.source == "torch":
        keep: Keep = lambda s, sh, p: torch_keep(s, sh, p, args.device)  # noqa: E731
        apply: Apply | None = reference_apply
    elif args.source == "triton":
        keep = lambda s, sh, p: triton_keep(s, sh, p, args.device)  # noqa: E731
        apply = None
    elif args.source == "bits":
        keep = lambda s, sh, p: bits_keep(s, sh, p, args.device)  # noqa: E731
        apply = None
    else:
        from pathlib import Path

        from miner.core import candidate as candidates
        from miner.core.workspace import Workspace

        launch = candidates.load(Workspace(Path.cwd()), "pf4693d7449_x4").kernel_module.launch
        keep = lambda s, sh, p: candidate_keep(launch, s, sh, p, args.device)  # noqa: E731
        apply = lambda x, s, p: candidate_apply(launch, x, s, p)  # noqa: E731
    print(f"random stream statistics: source {args.source}, {draws:.3g} draws per case, {args.device}")
    stats = all_stats(keep, apply, draws, device=args.device, log=print)
    failed = [s for s in stats if not s.ok]
    print(f"{len(stats) - len(failed)} of {len(stats)} statistics within limits")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
