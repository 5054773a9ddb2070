"""Scenario validation: presets, overrides and one-line errors that name the field and value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenarios import base_scenario

from simddp.config import Scenario, ScenarioError, deep_merge, set_path
from simddp.scenario_io import load_scenario, scenario_from_dict
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
        ({"model": {"preset": "gpt5"}}, "unknown preset 'gpt5' (did you mean 'gpt2'?); valid: bert-large"),
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


# ----------------------------------------------------------------------------- overrides compose
DEFAULT = Path(__file__).resolve().parent.parent / "simddp/default_scenario.yaml"
EXAMPLES = DEFAULT.parent.parent / "examples"


def test_default_scenario_does_not_pin_dp_so_resizing_works() -> None:
    s = load_scenario(DEFAULT, ["cluster.num_nodes=64", "ddp.bucket_cap_mb=100"])
    assert s.parallelism.dp is None and s.dp == 512
    assert load_scenario(DEFAULT, ["parallelism.tp=8", "parallelism.pp=2"]).dp == 8


def test_pinned_dp_mismatch_says_how_to_derive_it() -> None:
    with pytest.raises(ScenarioError, match=r"does not match 512 GPUs \(64 nodes x 8\); leave parallelism.dp out"):
        load_scenario(DEFAULT, ["parallelism.dp=128", "cluster.num_nodes=64"])


def test_name_is_derived_from_model_layout_and_gpus() -> None:
    assert load_scenario(DEFAULT).name == "llama2-7b-zero1-128xH100"
    s = load_scenario(DEFAULT, ["model.preset=llama3-70b", "cluster.num_nodes=32", "parallelism.tp=8",
                                "parallelism.sequence_parallel=true", "parallelism.zero_stage=0"])
    assert s.name == "llama3-70b-tp8-sp-ddp-256xH100"
    s = load_scenario(EXAMPLES / "gpt3-175b-3d-1024xA100.yaml", ["name=null"])
    assert s.name == "gpt3-175b-tp8-sp-pp8v2-zero1-1024xA100"
    custom = scenario_from_dict(base_scenario(model={"transformer": {
        "num_layers": 24, "hidden_size": 2048, "num_heads": 16, "ffn_hidden_size": 8192, "vocab_size": 50257}}))
    assert custom.name == "transformer-24L-2048h-ddp-16xA100"


def test_named_scenario_changed_by_set_is_marked_modified() -> None:
    path = EXAMPLES / "gpt3-175b-3d-1024xA100.yaml"
    assert load_scenario(path).name == "gpt3-175b-3d"
    s = load_scenario(path, ["ddp.bucket_cap_mb=100", "training.recompute=full"])
    assert s.name == "gpt3-175b-3d (modified: ddp.bucket_cap_mb=100, training.recompute=full)"
    assert load_scenario(path, ["name=mine", "ddp.bucket_cap_mb=100"]).name == "mine"


def test_derived_name_follows_a_variant_built_from_the_dump() -> None:
    s = load_scenario(DEFAULT)
    assert s.model_dump()["name"] is None  # derived: a variant derives its own
    data = s.model_dump()
    data["model"] = {"preset": "gpt2"}
    data["parallelism"]["zero_stage"] = 3
    assert scenario_from_dict(data).name == "gpt2-zero3-128xH100"
    named = load_scenario(EXAMPLES / "gpt3-175b-3d-1024xA100.yaml")
    assert named.model_dump()["name"] == "gpt3-175b-3d"


# ----------------------------------------------------------------------------- units in YAML and --set
def test_byte_and_rate_fields_take_units() -> None:
    s = load_scenario(DEFAULT, ["cluster.inter_node.nic_bandwidth_bytes_per_s=200Gbit/s",
                                "cluster.intra_node.bandwidth_bytes_per_s=450GB/s",
                                "cluster.gpu.hbm_bytes=40GiB", "memory.cuda_context_bytes=512MiB",
                                "cluster.gpu.hbm_bandwidth_bytes_per_s=2e12"])
    assert s.cluster.inter_node.nic_bandwidth_bytes_per_s == 200 * GBIT
    assert s.cluster.intra_node.bandwidth_bytes_per_s == 450 * GB
    assert s.cluster.gpu.hbm_bytes == 40 * 1024**3
    assert s.memory.cuda_context_bytes == 512 * MiB
    assert s.cluster.gpu.hbm_bandwidth_bytes_per_s == 2e12


def test_yaml_file_sizes_with_units(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 1, gpu: {hbm_bytes: 40GB},\n"
                 "          inter_node: {nic_bandwidth_bytes_per_s: 100Gbps}}\nmodel: {preset: gpt2}\n")
    s = load_scenario(p)
    assert s.cluster.gpu.hbm_bytes == 40 * GB and s.cluster.inter_node.nic_bandwidth_bytes_per_s == 100 * GBIT


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.inter_node.nic_bandwidth_bytes_per_s=25G",
         "cluster.inter_node.nic_bandwidth_bytes_per_s: unit 'G' is ambiguous: write 25GB/s (decimal), 25GiB/s "
         "(binary) or 25Gbit/s"),
        ("cluster.gpu.hbm_bytes=25GB/s", "cluster.gpu.hbm_bytes: '25GB/s' is a rate; expected a size"),
        ("cluster.inter_node.nic_bandwidth_bytes_per_s=-5GB/s",
         "cluster.inter_node.nic_bandwidth_bytes_per_s: Input should be greater than 0"),
    ],
)
def test_bad_units_name_the_field(override: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(DEFAULT, [override])
    assert message in str(info.value)


# ----------------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ddp.bucket_cap_mbs=3", "ddp.bucket_cap_mbs: unknown key; did you mean 'bucket_cap_mb'? (valid here: "
         "implementation, bucket_cap_mb, gradient_as_bucket_view, overlap, algorithm, overlap_param_gather, "
         "reduce_in_fp32, gradient_accumulation_fusion, stage3_prefetch_numel, stage3_max_reuse_distance_numel, "
         "stage3_persistence_threshold_numel, separate_reduce_scatter_group, find_unused_parameters, static_graph, "
         "wrapper, backend)"),
        ("cluster.inter_node.bandwidth=3", "did you mean 'nic_bandwidth_bytes_per_s'?"),
        ("parallelsm.tp=2", "parallelsm: unknown key; did you mean 'parallelism'? (valid here: name, cluster, model"),
        ("cluster.gpu.hbm=3", "cluster.gpu.hbm: unknown key; did you mean 'hbm_bytes'?"),
        ("ddp.zzz=1", "ddp.zzz: unknown key (valid here: implementation, bucket_cap_mb,"),
    ],
)
def test_unknown_key_suggests_the_closest_and_lists_valid_keys(override: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(DEFAULT, [override])
    assert message in str(info.value)


def test_unknown_key_inside_a_list_item() -> None:
    model = {"parameters": [{"name": "w", "numel": 10, "dtyp": "float32"}]}
    with pytest.raises(ScenarioError, match=r"model.parameters.0.dtyp: unknown key; did you mean 'dtype'\?"):
        scenario_from_dict({**base_scenario(), "model": model})


def test_an_empty_unused_parameters_list_is_null() -> None:
    # Found by tests/robustness/test_fuzz.py (2026-11-24): model.unused_parameters = [] on a transformer passed
    # validation as a list, and the step's workload cache, keyed by the model, could not hash it (a TypeError
    # traceback). An empty list says what null says; it is stored as null.
    from simddp import simulate

    data = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
            "model": {"preset": "gpt2", "unused_parameters": []},
            "training": {"micro_batch_size": 2, "seq_len": 512}}
    scenario = Scenario.model_validate(data)
    assert scenario.model.unused_parameters is None
    hash(scenario.model)
    assert simulate(data, trace=False).step_time_s == simulate(
        {**data, "model": {"preset": "gpt2"}}, trace=False).step_time_s


def test_a_list_is_set_whole_not_item_by_item() -> None:
    """`--set model.parameters.0.numel=5` replaced the list with a mapping ("Input should be a valid list"),
    and `--vary` said "unknown key" (found by a hostile-input probe)."""
    from simddp.cli_search import parse_vary
    from simddp.config import set_path

    data = {"model": {"parameters": [{"name": "w", "numel": 4}]}}
    with pytest.raises(ScenarioError, match=r"model.parameters is a list, set whole \(model.parameters=\[...\]\)"):
        set_path(data, "model.parameters.0.numel", "5")
    with pytest.raises(ScenarioError, match=r"--vary model\.parameters\.0\.numel: model\.parameters is a list"):
        parse_vary(["model.parameters.0.numel=1,2"])
    assert set_path(data, "model.parameters", "[{name: v, numel: 2}]")["model"]["parameters"] == [
        {"name": "v", "numel": 2}]
