"""What-if page: sliders change a copy of the planner's scenario; bucket sweep and heatmap."""

from __future__ import annotations

import pytest
from apptest_helpers import assert_clean, default_dict, figure, metric, metric_delta, open_page, start

import simddp
from simddp import sweeps, units


def test_starts_at_the_planner_without_deltas() -> None:
    at = open_page(start(), "whatif")
    ref = simddp.simulate(at.session_state["scenario"], trace=False)
    assert metric(at, "Step time") == units.fmt_time(ref.step_time_s)
    assert not metric_delta(at, "Step time")
    assert figure(at, "Bucket-cap sweep")


def test_slower_network_raises_step_time_and_exposed_comm() -> None:
    at = open_page(start(), "whatif")
    at.select_slider(key="wi:nic_gbit").set_value(25.0).run()
    assert_clean(at)
    expected = simddp.simulate(
        sweeps.with_values(at.session_state["scenario"],
                           {"cluster.inter_node.nic_bandwidth_bytes_per_s": 25 * units.GBIT}), trace=False)
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s)
    assert metric_delta(at, "Step time").startswith("+")
    assert metric(at, "Exposed communication") == f"{expected.exposed_comm_fraction:.1%}"
    # The planner's scenario is untouched until applied.
    assert "inter_node" not in at.session_state["scenario"]["cluster"]


def test_latency_bucket_cap_nodes_zero_and_apply() -> None:
    at = open_page(start(), "whatif")
    at.slider(key="wi:net_latency_us").set_value(80.0).run()
    at.select_slider(key="wi:bucket_cap_mb").set_value(1000.0).run()
    at.select_slider(key="wi:num_nodes").set_value(4).run()
    at.segmented_control(key="wi:zero_stage").set_value(3).run()
    assert_clean(at)
    what_if = sweeps.with_values(at.session_state["scenario"], {
        "ddp.bucket_cap_mb": 1000.0, "cluster.num_nodes": 4, "parallelism.zero_stage": 3,
        "cluster.inter_node.latency_s": 80.0 * units.US})
    expected = simddp.simulate(what_if, trace=False)
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s)
    assert expected.memory is not None
    assert metric(at, "Memory / GPU").startswith(f"{expected.memory.total_bytes / units.GiB:.1f} GiB")
    at.button(key="whatif_apply").click().run()
    assert_clean(at)
    assert at.session_state["scenario"]["cluster"]["num_nodes"] == 4
    assert at.session_state["scenario"]["parallelism"]["zero_stage"] == 3
    assert not metric_delta(at, "Step time")  # sliders restart at the new planner scenario


def test_reset_sliders() -> None:
    at = open_page(start(), "whatif")
    at.select_slider(key="wi:num_nodes").set_value(2).run()
    assert metric_delta(at, "Step time")
    at.button(key="whatif_reset").click().run()
    assert not metric_delta(at, "Step time")


def test_heatmap_over_two_parameters() -> None:
    at = open_page(start(), "whatif")
    at.segmented_control(key="whatif_view").set_value("Heatmap").run()
    assert_clean(at)
    heat = figure(at, "exposed comm (%) over bucket cap (MiB) x NIC line rate")["data"][0]
    assert heat["type"] == "heatmap"
    assert len(heat["z"]) == 5 and len(heat["z"][0]) == 6
    column = [row[2] for row in heat["z"]]  # 25 MiB buckets, NIC 50 .. 800 Gbit/s
    assert column == sorted(column, reverse=True) and column[0] > column[-1]
    at.selectbox(key="grid_y").set_value("nodes").run()
    at.selectbox(key="grid_metric").set_value("step time (ms)").run()
    assert_clean(at)
    heat = figure(at, "step time (ms) over bucket cap (MiB) x nodes")["data"][0]
    assert len(heat["z"]) == 6
    grid = sweeps.grid_sweep(at.session_state["scenario"], "ddp.bucket_cap_mb", (5.0, 10.0, 25.0, 50.0, 100.0, 250.0),
                             "cluster.num_nodes", (1, 2, 4, 8, 16, 32))
    assert heat["z"][3][2] == pytest.approx(grid.points[3 * 6 + 2].step_time_s / units.MS)  # 8 nodes, 25 MiB
    at.selectbox(key="grid_y").set_value("bucket cap (MiB)").run()
    assert at.main.warning  # two different parameters needed, said inline


def test_heatmap_keeps_the_batch_when_asked() -> None:
    """'Keep the global batch when nodes change' reaches the heatmap: nodes x ZeRO stage equals the strong-scaled
    sweep (it drew the weak-scaled one whatever the toggle said: 20 of 24 cells differed)."""
    from apptest_helpers import figure, open_page

    from simddp import sweeps

    at = open_page(start(), "whatif")
    at.segmented_control(key="whatif_view").set_value("Heatmap").run()
    at.toggle(key="wi:keep_batch").set_value(True).run()
    at.selectbox(key="grid_x").set_value("nodes")
    at.selectbox(key="grid_y").set_value("ZeRO stage")
    at.selectbox(key="grid_metric").set_value("tokens/s").run()
    heat = figure(at, "over")["data"][0]
    ref = sweeps.grid_sweep(default_dict(), "cluster.num_nodes", [1, 2, 4, 8, 16, 32], "parallelism.zero_stage",
                            [0, 1, 2, 3], batch="strong")
    want = {(p.x, p.y): p.tokens_per_s for p in ref.points}
    got = {(x, y): heat["z"][j][i] for j, y in enumerate(heat["y"]) for i, x in enumerate(heat["x"])}
    assert len(got) == 24
    for (x, y), value in got.items():
        expected = want[(int(x), int(y))]
        assert (value is None and expected is None) or value == pytest.approx(expected, rel=1e-9)
