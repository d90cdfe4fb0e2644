"""``miner verify [--ab] --executor ray``: one task per model, each in a fresh process.

Each task carries the workspace's ``fusions/`` folder (and, for ``--ab --candidates``, those
candidates' folders) as bytes, unpacks it into a temporary workspace, runs ``run_verify`` or
``abrun.run_all`` on its one model there and returns the results; the driver hands each result
to ``on_result`` (which saves the run table) as it arrives, in the local run's order. A task that
crashes, hangs past its timeout or loses its worker becomes an error result per mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from miner.core.executor import TASK_TIMEOUT_S, Outcome, isolated, pack


def _remaining(deadline: float | None) -> float | None:
    """Seconds left before ``deadline`` (epoch s); -1 once it passed (the runs then skip, as locally)."""
    return None if deadline is None else max(-1.0, deadline - time.time())


def verify_task(files: dict[str, bytes], model: str, options, deadline: float | None) -> list:
    """``run_verify`` of one model in a temporary workspace holding ``files`` (``options``: its ``VerifyOptions``)."""
    import tempfile

    from miner.check import verify
    from miner.core.executor import unpack
    from miner.core.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="miner-verify-") as tmp:  # a Workspace: a Path's .root is "/"
        return verify.run_verify([model], options, workspace=Workspace(unpack(files, tmp)),
                                 time_budget_s=_remaining(deadline))


def ab_task(files: dict[str, bytes], model: str, run, deadline: float | None) -> list:
    """``abrun.run_all`` of one model in a temporary workspace holding ``files`` (``run``: its ``ABRun``)."""
    import tempfile

    from miner.check import abrun
    from miner.core.executor import unpack
    from miner.core.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="miner-ab-") as tmp:
        return abrun.run_all([model], run, workspace=Workspace(unpack(files, tmp)), time_budget_s=_remaining(deadline))


def run_on(executor: Any, models: Sequence[str], options, *, workspace: Any, time_budget_s: float | None,
           on_result: Callable | None, log: Callable[[str], None] = print, timeout: float = TASK_TIMEOUT_S) -> list:
    """``run_verify`` (``options``: a ``VerifyOptions``) or ``abrun.run_all`` (an ``ABRun``) spread over
    ``executor``, one task per model. Returns the results in the local run's order (every model's first
    mode before any second mode).
    """
    from miner.check.abrun import ABRun

    ab = isinstance(options, ABRun)
    device = options.ab.device if ab else options.device
    chosen = options.candidates if ab else ()
    root = Path(getattr(workspace, "root", workspace))
    folders = ["fusions"]
    if chosen:  # ids as given may be prefixes: name the folders they resolve to
        from miner.core import candidate as candidates
        folders = [f"candidates/{candidates.find(workspace, c).name}" for c in chosen]
    files = pack(root, folders)
    deadline = None if time_budget_s is None else time.time() + time_budget_s
    gpus = 1 if device.startswith("cuda") else 0
    fn = ab_task if ab else verify_task
    tasks = [isolated(m, fn, (files, m, options, deadline), timeout=timeout, gpus=gpus) for m in models]
    log(f"submitting {len(tasks)} model(s) to {executor.describe()}" + (" (one GPU each)" if gpus else ""))
    results = []

    def on_done(out: Outcome) -> str | None:
        rs = out.value if out.error is None else failed(out.task.key, out.error, options)
        for r in rs:
            results.append(r)
            if on_result is not None:
                on_result(r)
        bad = [r.error for r in rs if r.error and not r.error.startswith("skipped")]
        return "; ".join(bad) if bad else None

    executor.run(tasks, on_done, echo=log)
    modes = list(options.modes)
    return sorted(results, key=lambda r: (modes.index(r.mode) if r.mode in modes else len(modes),
                                          list(models).index(r.model) if r.model in models else len(models)))


def failed(model: str, error: str, options) -> list:
    """One error result per planned run of ``model`` whose task returned nothing (``options``: a
    ``VerifyOptions`` or an ``ABRun``)."""
    from miner.check.abrun import ABRun

    if isinstance(options, ABRun):
        from miner.check.ab import ABResult
        from miner.check.abrun import plan
        return [ABResult(model, mode, compile_mode, options.ab.preset, options.batch, options.seq, error=error)
                for mode, compile_mode in plan(options.modes, options.compile_modes)]
    from miner.check.verify import VerifyResult
    return [VerifyResult(model, mode, options.preset, options.batch, options.seq, error=error)
            for mode in options.modes]
