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
