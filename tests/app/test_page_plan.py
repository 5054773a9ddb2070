"""Plan page: the ranked layouts of ``simddp plan``, the step-time / memory front, and "Open in Planner"."""

from __future__ import annotations

import pytest
from apptest_helpers import assert_clean, figure, open_page, start

from simddp import as_scenario, simulate, units
from simddp.planner import plan_layouts

SMALL = {
    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
    "model": {"transformer": {"num_layers": 4, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                              "vocab_size": 32000}},
    "training": {"global_batch_size": 32, "seq_len": 512, "micro_batch_size": 1},
}


def _searched(gpus: int = 4):  # type: ignore[no-untyped-def]
    at = start()
    at.session_state["scenario"] = SMALL
    at = open_page(at, "plan")
    at.number_input(key="plan_gpus").set_value(gpus).run()
    at.number_input(key="plan_top").set_value(5).run()
    at.toggle(key="plan_front_exact").set_value(True).run()
    at.button(key="plan_run").click().run()
    assert_clean(at)
    return at


def test_search_lists_the_planner_layouts_with_their_front() -> None:
    at = _searched()
    ref = plan_layouts(as_scenario(SMALL), 4, top=5, exact_front=True)
    table = at.main.dataframe[0].value
    assert list(table["rank"]) == [1, 2, 3, 4, 5]
    assert list(table["step time (ms)"]) == pytest.approx([lay.step_time_s / units.MS for lay in ref.layouts],
                                                          rel=1e-12)
    assert list(table["tp"]) == [lay.tp for lay in ref.layouts]
    fig = figure(at, "Step time against memory per GPU")
    front = next(t for t in fig["data"] if t["name"].startswith("Pareto front"))
    assert front["x"] == pytest.approx([lay.memory_bytes / units.GiB for lay in ref.front])
    assert len(next(t for t in fig["data"] if t["name"] == "simulated layouts")["x"]) == ref.simulated
    assert [m.value for m in at.main.metric if m.label == "Layouts evaluated"] == [f"{ref.evaluated:,}"]


def test_open_in_planner_loads_the_layout() -> None:
    at = _searched()
    ref = plan_layouts(as_scenario(SMALL), 4, top=5)
    at.selectbox(key="plan_pick").set_value(2).run()
    at.button(key="plan_open").click().run()
    assert_clean(at)
    scenario = as_scenario(at.session_state["scenario"])
    chosen = ref.layouts[1]
    assert (scenario.cluster.num_gpus, scenario.parallelism.tp, scenario.parallelism.zero_stage,
            scenario.training.micro_batch_size) == (4, chosen.tp, chosen.zero_stage, chosen.micro_batch_size)
    assert simulate(scenario, trace=False).step_time_s == chosen.step_time_s
    assert at.title[0].value == "Planner"


def test_a_gpu_count_no_layout_splits_is_one_error_line() -> None:
    at = start()
    at.session_state["scenario"] = SMALL
    at = open_page(at, "plan")
    at.number_input(key="plan_gpus").set_value(12).run()
    at.button(key="plan_run").click().run()
    assert not at.exception
    assert [e.value for e in at.error] and "GPUs(12)" in at.error[0].value
    assert not at.main.dataframe
