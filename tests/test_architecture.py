"""Imports flow one way: simddp never imports torch, streamlit, plotly (at module level) or calibration."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_TOP = {"torch", "streamlit", "plotly", "calibration", "app", "simddp_calibration", "simddp_app", "pandas"}


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_library_has_no_heavy_module_level_imports() -> None:
    for path in (ROOT / "simddp").rglob("*.py"):
        bad = _imports(path, top_level_only=True) & FORBIDDEN_TOP
        assert not bad, f"{path.relative_to(ROOT)} imports {bad} at module level"


def test_library_never_imports_calibration_or_torch() -> None:
    for path in (ROOT / "simddp").rglob("*.py"):
        bad = _imports(path, top_level_only=False) & {"torch", "calibration", "streamlit", "app", "simddp_calibration",
                                                             "simddp_app"}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_charts_do_not_import_streamlit() -> None:
    charts = ROOT / "app" / "charts.py"
    if charts.exists():
        assert "streamlit" not in _imports(charts, top_level_only=False)


def _simddp_imports(path: Path) -> set[str]:
    """Every simddp module ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("simddp")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("simddp"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_config_never_imports_the_calibration_profile() -> None:
    # The config <-> profile circle (issue 9): a calibration profile is applied by simddp.scenario_io, a layer
    # above both; the config models import neither the profile module nor the layer that uses it.
    imports = _simddp_imports(ROOT / "simddp" / "config.py")
    assert not {m for m in imports if m.startswith(("simddp.profile", "simddp.fit", "simddp.scenario_io"))}, imports
