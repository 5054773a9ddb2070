"""The whole run: Daly/Young checkpoint intervals, checkpoint and start-up times by hand, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scenarios import base_scenario

from simddp.cli import main
from simddp.collectives import collective_cost
from simddp.config import ScenarioError, deep_merge
from simddp.run import (
    PARAM_SYNC_CHUNK_BYTES,
    RUN_JSON_KEYS,
    checkpoint_bytes,
    checkpoint_times,
    daly_interval,
    expected_wall_s,
    simulate_run,
    startup_time,
    young_interval,
)
from simddp.scenario_io import scenario_from_dict
from simddp.sim import simulate_step
from simddp.topology import dp_group
from simddp.units import DAY, HOUR
from simddp.workload import total_params


def scenario(run: dict | None = None, **overrides: object) -> object:
    return scenario_from_dict(deep_merge(base_scenario(run={"tokens": 1e9, **(run or {})}), dict(overrides)))


@pytest.mark.parametrize(("delta", "mtbf"), [(10.0, 3 * HOUR), (300.0, 3 * HOUR), (60.0, 400 * HOUR), (2000.0, HOUR)])
def test_daly_interval_minimises_the_expected_wall_time(delta: float, mtbf: float) -> None:
    training, restart = 30 * DAY, 600.0
    taus = np.exp(np.linspace(math.log(delta / 10), math.log(20 * mtbf), 20001))
    walls = [expected_wall_s(training, t, delta, restart, mtbf) for t in taus]
    best = taus[int(np.argmin(walls))]
    daly = daly_interval(delta, mtbf)
    # Daly's higher-order estimate lands on the numerical optimum's wall time to well under 0.1%.
    assert expected_wall_s(training, daly, delta, restart, mtbf) == pytest.approx(min(walls), rel=1e-3)
    if delta < 2 * mtbf:
        assert daly == pytest.approx(best, rel=0.05)


def test_young_is_dalys_first_order_term() -> None:
    delta, mtbf = 1.0, 1e6
    assert daly_interval(delta, mtbf) == pytest.approx(young_interval(delta, mtbf), rel=1e-3)
    assert young_interval(50.0, 3600.0) == pytest.approx(math.sqrt(2 * 50 * 3600))
    assert daly_interval(5000.0, 2000.0) == 2000.0  # delta >= 2M: checkpoint every M


def test_expected_wall_without_failures_is_training_plus_checkpoints() -> None:
    wall = expected_wall_s(1000 * HOUR, HOUR, 60.0, 600.0, 1e12)
    assert wall == pytest.approx(1000 * HOUR * (1 + 60 / HOUR), rel=1e-6)


def test_checkpoint_bytes_follow_the_memory_model() -> None:
    s = scenario()
    n = total_params(s.model.transformer)
    assert checkpoint_bytes(s) == n * (2 + 4 + 8)  # bf16 weights, fp32 master, Adam's two moments
    sgd = scenario(training={"optimizer": "sgd", "precision": "fp32"})
    assert checkpoint_bytes(sgd) == n * 4


def test_rank0_against_sharded_saving_by_hand() -> None:
    s = scenario(run={"node_write_bytes_per_s": 10e9, "storage_write_bytes_per_s": 100e9})
    size = checkpoint_bytes(s)
    rank0, sharded = checkpoint_times(s, size)
    assert rank0 == pytest.approx(size / 10e9)  # plain DDP: rank 0 already holds it all, one node writes it
    assert sharded == pytest.approx(size / min(100e9, 2 * 10e9))  # both nodes write at once
    zero = scenario(run={"node_write_bytes_per_s": 10e9}, parallelism={"zero_stage": 1})
    r0, _ = checkpoint_times(zero, size)
    assert r0 > size / 10e9  # the sharded optimizer states are gathered to rank 0 first


def test_startup_broadcast_by_hand() -> None:
    s = scenario()
    size = total_params(s.model.transformer) * 2  # bf16 parameters, one pipeline stage
    grp = dp_group(s)
    full, rest = divmod(size, PARAM_SYNC_CHUNK_BYTES)
    expected = full * collective_cost("broadcast", PARAM_SYNC_CHUNK_BYTES, grp).time_s + \
        collective_cost("broadcast", rest, grp).time_s
    assert startup_time(s) == pytest.approx(expected)


def test_a_run_adds_up() -> None:
    s = scenario(run={"tokens": 5e10})
    r = simulate_run(s)
    step = simulate_step(s, trace=False)
    assert r.tokens_per_s == pytest.approx(step.tokens_per_s)
    assert r.training_s == pytest.approx(5e10 / step.tokens_per_s)
    assert r.wall_s == pytest.approx(r.startup_s + expected_wall_s(r.training_s, r.checkpoint_interval_s,
                                                                  r.checkpoint_time_s, r.restart_s, r.mtbf_s))
    assert r.goodput == pytest.approx(r.training_s / r.wall_s)
    assert r.gpu_hours == pytest.approx(r.wall_s * 16 / HOUR)
    assert r.cost == pytest.approx(r.gpu_hours * 12.29)
    assert r.mtbf_s == pytest.approx(50_700 * HOUR / 16)
    assert r.expected_failures == pytest.approx(r.wall_s / r.mtbf_s)
    best = max(r.curve, key=lambda p: p.goodput)
    assert r.goodput >= best.goodput * (1 - 1e-3)  # Daly's interval is at the top of the curve
    node = simulate_run(s.model_copy(update={"run": s.run.model_copy(update={"mtbf_scope": "node"})}))
    assert node.mtbf_s == pytest.approx(50_700 * HOUR / 2)


def test_variability_feeds_the_run() -> None:
    s = scenario(variability={"jitter_cv": 0.1})
    r = simulate_run(s)
    assert "Monte Carlo" in r.throughput_source
    assert r.step_time_s > simulate_step(s, trace=False).step_time_s


@pytest.mark.parametrize("variability", [{"jitter_cv": 0.1}, {"seq_len_distribution": "lognormal", "mean_seq_len": 64,
                                                                "sequence_handling": "padding"}])
def test_steps_times_the_step_is_the_training_time(variability: dict) -> None:
    """num_steps counts the steps that see run.tokens: with padding a step trains only its real tokens, so the
    steps are run.tokens over the real tokens per step (they were counted over full rows: a quarter of the steps
    the training time holds, with documents of a quarter of the context)."""
    r = simulate_run(scenario(variability=variability))
    assert r.num_steps * r.step_time_s == pytest.approx(r.training_s, rel=1e-9)
    padded = "seq_len_distribution" in variability
    full = r.tokens / (scenario().global_batch_size * scenario().training.seq_len)
    assert (r.num_steps > 1.5 * full) if padded else r.num_steps == pytest.approx(full, rel=1e-12)


def test_run_needs_tokens_and_finite_progress() -> None:
    with pytest.raises(ScenarioError, match=r"run\.tokens"):
        simulate_run(scenario_from_dict(base_scenario()))
    with pytest.raises(ScenarioError, match="the run never finishes"):
        simulate_run(scenario(run={"mtbf_hours": 1e-6}))


def test_run_command_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--set", "model.preset=gpt2", "--tokens", "300e9", "--gpu-hour-cost", "2.5",
                 "--mtbf-hours", "20000", "--checkpoint-bandwidth", "100GB/s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(RUN_JSON_KEYS) <= set(data)
    assert data["gpu_hour_cost_usd"] == 2.5 and data["cost"] == pytest.approx(data["gpu_hours"] * 2.5)
    assert data["mtbf_s"] == pytest.approx(20000 * HOUR / 128)
    assert main(["run", "--tokens", "300e9", "--set", "model.preset=gpt2"]) == 0
    out = capsys.readouterr().out
    for label in ("wall clock", "GPU-hours", "expected failures", "checkpoint interval", "goodput"):
        assert label in out


def test_run_command_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.tokens" in err
    with pytest.raises(SystemExit) as info:
        main(["run", "--tokens", "1e9", "--checkpoint-bandwidth", "fast"])
    assert info.value.code == 2
    assert "--checkpoint-bandwidth" in capsys.readouterr().err
    assert main(["run", "--tokens", "1e9", "--set", "run.checkpoint_saving=half"]) == 2
    assert "run.checkpoint_saving" in capsys.readouterr().err


def test_python_api() -> None:
    import simddp

    r = simddp.training_run(base_scenario(), tokens=1e9)
    assert r.tokens == 1e9 and r.goodput > 0.9
    with pytest.raises(ScenarioError, match=r"run\.tokens"):
        simddp.training_run(base_scenario(), tokens=-1)
    t = simddp.tails(base_scenario(variability={"jitter_cv": 0.05}), steps=20, seed=1)
    assert t.num_steps == 20 and t.seed == 1


def test_run_refuses_what_it_cannot_answer(capsys: pytest.CaptureFixture[str]) -> None:
    """Inputs whose arithmetic would overflow, or whose answer would be absurd, get a one-line error naming the key:
    they used to print 300-digit costs, 1e300-day runs, a step of 0.0 us from a throughput 10^3 times the GPU's
    peak, and an internal error under --json."""
    cases = [
        (["--tokens", "1e308", "--gpu-hour-cost", "1e308", "--json"], "run.tokens: Input should be less than"),
        (["--tokens", "1e12", "--mtbf-hours", "1e306"], "run.mtbf_hours: Input should be less than"),
        (["--tokens", "1e12", "--tflops-per-gpu", "1e6"], "run.achieved_tflops_per_gpu: 1e+06 TFLOP/s is above"),
        (["--tokens", "1"], "run.tokens: 1 is less than one step's"),
        (["--tokens", "3e11", "--tflops-per-gpu", "1e-9"], "run.achieved_tflops_per_gpu (--tflops-per-gpu) 1e-09"),
        (["--tokens", "1e12", "--set", "cluster.intra_node.latency_s=1e308"], "beyond the 1e+09 s"),
    ]
    for flags, message in cases:
        assert main(["run", "--set", "model.preset=gpt2", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (flags, err)
    with pytest.raises(ScenarioError, match=r"run\.tokens: 1e\+18 tokens take .* days of training"):
        simulate_run(scenario(run={"tokens": 1e18}, cluster={"num_nodes": 1}))


def test_checkpoint_intervals_the_run_cannot_take_are_said() -> None:
    # A checkpoint is taken between steps: an interval shorter than a step is raised to the step (until 2026-11-29
    # an interval of 1e-300 s was a run that never finishes, and 0.5 s for a 1.35 s step read goodput 11.4% with no
    # word); one longer than the training is one checkpoint at the end; a checkpoint longer than its interval says
    # most of the run is saving.
    s = scenario(run={"tokens": 3e11}, cluster={"num_nodes": 16})
    step = simulate_run(s).step_time_s
    short = simulate_run(s, s.run.model_copy(update={"checkpoint_interval_s": step / 3}))
    assert short.checkpoint_interval_s == step
    assert any("shorter than one step: raised to the step" in n for n in short.notes)
    assert any("longer than the" in n and "most of the run is spent saving" in n for n in short.notes)
    long = simulate_run(s, s.run.model_copy(update={"checkpoint_interval_s": 1e300}))
    assert long.checkpoint_interval_s == long.training_s
    assert any("one checkpoint at the end" in n for n in long.notes)
    daly = simulate_run(s)
    assert not any("raised to the step" in n or "checkpoint at the end" in n for n in daly.notes)


def test_run_with_variability_takes_the_steps_the_draws_allow() -> None:
    # `simddp run` has no --steps: a 64k-sample batch on 8,192 GPUs was refused with "use fewer steps". It now
    # averages as many Monte Carlo steps as the draws' limit allows: 2^23 / (8,192 replicas x 8 micro-batches) = 128.
    s = scenario(run={"tokens": 1e12}, cluster={"num_nodes": 1024},
                 training={"global_batch_size": 65536, "micro_batch_size": 1}, variability={"jitter_cv": 0.05})
    r = simulate_run(s)
    assert "(128 steps, variability on, fewer than 200: the draws' limit at this batch)" in r.throughput_source



def test_goodput_curve_starts_at_one_step() -> None:
    s = scenario(run={"tokens": 3e11, "checkpoint_interval_s": 0.5}, cluster={"num_nodes": 16})
    r = simulate_run(s)
    assert r.curve and min(p.checkpoint_interval_s for p in r.curve) >= r.step_time_s * (1 - 1e-12)


def test_run_notes_say_where_the_interval_comes_from() -> None:
    # A raised Daly interval read two notes that contradicted each other; a fixed one read none, under a caption
    # saying the interval maximises goodput.
    # GPT-2 on 16 nodes, sharded saving, a failure every 0.11 s: Daly's 0.0338 s is under the 0.0348 s step.
    tiny = scenario(run={"tokens": 3e9, "mtbf_hours": 0.0005, "mtbf_scope": "node", "restart_overhead_s": 0,
                         "checkpoint_saving": "sharded"}, cluster={"num_nodes": 16})
    r = simulate_run(tiny)
    assert r.checkpoint_interval_s == r.step_time_s
    assert not any("Daly's optimum for this" in n for n in r.notes)
    assert any("Daly's optimum, 0.0338 s," in n and "raised to the step" in n for n in r.notes)
    fixed = simulate_run(scenario(run={"tokens": 3e11, "checkpoint_interval_s": 3600}, cluster={"num_nodes": 16}))
    assert any("fixed by run.checkpoint_interval_s (3.6e+03 s); Daly's optimum would be" in n for n in fixed.notes)


def test_startup_broadcast_runs_on_the_backend_of_the_group() -> None:
    """DDP's start-up broadcast of the parameters runs on the process group's backend: with gloo it is gloo's
    (staged through the host, over TCP), not NCCL's. Until 2026-11-29 both read NCCL's 5.2 ms for ResNet-50 on PCIe
    A100s; gloo's is 106 ms."""
    from simddp import load_scenario
    from simddp.gloo import gloo_cost
    from simddp.run import startup_time
    from simddp.topology import dp_group

    example = str(Path(__file__).resolve().parent.parent / "examples" / "resnet50-pcie.yaml")
    nccl = load_scenario(example)
    gloo = load_scenario(example, ["ddp.backend=gloo"])
    size = 4 * 25_557_032  # ResNet-50's fp32 parameters, one chunk
    assert startup_time(gloo) == pytest.approx(gloo_cost("broadcast", size, dp_group(gloo), gloo.cluster.gloo).time_s,
                                               rel=1e-12)
    assert startup_time(gloo) > 10 * startup_time(nccl)
