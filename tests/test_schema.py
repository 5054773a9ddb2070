"""The discoverable schema: `simddp schema`, `simddp presets show` and `simddp init`, all generated from the
pydantic models and the presets."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from simddp.cli import default_scenario_path
from simddp.config import Cluster, ModelConfig, Scenario, ScenarioError, read_mapping
from simddp.keys import submodels
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS
from simddp.scenario_io import scenario_from_dict
from simddp.schema import KeyDoc, preset_yaml, schema_keys, starter_scenario


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simddp.cli", *args], capture_output=True, text=True, timeout=120)


def _leaf_paths(model, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        sub = submodels(field.annotation)
        out.add(prefix + name)
        if sub:
            listed = "list" in str(field.annotation)
            out |= _leaf_paths(sub[0], prefix + name + ("[]." if listed else "."))
    return out


def test_schema_lists_every_key_of_every_model() -> None:
    assert {k.path for k in schema_keys()} == _leaf_paths(Scenario)


def test_schema_key_has_type_unit_default_bounds_and_description() -> None:
    (cap,) = schema_keys("ddp.bucket_cap_mb")
    assert cap == KeyDoc(path="ddp.bucket_cap_mb", type="float", unit="MiB", accepts_units=False, required=False,
                         default=None, nullable=True, bounds="> 0, <= 1099511627776",
                         description="Gradient bucket size in MiB; null = the implementation's: torch DDP 25 (1 MiB "
                         "first, as torch reads bucket_cap_mb); DeepSpeed reduce_bucket_size 5e8 elements; Megatron "
                         "max(4e7, 1e6 x dp) elements with overlap, one bucket without. An element count is MiB x "
                         "2^20 / gradient bytes.")
    (nic,) = schema_keys("cluster.inter_node.nic_bandwidth_bytes_per_s")
    assert (nic.type, nic.unit, nic.accepts_units, nic.required, nic.bounds) == ("float", "bytes/s", True, True, "> 0")
    assert nic.preset_sets and "required (cluster.preset fills it)" in nic.to_text()
    assert not schema_keys("cluster.host_overhead_s")[0].preset_sets  # a default, no preset sets it
    (frag,) = schema_keys("memory.fragmentation_fraction")
    assert (frag.default, frag.bounds, frag.unit) == (0.1, ">= 0, < 1", "fraction of 1")
    (zero,) = schema_keys("parallelism.zero_stage")
    assert zero.type == "one of 0, 1, 2, 3" and zero.default == 0
    (name,) = schema_keys("model.parameters[].name")
    assert name == schema_keys("model.parameters.name")[0] and name.required


def test_schema_section_lists_its_keys() -> None:
    keys = [k.path for k in schema_keys("cluster.inter_node")]
    assert keys == ["cluster.inter_node", *(f"cluster.inter_node.{k}" for k in
                                            ("kind", "nics_per_node", "nic_bandwidth_bytes_per_s", "latency_s",
                                             "efficiency"))]


def test_schema_cli_text_json_and_unknown_key() -> None:
    r = run("schema", "training.recompute")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["training.recompute",
                                     "    one of none, selective, selective-op, full, default none",
                                     "    Activation recompute: selective re-runs the attention core (Megatron), "
                                     "selective-op is torchtitan's op-level checkpointing (keeps every other "
                                     "matmul output and the attention output, re-runs the rest of the block), "
                                     "full re-runs each block from its input."]
    data = json.loads(run("schema", "--json").stdout)
    assert len(data) == len(_leaf_paths(Scenario)) and {"path", "type", "unit", "default", "bounds"} <= set(data[0])
    r = run("schema", "ddp.bucket_cap_mbs")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(
        "simddp: error: schema: ddp.bucket_cap_mbs: unknown key; did you mean 'bucket_cap_mb'? (valid here: ")


@pytest.mark.parametrize("name", [*CLUSTER_PRESETS, *MODEL_PRESETS])
def test_presets_show_pastes_into_a_scenario_as_the_same_values(name: str) -> None:
    pasted = yaml.safe_load(preset_yaml(name))
    section = "cluster" if name in CLUSTER_PRESETS else "model"
    data = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"}, **pasted}
    if section == "cluster":
        data["cluster"]["num_nodes"] = 1
    got = getattr(scenario_from_dict(data), section)
    model = Cluster if section == "cluster" else ModelConfig
    expected = model.model_validate({"preset": name}).model_dump(exclude={"preset"})
    assert_same(got.model_dump(exclude={"preset"}), expected)


def _flat(data, prefix: str = "") -> dict:
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else None
    if items is None:
        return {prefix: data}
    out: dict = {}
    for k, v in items:
        out |= _flat(v, f"{prefix}.{k}")
    return out


def assert_same(got: dict, expected: dict) -> None:
    """Equal, floats to 12 digits (they are printed so: 3.4e-06, not 3.3999999999999996e-06)."""
    a, b = _flat(got), _flat(expected)
    assert a.keys() == b.keys()
    floats = [k for k, v in b.items() if isinstance(v, float)]
    assert [a[k] for k in floats] == pytest.approx([b[k] for k in floats], rel=1e-11)
    assert {k: v for k, v in a.items() if k not in floats} == {k: v for k, v in b.items() if k not in floats}


def test_presets_show_cli() -> None:
    r = run("presets", "show", "dgx-h100-80gb")
    assert r.returncode == 0, r.stderr
    assert "    nic_bandwidth_bytes_per_s: 50000000000.0" in r.stdout and "# 50.0 GB/s = 400 Gbit/s" in r.stdout
    assert json.loads(run("presets", "show", "llama2-7b", "--json").stdout)["model"]["transformer"]["num_layers"] == 32
    r = run("presets", "show", "llama-7b")
    assert r.returncode == 2 and "unknown preset 'llama-7b'; did you mean 'llama2-7b'?" in r.stderr
    assert "resnet50" in run("presets").stdout  # the listing still works
    listing = json.loads(run("presets", "--json").stdout)
    assert listing["clusters"]["dgx-h100-80gb"]["values"]["inter_node"]["nic_bandwidth_bytes_per_s"] == 50e9
    assert listing["models"]["llama3-70b"]["values"]["transformer"]["num_kv_heads"] == 8


def _uncomment(text: str) -> str:
    """Uncomment every key except the model shape a preset stands for (it and the preset are exclusive)."""
    out, skip_indent = [], None
    for line in text.splitlines():
        m = re.match(r"^(\s*)# (\s*)((?:\w+:|- ).*)$", line)
        if not m:
            out.append(line)
            continue
        indent = len(m.group(1)) + len(m.group(2))
        if skip_indent is not None and indent > skip_indent:
            continue
        skip_indent = indent if m.group(3).startswith(("transformer:", "parameters:")) else None
        if skip_indent is None:
            out.append(m.group(1) + m.group(2) + m.group(3))
    return "\n".join(out)


@pytest.mark.parametrize(("model", "cluster"), [(None, None), ("llama3-70b", "dgx-a100-80gb"),
                                                ("resnet50", "pcie-a100-80gb")])
def test_init_is_a_valid_scenario_listing_every_key(model, cluster) -> None:
    text = starter_scenario(read_mapping(default_scenario_path()), model, cluster, None)
    live = scenario_from_dict(yaml.safe_load(text))
    assert live.model.preset == (model or "llama2-7b") and live.cluster.preset == (cluster or "dgx-h100-80gb")
    keys = {m.group(1) for m in re.finditer(r"^[\s#]*(\w+):", text, flags=re.MULTILINE)}
    unused = "model.transformer" if model == "resnet50" else "model.parameters"  # the other model form
    expected = {p.rsplit(".", 1)[-1] for p in _leaf_paths(Scenario) if "[]" not in p and not p.startswith(unused)}
    assert expected <= keys
    every = scenario_from_dict(yaml.safe_load(_uncomment(text)))  # uncommenting changes nothing
    assert_same(every.model_dump(exclude={"name"}), live.model_dump(exclude={"name"}))
    assert every.name == live.name
    if model == "resnet50":
        assert live.training.seq_len == 1


def test_init_cli_writes_a_scenario_that_simulates(tmp_path) -> None:
    r = run("init", "--model", "gpt2", "--cluster", "dgx-a100-80gb", "--num-nodes", "2")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "scenario.yaml"
    path.write_text(r.stdout)
    sim = run("simulate", str(path), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["scenario"] == "gpt2-zero1-16xA100"
    r = run("init", "--model", "gpt9")
    assert r.returncode == 2 and "invalid choice: 'gpt9'" in r.stderr


def test_unknown_preset_in_init_is_a_one_line_error() -> None:
    with pytest.raises(ScenarioError, match="unknown preset 'dgx'"):
        starter_scenario(read_mapping(default_scenario_path()), None, "dgx", None)


def test_init_on_any_node_count_raises_the_batch_to_a_multiple_of_dp() -> None:
    """The default's 512 samples do not split over 3 nodes of 8 GPUs (dp 24): init used to fail for most node
    counts; it raises the batch to the next multiple (528) and says so in the file."""
    text = starter_scenario(read_mapping(default_scenario_path()), None, None, 3)
    assert "# training.global_batch_size: 528, the base's 512 raised to a multiple of dp x micro_batch_size (24 x 1)" \
        in text
    scenario = scenario_from_dict(yaml.safe_load(text))
    assert scenario.training.global_batch_size == 528 and scenario.dp == 24
    assert "raised" not in starter_scenario(read_mapping(default_scenario_path()), None, None, 16)


def test_schema_below_a_value_says_so() -> None:
    with pytest.raises(ScenarioError, match=r"schema: cluster\.gpu\.hbm_bytes is a value, with no keys under it \(x\)"):
        schema_keys("cluster.gpu.hbm_bytes.x")


@pytest.mark.parametrize("model, positions", [("gpt2", 1024), ("bert-large", 512), ("gpt3-175b", 2048),
                                              ("llama2-7b", None)])
def test_init_keeps_the_sequence_within_the_models_positions(model: str, positions: int | None) -> None:
    """`init --model gpt2` wrote the default's 4,096 tokens for a model with 1,024 learned positions (a probe);
    it now writes the model's own length where the default's is longer (rope models keep it), and simulate
    says so when a scenario asks for more."""
    from simddp import simulate

    data = yaml.safe_load(starter_scenario(read_mapping(default_scenario_path()), model, None, None))
    scenario = Scenario.model_validate(data)
    assert scenario.training.seq_len == (positions or 4096)
    assert not any("learned positions" in n for n in simulate(scenario, trace=False).not_modelled)
    longer = Scenario.model_validate({**data, "training": {**data["training"], "seq_len": 4096}})
    notes = [n for n in simulate(longer, trace=False).not_modelled if "learned positions" in n]
    assert bool(notes) == (positions is not None)
