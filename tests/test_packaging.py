"""Packaging: every package is listed, the installed top-level names are ours alone, fusions ship as files."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_under_miner_is_listed():
    listed = set(_config()["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "miner").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_generic_folders_install_under_names_of_ours():
    config = _config()
    assert config["package-dir"] == {"miner_models": "models", "miner_fusions": "fusions",
                                     "miner_testing": "tests/harness"}
    assert {p.split(".")[0] for p in config["packages"]} == {"miner", "miner_models", "miner_fusions", "miner_testing"}


def test_the_checkout_resolves_its_own_zoo_and_fusions():
    import miner_fusions
    import miner_models
    import miner_testing

    assert Path(miner_models.__file__).parent == REPO / "models"
    assert Path(miner_fusions.__file__).parent == REPO / "fusions"
    assert Path(miner_testing.__file__).parent == REPO / "tests" / "harness"


def test_the_product_package_imports_no_test_framework():
    # the fusions' test harness is miner_testing (tests/harness/); promote counts matches without pytest
    found = [str(p.relative_to(REPO)) for p in (REPO / "miner").rglob("*.py")
             if any(ln.strip().startswith(("import pytest", "from pytest", "from _pytest"))
                    for ln in p.read_text().splitlines())]
    assert not found, found


@pytest.mark.slow
def test_the_wheel_holds_only_our_top_level_names(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("miner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"miner", "miner_models", "miner_fusions", "miner_testing"}
    assert "miner/report/style.css" in names and "miner_testing/row_kernel.py" in names
    assert "miner_fusions/softmax_like/pattern.py" in names and "miner_fusions/softmax_like/wins.json" in names
