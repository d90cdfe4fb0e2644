"""How long miner's fusion pass adds to a compile: t5-base's training step (its 12+12 layers, at batch 1,
sequence 32 so the CPU can run it), bf16 autocast as on the GPU, the kernels interpreted (so that every match
goes through the safety checks and the gate as on CUDA), every promoted fusion in one pass.

    TRITON_INTERPRET=1 MINER_INTERPRET=1 python3 passcost.py [out.json]

Prints and writes the matches, the declines and ``FusionPass.seconds`` (per fusion, the pattern build).
"""

import json
import os
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402

import miner_fusions  # noqa: E402
import miner_models  # noqa: E402
from miner.check.verify import resize_inputs  # noqa: E402

built = miner_models.resolve("t5").build("base", "train", "cpu")
inputs = resize_inputs(built.inputs, 1, 32)
options = miner_fusions.inductor_options(miner_fusions.names())
graph_pass = options["post_grad_custom_post_pass"]
model = torch.compile(built.model, options=options)
t0 = time.perf_counter()
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = model(**inputs).loss
loss.backward()
out = {"first_step_s": round(time.perf_counter() - t0, 1),
       "pass_s": round(sum(graph_pass.seconds.values()), 2),
       "pass_s_by_part": {k: round(v, 2) for k, v in graph_pass.seconds.most_common()},
       "matches": {k: n for k, n in sorted(graph_pass.counts.items()) if n},
       "declined": {k: dict(v) for k, v in sorted(graph_pass.declined.items()) if v},
       "torch": torch.__version__}
print(json.dumps(out, indent=1))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
