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


def verify_task(files: dict[str, bytes], model: str, kwargs: dict, deadline: float | None) -> list:
    """``run_verify`` of one model in a temporary workspace holding ``files``."""
    import tempfile

    from miner.check import verify
    from miner.core.executor import unpack
    from miner.core.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="miner-verify-") as tmp:  # a Workspace: a Path's .root is "/"
        return verify.run_verify([model], workspace=Workspace(unpack(files, tmp)), time_budget_s=_remaining(deadline),
                                 **kwargs)


def ab_task(files: dict[str, bytes], model: str, kwargs: dict, deadline: float | None) -> list:
    """``abrun.run_all`` of one model in a temporary workspace holding ``files``."""
    import tempfile

    from miner.check import abrun
    from miner.core.executor import unpack
    from miner.core.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="miner-ab-") as tmp:
        return abrun.run_all([model], workspace=Workspace(unpack(files, tmp)), time_budget_s=_remaining(deadline),
                             **kwargs)


def run_on(executor: Any, models: Sequence[str], *, ab: bool, workspace: Any, device: str, kwargs: dict,
           time_budget_s: float | None, on_result: Callable | None, log: Callable[[str], None] = print,
           timeout: float = TASK_TIMEOUT_S) -> list:
    """``run_verify`` (or, with ``ab``, ``abrun.run_all``) spread over ``executor``, one task per model.

    ``kwargs``: the keyword arguments of that function other than the models, workspace and time
    budget (``modes``, ``preset``, ``device``, ...). Returns the results in the local run's order
    (every model's first mode before any second mode).
    """
    root = Path(getattr(workspace, "root", workspace))
    folders = ["fusions"] + [f"candidates/{c}" for c in kwargs.get("candidates", ())]
    if kwargs.get("candidates"):  # ids as given may be prefixes: name the folders they resolve to
        from miner.core import candidate as candidates
        folders = [f"candidates/{candidates.find(workspace, c).name}" for c in kwargs["candidates"]]
    files = pack(root, folders)
    deadline = None if time_budget_s is None else time.time() + time_budget_s
    gpus = 1 if device.startswith("cuda") else 0
    fn = ab_task if ab else verify_task
    tasks = [isolated(m, fn, (files, m, kwargs, deadline), timeout=timeout, gpus=gpus) for m in models]
    log(f"submitting {len(tasks)} model(s) to {executor.describe()}" + (" (one GPU each)" if gpus else ""))
    results = []

    def on_done(out: Outcome) -> str | None:
        rs = out.value if out.error is None else failed(out.task.key, out.error, ab=ab, kwargs=kwargs)
        for r in rs:
            results.append(r)
            if on_result is not None:
                on_result(r)
        bad = [r.error for r in rs if r.error and not r.error.startswith("skipped")]
        return "; ".join(bad) if bad else None

    executor.run(tasks, on_done, echo=log)
    modes = list(kwargs["modes"])
    return sorted(results, key=lambda r: (modes.index(r.mode) if r.mode in modes else len(modes),
                                          list(models).index(r.model) if r.model in models else len(models)))


def failed(model: str, error: str, *, ab: bool, kwargs: dict) -> list:
    """One error result per planned run of ``model`` whose task returned nothing."""
    args = dict(preset=kwargs["preset"], batch=kwargs.get("batch"), seq=kwargs.get("seq"), error=error)
    if ab:
        from miner.check.ab import ABResult
        from miner.check.abrun import plan
        return [ABResult(model, mode, compile_mode, **args) for mode, compile_mode in
                plan(kwargs["modes"], kwargs["compile_modes"])]
    from miner.check.verify import VerifyResult
    return [VerifyResult(model, mode, **args) for mode in kwargs["modes"]]
