"""Sweeps: variant scenarios built at dotted paths, every number from simddp.simulate."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simddp
from simddp import sweeps
from simddp.config import ScenarioError
from simddp.units import GBIT


def base_scenario(**sections: Any) -> dict[str, Any]:
    """GPT-2 on 2 DGX-A100 nodes (fast), with whole sections replaced (tests/conftest.py's, kept local so
    that another folder's conftest module cannot shadow it)."""
    data: dict[str, Any] = {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
        "model": {"preset": "gpt2"},
        "training": {"micro_batch_size": 4, "seq_len": 1024},
    }
    return {**data, **sections}


def test_default_gpu_counts() -> None:
    assert sweeps.default_gpu_counts(8) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert sweeps.default_gpu_counts(4, max_gpus=32) == [1, 2, 4, 8, 16, 32]
    assert sweeps.default_gpu_counts(1, max_gpus=4) == [1, 2, 4]


def test_scaling_points_are_simulations_of_resized_scenarios() -> None:
    base = base_scenario()
    sweep = sweeps.scaling_sweep(base, [1, 4, 8, 16, 64])
    assert [p.num_gpus for p in sweep.points] == [1, 4, 8, 16, 64]
    assert all(p.ok for p in sweep.points)
    assert [(p.num_nodes, p.gpus_per_node) for p in sweep.points] == [(1, 1), (1, 4), (1, 8), (2, 8), (8, 8)]
    assert [p.dp for p in sweep.points] == [1, 4, 8, 16, 64]
    # Weak scaling: micro-batch 4, one micro-batch per GPU.
    assert [p.global_batch_size for p in sweep.points] == [4, 16, 32, 64, 256]
    at_16 = next(p for p in sweep.points if p.num_gpus == 16)
    ref = simddp.simulate(base, trace=False)
    assert at_16.step_time_s == ref.step_time_s
    assert at_16.exposed_comm_fraction == ref.exposed_comm_fraction
    assert at_16.memory_bytes == ref.memory.total_bytes  # type: ignore[union-attr]
    one = sweep.points[0]
    assert one.comm_time_s == 0.0 and one.exposed_comm_time_s == pytest.approx(0.0, abs=1e-12)
    assert sweep.reference_num_gpus == 16 and sweep.batch == "weak"


def test_weak_scaling_keeps_gradient_accumulation() -> None:
    base = base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128, "seq_len": 1024})
    sweep = sweeps.scaling_sweep(base, [8, 16, 32])
    assert [p.global_batch_size for p in sweep.points] == [64, 128, 256]  # 4 micro-batches of 2 per GPU


def test_strong_scaling_reports_what_the_batch_does_not_divide() -> None:
    base = base_scenario(training={"micro_batch_size": 4, "global_batch_size": 64, "seq_len": 1024})
    sweep = sweeps.scaling_sweep(base, [8, 16, 32], batch="strong")
    assert [p.ok for p in sweep.points] == [True, True, False]
    assert "global_batch_size(64)" in (sweep.points[2].error or "")
    assert sweep.points[2].step_time_s is None
    assert {p.global_batch_size for p in sweep.points if p.ok} == {64}


def test_scaling_keeps_tp_and_drops_an_explicit_dp() -> None:
    base = base_scenario(parallelism={"dp": 8, "tp": 2})
    sweep = sweeps.scaling_sweep(base, [1, 2, 8, 32])
    assert not sweep.points[0].ok and "tp(2)" in (sweep.points[0].error or "")
    assert [p.dp for p in sweep.points[1:]] == [1, 4, 16]


def test_scaling_rejects_partial_nodes_above_one_node() -> None:
    sweep = sweeps.scaling_sweep(base_scenario(), [12])
    assert not sweep.points[0].ok and "whole number" in (sweep.points[0].error or "")
    with pytest.raises(ScenarioError):
        sweeps.scaling_sweep(base_scenario(), [0])


def test_bucket_cap_sweep() -> None:
    base = base_scenario()
    sweep = sweeps.bucket_cap_sweep(base, (1, 5, 25, 100, 1000))
    counts = [p.num_buckets for p in sweep.points]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    at_25 = sweep.points[2]
    ref = simddp.simulate(sweeps.set_value(base, "ddp.bucket_cap_mb", 25), trace=False)
    assert at_25.step_time_s == ref.step_time_s and at_25.num_buckets == len(ref.buckets)
    assert sweep.reference_bucket_cap_mb is None
    df = sweep.to_dataframe()
    assert list(df["bucket_cap_mb"]) == [1, 5, 25, 100, 1000]
    assert {"step_time_s", "exposed_comm_fraction", "ok", "error"} <= set(df.columns)


def test_grid_sweep_order_values_and_errors() -> None:
    base = base_scenario()
    grid = sweeps.grid_sweep(base, "parallelism.tp", [1, 2, 3], "cluster.num_nodes", [1, 2])
    assert [(p.x, p.y) for p in grid.points] == [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)]
    assert [p.ok for p in grid.points] == [True, True, False, True, True, False]
    assert "tp(3)" in (grid.points[2].error or "")
    ref = simddp.simulate(sweeps.with_values(base, {"parallelism.tp": 2, "cluster.num_nodes": 2}), trace=False)
    assert grid.points[4].step_time_s == ref.step_time_s
    df = grid.to_dataframe()
    assert df.pivot(index="y", columns="x", values="step_time_s").shape == (2, 3)


def test_grid_sweep_needs_two_keys() -> None:
    with pytest.raises(ScenarioError):
        sweeps.grid_sweep(base_scenario(), "ddp.bucket_cap_mb", [1], "ddp.bucket_cap_mb", [2])


def test_faster_network_never_slows_a_step() -> None:
    rates = [25 * GBIT, 100 * GBIT, 400 * GBIT]
    grid = sweeps.grid_sweep(base_scenario(), "cluster.inter_node.nic_bandwidth_bytes_per_s", rates,
                             "ddp.bucket_cap_mb", [5.0, 25.0])
    for y in (5.0, 25.0):
        steps = [p.step_time_s for p in grid.points if p.y == y]
        assert steps == sorted(steps, reverse=True)


def test_strategy_sweep_memory_goes_down_with_zero() -> None:
    base = base_scenario(model={"preset": "gpt2-medium"}, training={"micro_batch_size": 1, "seq_len": 1024})
    sweep = sweeps.strategy_sweep(base)
    names = [p.strategy for p in sweep.points]
    assert names == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)", "TP=8", "PP=4"]
    assert all(p.ok for p in sweep.points)
    mem = [p.memory_bytes for p in sweep.points[:4]]
    assert mem == sorted(mem, reverse=True) and len(set(mem)) == 4
    ddp, tp = sweep.points[0], sweep.points[4]
    assert (tp.tp, tp.dp) == (8, 2) and tp.params_bytes < ddp.params_bytes  # type: ignore[operator]
    for p in sweep.points:
        parts = (p.params_bytes, p.grads_bytes, p.optimizer_bytes, p.activations_bytes, p.buffers_bytes,
                 p.overhead_bytes)
        assert sum(parts) == p.memory_bytes  # type: ignore[arg-type]
    ref = simddp.simulate(sweeps.set_value(base, "parallelism.zero_stage", 2), trace=False)
    assert sweep.points[2].memory_bytes == ref.memory.total_bytes  # type: ignore[union-attr]


def test_strategy_that_the_model_forbids_is_an_error_point() -> None:
    sweep = sweeps.strategy_sweep(base_scenario(), {"DDP": {"tp": 1}, "TP=5": {"tp": 5}})
    assert sweep.points[0].ok and not sweep.points[1].ok


def test_scenario_objects_round_trip_through_dicts() -> None:
    for data in (base_scenario(), base_scenario(model={"preset": "resnet50"}, training={"seq_len": 1}),
                 base_scenario(model={"transformer": {"num_layers": 2, "hidden_size": 64, "num_heads": 4,
                                                      "ffn_hidden_size": 256, "vocab_size": 1000}})):
        s = simddp.scenario_from_dict(data)
        assert simddp.scenario_from_dict(sweeps.scenario_to_dict(s)) == s
    s = simddp.scenario_from_dict(base_scenario())
    assert sweeps.scenario_to_dict(s)["model"] == {"preset": "gpt2"}
    by_object = sweeps.bucket_cap_sweep(s, (10, 50))
    by_dict = sweeps.bucket_cap_sweep(base_scenario(), (10, 50))
    assert by_object.points == by_dict.points


def test_a_bad_base_scenario_raises_one_error() -> None:
    with pytest.raises(ScenarioError, match="tp"):
        sweeps.bucket_cap_sweep(base_scenario(parallelism={"tp": 3}))


def test_inputs_are_not_modified() -> None:
    base = base_scenario(parallelism={"dp": 16})
    before = copy.deepcopy(base)
    sweeps.scaling_sweep(base, [8, 32])
    sweeps.grid_sweep(base, "ddp.bucket_cap_mb", [5], "cluster.num_nodes", [1])
    assert base == before


@settings(max_examples=50, deadline=None)
@given(path=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(".".join),
       value=st.one_of(st.integers(), st.floats(allow_nan=False), st.none(), st.text(max_size=5)))
def test_set_value_then_get_path(path: str, value: object) -> None:
    data = {"a": {"b": 1}, "c": 2}
    out = sweeps.set_value(data, path, value)
    assert sweeps.get_path(out, path) == value
    assert data == {"a": {"b": 1}, "c": 2}


def _two_step_variant(base: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """The weak-scaled variant the slow way: validate it without its batch for its GPUs, then set the batch
    (the base's x GPUs / the base's GPUs)."""
    from simddp.config import set_value

    out = copy.deepcopy(base)
    for path, value in updates.items():
        out = set_value(out, path, value)
    if sweeps.get_path(out, "parallelism.dp") is not None and "parallelism.dp" not in updates:
        out = set_value(out, "parallelism.dp", None)
    resized = sweeps.scenario_from_dict_or_none(set_value(out, "training.global_batch_size", None))
    if resized is not None:
        before = sweeps.scenario_from_dict(base)
        batch, left = divmod(before.global_batch_size * resized.cluster.num_gpus, before.cluster.num_gpus)
        assert not left, "the cases below scale to whole batches"
        out = set_value(out, "training.global_batch_size", batch)
    return out


@pytest.mark.parametrize("updates", [
    {"cluster.num_nodes": 4}, {"cluster.num_nodes": 1, "cluster.gpus_per_node": 4},
    {"cluster.num_nodes": 8, "training.micro_batch_size": 2}, {"cluster.num_nodes": 4, "parallelism.tp": 2},
    {"cluster.num_nodes": 3, "parallelism.pp": 2},
    {"cluster.num_nodes": 4, "parallelism.tp": 3},  # tp 3 does not divide the heads: invalid either way
    {"cluster.num_nodes": 0},  # invalid cluster: no section-level answer
    {"cluster.num_nodes": 4, "parallelism": None},  # invalid section
    {"cluster.num_nodes": 4, "training.micro_batch_size": 4096},  # beyond what validation allows
    {"cluster.num_nodes": 2, "parallelism.dp": 4},  # a dp the point sets is kept: invalid on 16 GPUs
    {"cluster.num_nodes": 2, "parallelism.dp": 16},  # and valid where it matches (it was dropped: a probe)
])
def test_a_weak_scaled_variant_is_the_two_step_one(updates: dict[str, Any]) -> None:
    """Sweeps validate a weak-scaled variant once, its dp from its own sections; the dict, and the validated
    scenario when there is one, must be what validating it without its batch first gives."""
    base = base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128, "seq_len": 1024})
    data, scenario = sweeps._variant(base, updates, "weak", sweeps.scenario_from_dict(base))
    assert data == _two_step_variant(base, updates)
    assert sweeps.with_values(base, updates) == data
    if scenario is not None:
        assert scenario == sweeps.scenario_from_dict(data)
    metrics, _ = sweeps.evaluate(data, scenario)
    assert metrics == sweeps.evaluate(_two_step_variant(base, updates))[0]


def test_a_points_batch_does_not_depend_on_the_other_keys_varied() -> None:
    """Weak scaling scales the batch with the GPUs: a point at the base's cluster size has the base's batch
    whether or not the cluster size is varied beside the micro-batch size (it had twice the batch at
    micro-batch 2 when it was, from the base's micro-batch count x the new size) or beside tp (half the batch
    at tp 2 when the samples per replica were kept), and the node axis scales it."""
    base = base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128, "seq_len": 1024})
    nodes = sweeps.scenario_from_dict(base).cluster.num_nodes
    alone = sweeps.with_values(base, {"training.micro_batch_size": 4})
    beside = sweeps.with_values(base, {"training.micro_batch_size": 4, "cluster.num_nodes": nodes})
    assert sweeps.scenario_from_dict(beside).global_batch_size == sweeps.scenario_from_dict(alone).global_batch_size
    assert sweeps.scenario_from_dict(beside).global_batch_size == 128
    doubled = sweeps.scenario_from_dict(sweeps.with_values(base, {"training.micro_batch_size": 4,
                                                                  "cluster.num_nodes": 2 * nodes}))
    assert doubled.global_batch_size == 256 and doubled.num_micro_batches * 4 * doubled.dp == 256
    for tp in (2, 4):  # a probe's case: the same point's batch with and without the cluster size varied
        alone = sweeps.with_values(base, {"parallelism.tp": tp})
        beside = sweeps.with_values(base, {"parallelism.tp": tp, "cluster.num_nodes": nodes})
        assert sweeps.scenario_from_dict(beside).global_batch_size == 128 == \
            sweeps.scenario_from_dict(alone).global_batch_size
    twice = sweeps.scenario_from_dict(sweeps.with_values(base, {"parallelism.tp": 2, "cluster.num_nodes": 2 * nodes}))
    assert twice.global_batch_size == 256 and twice.dp == sweeps.scenario_from_dict(base).dp


def test_a_weak_batch_that_is_not_whole_is_an_invalid_point() -> None:
    """6 samples on 8 GPUs (tp 4, dp 2) scaled to 4 GPUs is 3 (dp 1) and to 8 is 6, but to 6 GPUs it is 4.5: with a
    layout valid there (tp 2) the point is invalid, its reason naming the batch; where tp 4 does not fit 6 GPUs the
    reason is the layout's own (a probe found the batch blamed for it), in a sweep and a scaling sweep alike."""
    base = base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": 1}, parallelism={"tp": 4},
                         training={"micro_batch_size": 1, "global_batch_size": 6, "seq_len": 1024})
    assert sweeps.scenario_from_dict(sweeps.with_values(base, {"cluster.gpus_per_node": 4})).global_batch_size == 3
    with pytest.raises(ScenarioError, match=r"training.global_batch_size: weak scaling gives 6 x 6 / 8 GPUs"):
        sweeps.with_values(base, {"cluster.gpus_per_node": 6, "parallelism.tp": 2})
    with pytest.raises(ScenarioError, match=r"tp\(4\) \* pp\(1\) = 4 does not divide 6 GPUs"):
        sweeps.scenario_from_dict(sweeps.with_values(base, {"cluster.gpus_per_node": 6}))
    sweep = sweeps.vary_sweep(base, {"cluster.gpus_per_node": [4, 6, 8], "parallelism.tp": [2, 4]})
    errors = {tuple(p.values.values()): p.error for p in sweep.points}
    assert "not a whole number of samples" in (errors[(6, 2)] or "")
    assert "does not divide 6 GPUs" in (errors[(6, 4)] or "")
    assert errors[(4, 4)] is None and errors[(8, 4)] is None
    scaling = sweeps.scaling_sweep(base, [4, 6, 8])
    assert [p.ok for p in scaling.points] == [True, False, True]
    assert [p.global_batch_size for p in scaling.points] == [3, None, 6]
    assert "does not divide 6 GPUs" in (scaling.points[1].error or "")


@pytest.mark.parametrize("updates", [
    {"ddp.bucket_cap_mb": 5}, {"training.seq_len": 512}, {"parallelism.zero_stage": 1, "ddp.bucket_cap_mb": 50},
    {"model.preset": "gpt2-medium"}, {"memory.fragmentation_fraction": 0.2}, {"name": "renamed"},
    {"cluster.preset": "dgx-h100-80gb"},
    {"parallelism.tp": 3},  # across sections: 3 does not divide the GPUs
    {"ddp.bucket_cap_mb": -1}, {"ddp.bucket_cap_mb": True}, {"training.seq_len": "long"},  # invalid sections
    {"ddp": None}, {"ddp.no_such_key": 1},
])
def test_a_variant_validated_with_the_bases_sections_is_the_whole_validation(updates: dict[str, Any]) -> None:
    """A sweep point takes its base's validated sections where its own are equal: where that validates it must
    equal the whole validation, reuse exactly the unchanged sections, and fail exactly where the whole
    validation does (whose error the point then reports)."""
    from simddp.config import ScenarioError, set_value

    base = base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128, "seq_len": 1024})
    ref = sweeps.scenario_from_dict(base)
    data, scenario = sweeps._variant(base, updates, "strong", ref)
    expected = copy.deepcopy(base)
    for path, value in updates.items():
        expected = set_value(expected, path, value)
    assert data == expected
    try:
        whole = sweeps.scenario_from_dict(data)
    except ScenarioError as err:
        assert scenario is None
        assert sweeps.evaluate(data, scenario)[0].error == str(err)
        return
    assert scenario == whole
    changed = {path.split(".")[0] for path in updates}
    for section in ("cluster", "model", "training"):  # the base's own sections (the rest are defaults)
        assert (getattr(scenario, section) is getattr(ref, section)) == (section not in changed)


def test_a_points_values_are_what_the_scenario_took() -> None:
    """A probe found `sweep --json` rows holding what was typed ('200Gbit/s', '2.5e1') beside numbers in a column
    named *_bytes_per_s; they hold the validated values now (an invalid point keeps what was typed)."""
    base = base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128, "seq_len": 1024})
    sweep = sweeps.vary_sweep(base, {"cluster.inter_node.nic_bandwidth_bytes_per_s": ["200Gbit/s", "50GB/s", 5e10],
                                     "ddp.bucket_cap_mb": ["2.5e1", -1]})
    got = [(p.values["cluster.inter_node.nic_bandwidth_bytes_per_s"], p.values["ddp.bucket_cap_mb"], p.ok)
           for p in sweep.points]
    assert got == [(200 * GBIT, 25.0, True), ("200Gbit/s", -1, False), (50e9, 25.0, True), ("50GB/s", -1, False),
                   (5e10, 25.0, True), (5e10, -1, False)]
    from simddp.cli_search import sweep_lines

    assert any(line.startswith("2.5e+10 ") for line in sweep_lines(sweep))


def test_a_batch_varied_beside_the_cluster_size_is_kept() -> None:
    """Weak scaling replaced a global batch the sweep varied itself (rows read 64, 64, 128, 128 for 64 and 128
    on 1 and 2 nodes, a review found): a point that sets the batch keeps it."""
    base = base_scenario(training={"micro_batch_size": 4, "global_batch_size": 64, "seq_len": 1024})
    sweep = sweeps.vary_sweep(base, {"cluster.num_nodes": [1, 2], "training.global_batch_size": [64, 128]})
    assert [(p.values["training.global_batch_size"], p.global_batch_size) for p in sweep.points] == [
        (64, 64), (128, 128), (64, 64), (128, 128)]


def test_a_varied_cluster_preset_brings_its_own_values() -> None:
    """A probe found `sweep --vary cluster.preset=dgx-a100-80gb,aws-p4d-24xlarge` printing the H100 base's step
    and memory on every row: the base's cluster was expanded from its preset, so only the name changed. A point
    now takes the new preset's GPU and links, keeping the keys the base set beside its preset (here its node
    count and a NIC it overrode), as `--set cluster.preset=...` does with the scenario file."""
    raw = {"name": "p", "model": {"preset": "llama2-7b"},
           "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 4, "inter_node": {"nic_bandwidth_bytes_per_s": 2.5e10}},
           "training": {"micro_batch_size": 1, "global_batch_size": 64, "seq_len": 2048},
           "parallelism": {"zero_stage": 1}}
    presets = ["dgx-a100-80gb", "aws-p4d-24xlarge", "dgx-h100-80gb"]
    sweep = sweeps.vary_sweep(simddp.as_scenario(raw), {"cluster.preset": presets})
    for preset, point in zip(presets, sweep.points, strict=True):
        alone = simddp.as_scenario(sweeps.set_value(raw, "cluster.preset", preset))
        assert alone.cluster.num_nodes == 4 and alone.cluster.inter_node.nic_bandwidth_bytes_per_s == 2.5e10
        result = simddp.simulate(alone, trace=False)  # the engine a sweep's points run (a trace runs simpy's)
        assert (point.step_time_s, point.memory_bytes, point.memory_fits) == (
            result.step_time_s, result.memory.total_bytes, result.memory.fits), preset
    steps = [p.step_time_s for p in sweep.points]
    assert len(set(steps)) == 3  # three GPUs and networks, three answers
    assert sweep.points[1].memory_fits is False  # p4d's A100s have 40 GB: the 7B model's 59 GiB does not fit


def test_a_sweep_point_is_what_simulate_set_gives_for_presets_and_profiles(tmp_path, capsys) -> None:
    """A consistency probe compared `sweep --vary K=v` with `simulate --set K=v` over every key: three disagreed,
    as the sweep started from the validated scenario, where what a preset or a profile filled in reads as set by
    the file. `simddp sweep` starts from the file's own keys now (the API from a Scenario, as far as it can)."""
    import json
    import sys
    from pathlib import Path

    from simddp.cli import main

    def cli(*argv: str) -> dict[str, Any]:
        assert main([*argv, "--json"]) in (0, 2)
        return json.loads(capsys.readouterr().out)

    def sweep_steps(path: Path, key: str, values: list[str]) -> list[float | None]:
        out = cli("sweep", str(path), "--vary", f"{key}={','.join(values)}", "--batch", "strong")
        return [p["step_time_s"] for p in out["points"]]

    def simulate_step(path: Path, key: str, value: str) -> float:
        return cli("simulate", str(path), "--set", f"{key}={value}")["step_time_s"]

    # 1. The file's own inter-node efficiency equals the H100 preset's (0.94): A100's preset has 0.96, and the
    #    file's 0.94 must stay (the collapsed base took it for the preset's: 3.610 s against 3.612 s).
    own = tmp_path / "own.yaml"
    own.write_text("cluster: {preset: dgx-h100-80gb, num_nodes: 2, inter_node: {efficiency: 0.94}}\n"
                   "model: {preset: gpt2}\ntraining: {micro_batch_size: 4, seq_len: 1024}\n")
    assert sweep_steps(own, "cluster.preset", ["dgx-a100-80gb"]) == [
        simulate_step(own, "cluster.preset", "dgx-a100-80gb")]
    assert simulate_step(own, "cluster.preset", "dgx-a100-80gb") != simulate_step(
        own, "cluster.inter_node.efficiency", "0.96")  # the 0.94 matters
    # 2. A preset model with a key of its own: another preset was refused ("give exactly one of preset,
    #    transformer or parameters"), from the file and from a Scenario alike.
    mod = tmp_path / "mod.yaml"
    mod.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 2}\nmodel: {preset: gpt2, num_autograd_nodes: 5000}\n"
                   "training: {micro_batch_size: 4, seq_len: 1024}\n")
    assert sweep_steps(mod, "model.preset", ["gpt2-medium"]) == [simulate_step(mod, "model.preset", "gpt2-medium")]
    from simddp.scenario_io import load_scenario

    by_object = sweeps.vary_sweep(load_scenario(mod), {"model.preset": ["gpt2-medium"]}, batch="strong")
    assert by_object.scenario.startswith("gpt2") and by_object.points[0].step_time_s == pytest.approx(
        simulate_step(mod, "model.preset", "gpt2-medium"), rel=1e-12)
    assert sweeps.scenario_to_dict(load_scenario(mod))["model"] == {"preset": "gpt2", "num_autograd_nodes": 5000}
    # 3. Another calibration profile: the first profile's values stood over it (both rows read the first's).
    sys.path.insert(0, str(Path(__file__).parent / "app"))
    from calibration_data import write_all

    files = write_all(tmp_path / "cal")
    other = json.loads(files["profile"].read_text())
    other["cluster"]["host_overhead_s"] = 0.005
    second = tmp_path / "cal" / "profile2.json"
    second.write_text(json.dumps(other))
    cal = tmp_path / "cal.yaml"
    cal.write_text(f"calibration: {files['profile']}\n")
    steps = sweep_steps(cal, "calibration", [str(files["profile"]), str(second)])
    assert steps == [simulate_step(cal, "calibration", str(files["profile"])), simulate_step(cal, "calibration",
                                                                                           str(second))]
    assert steps[1] == pytest.approx(steps[0] + 0.005 - json.loads(files["profile"].read_text())["cluster"].get(
        "host_overhead_s", 0.0), rel=1e-9)
