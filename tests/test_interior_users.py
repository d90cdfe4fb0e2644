"""Issue #29: a region whose interior node is also read outside it still fires.

In t5-base's H200 training graph relu's gradient mask (``le(relu, 0)``) is computed in the forward
and saved, so relu (inside the relu + dropout region ``pf4693d7449``) has a reader outside the
region; likewise the attention regions' position bias and ``full`` constants are read by every
layer. ``register_replacement``'s patterns require each interior node to have exactly its traced
users, so none of these regions matched on the H200 (0 times), and no decline reason was recorded
(the matcher fails before ``extra_check``). Not fixed yet: marking the interior pattern nodes
``users=MULTIPLE`` was not enough (branch i29d); the fix is either a matcher that lets an interior
node keep outside readers or regions that list such nodes as outputs. This test flags the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


class ReluDrop(nn.Module):
    """relu + dropout with nothing else keeping the mm output alive: the partitioner saves relu's
    gradient mask ``le(relu, 0)`` from the forward, a reader of relu outside the region."""

    def __init__(self, d: int = 32, f: int = 64):
        super().__init__()
        self.wi, self.wo = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.wo(self.drop(F.relu(self.wi(x)))).float().pow(2).mean()


@pytest.mark.xfail(strict=True, reason="issue #29 not fixed yet: the pattern fails at relu, which le(relu, 0) also reads "
                   "(FailedMatch(CallFunction(aten.relu.default, ...)))")
def test_relu_dropout_fires_when_relu_is_read_outside():
    from miner.runtime import rewrite

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ReluDrop()
    cid = "pf4693d7449_x4"
    gp = rewrite.FusionPass([rewrite.entry_for(REPO / "candidates" / cid / "pattern.py", cid)])
    seen = []

    def spy(graph):
        seen.extend(n.target for n in graph.nodes if n.op == "call_function")
        gp(graph)

    opts = rewrite.inductor_options(gp)
    opts["post_grad_custom_pre_pass"] = spy
    fn = torch.compile(model, options=opts, dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fn(torch.randn(2, 4, 32)).backward()
    assert torch.ops.aten.le.Scalar in seen  # the situation of the issue: relu read outside the region
    assert gp.counts[cid] == 1, (gp.counts, gp.declined)
    torch._dynamo.reset()
