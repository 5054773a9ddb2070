"""The dashboard stays thin: charts without streamlit, pages without the cost model's internals."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
#: simddp modules the app may use: scenario and results types (the memory verdict too), units, presets, sweeps,
#: memory/profile types, the layout planner, the input/output safety layer (safe parsing, errors, result sanity
#: checks, the CSV writer of exports), and the Monte Carlo, run and knob models (variability, run, knobs), called
#: whole like the sweeps.
ALLOWED = {"simddp", "simddp.units", "simddp.config", "simddp.presets", "simddp.results", "simddp.sweeps",
           "simddp.memory", "simddp.cli", "simddp.profile", "simddp.report", "simddp.fit", "simddp.verdict",
           "simddp.safeio", "simddp.errors", "simddp.sanity", "simddp.planner", "simddp.variability", "simddp.run",
           "simddp.knobs", "simddp.zero", "simddp.exports"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_charts_import_no_streamlit() -> None:
    assert not {m for m in _imports(APP / "charts.py") if m.split(".")[0] == "streamlit"}


def test_app_uses_no_cost_model_internals() -> None:
    for path in APP.rglob("*.py"):
        used = {m for m in _imports(path) if m.split(".")[0] == "simddp"}
        assert used <= ALLOWED, f"{path.relative_to(APP)} imports {used - ALLOWED}"


def test_every_page_is_registered() -> None:
    main = (APP / "streamlit_app.py").read_text()
    pages = sorted(p.name for p in (APP / "app_pages").glob("*.py") if p.name != "__init__.py")
    assert pages and all(f'"{p}"' in main for p in pages)
