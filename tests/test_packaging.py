"""Packaging: no generic top-level import names. The repository's app/ and calibration/ folders install as
simddp_app and simddp_calibration, with the dashboard's pages and Streamlit settings."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RENAMED = {"app": "simddp_app", "calibration": "simddp_calibration"}


def _packages_on_disk() -> set[str]:
    found = set()
    for top in ("simddp", "app", "calibration"):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join((RENAMED.get(parts[0], parts[0]), *parts[1:])))
    found.add("simddp_app.app_pages")  # scripts Streamlit runs as pages: a folder without __init__.py
    return found


def test_every_package_folder_is_listed_under_its_simddp_name() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert set(setuptools["packages"]) == _packages_on_disk()
    assert setuptools["package-dir"] == {"simddp_app": "app", "simddp_calibration": "calibration"}
    assert {p.split(".")[0] for p in setuptools["packages"]} == {"simddp", "simddp_app", "simddp_calibration"}


def test_the_wheel_installs_only_simddp_names(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("simddp", "app", "calibration"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("simddp-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"simddp", "simddp_app", "simddp_calibration",
                                                 wheel.name.split("-py")[0] + ".dist-info"}
    for needed in ("simddp_app/streamlit_app.py", "simddp_app/app_pages/planner.py",
                   "simddp_app/.streamlit/config.toml", "simddp_calibration/collectives.py",
                   "simddp_calibration/launch.py", "simddp_calibration/models/small_transformer.py",
                   "simddp/default_scenario.yaml"):
        assert needed in names, needed


def test_calibration_extra_accepts_the_users_torch_and_dev_pins_the_cpu_build() -> None:
    """`pip install simddp[calibration]` must not replace a cluster's CUDA torch; tests keep the pinned CPU build."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["calibration"] == ["torch>=2.1"]
    assert "torch==2.13.0" in extras["dev"]
