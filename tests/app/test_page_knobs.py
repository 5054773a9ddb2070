"""DDP knobs page: the knob table of the planner's scenario, as `simddp knobs` computes it."""

from __future__ import annotations

import pytest
from apptest_helpers import figure, open_page, start

from simddp.knobs import knob_table
from simddp.scenario_io import scenario_from_dict
from simddp.sweeps import set_value


def test_knob_table_matches_simddp() -> None:
    at = start()
    at.session_state["scenario"] = set_value(at.session_state["scenario"], "parallelism.zero_stage", 0)
    open_page(at, "knobs")
    ref = knob_table(scenario_from_dict(at.session_state["scenario"]))
    table = at.main.dataframe[0].value
    assert list(table["knob"]) == [r.knob for r in ref.rows]
    for shown, row in zip(table["step (ms)"], ref.rows, strict=True):
        assert shown == pytest.approx(row.step_time_s * 1e3)
    fig = figure(at, "Step time change of each DDP knob")
    assert any("ddp.backend = gloo" in y for y in fig["data"][0]["y"])
