"""Scenario input hygiene: finite numbers, no booleans as numbers, clean names, typed presets and paths,
bounded error messages, duplicate keys, and the size caps of simddp.limits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from scenarios import base_scenario

import simddp
from simddp.config import CollectiveFit, Link, ScenarioError, set_path
from simddp.limits import MAX_GPUS, MAX_LAYER_PASSES, check_simulation_size
from simddp.memory import smallest_layout_that_fits
from simddp.memory.search import _divisors
from simddp.profile import TimingStats
from simddp.scenario_io import load_scenario, scenario_from_dict


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("section, key", [
    ("cluster", "host_overhead_s"), ("cluster", "comm_compute_interference"), ("ddp", "bucket_cap_mb"),
    ("training", "optimizer_time_s"), ("memory", "fragmentation_fraction"),
])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_float_field_rejects_nan_and_infinity(section: str, key: str, value: float) -> None:
    data = base_scenario()
    data[section] = {**data.get(section, {}), key: value}
    assert f"{section}.{key}: Input should be a finite number" in _error(data)


def test_nested_and_calibration_floats_reject_infinity() -> None:
    data = base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": 2, "intra_node": {"latency_s": math.inf}})
    assert "cluster.intra_node.latency_s: Input should be a finite number" in _error(data)
    with pytest.raises(ValueError, match="finite number"):
        Link(kind="nvlink", latency_s=1e-6, bandwidth_bytes_per_s=math.inf, efficiency=0.5)
    with pytest.raises(ValueError, match="finite number"):
        CollectiveFit(op="all-reduce", tier="intra", min_bytes=0, max_bytes=1, latency_per_step_s=math.nan,
                      bus_bandwidth_bytes_per_s=1e9)
    with pytest.raises(ValueError, match="finite number"):  # list items too
        TimingStats(times_s=[1.0, math.nan], median_s=1, p10_s=1, p90_s=1, min_s=1, max_s=1, num_outliers=0)


@pytest.mark.parametrize("section, key, value, expected", [
    ("parallelism", "tp", True, "a number"), ("parallelism", "zero_stage", True, "one of 0, 1, 2, 3"),
    ("parallelism", "dp", False, "a number"), ("training", "micro_batch_size", True, "a number"),
    ("ddp", "bucket_cap_mb", True, "a number"), ("cluster", "num_nodes", True, "a number"),
    ("training", "recompute", True, "one of 'none', 'selective', 'selective-op', 'full'"),
    ("ddp", "implementation", True, "one of 'torch', 'deepspeed', 'megatron'"),
])
def test_booleans_are_not_numbers(section: str, key: str, value: bool, expected: str) -> None:
    """A boolean where a number, a choice or text goes (YAML reads yes and on as true) is named for what the key
    takes: a probe's `--set training.recompute=true` was told to give a number."""
    data = base_scenario()
    data[section] = {**data.get(section, {}), key: value}
    assert f"{section}.{key}: expected {expected}, not a boolean" in _error(data)


def test_booleans_are_not_list_numbers_and_bool_fields_still_take_booleans() -> None:
    data = base_scenario(model={"parameters": [{"name": "a", "numel": 4}, {"name": "b", "numel": 4}],
                                "grad_ready_order": [True, False]})
    assert "model.grad_ready_order: expected numbers, not booleans" in _error(data)
    scenario = scenario_from_dict(base_scenario(ddp={"overlap": False, "gradient_as_bucket_view": True},
                                                training={"dropout": True}))
    assert scenario.ddp.overlap is False and scenario.training.dropout is True
    assert scenario_from_dict(base_scenario(parallelism={"tp": 2})).parallelism.tp == 2  # ints unchanged


def test_names_lose_terminal_control_characters() -> None:
    scenario = scenario_from_dict(base_scenario(name="\x1b[31mred\x1b[0m\x07 run\x1b]0;pwned\x07"))
    assert scenario.name == "red run"
    result = simddp.simulate({**base_scenario(), "name": "\x1b[2Jx"}, trace=False)
    assert result.scenario == "x"


@pytest.mark.parametrize("preset", [["a"], {"a": 1}, 3, True])
def test_a_preset_that_is_not_a_name(preset: Any) -> None:
    message = _error(base_scenario(cluster={"preset": preset, "num_nodes": 1}))
    assert "preset must be a preset name" in message and "dgx-h100-80gb" in message
    message = _error(base_scenario(model={"preset": preset}))
    assert "preset must be a preset name" in message and "gpt2" in message


@pytest.mark.parametrize("path", [5, ["a"], {"a": 1}, 1.5])
def test_a_calibration_that_is_not_a_path(path: Any, tmp_path: Path) -> None:
    assert "calibration: expected the path of a profile" in _error(base_scenario(calibration=path))
    f = tmp_path / "s.yaml"
    f.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 1}\nmodel: {preset: gpt2}\n"
                 f"calibration: {path!r}\n".replace("'", '"'))
    with pytest.raises(ScenarioError, match="calibration: expected the path of a profile"):
        load_scenario(f)


def test_a_calibration_path_that_is_not_a_profile(tmp_path: Path) -> None:
    assert "is a directory" in _error(base_scenario(calibration=str(tmp_path)))
    other = tmp_path / "sc.yaml"
    other.write_text("a: 1\n")
    assert "malformed JSON" in _error(base_scenario(calibration=str(other)))


def test_error_messages_are_bounded() -> None:
    data = base_scenario(model={"parameters": [{"name": "p", "numel": -1}] * 100_000})
    message = _error(data)
    assert message.endswith("... and 99,990 more") and len(message) < 2000
    long = "x" * 10_000
    message = _error(base_scenario(cluster={"preset": long, "num_nodes": 1}))
    assert len(message) < 400


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 1}\nmodel: {preset: gpt2}\nmodel: {preset: gpt2-xl}\n")
    with pytest.raises(ScenarioError, match=r"duplicate key 'model' at line 3 column 1"):
        load_scenario(f)
    j = tmp_path / "s.json"
    j.write_text('{"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "num_nodes": 2}, '
                 '"model": {"preset": "gpt2"}}')
    with pytest.raises(ScenarioError, match="duplicate key 'num_nodes'"):
        load_scenario(j)


def test_deep_and_cyclic_dicts_are_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    assert "nesting deeper than 32 levels" in _error(base_scenario(cluster={"preset": "dgx-a100-80gb",
                                                                            "num_nodes": 1, "gpu": deep}))
    gpu: dict[str, Any] = {}
    gpu["gpu"] = gpu
    assert "nesting deeper" in _error(base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": 1, "gpu": gpu}))


def test_libyamls_own_depth_limit_is_the_same_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """libyaml (PyYAML 6.0.4's wheels) stops at 1,000 levels while looking ahead for a simple key, before the
    event scan sees 32: that is the nesting refusal too, never a malformed value that --set keeps as a string."""
    import yaml

    from simddp import safeio

    def tripped(text: str, source: str) -> None:
        raise yaml.scanner.ScannerError("while increasing flow level", None, "exceeded maximum nesting depth", None)

    monkeypatch.setattr(safeio, "_scan_events", tripped)
    with pytest.raises(ScenarioError, match=r"^--set 'name': nesting deeper than 32 levels$"):
        set_path({}, "name", "[[1]]")
    with pytest.raises(ScenarioError, match=r"^s\.yaml: nesting deeper than 32 levels$"):
        safeio.parse_yaml("a: [[1]]", "s.yaml")


def test_set_values_and_paths_are_bounded() -> None:
    with pytest.raises(ScenarioError, match="nesting deeper than 32 levels"):
        set_path({}, "name", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ScenarioError, match="more than 32 keys in the path"):
        set_path({}, ".".join(["a"] * 10_000), "1")
    assert set_path({}, "name", "[unclosed") == {"name": "[unclosed"}  # malformed YAML stays a string
    with pytest.raises(ScenarioError, match="duplicate key"):
        set_path({}, "ddp", "{overlap: true, overlap: false}")


# ------------------------------------------------------------------------------------------- limits
def test_size_caps() -> None:
    huge = base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": MAX_GPUS // 8 + 1})
    assert f"is over the limit of {MAX_GPUS:,}" in _error(huge)
    scenario_from_dict(base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": MAX_GPUS // 8}))
    # Said before the layout's checks, which blamed the batch for it (a fixed batch of 512 on 24 M GPUs: "not a
    # multiple of dp(24000000)", found by a hostile-input probe).
    fixed = base_scenario(cluster={"preset": "dgx-a100-80gb", "num_nodes": 3_000_000},
                          training={"global_batch_size": 512})
    assert _error(fixed).startswith("cluster: num_nodes(3000000) x gpus_per_node(8) = 24,000,000 GPUs is over")
    deep = base_scenario(model={"transformer": {"num_layers": 10**6, "hidden_size": 64, "num_heads": 1,
                                                "ffn_hidden_size": 64, "vocab_size": 10}})
    assert "num_layers(1,000,000) is over the limit of 16,384" in _error(deep)


def test_simulation_caps_on_pipeline_and_zero3_passes() -> None:
    pipe = scenario_from_dict(base_scenario(parallelism={"pp": 2}, training={"micro_batch_size": 1,
                                                                             "global_batch_size": 8 * 10**10}))
    with pytest.raises(ScenarioError, match=r"the pipeline would simulate .* over the limit of 131,072"):
        simddp.simulate(pipe)
    zero3 = scenario_from_dict(base_scenario(parallelism={"zero_stage": 3},
                                             training={"micro_batch_size": 1, "global_batch_size": 16 * 10**6}))
    with pytest.raises(ScenarioError, match=r"FSDP FULL_SHARD would simulate .* layer passes"):
        simddp.simulate(zero3)
    simddp.memory_breakdown(zero3)  # memory needs no simulation: still answered
    ok = scenario_from_dict(base_scenario(parallelism={"pp": 2}, training={"micro_batch_size": 1,
                                                                           "global_batch_size": 8 * 1024}))
    check_simulation_size(ok)
    assert ok.num_micro_batches * 2 <= MAX_LAYER_PASSES


def test_divisors_by_factorisation() -> None:
    for n in range(1, 2000):
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert len(_divisors(2**24)) == 25 and _divisors(16_777_213) == [1, 16_777_213]  # a prime: sqrt(n) steps
    assert len(_divisors(10**9)) == 100


def test_layout_search_is_bounded_and_refuses_too_many_gpus() -> None:
    scenario = scenario_from_dict(base_scenario())
    with pytest.raises(ScenarioError, match=r"num_gpus.*over the limit"):
        smallest_layout_that_fits(scenario, 10**9)
    found = smallest_layout_that_fits(scenario, 2**24)
    assert found.num_gpus == 2**24 and found.num_layouts > 0


def test_memory_of_many_parameters_is_linear() -> None:
    """The old buffer code rebuilt set(order) per parameter: 100k parameters took 173 s (the cap, 65,536)."""
    params = [{"name": f"p{i}", "numel": 1000} for i in range(2**16)]
    scenario = scenario_from_dict({"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                                   "model": {"parameters": params}, "training": {"seq_len": 1}})
    mem = simddp.memory_breakdown(scenario)
    buckets = next(i for i in mem.items if i.name == "DDP bucket copies")
    assert buckets.size_bytes == 2**16 * 1000 * 4
