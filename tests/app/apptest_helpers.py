"""Shared helpers of the dashboard's AppTests (a module name no other test folder uses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

import simddp
from simddp.cli import default_scenario_path
from simddp.config import read_mapping

APP = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
TIMEOUT_S = 60
PAGES = ["planner", "plan", "timeline", "scaling", "memory", "whatif", "variability", "run", "knobs", "calibration",
         "compare"]


def start() -> AppTest:
    """The dashboard after its first run (the Planner, on the default scenario)."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.run()
    assert_clean(at)
    return at


def open_page(at: AppTest, name: str) -> AppTest:
    at.switch_page(f"app_pages/{name}.py").run()
    assert_clean(at)
    return at


def assert_clean(at: AppTest, errors_allowed: bool = False) -> None:
    """No traceback on the page; and no inline error unless allowed."""
    assert not at.exception, [e.value for e in at.exception]
    if not errors_allowed:
        assert not at.error, [e.value for e in at.error]


def metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.main.metric if m.label == label]
    assert values, f"no metric {label!r}; have {[m.label for m in at.main.metric]}"
    return values[0]


def metric_delta(at: AppTest, label: str) -> str:
    return next(m.delta for m in at.main.metric if m.label == label)


def figures(at: AppTest) -> list[dict[str, Any]]:
    """The plotly figures on the page, as JSON."""
    return [json.loads(c.proto.spec) for c in at.main.get("plotly_chart")]


def figure(at: AppTest, title_part: str) -> dict[str, Any]:
    for fig in figures(at):
        title = fig["layout"].get("title", {})
        text = title.get("text", "") if isinstance(title, dict) else str(title)
        if title_part in text:
            return fig
    raise AssertionError(f"no figure titled with {title_part!r}")


def default_dict() -> dict[str, Any]:
    """The embedded default as the dashboard holds it (dp left to follow the GPUs)."""
    data = read_mapping(default_scenario_path())
    data["parallelism"].pop("dp", None)
    return data


def default_result() -> simddp.StepResult:
    return simddp.simulate(default_scenario_path(), trace=False)
