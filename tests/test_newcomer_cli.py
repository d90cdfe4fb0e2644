"""A new user's first hour (issue 11): the tool run as a user runs it, from a directory of their own.

Each test here would have caught one of the measured defects: a scan from outside the checkout
writing into it, the README's test command not being CI's, corrupt files reused or met with a
hint naming no real command, `report` creating a missing workspace, a traceback on a closed pipe.
The CLI runs as ``python -m miner.cli`` with PYTHONPATH set to this checkout (the console script
``miner`` on PATH may belong to another install); one test checks the console script's wiring.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from miner.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]

FACTORY = '''
import torch
from miner_models import Built


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return {"logits": torch.softmax(self.proj(x) * 0.5, dim=-1)}


def make(preset, mode, device):
    torch.manual_seed(0)
    return Built(Tiny().to(device), {"x": torch.randn(4, 16, device=device)}, lambda out: out["logits"].sum())
'''


def miner_cli(args, cwd, path=(), **kw):
    """``miner <args>`` in ``cwd``, running this checkout's miner (``path``: more PYTHONPATH entries)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *map(str, path)])}
    return subprocess.run([sys.executable, "-m", "miner.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, **kw)


def checkout_state() -> str:
    """The checkout's git status (tracked and untracked, ignored files aside)."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}


def test_the_console_script_is_miner_cli_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"miner": "miner.cli:main"}
    from importlib.metadata import entry_points

    installed = [e for e in entry_points(group="console_scripts") if e.name == "miner"]
    assert installed and installed[0].value == "miner.cli:main"  # what `pip install -e .` put on PATH


def test_scan_from_a_directory_of_ones_own(tmp_path):
    """Defect 1: the workers wrote into the checkout; relative and default workspaces failed."""
    user = tmp_path / "project"
    user.mkdir()
    (user / "tinymodel.py").write_text(FACTORY)  # the user's own model, importable only from their directory
    before = checkout_state()

    # relative --workspace, after the verb: resolved against the user's directory
    r = miner_cli(["scan", "--models", "tinymodel:make", "--mode", "infer", "--workspace", "ws"], cwd=user)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1/1 scans ok" in r.stdout
    landed = files_under(user / "ws")
    assert {"captures/tinymodel_make/tiny/infer.scan.json",
            "captures/tinymodel_make/tiny/infer-inference-0.json"} <= landed, landed
    assert files_under(user) - {"tinymodel.py"} == {f"ws/{f}" for f in landed}  # nothing beside the workspace
    graph = json.loads((user / "ws/captures/tinymodel_make/tiny/infer-inference-0.json").read_text())
    assert any(n["target"] == "aten._softmax.default" or "exp" in n["target"] for n in graph["graph"]["nodes"])

    # the default workspace (.) and an absolute one name the same files: both reuse them
    r = miner_cli(["scan", "--models", "tinymodel:make", "--mode", "infer"], cwd=user / "ws", path=[user])
    assert r.returncode == 0 and "reusing saved graphs" in r.stdout, r.stdout + r.stderr
    r = miner_cli(["--workspace", str(user / "ws"), "scan", "--models", "tinymodel:make", "--mode", "infer"],
                  cwd=tmp_path, path=[user])
    assert r.returncode == 0 and "reusing saved graphs" in r.stdout, r.stdout + r.stderr
    assert files_under(user / "ws") == landed
    assert checkout_state() == before  # nothing written into the checkout


def test_workspace_is_resolved_before_the_verb_runs(tmp_path, monkeypatch):
    seen = []
    import miner.commands.patterns as verb

    monkeypatch.setattr(verb, "run", lambda args: seen.append(args.workspace) or 0)
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["patterns", "--workspace", "ws"]) == 0
    assert main(["--workspace", "ws", "patterns"]) == 0
    assert main(["--workspace", "elsewhere", "patterns", "--workspace", "ws"]) == 0  # after the verb wins
    monkeypatch.chdir(tmp_path / "ws")
    assert main(["patterns"]) == 0
    assert seen == [str(tmp_path / "ws")] * 4


def test_scan_help_and_readme_mention_the_workspace(capsys):
    with pytest.raises(SystemExit):
        main(["scan", "--help"])
    assert "--workspace" in capsys.readouterr().out
    assert "--workspace" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("verb", ["report", "candidates", "patterns", "mine", "generate", "promote x --name y",
                                  "profile --show"])
def test_a_missing_workspace_is_an_error_and_is_not_created(tmp_path, monkeypatch, capsys, verb):
    monkeypatch.chdir(tmp_path)
    assert main(["--workspace", "nope", *verb.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no workspace" in err and str(tmp_path / "nope") in err
    assert list(tmp_path.iterdir()) == []


def test_profile_makes_its_workspace_as_scan_does(tmp_path, monkeypatch, capsys):
    # `miner profile` captures (the H200 run of 2026-12-03 was first refused "no workspace")
    monkeypatch.chdir(tmp_path)
    assert main(["--workspace", "new", "profile", "--models", "no_such_model_xyz", "--device", "cpu"]) != 0
    assert "no workspace" not in capsys.readouterr().err


# --------------------------------------------------------------------------- README and CI

def readme_first_block() -> list[str]:
    """The README's first code block, one command a line, comments aside."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def readme_test_command() -> str:
    """The README quick start's test command, as written (its comment aside)."""
    return next(line for line in readme_first_block() if "pytest" in line)


def ci_commands() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_readme_installs_torch_first_then_miner_as_ci_does():
    """Issue 33: the first block ran `pip install -e .` before the note to install CPU torch first."""
    lines = readme_first_block()
    installs = [line for line in lines if line.startswith("python3 -m pip install")]
    assert lines[:2] == installs == ["python3 -m pip install torch==2.13.0", "python3 -m pip install -e ."]
    ci = [line.replace(" -q", "") for line in ci_commands()]
    assert [line for line in ci if line in installs] == installs  # CI runs the same two, in that order


@pytest.mark.slow
def test_readme_first_block_installs_in_a_fresh_venv(tmp_path):
    """The README's install lines, literally, in a fresh virtual environment; then `miner models`."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    py = tmp_path / "venv" / "bin" / "python3"
    for line in readme_first_block()[:2]:
        cmd = [str(py), *shlex.split(line)[1:]]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, line + "\n" + r.stderr[-3000:]
    r = subprocess.run([str(py), "-c", "import torch, miner; print(torch.__version__)"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("2.13.0"), r.stderr[-2000:]


def test_readme_test_command_is_what_ci_runs():
    assert ci_commands()[-1] == readme_test_command()


def test_readme_test_command_collects_from_the_repo_root():
    """Defect 2: `tests.zoo_fixtures` did not import and tests/fusions shadowed `fusions`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = shlex.split(readme_test_command()) + ["--collect-only", "-q", "-p", "no:cacheprovider"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "error" not in r.stdout.splitlines()[-1], r.stdout[-3000:] + r.stderr[-2000:]
    assert "tests/test_scan.py::" in r.stdout and "tests/fusions/" in r.stdout


# --------------------------------------------------------------------------- corrupt files

def hinted_command(err: str) -> list[str]:
    """The command an error line says rebuilds a file, checked against the real parser."""
    m = re.search(r"rebuild it with `([^`]+)`", err)
    assert m, err
    argv = shlex.split(m.group(1))
    assert argv[0] == "miner"
    argv = [a if "<" not in a else "p0" for a in argv[1:]]
    from miner.cli import _verb

    build_parser(_verb(argv)).parse_args(argv)  # SystemExit on an option that does not exist
    return argv


def corrupt(path: Path, text: str = '{"schema": 1, "kind": "MiningResult", "result": {"patt') -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("verb", ["candidates", "candidates --json", "report", "patterns", "generate"])
def test_a_corrupt_patterns_file_fails_every_verb_that_reads_it(tmp_path, capsys, verb):
    bad = corrupt(tmp_path / "mined" / "patterns.json")
    assert main(["--workspace", str(tmp_path), *verb.split()]) != 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err, err
    assert hinted_command(err)[0] == "mine"
    assert not (tmp_path / "reports").exists()


def test_a_corrupt_capture_fails_mine_naming_the_scan_that_rebuilds_it(tmp_path, capsys):
    bad = corrupt(tmp_path / "captures" / "gpt2" / "tiny" / "train-backward-0.json")
    assert main(["--workspace", str(tmp_path), "mine"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err
    argv = hinted_command(err)
    assert argv[:5] == ["scan", "--models", "gpt2", "--mode", "train"] and "--workspace" in argv


@pytest.mark.parametrize("rel, verb", [("candidates/p0abc/candidate.json", "generate"),
                                       ("candidates/p0abc/validation.json", "validate"),
                                       ("candidates/p0abc/bench.json", "bench"),
                                       ("fusions/my_fusion/fusion.json", "promote"),
                                       ("captures/t5/base/infer.scan.json", "scan")])
def test_every_rebuild_hint_is_a_real_command(tmp_path, monkeypatch, rel, verb):
    from miner.core.errors import WorkspaceError
    from miner.core.workspace import read_json

    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkspaceError) as e:
        read_json(corrupt(tmp_path / rel, "{"))
    argv = hinted_command(str(e.value))
    assert argv[0] == verb and "--workspace" not in argv  # the current directory is the workspace


def test_scan_captures_a_corrupt_saved_graph_again_and_says_so(tmp_path, monkeypatch):
    """Defect 4: a truncated graph was reported as 'reusing saved graphs ... ok'."""
    from miner.core.records import CapturedGraph, GraphKey, ScanResult
    from miner.core.workspace import Workspace
    from miner.scan import scan as S

    ws = Workspace(tmp_path)
    key = GraphKey("gpt2", "tiny", "train", "forward", 0)
    ws.save_graph(CapturedGraph(key=key, nodes=()))
    ws.save_scan(ScanResult("gpt2", "tiny", "train", "cpu", True, graphs=(key,), provenance={"batch_seq": [2, 64]}))
    asked = []

    def fake_worker(req, ws_, timeout, echo, log_dir, threads=None):
        asked.append(req)
        return [ScanResult(req.model, req.preset, m, req.device, True) for m in req.modes]

    monkeypatch.setattr(S, "_run_worker", fake_worker)
    said = []
    S.scan(["gpt2"], workspace=ws, echo=said.append)
    assert asked == [] and any("reusing saved graphs" in s for s in said)  # an intact capture is reused

    corrupt(ws.graph_path(key), ws.graph_path(key).read_text()[:40])
    said.clear()
    S.scan(["gpt2"], workspace=ws, echo=said.append)
    assert [(r.model, r.modes) for r in asked] == [("gpt2", ("train",))]
    assert any("corrupt" in s and "train-forward-0.json" in s for s in said), said
    assert not any("reusing saved graphs" in s for s in said)

    asked.clear()
    corrupt(ws.scan_path("gpt2", "tiny", "train"), "not json")  # a corrupt scan result: the same
    S.scan(["gpt2"], workspace=ws, echo=said.append)
    assert [r.model for r in asked] == ["gpt2"]


# --------------------------------------------------------------------------- listings and pipes

def test_a_closed_pipe_ends_a_listing_without_a_traceback(tmp_path):
    """Defect 5: `miner candidates --json | head` ended in a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "miner.cli", "--workspace", str(ROOT), "patterns", "--top", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    proc.stdout.close()  # the reader went away before the first line, as `| head -0` would
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_mine_help_shows_the_defaults_mine_uses(capsys):
    import dataclasses

    from miner.mine.mine import MineOptions

    with pytest.raises(SystemExit):
        main(["mine", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--max-fanout N a node with more fusable users connects patterns only through its operands (default 4)" \
        in help_text
    args = build_parser("mine").parse_args(["mine"])
    shared = [f for f in dataclasses.fields(MineOptions) if hasattr(args, f.name)]
    assert len(shared) >= 8
    for f in shared:
        assert getattr(args, f.name) == f.default, f.name
    import miner.mine.mine as M

    assert not hasattr(M, "DEFAULTS")  # one set of defaults: MineOptions's, shown by the CLI
