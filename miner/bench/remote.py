"""``miner bench --executor ray``: one task per (candidate, case), each in a fresh process.

Each task carries its candidate's folder (``candidates/<id>/*``) as bytes, unpacks it into a
temporary workspace, measures its own environment (the GPU Ray gave it, its copy bandwidth) and
returns the ``BenchRow``; the driver hands each row to ``on_row`` (which saves it) as it arrives.
A task that crashes, hangs past its timeout or loses its worker is logged as not timed, with why.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from miner.core.executor import TASK_TIMEOUT_S, Outcome, isolated, pack


def bench_task(files: dict[str, bytes], cand_id: str, case, *, variants: Sequence[str], replays: int, device: str,
               deadline: float | None):
    """The task body (in its own process): the row of one case, or None once ``deadline`` (epoch s) passed."""
    if deadline is not None and time.time() > deadline:
        return None
    if not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # this process has not imported triton yet
    import tempfile

    from miner.bench.run import bench_case
    from miner.bench.timing import environment
    from miner.core import candidate as candidates
    from miner.core.executor import unpack
    from miner.core.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="miner-bench-") as tmp:
        ws = Workspace(unpack(files, tmp))
        cand = candidates.load(ws, cand_id)
        return bench_case(cand, case, environment(device), variants=variants, replays=replays, log=print)


def _bench_call(files, cand_id, case, variants, replays, device, deadline):
    return bench_task(files, cand_id, case, variants=variants, replays=replays, device=device, deadline=deadline)


def run_bench_on(executor: Any, cands: Sequence, options, *, time_budget_s: float | None, on_row: Callable | None,
                 log: Callable[[str], None] = print, timeout: float = TASK_TIMEOUT_S):
    """``run_bench`` on ``executor`` (``options``: its ``BenchOptions``): the same plan and rows; returns
    ``(env, rows, failures)``.

    ``time_budget_s``: a task that starts after that many seconds of the run returns nothing (its
    case is listed as not timed). ``env`` is the first row's (the GPU it ran on).
    """
    from miner.bench.run import plan_all
    from miner.bench.timing import environment

    plan = plan_all(cands, options.shapes, options.models, options.casts, log)
    device = options.device
    folders = {c.id: pack(c.path.parent.parent, [f"{c.path.parent.name}/{c.path.name}"]) for c in cands}
    deadline = None if time_budget_s is None else time.time() + time_budget_s
    gpus = 1 if device.startswith("cuda") else 0
    tasks = [isolated(f"{cand.label} {cand.id[:8]} {case.label}", _bench_call,
                      (folders[cand.id], cand.id, case, tuple(options.variants), options.replays, device, deadline),
                      timeout=timeout, gpus=gpus) for cand, case in plan]
    log(f"submitting {len(tasks)} case(s) to {executor.describe()}" + (" (one GPU each)" if gpus else ""))
    index = {id(t): i for i, t in enumerate(tasks)}
    rows, failures = [], []

    def on_done(out: Outcome) -> str | None:
        if out.error is not None:
            failures.append(f"{out.task.key}: {out.error}")
            return out.error
        if out.value is None:
            log(f"not timed (time budget): {out.task.key}")
            return None
        rows.append((index[id(out.task)], out.value))
        if on_row is not None:
            on_row(out.value)
        return None

    executor.run(tasks, on_done, echo=log)
    rows = [row for _, row in sorted(rows, key=lambda ir: ir[0])]  # the plan's order, as run_bench's
    env = rows[0].env if rows else environment("cpu", copy_gbps=0.0)
    return env, rows, failures
