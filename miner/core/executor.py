"""Where the zoo's work runs: a local thread pool (the default) or a Ray cluster (``--executor ray``).

``scan``, ``profile``, ``bench`` and ``verify`` hand an executor a list of ``Task`` s (one per
model, or per candidate and shape) and get one ``Outcome`` per task back, in task order, with a
progress line (done / running / failed) as each finishes. Isolation is the task's own business:
a scan task runs its worker as a subprocess with a timeout; ``in_subprocess`` gives any other
task the same (a crash, hang or out-of-memory becomes an error string, the Ray worker lives on).

* ``LocalExecutor(jobs)``: ``jobs`` threads on this machine; tasks share the driver's filesystem
  (``remote = False``), so they may write into the workspace themselves.
* ``RayExecutor(address)``: one Ray task per ``Task``, ``num_gpus`` / ``num_cpus`` as asked,
  retried on a lost worker (``max_retries``). Tasks may run on machines without the driver's
  filesystem (``remote = True``): they return their results as data, and the driver saves them.
  ``address=None`` starts a local cluster; ``"auto"`` joins the one this machine belongs to;
  ``"ray://host:10001"`` connects through Ray Client.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from miner.core.errors import UsageError

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'miner[ray]'  (or: pip install ray)"
TASK_TIMEOUT_S = 1800  # a task's process is killed after this long (scan: --timeout)
MAX_RETRIES = 2  # a Ray task whose worker process died (node lost, Ray's OOM killer) runs again, twice at most


@dataclass(frozen=True)
class Task:
    """One unit of work: ``fn(*args)``; ``fn`` a module-level function (Ray pickles it by name).

    ``key`` names it in the progress lines; ``gpus`` / ``cpus`` are the resources a Ray task asks
    for (the local pool ignores them).
    """

    key: str
    fn: Callable[..., Any]
    args: tuple = ()
    gpus: float = 0
    cpus: float = 1


@dataclass
class Outcome:
    """What a task returned (``value``), or why it returned nothing (``error``: one line)."""

    task: Task
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# ``on_done(outcome)`` stores what a task returned and says how it went: None when it went well, else
# the failure in one line; the executor then prints the progress line.
OnDone = Callable[[Outcome], "str | None"]


@dataclass
class Progress:
    """The count printed as each task finishes: ``[key] ok (d/n done, r running, f failed)``.

    ``running`` counts the tasks started and not finished; on Ray, where the driver sees only what it
    submitted, ``waiting="running or queued"`` says that it includes those waiting for a CPU or GPU.
    """

    total: int
    echo: Callable[[str], None] = print
    waiting: str = "running"
    done: int = 0
    failed: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, n: int = 1) -> None:
        with self.lock:
            self.running += n

    def finish(self, out: Outcome, on_done: OnDone | None) -> None:
        with self.lock:
            problem = on_done(out) if on_done is not None else out.error
            self.running -= 1
            self.done += 1
            self.failed += problem is not None
            self.echo(f"[{out.task.key}] {'ok' if problem is None else 'FAILED: ' + problem} in {out.seconds:.0f}s "
                      f"({self.done}/{self.total} done, {self.running} {self.waiting}, {self.failed} failed)")


class LocalExecutor:
    """``jobs`` threads on this machine; a task's ``fn`` runs in the driver process."""

    name = "local"
    remote = False

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, jobs)

    def describe(self) -> str:
        return f"local, {self.jobs} at once"

    def run(self, tasks: Sequence[Task], on_done: OnDone | None = None,
            echo: Callable[[str], None] = print) -> list[Outcome]:
        """Run every task; ``on_done`` (in a pool thread, one call at a time) sees each outcome as it finishes."""
        progress = Progress(len(tasks), echo)

        def one(task: Task) -> Outcome:
            progress.start()
            t0 = time.perf_counter()
            try:
                out = Outcome(task, value=task.fn(*task.args))
            except Exception as e:  # one broken task must never stop the others
                out = Outcome(task, error=one_line(e))
            out.seconds = time.perf_counter() - t0
            progress.finish(out, on_done)
            return out

        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(one, tasks))

    def close(self) -> None:
        pass


def _ray_call(fn: Callable[..., Any], args: tuple) -> Any:
    """The body of every Ray task: ``fn(*args)`` in the Ray worker."""
    return fn(*args)


class RayExecutor:
    """One Ray task per ``Task``, on a local cluster (``address=None``) or the one at ``address``."""

    name = "ray"
    remote = True

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 max_retries: int = MAX_RETRIES):
        ray = import_ray()
        self.ray = ray
        self.max_retries = max_retries
        self.started = False
        if not ray.is_initialized():
            if address is None:
                expose_checkout()  # the local cluster's workers import this very miner
                ray.init(num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=local_gpus(), include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
                except Exception as e:  # no cluster there, or ray:// without Ray Client installed
                    raise UsageError(f"--address {address}: cannot join that Ray cluster: {one_line(e)}") from None
            self.started = True
        self.address = address or "local cluster"
        self._remote = ray.remote(_ray_call)

    def resources(self) -> dict[str, float]:
        """The cluster's total resources (``CPU``, ``GPU``, ...)."""
        return dict(self.ray.cluster_resources())

    def largest_node(self, resource: str) -> float:
        """The most of ``resource`` one alive node has (a task asking for more never runs)."""
        nodes = [n.get("Resources", {}).get(resource, 0.0) for n in self.ray.nodes() if n.get("Alive")]
        return max(nodes, default=0.0)

    def describe(self) -> str:
        res = self.resources()
        return (f"ray ({self.address}: {res.get('CPU', 0):.0f} CPUs, {res.get('GPU', 0):.0f} GPUs, "
                f"{sum(1 for n in self.ray.nodes() if n.get('Alive'))} node(s))")

    def run(self, tasks: Sequence[Task], on_done: OnDone | None = None,
            echo: Callable[[str], None] = print) -> list[Outcome]:
        """Submit every task, then collect them as they finish (``on_done`` in the driver's thread).

        A task whose worker died is retried ``max_retries`` times by Ray; after that, or when ``fn``
        raised, the outcome carries the error. Interrupting the driver cancels what is left.
        """
        ray = self.ray
        for t in tasks:
            if t.gpus and self.largest_node("GPU") < t.gpus:
                raise UsageError(f"a task needs {t.gpus:g} GPU(s) but no node of the Ray cluster at {self.address} "
                                 f"has that many: {self.resources()}")
        refs = {}
        started = {}
        for i, t in enumerate(tasks):
            ref = self._remote.options(num_cpus=t.cpus, num_gpus=t.gpus, max_retries=self.max_retries,
                                       retry_exceptions=False, name=f"miner:{t.key}").remote(t.fn, t.args)
            refs[ref] = i
            started[ref] = time.perf_counter()
        progress = Progress(len(tasks), echo, waiting="running or queued")
        progress.start(len(tasks))
        outcomes: list[Outcome | None] = [None] * len(tasks)
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    task = tasks[refs[ref]]
                    try:
                        out = Outcome(task, value=ray.get(ref))
                    except Exception as e:  # RayTaskError (fn raised), WorkerCrashedError, OutOfMemoryError, ...
                        cause = getattr(e, "cause", None)
                        out = Outcome(task, error=one_line(cause if isinstance(cause, BaseException) else e))
                    out.seconds = time.perf_counter() - started[ref]
                    outcomes[refs[ref]] = out
                    progress.finish(out, on_done)
        finally:
            for ref in pending:  # interrupted: nothing of ours keeps running on the cluster
                ray.cancel(ref, force=True)
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def local_gpus() -> int | None:
    """The GPUs torch sees, when the driver has imported torch already (else Ray's own detection)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else None
    except Exception:
        return None


def import_ray():
    """The ``ray`` module, or a one-line ``UsageError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def expose_checkout() -> None:
    """Put the folder this ``miner`` came from, and the current directory, on ``$PYTHONPATH``.

    A local Ray cluster's processes inherit the driver's environment: its workers then import this
    checkout's ``miner`` (not another installed copy) and the user's own ``module:factory``.
    """
    root = str(Path(__file__).resolve().parents[2])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([root, *parts, os.getcwd()]))


def make(name: str, *, address: str | None = None, jobs: int = 1) -> LocalExecutor | RayExecutor:
    """The executor ``--executor name [--address A]`` asks for (``jobs``: the local pool's size)."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r}; executors: {', '.join(EXECUTORS)}")
    if name == "local":
        if address:
            raise UsageError("--address needs --executor ray")
        return LocalExecutor(jobs)
    return RayExecutor(address)


def add_arguments(p) -> None:
    """``--executor`` and ``--address``, the same on every verb that fans out over models."""
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: processes on this machine (default); ray: one Ray task per model (or per "
                        "candidate and case), on a local Ray cluster or the one at --address, asking for one GPU "
                        "each on CUDA (on scan/profile also CPUs/--jobs CPUs for the compile workers)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="with --executor ray: ray.init(address=ADDR), e.g. auto (the cluster this machine "
                        "belongs to) or ray://host:10001; without it a local cluster starts")


def elsewhere(args) -> bool:
    """Whether the work goes to a Ray cluster at ``--address`` (whose GPUs this machine may lack)."""
    return getattr(args, "executor", "local") == "ray" and bool(getattr(args, "address", None))


# --------------------------------------------------------------------------- what travels with a task

def pack(root: Path, folders: Sequence[str]) -> dict[str, bytes]:
    """The files under ``root/<folder>`` for each folder (``__pycache__`` left out), by relative path."""
    root = Path(root)
    files = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def unpack(files: dict[str, bytes], root: Path) -> Path:
    """Write ``pack``'s files under ``root`` (a task's temporary workspace); returns ``root``."""
    for rel, data in files.items():
        path = Path(root, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return Path(root)


# --------------------------------------------------------------------------- isolation for in-process work

def isolated(key: str, fn: Callable[..., Any], args: tuple, *, timeout: float, gpus: float = 0,
             cpus: float = 1) -> Task:
    """A ``Task`` that runs ``fn(*args)`` through ``in_subprocess`` (in the driver's directory when
    the machine has it), so a crash or hang is that task's error and its Ray worker lives on."""
    return Task(key, _isolated_call, (fn, args, timeout, os.getcwd()), gpus=gpus, cpus=cpus)


def _isolated_call(fn: Callable[..., Any], args: tuple, timeout: float, cwd: str) -> Any:
    return in_subprocess(fn, args, timeout=timeout, cwd=cwd if os.path.isdir(cwd) else None)


_CHILD = ("import pickle, sys; sys.path.insert(0, {root!r}); from miner.core.executor import child_main; "
          "sys.path.remove({root!r}); sys.exit(child_main(sys.argv[1], sys.argv[2]))")


def in_subprocess(fn: Callable[..., Any], args: tuple = (), *, timeout: float, cwd: str | None = None) -> Any:
    """``fn(*args)`` in a fresh Python process; its return value, or ``RuntimeError`` saying why not.

    A crash (segfault, ``os._exit``, the OOM killer) or a hang past ``timeout`` seconds costs only
    that process: the error names the exit code or the timeout and ends with the last line it
    printed. ``fn`` and ``args`` travel by pickle (``fn`` by its module and name).
    """
    root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="miner-task-") as tmp:
        src, dst, log = Path(tmp, "call.pkl"), Path(tmp, "result.pkl"), Path(tmp, "log.txt")
        src.write_bytes(pickle.dumps((fn, args)))
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=root), str(src), str(dst)],
                                    stdout=f, stderr=subprocess.STDOUT, cwd=cwd or os.getcwd(),
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"timed out after {timeout:.0f}s") from None
        if dst.exists():
            ok, value = pickle.loads(dst.read_bytes())
            if ok:
                return value
            raise RuntimeError(value)
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        raise RuntimeError(f"worker exited with code {code}" + (f" ({tail[0][:200]})" if tail else ""))


def child_main(src: str, dst: str) -> int:
    """The child of ``in_subprocess``: run the pickled call, pickle ``(ok, value or error line)``."""
    fn, args = pickle.loads(Path(src).read_bytes())
    try:
        result = (True, fn(*args))
    except Exception as e:
        import traceback
        traceback.print_exc()
        result = (False, one_line(e))
    tmp = Path(dst + ".tmp")
    tmp.write_bytes(pickle.dumps(result))
    os.replace(tmp, dst)
    return 0 if result[0] else 1
