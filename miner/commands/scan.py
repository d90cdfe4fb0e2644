"""``miner scan``: compile zoo models with Inductor and capture every post-grad graph."""

from __future__ import annotations

import os
import sys
import time

from miner.core import executor
from miner.core.errors import UsageError
from miner.core.workspace import Workspace
from miner.report.terminal import next_step, say

HELP = "build models from their configs, compile them with Inductor, capture every post-grad graph"


def add_arguments(p) -> None:
    p.add_argument("--models", required=True,
                   help="comma-separated zoo names (see `miner models`), model_types, groups (hf-suite, all), "
                        "local checkpoint dirs or package.module:factory")
    p.add_argument("--preset", default=None, help="tiny (CPU default) or base (published size; CUDA default)")
    p.add_argument("--mode", default="train", help="train, infer, or both: train,infer (default: train)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="autocast dtype; auto = float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--batch", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--seq", type=int, default=None, help="override the preset's sequence length")
    p.add_argument("--force", action="store_true", help="recompile even if saved graphs exist")
    p.add_argument("--jobs", type=int, default=None,
                   help="models scanned at once, each in its own process (default: one per CPU, at most 4 and at "
                        "most the number of models; the CPUs are split between them for Inductor's compile workers)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per model before it is killed (default 1800)")
    p.add_argument("--profile", action="store_true",
                   help="also profile the compiled step in the same process (as `miner profile`, one model at a time)")
    executor.add_arguments(p)


def expand_models(spec: str) -> list[str]:
    import miner_models as models
    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise UsageError("--models is empty")
    from miner.check.knobs import of_label

    for n in names:
        of_label(n)  # <model>@<knob>: an unknown knob is a usage error before anything compiles
    expand = getattr(models, "expand", None)
    if expand is not None:
        return expand(names)
    for n in names:
        models.resolve(n)  # raises UsageError listing the valid names
    return names


def default_jobs(n_models: int) -> int:
    """One model per CPU (at most 4): dynamo, AOTAutograd and Inductor's lowering are one Python
    thread per model, so a lone model leaves the other cores to the C++/Triton compile workers only.
    On this 2-core machine bert + gpt2 took 124-132 s one after the other and 102 s side by side with
    one compile thread each (``miner.scan.scan.scan`` splits the CPUs between the jobs)."""
    return max(1, min(4, os.cpu_count() or 1, n_models))


def require_device(args) -> None:
    """``--device cuda`` needs a GPU here, unless the work goes to a Ray cluster elsewhere (``--address``)."""
    if args.device.startswith("cuda") and not executor.elsewhere(args):
        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device cuda, but torch sees no CUDA device")


def scan_options(args, *, preset: str, modes: tuple[str, ...], jobs: int, profile: bool):
    """The ``ScanOptions`` of ``miner scan`` / ``miner profile``'s command line."""
    from miner.scan.scan import DEFAULT_TIMEOUT_S, ScanOptions

    return ScanOptions(preset=preset, modes=tuple(modes), device=args.device, dtype=args.dtype, batch=args.batch,
                       seq=args.seq, profile=profile, force=args.force, jobs=jobs,
                       timeout=args.timeout or DEFAULT_TIMEOUT_S)


def run(args) -> int:
    from miner.scan.scan import format_table, scan

    names = expand_models(args.models)
    modes = tuple(m.strip() for m in args.mode.split(",") if m.strip())
    bad = [m for m in modes if m not in ("train", "infer")]
    if bad or not modes:
        raise UsageError(f"unknown mode {','.join(bad) or '(none)'}; modes: train, infer")
    require_device(args)
    preset = args.preset or ("base" if args.device.startswith("cuda") else "tiny")
    t0 = time.perf_counter()
    say(f"miner scan: {len(names)} model(s), preset {preset}, mode {','.join(modes)}, device {args.device}, "
        f"workspace {args.workspace}")
    # one profile at a time on the local pool (a profile times the GPU); on Ray each task has its own GPU
    jobs = 1 if args.profile and args.executor == "local" else args.jobs or default_jobs(len(names))
    ex = executor.make(args.executor, address=args.address, jobs=jobs)
    try:
        results = scan(names, scan_options(args, preset=preset, modes=modes, jobs=jobs, profile=args.profile),
                       workspace=Workspace(args.workspace), echo=say, executor=ex)
    finally:
        ex.close()
    say()
    say(format_table(results))
    failed = [r for r in results if not r.ok]
    say(f"\n{len(results) - len(failed)}/{len(results)} scans ok in {time.perf_counter() - t0:.1f}s; "
        f"graphs under {Workspace(args.workspace).captures}")
    if failed:
        from miner.scan.scan import ScanRequest, log_name

        logs = Workspace(args.workspace).captures / "logs"
        say(f"miner scan: {len(failed)} scan(s) failed:", file=sys.stderr)
        for r in failed:  # the whole reason: the table's status column is cut
            log = logs / log_name(ScanRequest(model=r.model, preset=r.preset))
            say(f"  {r.model}/{r.mode}: {r.error or 'no reason recorded'}"
                + (f" (log: {log})" if log.exists() else ""), file=sys.stderr)
        next_step("`miner scan --models ...` again for the failed ones (saved graphs are reused), or `miner mine`")
        return 1
    next_step("`miner mine`")
    return 0
