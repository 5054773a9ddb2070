"""Memory page: stacked bytes per strategy against the capacity; the scenario's own items."""

from __future__ import annotations

import pytest
from apptest_helpers import figure, open_page, start

import simddp
from simddp import sweeps, units


def test_strategies_side_by_side_with_capacity() -> None:
    at = open_page(start(), "memory")
    table = at.main.dataframe[0].value
    assert list(table["strategy"]) == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)", "TP=8", "PP=4"]
    ref = sweeps.strategy_sweep(at.session_state["scenario"],
                                sweeps.default_strategies(sweeps.scenario_from_dict(at.session_state["scenario"]),
                                                          tp=8, pp=4))
    assert list(table["memory / GPU (GiB)"]) == pytest.approx([p.memory_bytes / units.GiB for p in ref.points])
    assert list(table["fits"]) == [p.memory_fits for p in ref.points]
    # Llama-2-7B with Adam does not fit 80 GB under plain DDP; ZeRO-3 does.
    assert not table["fits"][0] and table["fits"][3]
    fig = figure(at, "Memory per GPU")
    assert {t["name"] for t in fig["data"] if t.get("type") == "bar"} >= {"parameters", "gradients", "activations"}
    capacity = [s for s in fig["layout"]["shapes"] if s.get("type") == "line"]
    assert capacity and capacity[0]["y0"] == pytest.approx(ref.points[0].capacity_bytes / units.GiB)
    assert "fits" in at.main.subheader[0].value and "does not fit" not in at.main.subheader[0].value


def test_tp_degree_and_layout_search() -> None:
    at = open_page(start(), "memory")
    at.select_slider(key="mem_tp").set_value(2).run()
    assert not at.exception
    assert "TP=2" in list(at.main.dataframe[0].value["strategy"])
    at.toggle(key="mem_search").set_value(True).run()
    assert not at.exception
    assert any("least model parallelism that fits" in m.value for m in at.main.markdown)
    search = simddp.smallest_layout_that_fits(simddp.scenario_from_dict(at.session_state["scenario"]))
    listed = at.main.dataframe[-1].value  # every layout evaluated, as the CLI lists them
    assert len(listed) == search.num_layouts == len(search.evaluated)
    assert list(listed["recompute"])[:3] == [f.recompute for f in search.evaluated[:3]]
    assert list(listed["fits"]).count(True) == sum(f.fits for f in search.evaluated)


def test_a_change_in_the_planner_moves_the_bars() -> None:
    at = open_page(start(), "memory")
    before = list(at.main.dataframe[0].value["memory / GPU (GiB)"])
    at.session_state["scenario"] = sweeps.set_value(at.session_state["scenario"], "training.seq_len", 1024)
    at.run()
    after = list(at.main.dataframe[0].value["memory / GPU (GiB)"])
    assert all(a < b for a, b in zip(after, before, strict=True))  # fewer activations everywhere
