"""The Python API as a notebook user or a service calls it: found by a probe of the public functions (2026-11-25).
Each case was a hang, a bare KeyError/TypeError/ValueError, or a scenario that would not load back."""

from __future__ import annotations

import json

import pytest

import simddp
from simddp import ScenarioError, as_scenario
from simddp.config import ParameterSpec, Scenario

SMALL = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"},
         "training": {"seq_len": 1024, "micro_batch_size": 4}}


@pytest.mark.parametrize("model", ["gpt2", "llama2-7b", "resnet50"])
def test_a_preset_scenario_loads_back_from_its_own_dump(model: str) -> None:
    """A validated preset model holds its expanded shape beside the preset's name: its dump used to fail to load
    ('give exactly one of preset, transformer or parameters'), by every route."""
    data = {**SMALL, "model": {"preset": model}}
    if model == "resnet50":
        data["training"] = {"seq_len": 1, "micro_batch_size": 32}
    sc = as_scenario(data)
    for dumped in (sc.model_dump(), json.loads(sc.model_dump_json()), sc.model_dump(exclude_unset=True)):
        assert as_scenario(dumped) == sc
    assert Scenario.model_validate_json(sc.model_dump_json()) == sc
    other = sc.model_dump()
    other["model"]["transformer"] = {**(other["model"]["transformer"] or {"num_layers": 2}), "num_layers": 3}
    with pytest.raises(ScenarioError, match="exactly one of preset, transformer or parameters"):
        as_scenario(other)  # a shape that is not the preset's is still refused beside its name


def test_any_prefetch_depth_is_answered_at_once() -> None:
    """memory.fsdp_prefetch_layers had no bound and the engines looped over it: 10**18 never returned. No more
    units than there are can be ahead: every depth from the unit count up gives one answer."""
    base = {**SMALL, "parallelism": {"zero_stage": 3}}
    steps = {simddp.simulate({**base, "memory": {"fsdp_prefetch_layers": k}}, trace=False).step_time_s
             for k in (13, 10**4, 2**53)}  # 2^53: the largest integer a scenario takes (10^18 is refused at load)
    assert len(steps) == 1
    assert simddp.simulate({**base, "memory": {"fsdp_prefetch_layers": 2**53}}).step_time_s in steps
    with pytest.raises(simddp.ScenarioError, match="fsdp_prefetch_layers: an integer of 19 digits is over the limit"):
        simddp.simulate({**base, "memory": {"fsdp_prefetch_layers": 10**18}})


def test_a_pipeline_stage_without_layers_runs_in_every_engine() -> None:
    """A parameter-list model split by size can leave a stage without layers: the simpy engine (trace, exact)
    raised KeyError while the fast one answered."""
    sc = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
          "model": {"parameters": [{"name": "a", "numel": 100_000_000}, {"name": "b", "numel": 1},
                                   {"name": "c", "numel": 1000}, {"name": "d", "numel": 1_000_000}]},
          "parallelism": {"pp": 4}}
    fast = simddp.simulate(sc, trace=False).step_time_s
    assert simddp.simulate(sc, trace=False, exact=True).step_time_s == pytest.approx(fast, rel=1e-9)
    assert simddp.simulate(sc).step_time_s == pytest.approx(fast, rel=1e-9)


def test_adafactor_on_an_empty_tensor_parallel_slice() -> None:
    """vocab_size 1 at tp 2 leaves a rank an empty embedding slice: Adafactor's factored state raised
    'isqrt() argument must be nonnegative'."""
    sc = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
          "model": {"transformer": {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 1024,
                                    "vocab_size": 1}},
          "parallelism": {"tp": 2}, "training": {"optimizer": "adafactor", "seq_len": 512}}
    assert simddp.simulate(sc, trace=False).step_time_s > 0
    assert simddp.memory_breakdown(sc).total_bytes > 0


def test_the_api_refuses_what_the_cli_refuses() -> None:
    """simulate() returned a step of inf s where the CLI, tails() and training_run() refuse it."""
    slow = {**SMALL, "cluster": {**SMALL["cluster"], "gpu": {"peak_bf16_flop_per_s": 1e-300}}}
    with pytest.raises(ScenarioError, match="beyond the"):
        simddp.simulate(slow, trace=False)


@pytest.mark.parametrize("call, message", [
    (lambda: simddp.simulate(None), "a scenario is a Scenario, a dict of scenario keys or a YAML/JSON path"),
    (lambda: simddp.simulate(42), "not a int"),
    (lambda: simddp.tails(SMALL, steps=2.5), r"steps\(2.5\) must be a whole number >= 1"),
    (lambda: simddp.tails(SMALL, seed=-1), r"seed\(-1\) must be a whole number >= 0"),
    (lambda: simddp.max_micro_batch_that_fits(SMALL, limit=2.5), r"limit\(2.5\)"),
    (lambda: simddp.memory_breakdown(SMALL, stage=1), r"stage\(1\) must be in 0..0"),
    (lambda: simddp.smallest_layout_that_fits(SMALL, "16"), r"num_gpus\('16'\)"),
    (lambda: simddp.load_scenario("x.yaml", overrides="cluster.num_nodes=2"), "a list of 'key.path=value' strings"),
    (lambda: simddp.ddp_buckets([ParameterSpec(name="w", numel=10)], bucket_cap_mb=0),
     "bucket_cap_mb must be a finite number > 0"),
    (lambda: simddp.ddp_buckets([]), "needs at least one parameter"),
])
def test_bad_arguments_are_one_scenario_error(call, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        call()


def test_memory_searches_take_what_simulate_takes() -> None:
    """memory_breakdown and the two searches took only a Scenario (AttributeError on a dict)."""
    sc = as_scenario(SMALL)
    assert simddp.memory_breakdown(SMALL).total_bytes == simddp.memory_breakdown(sc).total_bytes
    assert simddp.max_micro_batch_that_fits(SMALL) == simddp.max_micro_batch_that_fits(sc)
    assert simddp.smallest_layout_that_fits(SMALL).num_gpus == 8


def test_review_findings_on_the_api(tmp_path) -> None:
    """A review of these changes: numpy integers are counts too; a preset with a key of its own beside the name
    (num_autograd_nodes) loads back from its dump; bucket_export's stage is checked; a refused command removes
    nested output directories it created, deepest first, across its outputs."""
    import numpy as np

    from simddp.cli import main
    from simddp.exports import bucket_export

    assert simddp.max_micro_batch_that_fits(SMALL, limit=np.int64(64)) == simddp.max_micro_batch_that_fits(
        SMALL, limit=64)
    assert simddp.memory_breakdown(SMALL, stage=np.int64(0)).total_bytes == simddp.memory_breakdown(SMALL).total_bytes
    sc = as_scenario({**SMALL, "model": {"preset": "gpt2", "num_autograd_nodes": 500}})
    assert as_scenario(sc.model_dump()) == sc
    with pytest.raises(ScenarioError, match=r"stage\(1\) must be in 0..0"):
        bucket_export(as_scenario(SMALL), stage=1)
    d2 = tmp_path / "d2"
    big = "training.global_batch_size=1000000000000000"
    assert main(["simulate", "--trace", str(d2 / "t.json"), "--csv", str(d2 / "b" / "c"), "--set", big]) == 2
    assert not d2.exists()


def _group(num_ranks, stride=1):
    from simddp.topology import group
    return group(as_scenario(SMALL).cluster, num_ranks, stride)


@pytest.mark.parametrize("call, message", [
    # A group of -3 ranks gave an all-reduce of -0.22 ms, one of 0 a ZeroDivisionError (2026-11-29 probe).
    (lambda: _group(-3), r"group: num_ranks\(-3\) must be a whole number >= 1"),
    (lambda: _group(0), r"group: num_ranks\(0\) must be a whole number >= 1"),
    (lambda: _group(2.5), r"group: num_ranks\(2.5\) must be a whole number"),
    (lambda: _group(True), r"group: num_ranks\(True\) must be a whole number"),
    (lambda: _group(10**9), r"group: num_ranks\(1000000000\) must be at most 16,777,216"),
    (lambda: _group(2, stride=0), r"group: stride\(0\) must be a whole number >= 1"),
    # Algorithms that do not run an op were plain ValueErrors: `except simddp.ScenarioError` missed them.
    (lambda: simddp.collective_cost("reduce-scatter", 1 << 20, _group(8), algorithm="tree"),
     "tree is an all-reduce algorithm in NCCL, not reduce-scatter"),
    (lambda: simddp.collective_cost("broadcast", 1 << 20, _group(8), algorithm="hierarchical"),
     "hierarchical is an all-reduce algorithm"),
    # Parameters that are not physical made buckets of -400 B or 12.5 B.
    (lambda: simddp.ddp_buckets([ParameterSpec(name="w", numel=10), ParameterSpec.model_construct(
        name="v", numel=-100, dtype="float32")]), r"params\[1\].numel\(-100\) must be a whole number >= 0"),
    (lambda: simddp.ddp_buckets([ParameterSpec.model_construct(name="v", numel=2.5, dtype="float32")]),
     r"params\[0\].numel\(2.5\)"),
    (lambda: simddp.ddp_buckets([ParameterSpec.model_construct(name="v", numel=3, dtype="float99")]),
     r"params\[0\].dtype: unknown dtype 'float99'"),
    (lambda: simddp.ddp_buckets([{"numel": 3, "dtype": "float32"}]),
     r"params\[0\]: expected a parameter with numel and dtype"),
])
def test_more_bad_arguments_are_one_scenario_error(call, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        call()


def test_numpy_counts_make_whole_buckets() -> None:
    import numpy as np

    assert _group(np.int64(8), np.int64(1)) == _group(8)

    from simddp.workload import Param
    (bucket,) = simddp.ddp_buckets([Param("w", np.int64(10), "bfloat16")])
    assert bucket.size_bytes == 20 and type(bucket.size_bytes) is int


def test_planner_and_sweeps_take_what_simulate_takes(tmp_path) -> None:
    """plan_layouts took only a Scenario (AttributeError on a dict or a path), checked its objective only after the
    whole search (a pydantic error), and vary_sweep swept the characters of "5,25" ('5', ',', '2', '5')."""
    from simddp.planner import plan_layouts
    from simddp.sweeps import vary_sweep

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SMALL))
    by = [plan_layouts(s, 8, top=2) for s in (as_scenario(SMALL), SMALL, str(path))]
    assert by[0].evaluated > 0 and by[0].layouts
    assert by[1] == by[0] == by[2]
    with pytest.raises(ScenarioError, match=r"--objective\('mfu'\) must be one of step_time, tokens_per_s"):
        plan_layouts(SMALL, 8, objective="mfu")
    with pytest.raises(ScenarioError, match=r"--top\(2.5\) must be a whole number"):
        plan_layouts(SMALL, 8, top=2.5)
    with pytest.raises(ScenarioError, match=r"--vary ddp\.bucket_cap_mb: expected a list of values, not str '5,25'"):
        vary_sweep(SMALL, {"ddp.bucket_cap_mb": "5,25"})
    from simddp.sweeps import bucket_cap_sweep, grid_sweep, scaling_sweep
    with pytest.raises(ScenarioError, match=r"^training\.micro_batch_size: expected a list of values, not str"):
        grid_sweep(SMALL, "ddp.bucket_cap_mb", [5, 25], "training.micro_batch_size", "12")
    with pytest.raises(ScenarioError, match=r"^caps_mb: expected a list of values, not str '525'"):
        bucket_cap_sweep(SMALL, "525")  # swept 5, 2 and 5 MiB
    with pytest.raises(ScenarioError, match=r"^gpu_counts: expected a list of values, not str '8'"):
        scaling_sweep(SMALL, "8")  # a TypeError
    with pytest.raises(ScenarioError, match=r"^gpu count\(2\.5\) must be a whole number"):
        scaling_sweep(SMALL, [8, 2.5])
    for bad in ("8", None, True, 8.0):  # "8" and None were TypeErrors; True and 8.0 were taken
        with pytest.raises(ScenarioError, match=r"^num_gpus\("):
            plan_layouts(SMALL, bad)
    points = [vary_sweep(s, {"ddp.bucket_cap_mb": [5, 25]}).points for s in (SMALL, str(path))]
    assert [p.step_time_s for p in points[0]] == [p.step_time_s for p in points[1]]
    assert points[0][0].step_time_s != points[0][1].step_time_s


def test_a_per_sample_model_says_what_its_sequence_length_counts() -> None:
    """ResNet-50 left at a language model's seq_len printed 73.5 M tokens/s: its layers cost per sample, so the
    length only multiplies samples into tokens. The step says so; the step itself does not change."""
    base = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "resnet50"},
            "training": {"micro_batch_size": 32, "global_batch_size": 256}}
    one = simddp.simulate({**base, "training": {**base["training"], "seq_len": 1}}, trace=False)
    long = simddp.simulate({**base, "training": {**base["training"], "seq_len": 2048}}, trace=False)
    assert long.step_time_s == one.step_time_s
    assert long.tokens_per_s == pytest.approx(2048 * one.tokens_per_s)
    said = [n for n in long.not_modelled if "training.seq_len(2048) does not change this step" in n]
    assert len(said) == 1 and not [n for n in one.not_modelled if "seq_len" in n]
    gpt2 = simddp.simulate(SMALL, trace=False)  # a transformer's tokens are real
    assert not [n for n in gpt2.not_modelled if "does not change this step" in n]
