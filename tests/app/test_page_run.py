"""Run page: days, cost and goodput of the planner's scenario; goodput against the checkpoint interval."""

from __future__ import annotations

import pytest
from apptest_helpers import figure, metric, open_page, start

from simddp.config import deep_merge
from simddp.run import simulate_run
from simddp.scenario_io import scenario_from_dict


def test_days_cost_goodput_match_simddp_run() -> None:
    at = open_page(start(), "run")
    at.number_input(key="run_tokens").set_value(300.0).run()
    at.number_input(key="run_price").set_value(2.0).run()
    assert not at.exception and not at.error
    run = {"tokens": 300e9, "gpu_hour_cost_usd": 2.0}
    ref = simulate_run(scenario_from_dict(deep_merge(at.session_state["scenario"], {"run": run})))
    assert metric(at, "Days") == f"{ref.days:,.1f}"
    assert metric(at, "Cost") == f"${ref.cost:,.0f}"
    assert metric(at, "Goodput") == f"{ref.goodput:.1%}"
    fig = figure(at, "Goodput against the checkpoint interval")
    curve = fig["data"][0]
    assert len(curve["x"]) == len(ref.curve) > 10
    assert max(curve["y"]) == pytest.approx(100 * max(p.goodput for p in ref.curve))
    assert fig["data"][1]["x"] == pytest.approx([ref.checkpoint_interval_s / 60])


def test_a_lower_mtbf_costs_goodput_and_sharded_saving_helps() -> None:
    at = open_page(start(), "run")
    before = float(metric(at, "Goodput").rstrip("%"))
    at.number_input(key="run_mtbf").set_value(500.0).run()
    low = float(metric(at, "Goodput").rstrip("%"))
    assert low < before
    at.segmented_control(key="run_saving").set_value("sharded").run()
    assert float(metric(at, "Goodput").rstrip("%")) > low


def test_fed_throughput_replaces_the_simulated_step() -> None:
    at = open_page(start(), "run")
    at.number_input(key="run_tflops").set_value(100.0).run()
    assert not at.exception and not at.error
    assert any("fed: 100 TFLOP/s" in c.value for c in at.main.caption)
