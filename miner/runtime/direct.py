"""Launching a compiled Triton kernel without Triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds, specializes and hashes every argument on every call
before it reaches the compiled kernel's launcher: for a region kernel's ~45 arguments that is a
large share of the ~100 us of host time each fused op costs between Inductor's kernels (H200,
2026-12-06: bert's 23 region calls made the host issue each step 2.3 ms later). A
:class:`miner.runtime.launch.Plan` fixes the shapes, strides, dtypes and constexprs of its later calls;
what still changes between them is the tensors' addresses and the int scalars (a dropout layer's
seed index), and the compiled kernel depends on those only through Triton's specialization of them
(:func:`specialization`). So the kernel compiled for one specialization is launched directly, with
the call Triton's own ``JITFunction.run`` ends in (``CompiledKernel.run(grid, stream, function,
metadata, launch_metadata, hooks, *every argument in signature order)``, triton >= 3.3).

Nothing here is trusted blindly (:func:`launcher`): the compiled kernel's signature must name the
kernel's parameters in order, with a tensor exactly where it expects a pointer and the same value
for every constexpr; and the first direct launch of each (plan, specialization) is checked against
Triton's own launch of the same arguments, bit for bit in every output, before its outputs are
used. Anything that does not hold keeps Triton's launch for that plan, which is also what runs under
the Triton interpreter, inside a CUDA-graph capture (where host time is not replayed) and while a
launch hook (a profiler) is installed.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

INT32 = (-2 ** 31, 2 ** 31)

# launches of generated kernels since the process started, by the path they took: "direct" (this module),
# "triton" (Triton's own launch: a first call, a plan off CUDA, under a capture or a hook, a launcher not shown
# safe or dropped), "checked" (a direct launch and Triton's, compared). ``miner verify --ab`` reports each
# variant's per step, so a run shows which path its region calls took.
LAUNCHES: Counter = Counter()


def specialization(tensors: Sequence, ints: Sequence[int]) -> tuple:
    """What Triton specializes a compiled kernel on, among what may change between calls of one plan:
    each pointer's 16-byte alignment; each int's being 1, divisible by 16, and fitting 32 bits."""
    return (tuple(t.data_ptr() % 16 == 0 for t in tensors),
            tuple((v == 1, v % 16 == 0, INT32[0] <= v < INT32[1]) for v in ints))


def _signature(compiled) -> list[tuple[str, str]] | None:
    """(name, type) per parameter of ``compiled`` (a ``CompiledKernel``), in order; None when this
    Triton does not expose it the way this module reads it."""
    sig = getattr(getattr(compiled, "src", None), "signature", None)
    if not isinstance(sig, dict):
        return None
    return [(str(k), str(v)) for k, v in sig.items()]


def launcher(kernel, compiled, args: Sequence, constexprs: dict, grid: Sequence[int], device_index: int,
             varying: Sequence[int] = ()) -> Callable | None:
    """A function ``(args) -> None`` launching ``compiled`` (what ``kernel[grid](*args, **constexprs)``
    returned) with new positional ``args`` of the same kinds, or None where that cannot be shown safe.

    Safe here means: ``compiled`` exposes the launcher and signature this module reads; the signature
    names ``kernel``'s parameters in order, each either one of ``args`` (a tensor exactly where the
    signature has a pointer) or a constexpr whose value ``constexprs`` holds (launched as it); and no
    int at a position in ``varying`` (the ints :func:`specialization` classes) was compiled in as a
    constexpr other than Triton's own specialization of 1 (a kernel taking that int as ``tl.constexpr``
    is compiled per value, which no class tells apart).
    """
    import torch

    if compiled is None or type(compiled).__name__ != "CompiledKernel":
        return None
    names = list(getattr(kernel, "arg_names", ()) or ())
    sig = _signature(compiled)
    if sig is None or [n for n, _ in sig] != names or len(args) > len(names):
        return None
    tail = []
    for k, (name, kind) in enumerate(sig):
        if k < len(args):
            if kind.startswith("*") != isinstance(args[k], torch.Tensor):
                return None
            if k in varying and kind == "constexpr" and args[k] != 1:
                return None
        elif name in constexprs and kind == "constexpr":
            tail.append(constexprs[name])
        else:
            return None
    try:
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except Exception:  # noqa: BLE001 - a Triton without these: keep its own launch
        return None
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    raw_stream = torch._C._cuda_getCurrentRawStream  # Inductor's own launchers' stream lookup
    tail = tuple(tail)

    def launch(new_args: Sequence) -> None:
        run(g0, g1, g2, raw_stream(device_index), function, metadata, None, None, None, *new_args, *tail)

    return launch


@functools.cache
def _knobs():
    """``triton.knobs``, or None on a Triton without it (older than the launcher this module calls)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs


def hooked() -> bool:
    """Whether Triton has a launch hook installed (a profiler): then every launch goes through Triton,
    as on a Triton without ``triton.knobs``."""
    knobs = _knobs()
    return knobs is None or _installed(knobs.runtime.launch_enter_hook) or _installed(knobs.runtime.launch_exit_hook)


def _installed(hook) -> bool:
    """A hook slot holding something to call: a function (older Triton) or a non-empty ``HookChain``."""
    return hook is not None and bool(getattr(hook, "calls", True))


def same_bits(a: Sequence, b: Sequence) -> bool:
    """Whether two launches' outputs hold the same bytes (NaN included)."""
    import torch

    return all(x.shape == y.shape and x.dtype == y.dtype
               and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
               for x, y in zip(a, b))


class Direct:
    """The direct launchers of one plan, per :func:`specialization`: None (Triton's launch for that
    one: not safe, or its check failed) or a launcher, with whether its check has passed."""

    def __init__(self) -> None:
        self.launchers: dict[tuple, tuple[Callable | None, bool]] = {}

    def launch(self, spec: tuple, args: Sequence, outs: Sequence, jit_launch: Callable[[Sequence], Any],
               build: Callable[[Any], Callable | None]) -> str:
        """Fill ``outs`` by launching ``args`` (which hold ``outs``): directly where ``spec`` has a checked
        launcher; else through ``jit_launch(args)`` (Triton's launch, returning its compiled kernel),
        building the direct launcher from what the first returns (``build``), or, at its first use,
        checking it against Triton's launch of the same inputs into fresh outputs. Returns the path taken
        (a key of :data:`LAUNCHES`)."""
        fn, checked = self.launchers.get(spec, (None, False))
        if spec not in self.launchers:
            self.launchers[spec] = (build(jit_launch(args)), False)
        elif fn is None:
            jit_launch(args)
        elif checked:
            fn(args)
            return "direct"
        else:
            self.launchers[spec] = (self._check(fn, args, outs, jit_launch), True)
            return "checked"
        return "triton"

    @staticmethod
    def _check(fn: Callable, args: Sequence, outs: Sequence, jit_launch: Callable) -> Callable | None:
        """``fn`` if its launch of ``args`` fills ``outs`` with the bits Triton's own launch gives; else
        None, ``outs`` holding Triton's results."""
        import torch

        theirs = [torch.empty_like(o) for o in outs]
        jit_launch(_with_outputs(args, outs, theirs))
        try:
            fn(args)
            why = None if same_bits(outs, theirs) else "its outputs differed from Triton's own launch"
        except Exception as e:  # noqa: BLE001 - a launcher this Triton refuses: keep Triton's launch
            why = f"it failed: {type(e).__name__}: {e}"[:200]
        if why is None:
            return fn
        for o, t in zip(outs, theirs):
            o.copy_(t)
        log.warning("miner: a direct Triton launch is not used for this kernel (%s); Triton launches it", why)
        return None


def _with_outputs(args: Sequence, outs: Sequence, other: Sequence) -> list:
    """``args`` with each of ``outs`` (by identity) replaced by the matching tensor of ``other``."""
    swap = {id(o): n for o, n in zip(outs, other)}
    return [swap.get(id(a), a) for a in args]
