"""A promoted fusion loads into torch.compile by path, with one line, under any mode (issue 11 item 3)."""

import pytest
import torch

from miner.core.errors import UsageError
from miner.core.workspace import Workspace
from miner.runtime import fusions
from test_promote import validated


class Chain(torch.nn.Module):
    """A projection feeding the fusion's own pattern (exp / sum / div), as in a model."""

    def __init__(self, pattern):
        super().__init__()
        self.proj = torch.nn.Linear(20, 20)
        self.pattern = pattern

    def forward(self, x):
        return self.pattern(self.proj(x))[0]


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    """One promoted workspace for the module (generate, validate and promote take ~17 s on CI's CPU); the
    tests only read it."""
    from miner.promote import promote

    ws = Workspace(tmp_path_factory.mktemp("promoted"))
    promote(ws, validated(ws).id, "exp_softmax")
    return ws


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_install_makes_every_compile_use_the_workspace_fusions(promoted, mode):
    graph_pass = fusions.install(promoted.root)
    try:
        torch._dynamo.reset()
        model, x = Chain(fusions.load(promoted.root, "exp_softmax").pattern), torch.randn(6, 20)
        with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
            got = torch.compile(model, mode=mode, dynamic=False)(x)
    finally:
        fusions.uninstall()
        torch._dynamo.reset()
    assert graph_pass.counts["exp_softmax"] == 1
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
    assert torch._inductor.config.post_grad_custom_post_pass is None


def test_inductor_options_hold_for_one_compile(promoted):
    graph_pass = fusions.graph_pass(promoted.root)
    options = fusions.inductor_options(promoted.root, graph_pass_=graph_pass)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
        model = Chain(fusions.load(promoted.root, "exp_softmax").pattern)
        torch.compile(model, options=options, dynamic=False)(torch.randn(6, 20))
    torch._dynamo.reset()
    assert graph_pass.counts == {"exp_softmax": 1}


def test_a_fusions_folder_and_its_workspace_load_alike(promoted):
    assert fusions.names(promoted.root) == fusions.names(promoted.fusions) == ["exp_softmax"]
    with pytest.raises(UsageError, match="unknown fusion 'nope'.*exp_softmax"):
        fusions.load(promoted.root, "nope")


def test_install_refuses_to_replace_a_foreign_pass(promoted):
    # config.patch, not monkeypatch: some pytest versions undo a setattr on torch's config module with
    # delattr, which hides the option for the rest of the process ("... does not exist")
    with torch._inductor.config.patch(post_grad_custom_post_pass=object()):
        with pytest.raises(UsageError, match="already holds"):
            fusions.install(promoted.root)
    assert torch._inductor.config.post_grad_custom_post_pass is None
