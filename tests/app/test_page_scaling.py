"""Scaling page: 1 to 2,048 GPUs with 128 marked; weak and strong scaling."""

from __future__ import annotations

import pytest
from apptest_helpers import figures, open_page, start

from simddp import sweeps


def test_weak_scaling_from_1_to_2048_gpus() -> None:
    at = open_page(start(), "scaling")
    table = at.main.dataframe[0].value
    assert list(table["num_gpus"]) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert (table["note"] == "").all()
    ref = sweeps.scaling_sweep(at.session_state["scenario"])
    assert list(table["step time (ms)"]) == pytest.approx([p.step_time_s * 1e3 for p in ref.points], rel=1e-12)
    fig = figures(at)[0]
    marks = [s for s in fig["layout"].get("shapes", []) if s.get("type") == "line"]
    assert marks, "128 GPUs is marked"
    assert any(a.get("text") == "128 GPUs" for a in fig["layout"]["annotations"])


def test_strong_scaling_reports_gpu_counts_the_batch_does_not_divide() -> None:
    at = open_page(start(), "scaling")
    at.segmented_control(key="scaling_batch").set_value("strong").run()
    assert not at.exception
    table = at.main.dataframe[0].value
    assert set(table["global_batch_size"].dropna()) == {512}
    bad = table[table["note"] != ""]
    assert list(bad["num_gpus"]) == [1024, 2048]
    assert bad["note"].str.contains("global_batch_size").all()


def test_fewer_gpus_and_a_different_scenario_change_the_sweep() -> None:
    at = open_page(start(), "scaling")
    at.select_slider(key="scaling_max").set_value(256).run()
    table = at.main.dataframe[0].value
    assert table["num_gpus"].max() == 256
    before = list(table["step time (ms)"])
    at.session_state["scenario"] = sweeps.set_value(at.session_state["scenario"],
                                                    "cluster.inter_node.nic_bandwidth_bytes_per_s", 12.5e9 / 4)
    at.run()
    after = list(at.main.dataframe[0].value["step time (ms)"])
    assert after[:4] == before[:4]  # one node: no network
    assert after[-1] > before[-1]
