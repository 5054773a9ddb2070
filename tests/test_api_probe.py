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
