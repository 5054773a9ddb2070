"""Scenario validation: presets, overrides and one-line errors that name the field and value."""

from __future__ import annotations

import json

import pytest
from scenarios import base_scenario

from simddp.config import Scenario, ScenarioError, deep_merge, load_scenario, scenario_from_dict, set_path
from simddp.units import GB, GBIT, MiB


def test_preset_expands_and_user_keys_override() -> None:
    s = scenario_from_dict(base_scenario(cluster={"preset": "dgx-h100-80gb", "num_nodes": 3,
                                                  "inter_node": {"nics_per_node": 4}}))
    assert s.cluster.num_gpus == 24
    assert s.cluster.gpu.name == "H100-SXM5-80GB"
    assert s.cluster.inter_node.nics_per_node == 4
    assert s.cluster.inter_node.nic_bandwidth_bytes_per_s == 400 * GBIT  # untouched preset value
    assert s.cluster.intra_node.bandwidth_bytes_per_s == 450 * GB


def test_dp_defaults_to_gpus_over_tp_pp() -> None:
    s = scenario_from_dict(base_scenario(parallelism={"tp": 2, "pp": 2}))
    assert s.dp == 4
    assert s.global_batch_size == 4 * 4
    assert s.num_micro_batches == 1


def test_gradient_accumulation_steps() -> None:
    s = scenario_from_dict(base_scenario(training={"micro_batch_size": 2, "global_batch_size": 128}))
    assert s.dp == 16 and s.num_micro_batches == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"training": {"micro_batch_size": 0}}, "training.micro_batch_size: Input should be greater than 0 (got 0)"),
        ({"training": {"seq_len": -5}}, "training.seq_len: Input should be greater than 0 (got -5)"),
        ({"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 0}}, "cluster.num_nodes: Input should be greater"),
        ({"cluster": {"preset": "dgx-z", "num_nodes": 1}}, "unknown preset 'dgx-z'; valid: aws-p4d-24xlarge, dgx-a100"),
        ({"model": {"preset": "gpt5"}}, "unknown preset 'gpt5'; valid: bert-large"),
        ({"ddp": {"bucket_cap": 25}}, "ddp.bucket_cap: unknown key"),
        ({"parallelism": {"dp": 3}}, "dp(3) * tp(1) * pp(1) = 3 does not match 16 GPUs (2 nodes x 8)"),
        ({"parallelism": {"tp": 8}, "model": {"transformer": {"num_layers": 2, "hidden_size": 768,
          "num_heads": 12, "ffn_hidden_size": 3072, "vocab_size": 1000}}}, "tp(8) does not divide num_heads(12)"),
        ({"parallelism": {"tp": 16}}, "tp(16) must divide gpus_per_node(8)"),
        ({"parallelism": {"sequence_parallel": True}}, "sequence_parallel(true) needs tp > 1"),
        ({"training": {"micro_batch_size": 4, "global_batch_size": 100}},
         "global_batch_size(100) is not a multiple of micro_batch_size(4) * dp(16) = 64"),
        ({"model": {"preset": "gpt2", "transformer": {"num_layers": 1}}},
         "give exactly one of preset, transformer or parameters (got preset, transformer)"),
        ({"model": {"parameters": [{"name": "w", "numel": 10, "dtype": "float13"}]}}, "unknown dtype 'float13'"),
        ({"model": {"parameters": [{"name": "w", "numel": 10}], "grad_ready_order": [1]}},
         "grad_ready_order must be a permutation of 0..0"),
        ({"training": {"precision": "fp8"}}, "training.precision: Input should be 'fp32', 'bf16-mixed'"),
    ],
)
def test_bad_input_gives_one_line_error_naming_field(change: dict, message: str) -> None:
    data = deep_merge(base_scenario(), change) if "model" not in change else {**base_scenario(), **change}
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_scenario_is_frozen() -> None:
    s = scenario_from_dict(base_scenario())
    with pytest.raises(ValueError):
        s.training.seq_len = 5  # type: ignore[misc]


def test_load_yaml_json_and_overrides(tmp_path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 1}\nmodel: {preset: gpt2}\n")
    s = load_scenario(y, ["ddp.bucket_cap_mb=50", "training.recompute=full", "ddp.overlap=false"])
    assert s.ddp.bucket_cap_mb == 50 and s.training.recompute == "full" and s.ddp.overlap is False
    j = tmp_path / "s.json"
    j.write_text(json.dumps(base_scenario()))
    assert isinstance(load_scenario(j), Scenario)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "cluster: [1, 2\n", "malformed YAML at line"),
        ("bad.json", '{"cluster": ', "malformed JSON at line 1"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping at the top level, got list"),
    ],
)
def test_malformed_files(tmp_path, name: str, text: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(p)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "nope.yaml")


def test_set_path_parses_yaml_scalars() -> None:
    out = set_path({"a": {"b": 1}}, "a.c.d", "null")
    assert out == {"a": {"b": 1, "c": {"d": None}}}
    assert set_path({}, "x", "1.5")["x"] == 1.5
    with pytest.raises(ScenarioError, match="empty key"):
        set_path({}, "a..b", "1")


def test_bucket_cap_is_mib() -> None:
    from simddp.units import mib_to_bytes

    assert mib_to_bytes(25) == 25 * MiB
    assert mib_to_bytes(0.1) == 104857  # int(0.1 * 1024 * 1024), as torch truncates


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"parameters": [{"name": "w", "numel": 10}], "layers": []}, "layers is empty"),
        ({"parameters": [{"name": "w", "numel": 10}, {"name": "v", "numel": 5}],
          "layers": [{"name": "l", "param_indices": [0]}]}, "parameters [1] (v) belong to no layer"),
        ({"parameters": [{"name": "w", "numel": 10}],
          "layers": [{"name": "l", "param_indices": [0], "fwd_time_s": 0.1}]}, "give both fwd_time_s and bwd_time_s"),
    ],
)
def test_parameter_list_layers_are_checked(model: dict, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({**base_scenario(), "model": model})
    assert message in str(info.value)


def test_non_utf8_file(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(b"\xd0\xff\xfe binary")
    with pytest.raises(ScenarioError, match="not a text file"):
        load_scenario(p)
