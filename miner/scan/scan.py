"""``miner scan``: build zoo models, compile them, and save their post-grad graphs.

Each model is scanned in its own Python process (``python -m miner.scan <args>``), so a
crash, a hang (``timeout``) or an out-of-memory in one model is recorded as a failed
``ScanResult`` and the other models go on. The worker saves each graph, then the
``ScanResult`` last: a ``*.scan.json`` that says ``ok`` means every graph it names is on
disk. A later scan reuses those (that is also how an interrupted scan resumes), unless
``force``; failed scans are always retried.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from miner.core.errors import WorkspaceError
from miner.core.records import ScanResult
from miner.core.workspace import Workspace

DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class ScanRequest:
    model: str
    preset: str = "tiny"
    modes: tuple[str, ...] = ("train",)
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 autocast on CUDA
    batch: int | None = None  # override the preset's batch size / sequence length
    seq: int | None = None
    profile: bool = False  # also time and profile the compiled step (miner.scan.profile)


def reusable(ws: Workspace, model: str, preset: str, mode: str,
             batch_seq: tuple[int, int] | None = None, problems: list[str] | None = None) -> ScanResult | None:
    """The saved result of an earlier successful scan (of that input shape) whose graphs all read back.

    A saved file that does not parse (truncated, another schema) is never reused: its reason is
    appended to ``problems`` and the scan captures that (model, mode) again.
    """
    try:
        result = ws.load_scan(model, preset, mode)
        if result is None or not result.ok or not all(ws.graph_path(k).exists() for k in result.graphs):
            return None
        for key in result.graphs:
            ws.load_graph(key)
    except WorkspaceError as e:
        if problems is not None:
            problems.append(str(e))
        return None
    saved = result.provenance.get("batch_seq")
    if batch_seq is not None and saved is not None and tuple(saved) != tuple(batch_seq):
        return None
    return result


def summarize_graphs(graphs) -> tuple[dict[str, int], int]:
    categories = Counter(n.category for g in graphs for n in g.nodes if n.op == "call_function")
    kernels = sum(len(g.kernels) for g in graphs)
    return dict(sorted(categories.items())), kernels


# --------------------------------------------------------------------------- worker (one process per model)

def scan_in_process(req: ScanRequest, ws: Workspace, progress: Callable[[str], None]) -> list[ScanResult]:
    """Build ``req.model`` and capture each of its modes here; saves graphs and results."""
    import torch

    import miner_models as models
    from miner.scan.capture import capture_step, versions

    if req.batch or req.seq:  # this worker process is ours alone: override the preset's input shape
        batch, seq = models.base.SHAPES[req.preset]
        models.base.SHAPES[req.preset] = (req.batch or batch, req.seq or seq)
    results = []
    for mode in req.modes:
        t0 = time.perf_counter()
        try:
            torch.manual_seed(0)
            progress(f"{mode}: building")
            built = models.resolve(req.model).build(req.preset, mode, req.device)
            autocast = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
                req.dtype, torch.bfloat16 if req.device.startswith("cuda") else None)
            outcome = capture_step(built.model, built.inputs, built.loss, name=req.model, preset=req.preset,
                                   mode=mode, device=req.device, autocast_dtype=autocast,
                                   progress=lambda s: progress(f"{mode}: {s}"), profile=req.profile)
            if outcome.profile is not None:
                from miner.scan.profile import save as save_profile
                save_profile(ws, outcome.profile)
            for old in ws.graph_files([req.model]):
                if old.parent.name == req.preset and old.name.startswith(f"{mode}-"):
                    old.unlink()
            for g in outcome.graphs:
                ws.save_graph(g)
            categories, kernels = summarize_graphs(outcome.graphs)
            result = ScanResult(req.model, req.preset, mode, req.device, True,
                                graphs=tuple(g.key for g in outcome.graphs), graph_breaks=outcome.graph_breaks,
                                seconds=round(outcome.seconds, 2), nodes_by_category=categories, kernels=kernels,
                                provenance={**outcome.graphs[0].provenance, "phase_seconds": outcome.phase_seconds,
                                            "batch_seq": list(models.base.SHAPES[req.preset])})
        except Exception as e:  # one broken model or mode must never stop the scan
            progress(f"{mode}: FAILED: {one_line(e)}")
            traceback.print_exc(file=sys.stderr)
            result = ScanResult(req.model, req.preset, mode, req.device, False, error=one_line(e),
                                seconds=round(time.perf_counter() - t0, 2), provenance=versions())
        ws.save_scan(result)
        results.append(result)
        progress(f"{mode}: {'done' if result.ok else 'failed'} in {result.seconds:.1f}s")
    return results


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m miner.scan")
    p.add_argument("--model", required=True)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--modes", default="train")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--workspace", default=".")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    req = ScanRequest(a.model, a.preset, tuple(a.modes.split(",")), a.device, a.dtype, a.batch, a.seq, a.profile)

    def progress(msg: str) -> None:
        print(f"PROGRESS {msg}", flush=True)

    results = scan_in_process(req, Workspace(a.workspace), progress)
    return 0 if all(r.ok for r in results) else 1


# --------------------------------------------------------------------------- orchestrator

def worker_command() -> list[str]:
    """``python -m miner.scan`` that imports this very ``miner`` package, from any directory.

    The worker runs in the user's directory (their factory modules and checkpoint paths resolve
    there), yet must not pick up another installed copy of miner: it imports ``miner`` from the
    folder this one came from, then takes that folder off ``sys.path`` again, so the checkout's
    other top-level folders (``models``, ``fusions``, ``tests``) shadow nothing of the user's.
    """
    root = str(Path(__file__).resolve().parents[2])
    boot = ("import sys; sys.path.insert(0, {r!r}); import miner.scan.scan as s; sys.path.remove({r!r}); "
            "sys.argv[0] = 'python -m miner.scan'; sys.exit(s.worker_main())").format(r=root)
    return [sys.executable, "-c", boot]


def compile_threads(jobs: int) -> int:
    """Inductor compile workers per model when ``jobs`` models compile at once: the CPUs, shared."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _run_worker(req: ScanRequest, ws: Workspace, timeout: float, echo: Callable[[str], None],
                log_dir: Path, threads: int | None = None) -> list[ScanResult]:
    cmd = [*worker_command(), "--model", req.model, "--preset", req.preset,
           "--modes", ",".join(req.modes), "--device", req.device, "--dtype", req.dtype,
           "--workspace", str(ws.root.resolve())]
    cmd += [f"--batch={req.batch}"] if req.batch else []
    cmd += [f"--seq={req.seq}"] if req.seq else []
    cmd += ["--profile"] if req.profile else []
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{req.model.replace('/', '_').replace(':', '_')}.{req.preset}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads is not None and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:  # the user's setting wins
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    started = time.time()
    with open(log_path, "w") as log:
        # the user's directory: a relative checkpoint dir or a factory module there resolves as they typed it
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=os.getcwd())

        def pump():
            for line in proc.stdout:
                if line.startswith("PROGRESS "):
                    echo(f"[{req.model}] {line[9:].rstrip()}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
            problem = None if code == 0 else f"worker exited with code {code} (see {log_path})"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            problem = f"timed out after {timeout:.0f}s"
        reader.join(timeout=5)

    results = []
    for mode in req.modes:
        try:
            saved = ws.load_scan(req.model, req.preset, mode)
        except WorkspaceError:  # the corrupt file of before, not rewritten: the worker died first
            saved = None
        fresh = saved is not None and ws.scan_path(req.model, req.preset, mode).stat().st_mtime >= started
        if not fresh:  # the worker died before it could record this mode
            saved = ScanResult(req.model, req.preset, mode, req.device, False, error=problem or "no result written",
                               seconds=round(time.time() - started, 2))
            ws.save_scan(saved)
        results.append(saved)
    return results


def scan(model_names: list[str], *, preset: str = "tiny", modes: tuple[str, ...] = ("train",), device: str = "cpu",
         dtype: str = "auto", batch: int | None = None, seq: int | None = None, workspace: Workspace, force: bool = False, jobs: int = 1,
         timeout: float = DEFAULT_TIMEOUT_S, echo: Callable[[str], None] = print,
         profile: bool = False) -> list[ScanResult]:
    """Scan each model (in its own process), reusing earlier results unless ``force``.

    ``profile``: also profile the compiled step in the same process (``miner.scan.profile``); a
    saved scan is then reused only when its profile is saved too."""
    import miner_models as models
    from miner.scan.profile import profile_path

    default_batch, default_seq = models.base.SHAPES[preset]
    batch_seq = (batch or default_batch, seq or default_seq)
    results: dict[tuple[str, str], ScanResult] = {}
    todo: list[ScanRequest] = []
    for m in model_names:
        missing = []
        for mode in modes:
            problems: list[str] = []
            prior = None if force else reusable(workspace, m, preset, mode, batch_seq, problems)
            for problem in problems:
                echo(f"[{m}] not reusing a corrupt saved file, capturing {mode} again: {problem}")
            if profile and prior is not None and not profile_path(workspace, m, preset, mode).exists():
                prior = None
            if prior is not None:
                results[m, mode] = dataclasses.replace(prior, reused=True)
            else:
                missing.append(mode)
        if missing:
            todo.append(ScanRequest(m, preset, tuple(missing), device, dtype, batch, seq, profile))
        else:
            echo(f"[{m}] reusing saved graphs ({', '.join(modes)}); --force to recompile")

    log_dir = workspace.captures / "logs"
    done = len(model_names) - len(todo)

    threads = compile_threads(min(jobs, len(todo)))

    def run_one(req: ScanRequest) -> list[ScanResult]:
        nonlocal done
        echo(f"[{req.model}] starting ({', '.join(req.modes)}, preset {req.preset}, {req.device})")
        out = _run_worker(req, workspace, timeout, echo, log_dir, threads)
        done += 1
        status = "ok" if all(r.ok for r in out) else "FAILED: " + "; ".join(r.error or "" for r in out if not r.ok)
        echo(f"[{req.model}] {status} ({done}/{len(model_names)} models)")
        return out

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for out in pool.map(run_one, todo):
            for r in out:
                results[r.model, r.mode] = r
    return [results[m, mode] for m in model_names for mode in modes]


def format_table(results: list[ScanResult]) -> str:
    """One row per (model, mode): graphs, nodes by category, kernels, breaks, seconds."""
    cats = ("pointwise", "reduction", "view", "matmul", "other")
    header = ["model", "mode", "graphs", "nodes", *cats, "kernels", "breaks", "seconds", "status"]
    rows = []
    for r in results:
        phases = Counter(k.phase for k in r.graphs)
        graphs = "+".join(f"{n}{p[0]}" for p, n in sorted(phases.items(), reverse=True)) or "0"
        nodes = sum(r.nodes_by_category.values())
        other = nodes - sum(r.nodes_by_category.get(c, 0) for c in cats[:-1])
        status = ("reused" if r.reused else "ok") if r.ok else f"FAILED {r.error}"
        rows.append([r.model, r.mode, graphs, str(nodes), *(str(r.nodes_by_category.get(c, 0)) for c in cats[:-1]),
                     str(other), str(r.kernels), str(r.graph_breaks), f"{r.seconds:.1f}", status])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in (0, 1, len(header) - 1) else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows]
    return "\n".join(lines) + "\n(graphs: f = forward, b = backward, i = inference)"


def results_json(results: list[ScanResult]) -> str:
    from miner.core.records import to_json
    return json.dumps([to_json(r) for r in results], indent=1)


