"""The CLI's verb registry: every verb imports, and help is cheap."""

import importlib
import subprocess
import sys

import pytest

from miner.cli import VERBS, main


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_module_exists(verb):
    module = importlib.import_module(VERBS[verb][0])
    assert callable(module.add_arguments) and callable(module.run)


def test_help_lists_every_verb_without_importing_torch():
    out = subprocess.run([sys.executable, "-c", "import sys; from miner.cli import main\n"
                          "try: main(['--help'])\nexcept SystemExit: pass\n"
                          "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"],
                         capture_output=True, text=True, check=True).stdout
    assert all(v in out for v in VERBS) and out.strip().endswith("NO-TORCH")


def test_no_verb_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "scan" in capsys.readouterr().out
