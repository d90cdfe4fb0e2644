"""A peer in the same harness: Liger-Kernel on llama (``miner verify --peer liger``).

Each variant runs in its OWN process (``python -m miner.check.peers VARIANT --out FILE``):
``apply_liger_kernel_to_llama(model=...)`` also replaces ``modeling_llama``'s module-level
classes, so every later model of the same process would silently run Liger too. Variants:

* ``compile``: ``torch.compile`` default (the reference row);
* ``compile+liger``: Liger's rope, rms_norm, swiglu and cross_entropy, then ``torch.compile``;
* ``eager+liger-flce``: Liger's rope, rms_norm, swiglu and fused linear cross-entropy, no compile;
* ``compile+liger-flce``: the same compiled (known to fail to compile: the failure is the row);
* ``eager``: no compile, no Liger.

A row: ``{"variant", "ms", "p20", "p80", "steps", "peak_gib", "first_step_s", "loss", "error",
"liger", "torch"}``; steps timed one after another (one variant per process: no alternation).
liger-kernel is an optional extra (``pip install 'miner[peers]'``), imported only in the child;
when it is missing the row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

VARIANTS = ("compile", "compile+liger", "eager+liger-flce", "compile+liger-flce", "eager")
DEFAULT_VARIANTS = ("compile", "compile+liger", "eager+liger-flce", "compile+liger-flce")
MISSING = "liger-kernel is not installed (optional extra: pip install 'miner[peers]')"
_PATCH = {"compile+liger": dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=True,
                                fused_linear_cross_entropy=False),
          "eager+liger-flce": dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                   fused_linear_cross_entropy=True)}
_PATCH["compile+liger-flce"] = _PATCH["eager+liger-flce"]


def run_variant(variant: str, *, model: str = "llama", preset: str = "base", steps: int = 15, warmup: int = 3,
                device: str = "cuda") -> dict:
    """One variant in this process (call it in a fresh one): its row."""
    import torch

    import miner_models as zoo
    from miner.bench import roofline as rl
    from miner.check.verify import make_step, time_step

    row = {"variant": variant, "model": model, "preset": preset, "torch": torch.__version__, "liger": None,
           "ms": None, "p20": None, "p80": None, "steps": 0, "peak_gib": None, "first_step_s": None, "loss": None,
           "error": None}
    if variant not in VARIANTS:
        row["error"] = f"unknown peer variant {variant!r}; variants: {', '.join(VARIANTS)}"
        return row
    if "liger" in variant:
        try:
            import liger_kernel
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except ImportError:
            row["error"] = MISSING
            return row
        row["liger"] = getattr(liger_kernel, "__version__", None) or _dist_version("liger-kernel")
    built = zoo.resolve(model).build(preset, "train", device)
    net = built.model
    if "liger" in variant:
        apply_liger_kernel_to_llama(model=net, **_PATCH[variant])
    runner = torch.compile(net) if variant.startswith("compile") else net
    step = make_step(runner, built.inputs, built.loss, "train", device)
    import time

    try:
        t0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            _, loss = step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        row["first_step_s"] = round(time.perf_counter() - t0, 1)
        times, peak = [], 0
        for _ in range(steps):
            ms, p = time_step(step, device)
            times.append(ms)
            peak = max(peak, p)
        m, lo, hi = rl.summarize(times)
        row.update(ms=m, p20=lo, p80=hi, steps=len(times), peak_gib=peak / 2**30, loss=float(loss.detach().float()))
    except Exception as e:  # a variant that fails to compile is a result
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
    return row


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def run_peers(variants: Sequence[str] = DEFAULT_VARIANTS, *, preset: str = "base", steps: int = 15, warmup: int = 3,
              device: str = "cuda", timeout_s: float = 300, log: Callable[[str], None] = print) -> list[dict]:
    """Every variant in its own child process; a child that crashes or times out is a row with its error."""
    rows = []
    for v in variants:
        log(f"peer {v}: own process")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [sys.executable, "-m", "miner.check.peers", v, "--out", str(out), "--preset", preset,
                   "--steps", str(steps), "--warmup", str(warmup), "--device", device]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
                if out.exists():
                    row = json.loads(out.read_text())
                else:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                    row = {"variant": v, "error": f"child exited {proc.returncode}: {tail[0][:300]}"}
            except subprocess.TimeoutExpired:
                row = {"variant": v, "error": f"timed out after {timeout_s:.0f} s"}
        rows.append(row)
        log(f"peer {v}: {describe(row)}")
    ref = next((r for r in rows if r.get("variant") == "compile" and r.get("ms")), None)
    for r in rows:
        r["speedup"] = ref["ms"] / r["ms"] if ref and r.get("ms") else None
    return rows


def describe(row: dict) -> str:
    if row.get("error"):
        return f"FAILED {row['error']}"
    return (f"{row['ms']:.2f} ms ({row['p20']:.2f}-{row['p80']:.2f}), peak {row['peak_gib']:.2f} GiB, "
            f"first steps {row['first_step_s']} s")


def peer_table(rows: Sequence[dict]) -> str:
    lines = ["| variant | ms (p20-p80) | vs compile | step peak GiB | liger | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['variant']} | - | - | - | {r.get('liger') or '-'} | {r['error']} |")
            continue
        sp = "-" if r.get("speedup") is None else f"{r['speedup']:.3f}x"
        lines.append(f"| {r['variant']} | {r['ms']:.2f} ({r['p20']:.2f}-{r['p80']:.2f}) | {sp} | "
                     f"{r['peak_gib']:.2f} | {r.get('liger') or '-'} | {r['steps']} steps |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m miner.check.peers", description="one peer variant (own process)")
    p.add_argument("variant", choices=VARIANTS)
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="base")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    row = run_variant(a.variant, preset=a.preset, steps=a.steps, warmup=a.warmup, device=a.device)
    Path(a.out).write_text(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
