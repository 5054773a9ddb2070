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


def _search(scenario: dict, gpus: int):  # type: ignore[no-untyped-def,type-arg]
    at = start()
    at.session_state["scenario"] = scenario
    at = open_page(at, "plan")
    at.number_input(key="plan_gpus").set_value(gpus).run()
    at.number_input(key="plan_top").set_value(3).run()
    at.button(key="plan_run").click().run()
    assert_clean(at)
    return at


def test_the_page_plans_what_the_cli_plans() -> None:
    """A probe found the page planning a null batch derived on the scenario's own GPUs (the CLI derives it on the
    planned ones) and refusing a scenario whose own layout is invalid (a batch smaller than its GPUs), which the
    CLI plans. Both go through simddp.planner.plan_start now: the same counts, rows and 'your layout'."""
    from simddp.planner import plan_start, scenario_layout

    null_batch = {**SMALL, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 4},
                  "training": {**SMALL["training"], "global_batch_size": None, "micro_batch_size": 2}}
    small_batch = {**SMALL, "training": {**SMALL["training"], "global_batch_size": 4}}  # 4 samples, 8 GPUs
    for scenario, gpus in ((null_batch, 8), (small_batch, 8)):
        at = _search(scenario, gpus)
        begin = plan_start(scenario, gpus)
        ref = plan_layouts(begin.base, gpus, top=3, pareto=True)
        table = at.main.dataframe[0].value
        assert list(table["step time (ms)"]) == pytest.approx([lay.step_time_s / units.MS for lay in ref.layouts],
                                                              rel=1e-12)
        assert [m.value for m in at.main.metric if m.label == "Layouts evaluated"] == [f"{ref.evaluated:,}"]
        captions = " ".join(c.value for c in at.main.caption)
        if begin.own is not None:
            yours = scenario_layout(begin.own)
            assert yours is not None and units.fmt_time(yours.step_time_s) in captions
        else:
            assert "Your layout is not compared: global_batch_size(4) is not a multiple" in captions
    # the null batch is derived on the planned GPUs: micro-batch 2 x dp 8 (on the scenario's own 4 GPUs, 8)
    assert plan_start(null_batch, 8).base.global_batch_size == 16 and as_scenario(null_batch).global_batch_size == 8


def test_a_cluster_beyond_65536_gpus_opens_the_page() -> None:
    """A hostile-input probe: the Planner's cluster at its widgets' limits (4,096 nodes of 64 GPUs, 262,144 GPUs)
    crashed the Plan page (the GPU count's widget stopped at 65,536); it now goes up to the GPUs any scenario may
    have."""
    at = start()
    at.session_state["scenario"] = {**SMALL, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 4096,
                                                         "gpus_per_node": 64}}
    at = open_page(at, "plan")
    assert_clean(at)
    assert at.number_input(key="plan_gpus").value == 4096 * 64
