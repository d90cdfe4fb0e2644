"""``miner bench``: candidates timed on a GPU against eager and Inductor, per shape.

The stage by job: ``cases`` (what is timed: observed shapes and their published-size scaling),
``timing`` (CUDA-graph replays, the copy ceiling, the environment), ``run`` (numerics first, then
timing, per variant), ``results`` (rows, their JSON, tables, wins per shape), ``roofline`` (the
arithmetic). The names below are the stage's public API.
"""

from miner.bench.cases import BenchCase, cases_from_meta, cast_case, derive_case, merge_cases, plan_cases
from miner.bench.results import (BASELINE, COPY, VARIANTS, BenchRow, VariantResult, env_header, gpu_slug, load_rows,
                                 markdown_table, row_from_json, row_to_json, save_results, targets, today_dir,
                                 wins_table)
from miner.bench.run import (EXTRA_VARIANTS, BenchOptions, bench_case, build_variant, compare, inputs_of, reference64,
                              run_bench)
from miner.bench.timing import Env, NoDeviceError, Timing, environment, gpu_timing_lock, require_cuda
from miner.core.sizes import derive_shape
from miner.core.tensors import TensorSpec

__all__ = ["BASELINE", "COPY", "EXTRA_VARIANTS", "VARIANTS", "BenchCase", "BenchOptions", "BenchRow", "Env",
           "NoDeviceError", "TensorSpec", "Timing", "VariantResult", "bench_case", "build_variant", "cases_from_meta",
           "cast_case", "compare", "derive_case", "derive_shape", "env_header", "environment", "gpu_slug",
           "gpu_timing_lock", "inputs_of", "load_rows", "markdown_table", "merge_cases", "plan_cases", "reference64",
           "require_cuda", "row_from_json", "row_to_json", "run_bench", "save_results", "targets", "today_dir",
           "wins_table"]
