"""The workspace on disk: where each stage reads and writes, atomically.

Layout (default root: the current directory; ``--workspace DIR``)::

    captures/<model>/<preset>/<mode>-<phase>-<i>.json   one CapturedGraph each (schema-versioned)
    captures/<model>/<preset>/<mode>.scan.json           the ScanResult of that (model, preset, mode)
    mined/patterns.json                                   mining results (miner.mine.mine)
    candidates/<id>/                                      generated candidates (miner.generate.generate)
    fusions/<name>/                                       promoted fusions (miner.promote)
    reports/                                              reports and benchmark runs

Every write goes to a temporary file in the same folder and is renamed into place, so a
crash never leaves a half-written file. A file that cannot be read raises
``WorkspaceError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from miner.core.errors import WorkspaceError
from miner.core.records import SCHEMA_VERSION, CapturedGraph, GraphKey, ScanResult, from_json, to_json


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; ``WorkspaceError`` naming the file (and the command that rebuilds it)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise WorkspaceError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        cmd = rebuild_command(path)
        raise WorkspaceError(f"{path}: corrupt JSON ({e}); "
                             + (f"rebuild it with `{cmd}`" if cmd else "delete it")) from None


def rebuild_command(path: Path) -> str | None:
    """The ``miner`` command that writes workspace file ``path`` again, or None for a file of no stage.

    ``captures/<model>/<preset>/<mode>...json`` -> ``miner scan`` of that model, preset and mode
    (scan captures again whatever does not read back); ``mined/patterns.json`` -> ``miner mine``;
    ``candidates/<id>/validation.json`` -> ``miner validate <id>``; ``bench.json`` -> ``miner bench``;
    the other files of ``candidates/<id>/`` -> ``miner generate --only <id>``; ``fusions/<name>/*``
    -> ``miner promote``. A workspace other than the current directory is named with ``--workspace``.
    """
    parts = Path(path).parts
    n = len(parts)

    def at(depth: int, folder: str) -> bool:
        return n > depth and parts[n - depth - 1] == folder

    if at(3, "captures"):
        model, preset, mode = parts[-3], parts[-2], parts[-1].split(".")[0].split("-")[0]
        cmd, root = f"miner scan --models {model} --mode {mode}" + (f" --preset {preset}" if preset != "tiny" else ""), 4
    elif at(1, "mined") and parts[-1] == "patterns.json":
        cmd, root = "miner mine", 2
    elif at(2, "candidates"):
        cid, file = parts[-2], parts[-1]
        cmd = {"validation.json": f"miner validate {cid}",
               "bench.json": f"miner bench --candidates {cid}"}.get(file, f"miner generate --only {cid}")
        root = 3
    elif at(1, "candidates"):
        cmd, root = "miner generate", 2
    elif at(2, "fusions"):
        cmd, root = f"miner promote <candidate-id> --name {parts[-2]}", 3
    else:
        return None
    ws = Path(*parts[:n - root]) if n > root else Path(".")
    if ws.resolve() != Path.cwd().resolve():
        cmd += f" --workspace {ws}"
    return cmd


def safe_name(name: str) -> str:
    """A model name as a folder name: ``pkg.mod:factory`` -> ``pkg.mod_factory``, ``org/model`` -> ``org_model``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def read_envelope(path: Path, kind: str, schema: int, rerun: str) -> Any:
    """The payload of a versioned workspace file ``{"schema", "kind", ...}``; ``WorkspaceError`` otherwise."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise WorkspaceError(f"{path}: not a miner {kind} file")
    if data.get("schema") != schema:
        raise WorkspaceError(f"{path}: schema {data.get('schema')}, this miner reads {schema}; re-run `{rerun}`")
    return data


class Workspace:
    def __init__(self, root: str | Path = "."):
        self.root = Path(root)

    # ---- paths
    @property
    def captures(self) -> Path:
        return self.root / "captures"

    @property
    def mined(self) -> Path:
        return self.root / "mined"

    @property
    def candidates(self) -> Path:
        return self.root / "candidates"

    @property
    def fusions(self) -> Path:
        return self.root / "fusions"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def graph_path(self, key: GraphKey) -> Path:
        return self.captures / safe_name(key.model) / key.preset / f"{key.slug}.json"

    def scan_path(self, model: str, preset: str, mode: str) -> Path:
        return self.captures / safe_name(model) / preset / f"{mode}.scan.json"

    # ---- graphs
    def save_graph(self, graph: CapturedGraph) -> Path:
        return write_json(self.graph_path(graph.key), {"schema": SCHEMA_VERSION, "kind": "CapturedGraph",
                                                       "graph": to_json(graph)})

    def load_graph(self, path_or_key: Path | GraphKey) -> CapturedGraph:
        path = self.graph_path(path_or_key) if isinstance(path_or_key, GraphKey) else Path(path_or_key)
        data = read_envelope(path, "CapturedGraph", SCHEMA_VERSION, "miner scan --force")
        try:
            return from_json(CapturedGraph, data["graph"])
        except (ValueError, TypeError, KeyError) as e:
            raise WorkspaceError(f"{path}: malformed graph ({e})") from None

    def graph_files(self, models: list[str] | None = None) -> list[Path]:
        files = sorted(p for p in self.captures.glob("*/*/*.json") if not p.name.endswith(".scan.json"))
        if models is not None:
            wanted = {safe_name(m) for m in models}
            files = [p for p in files if p.parts[-3] in wanted]
        return files

    def load_graphs(self, models: list[str] | None = None) -> list[CapturedGraph]:
        return [self.load_graph(p) for p in self.graph_files(models)]

    # ---- scan results
    def save_scan(self, result: ScanResult) -> Path:
        return write_json(self.scan_path(result.model, result.preset, result.mode),
                          {"schema": SCHEMA_VERSION, "kind": "ScanResult", "scan": to_json(result)})

    def load_scan(self, model: str, preset: str, mode: str) -> ScanResult | None:
        path = self.scan_path(model, preset, mode)
        return self._read_scan(path) if path.exists() else None

    def _read_scan(self, path: Path) -> ScanResult:
        data = read_envelope(path, "ScanResult", SCHEMA_VERSION, "miner scan --force")
        try:
            return from_json(ScanResult, data["scan"])
        except (ValueError, TypeError, KeyError) as e:
            raise WorkspaceError(f"{path}: malformed scan result ({e})") from None

    def scans(self) -> list[ScanResult]:
        return [self._read_scan(p) for p in sorted(self.captures.glob("*/*/*.scan.json"))]
