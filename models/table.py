"""The zoo table (``reports/zoo.md``): every hf-suite entry and every supported model_type, with
what ``miner scan`` made of it (from the ``ScanResult`` files of a workspace) and, optionally,
whether it builds and runs one eager step (``eager_check``).

Regenerate with::

    miner scan --workspace /tmp/zoo-ws --models hf-suite,all --preset tiny --mode train --jobs 1 --timeout 600
    miner --workspace /tmp/zoo-ws models --table reports/zoo.md --eager [--gpu-scans DIR]

``--gpu-scans DIR``: the workspace of a ``miner scan --device cuda`` of the same preset and mode
(e.g. on the H200), shown in three more columns.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from miner.core.records import ScanResult

CHECK_SECONDS = 120


@dataclass(frozen=True)
class EagerCheck:
    """One eager build + forward (+ backward in train mode) of a zoo model, outside torch.compile."""

    built: bool
    ran: bool
    seconds: float
    error: str | None = None


def _one_line(e: BaseException) -> str:
    return re.sub(r"\s+", " ", f"{type(e).__name__}: {e}")[:200]


def eager_check(name: str, preset: str = "tiny", mode: str = "train", seconds: int = CHECK_SECONDS) -> EagerCheck:
    """Build ``name`` and run one eager step (under an alarm of ``seconds``)."""
    import miner_models as models

    def _timeout(*_):
        raise TimeoutError(f"no eager step within {seconds} s")

    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(seconds)
    built = False
    try:
        b = models.resolve(name).build(preset, mode, "cpu")
        built = True
        out = b.model(**b.inputs)
        if mode == "train":
            b.loss(out).backward()
        return EagerCheck(True, True, round(time.perf_counter() - t0, 2))
    except Exception as e:  # noqa: BLE001 - recorded in the table
        return EagerCheck(built, False, round(time.perf_counter() - t0, 2), _one_line(e))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _percent(part: int, total: int) -> str:
    return f"{100 * part / total:.0f}%" if total else "-"


def _nodes(r: ScanResult) -> int:
    return sum(r.nodes_by_category.values())


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _scan_cells(scan: ScanResult | None) -> tuple[str, str, str, str, str, str]:
    """compiled, graphs, nodes, breaks, seconds, error of one scan result."""
    if scan is None:
        return "not scanned", "", "", "", "", ""
    if scan.ok:
        return ("yes", str(len(scan.graphs)), str(_nodes(scan)), str(scan.graph_breaks), f"{scan.seconds:.1f}", "")
    return "no", "", "", "", f"{scan.seconds:.1f}", scan.error or ""


def row(name: str, kind: str, head: str, scan: ScanResult | None, check: EagerCheck | None,
        gpu: ScanResult | None = None, with_gpu: bool = False) -> str:
    built = "-" if check is None else ("yes" if check.built and check.ran else "build only" if check.built else "no")
    compiled, graphs, nodes, breaks, secs, error = _scan_cells(scan)
    if not error and check is not None and check.error:
        error = f"eager: {check.error}"
    cells = [name, kind, head, built, compiled, graphs, nodes, breaks, secs]
    if with_gpu:
        g_compiled, _, g_nodes, _, g_secs, g_error = _scan_cells(gpu)
        cells += [g_compiled, g_nodes, g_secs]
        if g_error and not error:
            error = f"cuda: {g_error}"
    return "| " + " | ".join(cells + [_cell(error)]) + " |"


def header(with_gpu: bool) -> str:
    cols = ["model", "kind", "head", "eager", "compiled", "graphs", "nodes", "breaks", "seconds"]
    cols += ["cuda compiled", "cuda nodes", "cuda seconds"] if with_gpu else []
    cols.append("error")
    return "| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|"


def _unsupported_row(name: str, why: str, with_gpu: bool) -> str:
    blanks = 5 + (3 if with_gpu else 0)
    return f"| {name} | unsupported | | no |" + " |" * blanks + f" {_cell(why)} |"


def _versions(scans: list[ScanResult]) -> str:
    seen = sorted({f"torch {r.provenance.get('torch', '?')}, transformers {r.provenance.get('transformers', '?')}"
                   for r in scans if r.provenance})
    return "; ".join(seen) or "unknown versions"


def _dates(scans: list[ScanResult]) -> str:
    """The days the scans ran on (their provenance ``date``), with how many scans each."""
    days: dict[str, int] = {}
    for r in scans:
        day = r.provenance.get("date", "no date")  # a scan that failed before capturing records none
        days[day] = days.get(day, 0) + 1
    return ", ".join(f"{d} ({n})" for d, n in sorted(days.items(), key=lambda kv: kv[0] == "no date")) or "none"


def _gpus(scans: list[ScanResult]) -> str:
    return ", ".join(sorted({r.provenance["gpu"] for r in scans if r.provenance.get("gpu")})) or "a CUDA device"


def _host() -> str:
    import os
    import platform
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


def render(scans: list[ScanResult], preset: str = "tiny", mode: str = "train",
           checks: dict[str, EagerCheck] | None = None, command: str = "",
           gpu_scans: list[ScanResult] | None = None) -> str:
    """The markdown table: the hf-suite section (with the unsupported names), then every model_type.

    ``scans`` are the CPU results; ``gpu_scans`` (optional) a CUDA scan of the same preset and mode,
    shown in three more columns.
    """
    import torch
    import transformers

    import miner_models as models
    from .generic import UNSUPPORTED
    from .suite import SUITE_LIST, unsupported, zoo_name
    checks = checks or {}
    with_gpu = gpu_scans is not None
    by_name = {r.model: r for r in scans if r.preset == preset and r.mode == mode}
    gpu_by_name = {r.model: r for r in gpu_scans or [] if r.preset == preset and r.mode == mode}
    missing = unsupported()

    def section(names: list[str]) -> tuple[list[str], dict[str, float]]:
        lines, n = [], dict(captured=0, scanned=0, graphs=0, nodes=0, seconds=0.0, gpu_captured=0, gpu_scanned=0)
        for name in names:
            spec = models.resolve(name)
            r, g = by_name.get(name), gpu_by_name.get(name)
            n["scanned"] += r is not None
            n["seconds"] += r.seconds if r is not None else 0.0
            if r and r.ok and r.graphs:
                n["captured"] += 1
                n["graphs"] += len(r.graphs)
                n["nodes"] += _nodes(r)
            n["gpu_scanned"] += g is not None
            n["gpu_captured"] += bool(g and g.ok and g.graphs)
            lines.append(row(name, spec.source, _cell(spec.note.split(";")[0]), r, checks.get(name), g, with_gpu))
        return lines, n

    def summary(n: dict[str, float], total: int) -> str:
        cpu, gpu = n["captured"], n["gpu_captured"]
        text = f"{cpu}/{total} ({_percent(cpu, total)}) captured on the CPU ({n['scanned']} scanned)"
        if with_gpu:
            text += f", {gpu}/{total} ({_percent(gpu, total)}) on CUDA ({n['gpu_scanned']} scanned)"
        return text

    def totals(n: dict[str, float]) -> str:
        failed = n["scanned"] - n["captured"]
        return (f"CPU totals: {n['scanned']} scanned, {n['captured']} captured, {failed} failed; "
                f"{n['graphs']} graphs, {n['nodes']} nodes; {n['seconds'] / 60:.1f} min of scans "
                "(the sum of the *seconds* column).")

    suite_names = [zoo_name(n) for n, _ in SUITE_LIST if n not in missing]
    suite_lines, suite_n = section(suite_names)
    suite_lines += [_unsupported_row(n, why, with_gpu) for n, why in missing.items()]
    type_names = models.group("all")
    type_lines, type_n = section(type_names)
    type_lines += [_unsupported_row(n, why, with_gpu) for n, why in sorted(UNSUPPORTED.items())]

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = list(by_name.values())
    gpu = list(gpu_by_name.values())
    gpu_note = (f" The *cuda* columns come from a scan on {_gpus(gpu)} ({_versions(gpu)}, "
                f"bfloat16 autocast, same preset; scans dated {_dates(gpu)})." if with_gpu else "")
    return "\n".join([
        "# The miner zoo",
        "",
        f"Generated by `{command or 'miner models --table reports/zoo.md'}` on {stamp} "
        f"(torch {torch.__version__}, transformers {transformers.__version__}; {_host()}) from the `miner scan` "
        f"results of preset `{preset}`, mode `{mode}` ({_versions(cpu)} on the CPU; scans dated {_dates(cpu)}; "
        f"a scan records its versions and date, not its host).{gpu_note}",
        "",
        "Regenerate (scan results are reused, so an interrupted scan resumes):",
        "",
        "```",
        f"miner --workspace /tmp/zoo-ws scan --models hf-suite,all --preset {preset} --mode {mode} --jobs 1 "
        "--timeout 600",
        f"miner --workspace /tmp/zoo-ws models --table reports/zoo.md --preset {preset} --mode {mode} "
        "[--gpu-scans DIR] [--eager]",
        "```",
        "",
        "Columns: *eager* = builds and runs one eager step (forward + backward; `-` = not checked), "
        "*compiled* = `miner scan` captured its post-grad graphs, *nodes* = call_function nodes over all "
        "graphs, *breaks* = graph breaks, *seconds* = the scan's build + compile + capture time.",
        "",
        f"## hf-suite (PyTorch's HF dynamo benchmark list): {summary(suite_n, len(SUITE_LIST))}",
        "",
        totals(suite_n),
        "",
        header(with_gpu), *suite_lines,
        "",
        f"## Every supported transformers model_type: {summary(type_n, len(type_names))}",
        "",
        "Supported = has a head with a loss (`models.generic.HEAD_ORDER`) and takes an eager training step; "
        f"the {len(UNSUPPORTED)} that have a head but fail are listed last as unsupported, with the error. "
        + totals(type_n),
        "",
        header(with_gpu), *type_lines,
        "",
    ])
