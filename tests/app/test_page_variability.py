"""Variability page: the Monte Carlo of the planner's scenario, its histogram and p99 against the GPUs."""

from __future__ import annotations

import pytest
from apptest_helpers import figure, metric, open_page, start

from simddp.config import deep_merge
from simddp.scenario_io import scenario_from_dict
from simddp.variability import simulate_tails, tails_vs_ranks


def test_histogram_with_p50_and_p99_and_the_numbers_of_simddp() -> None:
    at = open_page(start(), "variability")
    at.slider(key="var_cv").set_value(5.0).run()
    at.number_input(key="var_stragglers").set_value(2).run()
    assert not at.exception and not at.error
    data = deep_merge(at.session_state["scenario"], {"variability": {
        "jitter_cv": 0.05, "num_stragglers": 2, "straggler_slowdown": 1.0, "seq_len_distribution": "fixed",
        "sequence_handling": "padding", "mean_seq_len": 1024, "seed": 0}})
    ref = simulate_tails(scenario_from_dict(data), 200)
    assert metric(at, "p99 step") == f"{ref.p99_s:.3f} s"
    fig = figure(at, "Monte Carlo steps")
    assert len(fig["data"][0]["x"]) == 200
    texts = [a["text"] for a in fig["layout"]["annotations"]]
    assert any(t.startswith("p50 ") for t in texts) and any(t.startswith("p99 ") for t in texts)
    table = at.main.dataframe[0].value
    assert table["synchronisation point"].iloc[0] == "data-parallel gradient reduction"


def test_p99_tail_grows_with_the_gpus_and_matches_simddp() -> None:
    at = open_page(start(), "variability")
    at.slider(key="var_cv").set_value(5.0).run()
    at.select_slider(key="var_max_nodes").set_value(8).run()
    fig = figure(at, "p99 step time against the number of GPUs")
    gpus = fig["data"][0]["x"]
    assert gpus == [8, 16, 32, 64]
    p99 = fig["data"][0]["y"]
    data = deep_merge(at.session_state["scenario"], {"variability": {"jitter_cv": 0.05, "mean_seq_len": 1024}})
    ref = tails_vs_ranks(scenario_from_dict(data), [1, 2, 4, 8], 200)
    assert p99 == pytest.approx([p.p99_s * 1e3 for p in ref], rel=1e-9)
    # More ranks wait for the slowest of more draws: the p99 beyond the simulated step grows with the GPUs
    # (the step itself shrinks a little, ZeRO-1 sharding the optimizer over more of them).
    excess = [p.p99_s - p.deterministic_step_s for p in ref]
    assert excess == sorted(excess)


def test_keeping_the_settings_writes_the_scenario() -> None:
    at = open_page(start(), "variability")
    at.slider(key="var_cv").set_value(3.0).run()
    at.button(key="var_keep").click().run()
    assert at.session_state["scenario"]["variability"]["jitter_cv"] == pytest.approx(0.03)


def test_packing_has_no_padding() -> None:
    at = open_page(start(), "variability")
    at.selectbox(key="var_lengths").set_value("lognormal").run()
    at.segmented_control(key="var_handling").set_value("packing").run()
    assert not at.exception and not at.error
    assert metric(at, "Lost to the tail").endswith("%")
