"""Planner page: opens on the default scenario with real numbers; widgets change the result."""

from __future__ import annotations

import pytest
from apptest_helpers import assert_clean, default_dict, default_result, figure, metric, start

import simddp
from simddp import units
from simddp.cli import default_scenario_path
from simddp.config import Cluster, DDPConfig, Parallelism, Training


def test_opens_on_the_default_scenario_with_simddp_numbers() -> None:
    at = start()
    ref = default_result()
    assert at.main.title[0].value == "Planner"
    assert metric(at, "Step time") == units.fmt_time(ref.step_time_s)
    assert metric(at, "Exposed communication") == f"{ref.exposed_comm_fraction:.1%}"
    assert metric(at, "Tokens / s") == f"{ref.tokens_per_s:,.0f}"
    assert metric(at, "MFU") == f"{ref.mfu:.1%}"
    assert ref.memory is not None
    assert metric(at, "Memory / GPU") == f"{ref.memory.total_bytes / units.GiB:.1f} GiB"
    fig = figure(at, "Where the step goes")
    compute_ms = next(t["x"][0] for t in fig["data"] if t["name"] == "compute")
    assert any(t["name"] == "data-parallel comm (exposed)" for t in fig["data"])
    assert compute_ms * units.MS == pytest.approx(ref.part("compute"), rel=1e-9)
    # the step's bar is every part of the step (interference was left out, and the exposed bar said it held TP)
    step_ms = sum(t["x"][0] for t in fig["data"] if t["y"][0] == "step")
    assert step_ms * units.MS == pytest.approx(ref.step_time_s, rel=1e-9)
    assert any("128 GPUs" in c.value for c in at.main.caption)


def test_help_texts_are_the_config_descriptions() -> None:
    at = start()
    assert at.number_input(key="w:cluster.num_nodes").help == Cluster.model_fields["num_nodes"].description
    assert at.number_input(key="w:ddp.bucket_cap_mb").help == DDPConfig.model_fields["bucket_cap_mb"].description
    assert at.selectbox(key="w:parallelism.zero_stage").help == Parallelism.model_fields["zero_stage"].description
    assert at.number_input(key="w:training.seq_len").help == Training.model_fields["seq_len"].description


def test_number_of_nodes_changes_the_result() -> None:
    at = start()
    before = metric(at, "Step time")
    at.number_input(key="w:cluster.num_nodes").set_value(2).run()
    assert_clean(at)
    assert at.session_state["scenario"]["cluster"]["num_nodes"] == 2
    expected = simddp.simulate(at.session_state["scenario"], trace=False)
    assert expected.num_gpus == 16
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s) != before


def test_zero_stage_changes_memory_and_fit() -> None:
    at = start()
    # The default (ZeRO-1) fits; plain DDP does not: Adam needs 16 B/param on every GPU.
    assert next(m.delta for m in at.main.metric if m.label == "Memory / GPU").startswith("fits (of 79.65 GiB)")
    assert not at.error  # no banner while it fits
    at.selectbox(key="w:parallelism.zero_stage").set_value(0).run()
    assert_clean(at, errors_allowed=True)
    assert "does NOT fit" in next(m.delta for m in at.main.metric if m.label == "Memory / GPU")
    # The verdict first: a banner above the (hypothetical) figures, the CLI's first line.
    ddp = simddp.simulate(at.session_state["scenario"], trace=False).memory
    assert ddp is not None and not ddp.fits
    (banner,) = at.error
    need, have = ddp.total_bytes / units.GiB, ddp.capacity_bytes / units.GiB
    assert banner.value.startswith(f"**DOES NOT FIT: needs {need:.1f} GiB per GPU, {have:.1f} GiB available "
                                   f"({need - have:.1f} GiB over)**. The figures below are hypothetical")
    at.selectbox(key="w:parallelism.zero_stage").set_value(2).run()
    assert_clean(at)
    expected = simddp.simulate(at.session_state["scenario"], trace=False)
    assert expected.memory is not None and expected.memory.fits
    assert metric(at, "Memory / GPU") == f"{expected.memory.total_bytes / units.GiB:.1f} GiB"
    assert next(m.delta for m in at.main.metric if m.label == "Memory / GPU").startswith("fits")


def test_bucket_cap_and_network_overrides_reach_the_scenario() -> None:
    at = start()
    at.number_input(key="w:ddp.bucket_cap_mb").set_value(250.0).run()
    at.number_input(key="w:cluster.inter_node.nic_bandwidth_bytes_per_s").set_value(50.0).run()
    assert_clean(at)
    data = at.session_state["scenario"]
    assert data["ddp"]["bucket_cap_mb"] == 250.0
    assert data["cluster"]["inter_node"]["nic_bandwidth_bytes_per_s"] == 50 * units.GBIT
    expected = simddp.simulate(data, trace=False)
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s)
    assert metric(at, "Exposed communication") == f"{expected.exposed_comm_fraction:.1%}"
    assert any(f"{len(expected.buckets)} buckets" in c.value for c in at.main.caption)


def test_invalid_input_shows_an_inline_error_not_a_traceback() -> None:
    at = start()
    at.number_input(key="w:parallelism.tp").set_value(3).run()
    assert_clean(at, errors_allowed=True)
    assert len(at.error) == 1
    assert "tp(3)" in at.error[0].value and "Invalid scenario" in at.error[0].value
    assert not at.main.metric  # no stale numbers
    at.number_input(key="w:parallelism.tp").set_value(2).run()
    assert_clean(at)
    assert metric(at, "Step time")


def test_cluster_preset_swaps_the_hardware() -> None:
    at = start()
    at.selectbox(key="w:cluster_preset").set_value("dgx-a100-80gb").run()
    assert_clean(at)
    data = at.session_state["scenario"]
    assert data["cluster"] == {"preset": "dgx-a100-80gb", "num_nodes": 16}
    expected = simddp.simulate(data, trace=False)
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s)
    assert any("A100-SXM4-80GB" in c.value for c in at.main.caption)


def test_custom_transformer_shape() -> None:
    at = start()
    at.selectbox(key="w:model").set_value("custom transformer").run()
    assert_clean(at)
    assert "transformer" in at.session_state["scenario"]["model"]
    before = metric(at, "Step time")
    at.number_input(key="w:model.transformer.num_layers").set_value(16).run()
    assert_clean(at)
    assert at.session_state["scenario"]["model"]["transformer"]["num_layers"] == 16
    assert metric(at, "Step time") != before


def test_global_batch_follows_dp_when_auto() -> None:
    at = start()
    at.toggle(key="w:gbs_auto").set_value(True).run()
    assert_clean(at)
    assert at.session_state["scenario"]["training"]["global_batch_size"] is None
    at.number_input(key="w:cluster.num_nodes").set_value(4).run()
    expected = simddp.simulate(at.session_state["scenario"], trace=False)
    assert expected.global_batch_size == 32  # micro-batch 1 x dp 32
    assert metric(at, "Step time") == units.fmt_time(expected.step_time_s)


def test_default_dict_is_the_embedded_scenario() -> None:
    """The dashboard drops the YAML's dp: 128 so that resizing stays valid: the same scenario otherwise."""
    ours, embedded = simddp.scenario_from_dict(default_dict()), simddp.load_scenario(default_scenario_path())
    assert ours.dp == embedded.dp == 128
    assert ours.model_copy(update={"parallelism": embedded.parallelism}) == embedded


def test_scaled_inputs_cannot_overflow_to_infinity() -> None:
    """A value typed in TFLOP/s or GiB is refused by the widget where its scaled value would be inf (it used to
    reach the scenario as inf and read "got inf" beside the 1e300 typed)."""
    import math

    at = start()
    at.expander[0]  # the hardware overrides are rendered (collapsed)
    for key, scale in (("w:cluster.gpu.peak_bf16_flop_per_s", units.TFLOP), ("w:cluster.gpu.hbm_bytes", units.GiB)):
        widget = at.number_input(key=key)
        assert math.isfinite(widget.max * scale)
        assert widget.max > 1e290
    assert at.number_input(key="w:cluster.num_nodes").max == 4096  # other bounds unchanged


@pytest.mark.parametrize("sets", [["parallelism.zero_stage=3"],
                                  ["parallelism.tp=4", "parallelism.sequence_parallel=true"],
                                  ["parallelism.tp=2", "parallelism.pp=2"]])
def test_step_charts_stack_every_part_of_the_step(sets: list[str]) -> None:
    """The step's bar and the compare chart's columns add up to the step (they left out interference, TP waits,
    stage imbalance, clipping and framework host time: 1,200 of 1,282 ms under ZeRO-3, 1,386 of 1,694 ms at tp 4)."""
    from simddp.scenario_io import load_scenario
    from simddp_app import charts

    result = simddp.simulate(load_scenario(default_scenario_path(), sets), trace=False)
    fig = charts.step_breakdown(result).to_dict()
    step_ms = sum(t["x"][0] for t in fig["data"] if t["y"][0] == "step")
    assert step_ms * units.MS == pytest.approx(result.step_time_s, rel=1e-9)
    columns = charts.compare({"a": result}).to_dict()
    assert sum(t["y"][0] for t in columns["data"]) * units.MS == pytest.approx(result.step_time_s, rel=1e-9)


def test_default_toggles_follow_the_implementation() -> None:
    """The overlap and fp32-reduction toggles show the chosen implementation's defaults while the scenario leaves
    them unset: after switching to Megatron the overlap toggle stayed on (torch's default) while Megatron's step
    ran without overlap, and switching it on changed nothing."""
    at = start()
    assert at.toggle(key="w:ddp.overlap").value is True
    at.selectbox(key="w:ddp.implementation").set_value("megatron").run()
    assert at.toggle(key="w:ddp.overlap").value is False and at.toggle(key="w:ddp.reduce_in_fp32").value is True
    at.toggle(key="w:ddp.overlap").set_value(True).run()
    assert at.session_state["scenario"]["ddp"]["overlap"] is True
    ref = simddp.simulate(simddp.scenario_io.load_scenario(default_scenario_path(), [
        "ddp.implementation=megatron", "ddp.overlap=true"]), trace=False)
    assert metric(at, "Step time") == units.fmt_time(ref.step_time_s)
    at.selectbox(key="w:ddp.implementation").set_value("torch").run()
    assert at.toggle(key="w:ddp.overlap").value is True  # set by the user: kept
    assert_clean(at, errors_allowed=False)
