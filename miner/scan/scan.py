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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from miner.core.errors import WorkspaceError
from miner.core.executor import LocalExecutor, Outcome, RayExecutor, Task, one_line
from miner.core.records import CapturedGraph, ScanResult
from miner.core.workspace import Workspace, write_text

DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Capture:
    """What a scan captures of each model: the fields a scan request and the command's options share."""

    preset: str = "tiny"
    modes: tuple[str, ...] = ("train",)
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 autocast on CUDA
    batch: int | None = None  # override the preset's batch size / sequence length
    seq: int | None = None
    # also time and profile the compiled step in the same process (``miner.scan.profile``); a saved
    # scan is then reused only when its profile is saved too
    profile: bool = False


@dataclass(frozen=True)
class ScanRequest(Capture):
    """One model's scan, as a worker process (or a Ray task) gets it."""

    model: str = ""


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
            outcome = capture_step(built, name=req.model, preset=req.preset, mode=mode, device=req.device,
                                   autocast_dtype=autocast,
                                   progress=lambda s: progress(f"{mode}: {s}"), profile=req.profile)
            if outcome.profile is not None:
                from miner.scan.profile import save as save_profile
                save_profile(ws, outcome.profile)
            replace_graphs(ws, req.model, req.preset, mode, outcome.graphs)
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


def replace_graphs(ws: Workspace, model: str, preset: str, mode: str, graphs) -> None:
    """Save ``graphs`` as the (model, preset, mode)'s graphs, removing those an earlier scan left."""
    for old in ws.graph_files([model]):
        if old.parent.name == preset and old.name.startswith(f"{mode}-"):
            old.unlink()
    for g in graphs:
        ws.save_graph(g)


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
    req = ScanRequest(model=a.model, preset=a.preset, modes=tuple(a.modes.split(",")), device=a.device, dtype=a.dtype,
                      batch=a.batch, seq=a.seq, profile=a.profile)

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
                log_dir: Path, threads: int | None = None, cwd: str | None = None) -> list[ScanResult]:
    cmd = [*worker_command(), "--model", req.model, "--preset", req.preset,
           "--modes", ",".join(req.modes), "--device", req.device, "--dtype", req.dtype,
           "--workspace", str(ws.root.resolve())]
    cmd += [f"--batch={req.batch}"] if req.batch else []
    cmd += [f"--seq={req.seq}"] if req.seq else []
    cmd += ["--profile"] if req.profile else []
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / log_name(req)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads is not None and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:  # the user's setting wins
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    started = time.time()
    with open(log_path, "w") as log:
        # the user's directory: a relative checkpoint dir or a factory module there resolves as they typed it
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=cwd or os.getcwd())

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


def _run_local(req: ScanRequest, ws: Workspace, timeout: float, echo: Callable[[str], None], log_dir: Path,
               threads: int) -> list[ScanResult]:
    echo(f"[{req.model}] starting ({', '.join(req.modes)}, preset {req.preset}, {req.device})")
    return _run_worker(req, ws, timeout, echo, log_dir, threads)


def log_name(req: ScanRequest) -> str:
    return f"{req.model.replace('/', '_').replace(':', '_')}.{req.preset}.log"


@dataclass(frozen=True)
class ScanBundle:
    """What a remote scan task returns: its results, graphs, profiles and worker log, as data."""

    results: tuple[ScanResult, ...]
    graphs: tuple[CapturedGraph, ...] = ()
    profiles: tuple = ()  # miner.scan.profile.StepProfile
    log: str = ""
    host: str = ""
    root: str = ""  # the temporary workspace it ran in (errors name files there)
    gpus: str = ""  # CUDA_VISIBLE_DEVICES as Ray set it for the task

    @property
    def where(self) -> str:
        return self.host + (f", GPU {self.gpus}" if self.gpus else "")


def scan_remote(req: ScanRequest, timeout: float, threads: int, cwd: str) -> ScanBundle:
    """A Ray task: scan ``req`` into a temporary workspace (the same worker process, timeout and
    crash handling as the local pool) and return everything it wrote; nothing stays on this machine.

    ``cwd``: the driver's directory, where the worker runs when this machine has it (a local
    cluster), so a user's ``module:factory`` there resolves.
    """
    import socket
    import tempfile

    with tempfile.TemporaryDirectory(prefix="miner-scan-") as tmp:
        ws = Workspace(tmp)
        log_dir = ws.captures / "logs"
        results = _run_worker(req, ws, timeout, lambda s: None, log_dir, threads,
                              cwd=cwd if os.path.isdir(cwd) else tmp)
        graphs, profiles = [], []
        for r in results:
            if r.ok:
                graphs += [ws.load_graph(k) for k in r.graphs]
                if req.profile:
                    from miner.scan import profile as prof
                    path = prof.profile_path(ws, r.model, r.preset, r.mode)
                    if path.exists():
                        profiles.append(prof.load(path))
        log = log_dir / log_name(req)
        return ScanBundle(tuple(results), tuple(graphs), tuple(profiles),
                          log.read_text(errors="replace") if log.exists() else "", socket.gethostname(),
                          str(ws.root.resolve()), os.environ.get("CUDA_VISIBLE_DEVICES", ""))


def store(ws: Workspace, bundle: ScanBundle) -> list[ScanResult]:
    """Save a remote scan's files into ``ws`` with the workspace's own writers (atomic), each
    ScanResult last, as the local worker does; returns the results."""
    here = str(ws.root.resolve())
    results = [dataclasses.replace(r, error=r.error.replace(bundle.root, here)) if r.error and bundle.root else r
               for r in bundle.results]
    for r in results:
        if r.ok:
            replace_graphs(ws, r.model, r.preset, r.mode, [g for g in bundle.graphs if g.key.mode == r.mode])
            for p in bundle.profiles:
                if p.mode == r.mode:
                    from miner.scan import profile as prof
                    prof.save(ws, p)
        ws.save_scan(r)
    if results:
        write_text(ws.captures / "logs" / log_name(ScanRequest(model=results[0].model, preset=results[0].preset)),
                   f"# ran on {bundle.where} (miner scan --executor ray)\n" + bundle.log)
    return results


@dataclass(frozen=True)
class ScanOptions(Capture):
    """How ``miner scan`` (and ``miner profile``) capture each model; built once from the command line."""

    force: bool = False  # capture again even where an earlier result could be reused
    jobs: int = 1  # models at once in the default local pool
    timeout: float = DEFAULT_TIMEOUT_S  # seconds per model's process

    def request(self, model: str, modes: tuple[str, ...]) -> ScanRequest:
        """The scan of ``model`` in ``modes`` with these options' capture fields."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(Capture)}
        return ScanRequest(**{**shared, "modes": tuple(modes)}, model=model)


def scan(model_names: list[str], options: ScanOptions = ScanOptions(), *, workspace: Workspace,
         echo: Callable[[str], None] = print, executor: LocalExecutor | RayExecutor | None = None) -> list[ScanResult]:
    """Scan each model (in its own process), reusing earlier results unless ``options.force``.

    ``executor``: where the models run (``miner.core.executor``; default: a local pool of
    ``options.jobs``); on Ray each model is a task asking for the compile threads' CPUs (and one GPU
    on CUDA)."""
    import miner_models as models
    from miner.scan.profile import profile_path

    preset, modes, device, batch, seq, profile = (options.preset, options.modes, options.device, options.batch,
                                                  options.seq, options.profile)
    force, jobs, timeout = options.force, options.jobs, options.timeout
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
            todo.append(options.request(m, tuple(missing)))
        else:
            echo(f"[{m}] reusing saved graphs ({', '.join(modes)}); --force to recompile")

    log_dir = workspace.captures / "logs"
    threads = compile_threads(min(jobs, len(todo)))
    executor = executor or LocalExecutor(jobs)
    if not todo:
        tasks = []
    elif executor.remote:  # the task returns its files as data; this process saves them (see scan_remote)
        cpus = max(1, min(threads, int(executor.largest_node("CPU")) or 1))
        gpus = 1 if device.startswith("cuda") else 0
        tasks = [Task(r.model, scan_remote, (r, timeout, cpus, os.getcwd()), gpus=gpus, cpus=cpus) for r in todo]
        echo(f"submitting {len(todo)} model(s) to {executor.describe()}: {cpus} CPU(s)"
             + (f" and {gpus} GPU" if gpus else "") + " each")
    else:
        tasks = [Task(r.model, _run_local, (r, workspace, timeout, echo, log_dir, threads)) for r in todo]

    def on_done(out: Outcome) -> str | None:
        req = out.task.args[0]
        if out.error is not None:  # the task itself was lost (its worker died past its retries, or was cancelled)
            rs = [ScanResult(req.model, req.preset, m, req.device, False, error=out.error,
                             seconds=round(out.seconds, 2)) for m in req.modes]
            for r in rs:
                workspace.save_scan(r)
        elif executor.remote:
            rs = store(workspace, out.value)
            echo(f"[{req.model}] ran on {out.value.where}")
        else:
            rs = out.value
        for r in rs:
            results[r.model, r.mode] = r
        bad = [r.error or "" for r in rs if not r.ok]
        return "; ".join(bad) if bad else None

    if tasks:
        executor.run(tasks, on_done, echo=echo)
    return [results[m, mode] for m in model_names for mode in modes]


def format_table(results: list[ScanResult]) -> str:
    """One row per (model, mode): graphs, nodes by category, kernels, breaks, seconds."""
    cats = ("pointwise", "reduction", "view", "matmul", "other")
    header = ["model", "mode", "graphs", "nodes", *cats, "kernels", "breaks", "compile s", "status"]
    rows = []
    for r in results:
        phases = Counter(k.phase for k in r.graphs)
        graphs = "+".join(f"{n}{p[0]}" for p, n in sorted(phases.items(), reverse=True)) or "0"
        nodes = sum(r.nodes_by_category.values())
        other = nodes - sum(r.nodes_by_category.get(c, 0) for c in cats[:-1])
        status = ("reused" if r.reused else "ok") if r.ok else f"FAILED {r.error}"[:60]
        rows.append([r.model, r.mode, graphs, str(nodes), *(str(r.nodes_by_category.get(c, 0)) for c in cats[:-1]),
                     str(other), str(r.kernels), str(r.graph_breaks),
                     "-" if r.reused else f"{r.seconds:.1f}", status])  # a reused scan compiled nothing now
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: " ".join(c.ljust(w) if i in (0, 1, len(header) - 1) else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in rows]
    return "\n".join(lines) + "\n(graphs: f = forward, b = backward, i = inference; compile s: - where reused)"


def results_json(results: list[ScanResult]) -> str:
    from miner.core.records import to_json
    return json.dumps([to_json(r) for r in results], indent=1)


