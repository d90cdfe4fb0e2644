"""The one line a user copies (issue 33): ``miner.runtime.fusions.install(<workspace>)``, then torch.compile.

Each test fails on the code before issue 33:
- a graph Inductor cached while the Triton interpreter was on was served to a process without it,
  whose first call raised "CPU tensors need TRITON_INTERPRET=1" (the cache key lacked the interpreter);
- on the CPU the fusions fired as interpreted kernels (~100x slower) without being asked;
- ``counts`` read ``{}`` on a warm cache and nothing said the pass had not run;
- ``install`` of a missing path, the README's placeholder or a folder without ``fusions/`` returned
  an empty pass without a word.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miner.core.errors import UsageError
from miner.runtime import fusions, rewrite

ROOT = Path(__file__).resolve().parents[1]

# A user's own small model: Linear, LayerNorm, GELU, Linear, log_softmax (two promoted fusions match).
USER_SCRIPT = r'''
import json, sys, torch
import miner.runtime.fusions as F

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln, self.b = torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 32)

    def forward(self, x):
        return torch.log_softmax(self.b(torch.nn.functional.gelu(self.ln(self.a(x)))), -1)

torch.manual_seed(0)
m, x = Net().eval(), torch.randn(16, 64)
p = F.install(sys.argv[1])
with torch.no_grad():
    y = torch.compile(m)(x)
    ok = torch.allclose(y, m(x), atol=1e-5, rtol=1e-5)
print(json.dumps({"counts": dict(p.counts), "hits": p.cache_hits(), "ok": ok,
                  "declined": {k: sorted(v) for k, v in p.declined.items()}}))
'''


def user_run(tmp_path: Path, cache: Path, interpret: bool) -> dict:
    """The script above in a fresh process, Inductor's caches in ``cache``; TRITON_INTERPRET and
    MINER_INTERPRET both set (``interpret``) or both unset, as a user's shell would have them."""
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MINER_INTERPRET")}
    env.update(PYTHONPATH=str(ROOT), TORCHINDUCTOR_CACHE_DIR=str(cache), CUDA_VISIBLE_DEVICES="")
    if interpret:
        env.update(TRITON_INTERPRET="1", MINER_INTERPRET="1")
    r = subprocess.run([sys.executable, str(script), str(ROOT)], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_graph_cached_under_the_interpreter_is_not_served_without_it(tmp_path):
    cache = tmp_path / "inductor-cache"
    first = user_run(tmp_path, cache, interpret=True)
    assert first["counts"] == {"layer_norm": 1, "log_softmax": 1} and first["ok"]
    second = user_run(tmp_path, cache, interpret=False)  # crashed at its first call before issue 33
    assert second["ok"] and second["counts"] == {} and second["hits"] == 0
    assert all(any("MINER_INTERPRET=1" in r for r in reasons) for reasons in second["declined"].values())
    assert set(second["declined"]) == {"layer_norm", "log_softmax"}


def test_a_warm_cache_says_its_matches_were_not_counted(tmp_path):
    cache = tmp_path / "inductor-cache"
    assert user_run(tmp_path, cache, interpret=True)["counts"] == {"layer_norm": 1, "log_softmax": 1}
    warm = user_run(tmp_path, cache, interpret=True)
    assert warm["ok"] and warm["counts"] == {}  # the pass did not run: Inductor served the graph
    assert warm["hits"] >= 1  # ... and the pass says so (FusionPass.cache_hits)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln = torch.nn.Linear(8, 32), torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(self.a(x))


def compiled_counts(monkeypatch, interpret):
    monkeypatch.delenv("MINER_INTERPRET", raising=False)  # conftest asks for the interpreter; a user does not
    p = fusions.install(ROOT, ["layer_norm"], interpret=interpret)
    try:
        torch._dynamo.reset()
        with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
            torch.compile(Net(), dynamic=False)(torch.randn(4, 8))
    finally:
        fusions.uninstall()
        torch._dynamo.reset()
    return p


def test_on_the_cpu_the_fusions_decline_unless_asked_and_say_how(monkeypatch, caplog):
    assert rewrite.interpreter_enabled()  # the suite's interpreter is on: only the ask is missing
    with caplog.at_level(logging.WARNING, logger="miner.runtime.rewrite"):
        p = compiled_counts(monkeypatch, interpret=None)
    assert p.counts == {} and list(p.declined["layer_norm"]) == [rewrite.CPU_NOT_ASKED]
    warnings = [r.getMessage() for r in caplog.records if "MINER_INTERPRET=1" in r.getMessage()]
    assert len(warnings) == 1 and "interpret=True" in warnings[0]
    assert compiled_counts(monkeypatch, interpret=True).counts == {"layer_norm": 1}


def test_the_ask_and_the_interpreter_are_in_the_cache_key(monkeypatch):
    entries = fusions.graph_pass(ROOT, ["layer_norm"]).entries
    asked, not_asked = rewrite.FusionPass(entries, interpret=True), rewrite.FusionPass(entries, interpret=False)
    assert asked.uuid() != not_asked.uuid()
    before = asked.uuid()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert asked.uuid() != before


@pytest.mark.parametrize("where, message", [("path/to/workspace", "placeholder"),
                                            ("missing", "no such directory"),
                                            ("empty", "no fusions/ here")])
def test_install_of_a_path_without_fusions_is_an_error(tmp_path, monkeypatch, where, message):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        fusions.install(where)
    assert torch._inductor.config.post_grad_custom_post_pass is None
