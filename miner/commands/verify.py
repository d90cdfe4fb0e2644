"""miner verify: model steps with torch.compile vs torch.compile + the promoted fusions."""

from __future__ import annotations

import sys
from pathlib import Path

from miner.core import executor
from miner.core.errors import UsageError

HELP = ("time and compare a model's training / inference step compiled with and without the promoted "
        "fusions (speedup, peak memory, loss/logits/grad parity, fusion match counts); --ab: each fusion "
        "alone in each model, a control for the noise band, kernels removed/added, the gate; needs CUDA")


def add_arguments(p) -> None:
    p.add_argument("--models", default="bert,gpt2", metavar="M,...", help="zoo models (default bert,gpt2)")
    p.add_argument("--mode", default="train", metavar="train,infer",
                   help="train: forward+loss+backward; infer: forward under no_grad; both or a comma list "
                        "(default train)")
    p.add_argument("--preset", default=None, help="zoo preset (default base on CUDA, tiny with --allow-cpu)")
    p.add_argument("--batch", type=_sizes, default=None, metavar="B[,B...]",
                   help="batch size (default: the preset's, 16 for base); --ab: a list, each size its own A/B")
    p.add_argument("--seq", type=_sizes, default=None, metavar="S[,S...]",
                   help="sequence length (default: the preset's, 512 for base); --ab: a list, every "
                        "(batch, seq) of the two lists its own A/B (e.g. --batch 8,32 --seq 256,1024)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20; --ab: see --rounds)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps, the first compiles (default 3)")
    ab = p.add_argument_group("in-model A/B (--ab)")
    ab.add_argument("--ab", action="store_true",
                    help="per model and mode: default, control (default again: the noise band), all fusions "
                         "(gate open), each firing fusion alone, all with the gate on; alternating timed steps")
    ab.add_argument("--compile-modes", default="default", metavar="M,...",
                    help="default (dynamic=False), dynamic (dynamic=True), reduce-overhead (CUDA graphs; "
                         "inference only) (default: default)")
    ab.add_argument("--rounds", type=int, default=15, help="alternating timed rounds, one step per variant each "
                                                           "(default 15)")
    ab.add_argument("--model-budget", type=float, default=None, metavar="S",
                    help="per model and mode: compile no further variant after S seconds (recorded); "
                         "--time-budget caps the whole run")
    ab.add_argument("--profile-steps", type=int, default=3,
                    help="steps per variant under torch.profiler for the kernel diff (0: none; default 3)")
    ab.add_argument("--candidates", default=None, metavar="ID,...",
                    help="A/B these candidates (ungated) instead of the promoted fusions: the evidence "
                         "`miner promote` requires (with --record: candidates/<id>/in_model.json)")
    ab.add_argument("--parity-reference", choices=("float32", "none"), default="float32",
                    help="what parity is judged against: the same seeded step compiled in float32 (default: one "
                         "compile more) or none (the fixed tolerances; dropout kernels of another stream are "
                         "judged with their masks injected either way)")
    ab.add_argument("--knobs", default=None, metavar="K,...",
                    help="also measure these knobs, each alone (knob:<k>) and with the fusions (knob:<k>+fusions): "
                         "sdpa_reduced_math, reduce_overhead, max_autotune_no_cudagraphs, coordinate_descent, "
                         "combo_kernels, benchmark_fusion, all, a+b (together), module:attr (your own Knob)")
    ab.add_argument("--fusion-variants", default="all,alone,gated", metavar="V,...",
                    help="fusion variants to compile: all (gate open), alone (each firing fusion: with all, alone "
                         "over the default; with --knobs, alone on top of each knob, knob:<k>+alone:<f>), gated "
                         "(default: all,alone,gated; alone,gated to measure each fusion on top of the knobs only), "
                         "none (with --knobs: each knob alone and with the gated fusions, what a user of that knob "
                         "gets, and nothing else)")
    ab.add_argument("--no-fusions", action="store_true",
                    help="with --knobs: the knobs alone against the default, no fusion loaded (one compile per "
                         "knob instead of two)")
    ab.add_argument("--record", action="store_true",
                    help="write each fusion-alone verdict into fusions/<name>/wins.json (in_model): the gate's "
                         "evidence (CUDA runs only)")
    ab.add_argument("--record-from", metavar="VERIFY_JSON",
                    help="no run: record the verdicts of a saved `verify --ab` run (e.g. from a GPU machine)")
    ab.add_argument("--peer", choices=("liger",), default=None,
                    help="also run Liger-Kernel on llama (each variant in its own process)")
    ab.add_argument("--peer-only", action="store_true", help="run only the --peer rows")
    ab.add_argument("--peer-variants", default=None, metavar="V,...",
                    help="peer variants (default compile,compile+liger,eager+liger-flce,compile+liger-flce)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="skip the remaining models once this many seconds have passed")
    p.add_argument("--out", metavar="DIR", help="results folder (default reports/gpu/<date>-<gpu>/)")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--allow-cpu", action="store_true",
                   help="smoke-run on the CPU (tiny preset, Triton interpreter); its times mean nothing")
    executor.add_arguments(p)


def run(args) -> int:

    if args.allow_cpu:
        from miner.commands import interpret_on_cpu

        interpret_on_cpu("verify")
    from miner import bench
    from miner.check import verify
    from miner.core.workspace import Workspace

    ws = Workspace(args.workspace)
    if args.record_from:
        return _record_from(ws, Path(args.record_from))
    # a cluster at --address has the GPUs, not necessarily this machine
    device = "cuda" if executor.elsewhere(args) and not args.allow_cpu else \
        bench.require_cuda("miner verify", allow_cpu=args.allow_cpu)
    preset = args.preset or ("base" if device == "cuda" else "tiny")
    modes = _modes(args.mode)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models is empty")
    out_dir = Path(args.out) if args.out else None
    if args.ab or args.peer:
        return _run_ab(args, ws, device, preset, modes, models, out_dir)
    done: list = []

    def on_result(r):
        done.append(r)
        if not args.no_save:
            target = out_dir or bench.today_dir(_env_like(r.env), ws.reports)
            verify.save(done, target)

    options = verify.VerifyOptions(modes=tuple(modes), preset=preset, device=device,
                                   batch=_single(args.batch, "batch"), seq=_single(args.seq, "seq"),
                                   warmup=args.warmup, steps=args.steps)
    results = _spread(args, models, options, ws=ws, on_result=on_result)
    print()
    print(verify.markdown_table(results))
    if not args.no_save and results:
        print(f"wrote {(out_dir or bench.today_dir(_env_like(results[0].env), ws.reports)) / 'verify.json'}")
    bad = [r for r in results if r.error or (r.parity is not None and not r.parity.ok)]
    return 1 if bad else 0


def _sizes(text: str) -> list[int]:
    """``--batch`` / ``--seq``: one size or a comma list of sizes."""
    import argparse

    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes as integers, e.g. 8,16,32") from None
    if not sizes or any(n < 1 for n in sizes) or len(set(sizes)) < len(sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct sizes of at least 1")
    return sizes


def _single(sizes: list[int] | None, name: str) -> int | None:
    if sizes is not None and len(sizes) > 1:
        raise UsageError(f"--{name} {','.join(map(str, sizes))}: several sizes need --ab (one A/B per size)")
    return None if sizes is None else sizes[0]


def _modes(text: str) -> tuple[str, ...]:
    modes = ("train", "infer") if text == "both" else tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in ("train", "infer")]
    if bad or not modes:
        raise UsageError(f"--mode {text!r}: use train, infer, both or a comma list of train,infer")
    return modes


def _run_ab(args, ws, device: str, preset: str, modes, models, out_dir: Path | None) -> int:
    from miner import bench
    from miner.check import abrun, peers

    if args.rounds < 1 or args.warmup < 1 or args.profile_steps < 0:
        raise UsageError("--rounds and --warmup must be at least 1, --profile-steps at least 0")
    compile_modes = [c.strip() for c in args.compile_modes.split(",") if c.strip()]
    abrun.plan(modes, compile_modes)  # a bad mode fails before anything compiles
    ab_run = _ab_run(args, preset, device, modes, compile_modes)  # a bad fusion variant fails here
    if args.no_fusions and (not args.knobs or args.candidates or args.record):
        raise UsageError("--no-fusions measures knobs alone: give --knobs, and neither --candidates nor --record")
    if args.knobs:
        from miner.check import knobs

        knobs.parse(args.knobs)  # an unknown knob fails here, listing the valid names
    peer_variants = [v.strip() for v in (args.peer_variants or ",".join(peers.DEFAULT_VARIANTS)).split(",")]
    bad = [v for v in peer_variants if v not in peers.VARIANTS]
    if bad:
        raise UsageError(f"unknown peer variant {bad[0]!r}; variants: {', '.join(peers.VARIANTS)}")
    done: list = []
    rows: list = []

    def target() -> Path:
        env = next((r.env for r in done if r.env), None) or verify_env(device)
        return out_dir or bench.today_dir(_env_like(env), ws.reports)

    def on_result(r):
        done.append(r)
        if not args.no_save:
            abrun.save(done, target(), rows)

    if not args.peer_only:
        try:
            _spread(args, models, ab_run, ws=ws, on_result=on_result)
        except KeyboardInterrupt:
            if done and not args.no_save:
                print(f"interrupted: what was measured is in {target() / 'verify.json'} "
                      f"({len(done)} model row(s); evidence not recorded)", file=sys.stderr)
            raise
    if args.peer:
        rows.extend(peers.run_peers(peer_variants, preset=preset, steps=args.rounds, warmup=args.warmup,
                                    device=device, log=_log))
    print()
    if done:
        print(abrun.summary_table(done))
        for r in done:  # a band wider than 1%: what sets it, and the rounds that would narrow it
            if note := abrun.band_note(r):
                print(f"{r.model} {r.mode}/{r.compile}: noise band {abrun.pct(r.noise_band)}.{note}")
    if rows:
        print(peers.peer_table(rows))
    if not args.no_save:
        paths = abrun.save(done, target(), rows)
        print(f"wrote {paths[0]} and {paths[1].name}")
        if args.record:
            _print_recorded(abrun.record(ws, done, source=str(paths[0])), done)
    elif args.record:
        _print_recorded(abrun.record(ws, done), done)
    bad = failures(done)
    for why in bad:  # the exit status says something went wrong: say what, last, where a user looks
        print(f"exit 1: {why}", file=sys.stderr)
    return 1 if bad else 0


def failures(done) -> list[str]:
    """Why an A/B exits 1, one line each: a model that failed (not one skipped), a variant whose parity
    failed or could not be judged (its speedup is then never a win)."""
    bad = [f"{r.model} {r.mode}/{r.compile}: {r.error}" for r in done if r.error and not r.error.startswith("skipped")]
    return bad + [f"{r.model} {r.mode}/{r.compile} {v.name}: parity " + ("not judged" if v.parity.unjudged else "failed")
                  for r in done for v in r.variants if v.parity is not None and not v.parity.ok]


def _ab_run(args, preset: str, device: str, modes, compile_modes):
    """The ``ABRun`` of ``miner verify --ab``: the command line's options, checked by the caller."""
    from miner.check.ab import FUSION_VARIANTS, ABOptions
    from miner.check.abrun import ABRun

    options = ABOptions(preset=preset, device=device, warmup=args.warmup, rounds=args.rounds,
                        profile_steps=args.profile_steps, parity_reference=args.parity_reference == "float32",
                        fusion_variants=_fusion_variants(args.fusion_variants, bool(args.knobs)) or FUSION_VARIANTS)
    return ABRun(options, modes=tuple(modes), compile_modes=tuple(compile_modes),
                 batch=None if args.batch is None else tuple(args.batch),
                 seq=None if args.seq is None else tuple(args.seq),
                 model_budget_s=args.model_budget, knobs=args.knobs, fusions=not args.no_fusions,
                 candidates=tuple(c.strip() for c in (args.candidates or "").split(",") if c.strip()))


def _fusion_variants(text: str, knobs: bool = False) -> tuple[str, ...]:
    from miner.check.ab import FUSION_VARIANTS

    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    if chosen == ("none",):
        if not knobs:
            raise UsageError("--fusion-variants none: give --knobs (without them nothing but the default is compiled)")
        return chosen
    bad = [v for v in chosen if v not in FUSION_VARIANTS]
    if bad:
        raise UsageError(f"--fusion-variants: unknown {bad[0]!r}; variants: {', '.join(FUSION_VARIANTS)}, "
                         "or none with --knobs")
    if "alone" in chosen and "all" not in chosen and not knobs:
        raise UsageError("--fusion-variants: alone needs all or --knobs (the matches of all, or of each "
                         "knob:<k>+fusions, say which fusions fire)")
    return chosen


def _spread(args, models, options, *, ws, on_result) -> list:
    """``run_verify`` (``options``: ``VerifyOptions``) / ``abrun.run_all`` (``ABRun``) here (``--executor
    local``) or one task per model (``ray``)."""
    from miner.check import abrun, verify

    ex = executor.make(args.executor, address=args.address)
    if not ex.remote:
        run = abrun.run_all if isinstance(options, abrun.ABRun) else verify.run_verify
        return run(models, options, time_budget_s=args.time_budget, workspace=ws, on_result=on_result, log=_log)
    from miner.check.remote import run_on
    try:
        if not getattr(options, "candidates", ()) and not getattr(options, "knobs", None):
            verify.load_fusions(ws.root)  # none to verify: the one-line error here, not one per task
        return run_on(ex, models, options, workspace=ws, time_budget_s=args.time_budget, on_result=on_result,
                      log=_log)
    finally:
        ex.close()


def _log(line: str) -> None:
    print(line, flush=True)  # a run cut short by a time limit still shows how far it got


def _print_recorded(written, results, where: str = "") -> None:
    """Each evidence file ``--record`` wrote, or why it wrote none (``abrun.nothing_recorded``)."""
    from miner.check import abrun

    if not written:
        print(f"{where}{abrun.nothing_recorded(results)}")
    for p in written:
        print(f"recorded in-model evidence: {p}")


def _record_from(ws, path: Path) -> int:
    from miner.check import abrun

    results, _ = abrun.load(path)
    _print_recorded(abrun.record(ws, results, source=str(path)), results, f"{path}: ")
    return 0


def verify_env(device: str) -> dict:
    from miner.check.verify import run_env
    return run_env(device)


def _env_like(env: dict):
    from miner.bench.timing import Env
    return Env(device=env.get("device", "cpu"), gpu=env.get("gpu", "cpu"), torch=env.get("torch", ""),
               triton=env.get("triton", ""), date=env.get("date", "0000-00-00"), copy_gbps=0.0, l2_bytes=0)
