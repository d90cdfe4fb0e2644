"""Mining time vs graph size: ``python benchmarks/bench_mining.py [--workspace DIR] [--models a,b,...]``.

Mines the captured graphs of the first 1, 2, ..., N models (in the order given) and prints
one row per step: models, graphs, nodes, fusable nodes, frequent subgraphs, reported patterns,
and the time split (index / grow / report), as wall-clock and as this process's CPU time.
On a shared machine the CPU time is the number to compare: wall time also counts the time
other processes held the cores. A script, not a test: nothing here asserts a time.

    python benchmarks/bench_mining.py --workspace /work/base-ws --models bert,gpt2 --preset base
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miner.mine.mine import mine  # noqa: E402
from miner.core.workspace import Workspace  # noqa: E402


def run(workspace: str, models: list[str] | None, preset: str | None, modes: list[str] | None, **options) -> list[dict]:
    ws = Workspace(workspace)
    available = sorted({p.parts[-3] for p in ws.graph_files()})
    order = models or available
    missing = [m for m in order if m not in available]
    if missing:
        raise SystemExit(f"no captures of {', '.join(missing)} under {ws.captures}; captured: {', '.join(available)}")
    graphs_by_model = {}
    for m in order:
        gs = ws.load_graphs([m])
        graphs_by_model[m] = [g for g in gs if (preset is None or g.key.preset == preset)
                              and (modes is None or g.key.mode in modes)]
    rows = []
    for n in range(1, len(order) + 1):
        graphs = [g for m in order[:n] for g in graphs_by_model[m]]
        wall, cpu = time.perf_counter(), time.process_time()
        result = mine(graphs, **options)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        s = result.stats
        rows.append({"models": ",".join(order[:n]), "graphs": s["graphs"], "nodes": s["nodes"],
                     "fusable": s["fusable_nodes"], "frequent": s["frequent_patterns"],
                     "patterns": s["reported_patterns"], "index_s": s["seconds"]["index"],
                     "grow_s": s["seconds"]["grow"], "report_s": s["seconds"]["report"],
                     "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
        print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workspace", default=".")
    p.add_argument("--models", help="comma-separated, in the order they are added (default: all captured)")
    p.add_argument("--preset", help="only graphs of this preset (tiny, base)")
    p.add_argument("--modes", help="only these modes (train, infer)")
    p.add_argument("--max-nodes", type=int, default=8)
    p.add_argument("--max-views", type=int, default=2)
    p.add_argument("--min-support", type=int, default=2)
    p.add_argument("--support", choices=("occurrences", "graphs"), default="occurrences")
    a = p.parse_args(argv)
    rows = run(a.workspace, a.models.split(",") if a.models else None, a.preset,
               a.modes.split(",") if a.modes else None, max_nodes=a.max_nodes, max_views=a.max_views,
               min_support=a.min_support, support=a.support)
    cols = list(rows[0])
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
