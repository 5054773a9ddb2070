"""Sidebar of every page: the scenario in use and the exports (YAML, CSV, Perfetto trace)."""

from __future__ import annotations

import json

import pytest
from apptest_helpers import open_page, start

from simddp import sweeps
from simddp_app import state


def test_exports_on_every_page() -> None:
    at = start()
    for page in ("planner", "timeline", "scaling", "memory", "whatif", "calibration", "compare"):
        open_page(at, page)
        labels = [b.label for b in at.sidebar.get("download_button")]
        assert labels == ["Scenario YAML", "Results CSV", "Perfetto trace"], page


def test_exported_yaml_round_trips_and_the_trace_is_perfetto_json() -> None:
    at = start()
    data = at.session_state["scenario"]
    assert state.parse_scenario_upload("scenario.yaml", state.to_yaml(data).encode()) == data
    result = state._simulate.__wrapped__(state.to_json(data))  # the cached call, uncached
    assert result.trace is None  # pages other than the Timeline get the fast engine's answer, no trace
    traced = state._simulate.__wrapped__(state.to_json(data), True)
    assert traced.trace is not None and traced.step_time_s == pytest.approx(result.step_time_s, rel=1e-9)
    events = json.loads(state.perfetto_json(state.to_json(data)))["traceEvents"]  # what the button downloads
    assert {e["ph"] for e in events} == {"M", "X"}
    csv = result.summary_dataframe().to_csv(index=False)
    assert csv.startswith("metric,value") and "step_time_s" in csv


def test_invalid_scenario_keeps_the_sidebar_usable() -> None:
    at = start()
    at.session_state["scenario"] = sweeps.set_value(at.session_state["scenario"], "parallelism.tp", 3)
    at.run()
    assert not at.exception
    assert at.sidebar.warning
    assert [b.label for b in at.sidebar.get("download_button")] == ["Scenario YAML"]
