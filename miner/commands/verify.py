"""miner verify: model steps with torch.compile vs torch.compile + the promoted fusions."""

from __future__ import annotations

from pathlib import Path

from miner.core.errors import UsageError

HELP = ("time and compare a model's training / inference step compiled with and without the promoted "
        "fusions (speedup, peak memory, loss/logits/grad parity, fusion match counts); needs CUDA")


def add_arguments(p) -> None:
    p.add_argument("--models", default="bert,gpt2", metavar="M,...", help="zoo models (default bert,gpt2)")
    p.add_argument("--mode", choices=("train", "infer", "both"), default="train",
                   help="train: forward+loss+backward; infer: forward under no_grad (default train)")
    p.add_argument("--preset", default=None, help="zoo preset (default base on CUDA, tiny with --allow-cpu)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the preset's, 16 for base)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's, 512 for base)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps, the first compiles (default 3)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="skip the remaining models once this many seconds have passed")
    p.add_argument("--out", metavar="DIR", help="results folder (default reports/gpu/<date>-<gpu>/)")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--allow-cpu", action="store_true",
                   help="smoke-run on the CPU (tiny preset, Triton interpreter); its times mean nothing")


def run(args) -> int:
    import os
    import sys

    if args.allow_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        import torch
        if not torch.cuda.is_available():
            if "triton" in sys.modules:
                raise UsageError("--allow-cpu needs TRITON_INTERPRET=1 set before triton is imported: "
                                 "run `TRITON_INTERPRET=1 miner verify --allow-cpu ...`")
            os.environ["TRITON_INTERPRET"] = "1"
    from miner import bench
    from miner.check import verify
    from miner.core.workspace import Workspace

    device = bench.require_cuda("miner verify", allow_cpu=args.allow_cpu)
    preset = args.preset or ("base" if device == "cuda" else "tiny")
    modes = ("train", "infer") if args.mode == "both" else (args.mode,)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models is empty")
    ws = Workspace(args.workspace)
    out_dir = Path(args.out) if args.out else None
    done: list = []

    def on_result(r):
        done.append(r)
        if not args.no_save:
            target = out_dir or bench.today_dir(_env_like(r.env), ws.reports)
            verify.save(done, target)

    results = verify.run_verify(models, modes=modes, preset=preset, device=device, batch=args.batch, seq=args.seq,
                                warmup=args.warmup, steps=args.steps, time_budget_s=args.time_budget,
                                on_result=on_result, workspace=ws)
    print()
    print(verify.markdown_table(results))
    if not args.no_save and results:
        print(f"wrote {(out_dir or bench.today_dir(_env_like(results[0].env), ws.reports)) / 'verify.json'}")
    bad = [r for r in results if r.error or (r.parity is not None and not r.parity.ok)]
    return 1 if bad else 0


def _env_like(env: dict):
    from miner.bench.timing import Env
    return Env(device=env.get("device", "cpu"), gpu=env.get("gpu", "cpu"), torch=env.get("torch", ""),
               triton=env.get("triton", ""), date=env.get("date", "0000-00-00"), copy_gbps=0.0, l2_bytes=0)
