"""Per-GPU memory model: model states, activations, buffers, verdicts, helpers, CLI and properties."""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simddp
from simddp.cli import main
from simddp.config import ParameterSpec, Scenario, ScenarioError, TransformerSpec, deep_merge
from simddp.memory import (
    FSDP_SHARDING_ZERO_STAGE,
    MemoryBreakdown,
    in_flight_micro_batches,
    max_micro_batch_that_fits,
    memory_breakdown,
    model_states_bytes,
    recompute_working_set_bytes,
    smallest_layout_that_fits,
    transformer_embedding_activation_bytes,
    transformer_layer_activation_bytes,
    transformer_output_activation_bytes,
    zero_model_states_bytes,
)
from simddp.scenario_io import scenario_from_dict
from simddp.units import GiB, MiB
from simddp.workload import build_workload

GPT3 = TransformerSpec(num_layers=96, hidden_size=12288, num_heads=96, ffn_hidden_size=4 * 12288, vocab_size=50257)


def make(overrides: dict[str, Any] | None = None) -> Scenario:
    base = {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1},
        "model": {"preset": "gpt2"},
        "training": {"seq_len": 1024, "micro_batch_size": 4},
    }
    return scenario_from_dict(deep_merge(base, overrides or {}))


def llama70b(**parallelism: Any) -> Scenario:
    return make({
        "cluster": {"num_nodes": 8},
        "model": {"preset": "llama2-70b"},
        "parallelism": {"zero_stage": 3, **parallelism},
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 512, "recompute": "full"},
    })


def item(m: MemoryBreakdown, name: str) -> int:
    return next(i.size_bytes for i in m.items if i.name == name)


# ------------------------------------------------------------------------------------ model states
@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [
        ("fp32", "adamw", (4, 4, 0, 8)),
        ("fp32", "adam", (4, 4, 0, 8)),
        ("bf16-mixed", "adamw", (2, 2, 4, 8)),  # K = 12 (ZeRO paper)
        ("fp16-mixed", "adam", (2, 2, 4, 8)),
        ("fp32", "sgd", (4, 4, 0, 0)),
        ("bf16-mixed", "sgd", (2, 2, 4, 0)),
        ("fp32", "sgd-momentum", (4, 4, 0, 4)),
        ("bf16-mixed", "sgd-momentum", (2, 2, 4, 4)),
    ],
)
def test_bytes_per_parameter_by_precision_and_optimizer(precision, optimizer, expected):
    n = 1_000_000
    states = zero_model_states_bytes(n, dp=1, zero_stage=0, precision=precision, optimizer=optimizer)
    assert tuple(states)[:4] == tuple(e * n for e in expected)
    assert states.optimizer_bytes == (expected[2] + expected[3]) * n


def test_adafactor_keeps_factored_second_moments():
    n = 4096 * 4096
    states = zero_model_states_bytes(n, 1, 0, "fp32", "adafactor")
    assert states.optimizer_state_bytes == 4 * (4096 + 4096)
    tiny = zero_model_states_bytes(3, 1, 0, "fp32", "adafactor")
    assert tiny.optimizer_state_bytes == 4 * 3  # a vector: its full second moment


def test_fp32_parameters_under_autocast_keep_no_master_copy():
    p = [ParameterSpec(name="w", numel=1000, dtype="float32")]
    states = model_states_bytes(p, "bf16-mixed", "adamw")
    assert (states.params_bytes, states.grads_bytes, states.master_bytes, states.optimizer_state_bytes) == (
        4000, 4000, 0, 8000)
    assert states.total_bytes == 16 * 1000  # the same 16 bytes per parameter as ZeRO's 2 + 2 + 12


def test_reduce_in_fp32_makes_gradients_four_bytes():
    p = [ParameterSpec(name="w", numel=1000, dtype="bfloat16")]
    assert model_states_bytes(p, "bf16-mixed", "adamw", reduce_in_fp32=True).grads_bytes == 4000


@given(
    num_params=st.integers(1, 10**12),
    dp=st.integers(1, 4096),
)
def test_zero_stages_follow_the_paper(num_params, dp):
    psi = num_params

    def total(stage: int) -> int:
        return zero_model_states_bytes(psi, dp, stage).total_bytes

    assert total(0) == 16 * psi
    # ceil per sharded buffer: at most one byte over the exact formula per buffer.
    assert 0 <= total(1) - (4 * psi + 12 * psi / dp) < 2
    assert 0 <= total(2) - (2 * psi + 14 * psi / dp) < 3
    assert 0 <= total(3) - 16 * psi / dp < 4


@settings(max_examples=200)
@given(num_params=st.integers(1, 10**11), dp=st.integers(1, 1024), extra=st.integers(1, 1024),
       stage=st.sampled_from([1, 2, 3]),
       precision=st.sampled_from(["fp32", "bf16-mixed"]),
       optimizer=st.sampled_from(["adamw", "sgd", "sgd-momentum", "adafactor"]))
def test_model_states_never_grow_with_dp_for_zero_stages(num_params, dp, extra, stage, precision, optimizer):
    small = zero_model_states_bytes(num_params, dp, stage, precision, optimizer).total_bytes
    large = zero_model_states_bytes(num_params, dp + extra, stage, precision, optimizer).total_bytes
    assert large <= small


def test_fsdp_strategies_map_to_zero_stages():
    assert FSDP_SHARDING_ZERO_STAGE == {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}


def test_model_states_are_divided_by_tp_and_per_stage():
    full = memory_breakdown(make({"model": {"preset": "gpt2-medium"}}))
    tp = memory_breakdown(make({"model": {"preset": "gpt2-medium"}, "parallelism": {"tp": 4}}))
    pp = memory_breakdown(make({"model": {"preset": "gpt2-medium"}, "parallelism": {"pp": 4}}))
    assert tp.num_params == pytest.approx(full.num_params / 4, rel=0.02)  # norms, biases, wpe replicated
    assert pp.num_params < full.num_params / 2  # most loaded stage: 6 of 24 blocks + embeddings
    assert full.model_states_bytes == 16 * full.num_params


def test_tied_embedding_is_copied_to_the_last_stage():
    s = make({"parallelism": {"pp": 2}})
    workload = build_workload(s)
    wte = workload.parameters[0]
    assert wte.name == "transformer.wte.weight"
    first = memory_breakdown(s, stage=0)
    last = memory_breakdown(s, stage=1)
    blocks = sum(p.numel for p in workload.parameters if ".h." in p.name) // 2
    assert last.num_params >= blocks + wte.numel
    assert first.num_params >= blocks + wte.numel


# ------------------------------------------------------------------------------------ activations
SBH = 2048 * 1 * 12288


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "per_sbh"),
    [
        (1, False, "none", 34 + 5 * 96 * 2048 / 12288),
        (8, False, "none", 10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8)),
        (8, True, "none", 34 / 8 + 5 * 96 * 2048 / (12288 * 8)),
        (8, False, "selective", 10 + 24 / 8),
        (8, True, "selective", 34 / 8),
        (1, False, "full", 2),
        (8, False, "full", 2),
    ],
)
def test_korthikanti_table2_on_gpt3(tp, sp, recompute, per_sbh):
    got = transformer_layer_activation_bytes(GPT3, 2048, 1, tp, sp, recompute)
    assert got == pytest.approx(per_sbh * SBH, rel=1e-12)


@given(
    s=st.sampled_from([128, 512, 2048, 4096]),
    b=st.integers(1, 8),
    heads=st.sampled_from([8, 16, 32, 64]),
    head_dim=st.sampled_from([64, 128]),
    t=st.sampled_from([1, 2, 4, 8]),
)
def test_korthikanti_formulas_for_any_gpt_shape(s, b, heads, head_dim, t):
    h = heads * head_dim
    spec = TransformerSpec(num_layers=2, hidden_size=h, num_heads=heads, ffn_hidden_size=4 * h, vocab_size=1000)
    sbh = s * b * h
    attn = 5 * heads * s / (h * t)
    f = transformer_layer_activation_bytes
    assert f(spec, s, b, t, False, "none") == pytest.approx(sbh * (10 + 24 / t + attn), rel=1e-9)
    assert f(spec, s, b, t, t > 1, "none") == pytest.approx(sbh * ((34 / t if t > 1 else 34) + attn), rel=1e-9)
    assert f(spec, s, b, t, False, "selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-9)
    assert f(spec, s, b, t, False, "full") == 2 * sbh


def test_gqa_gated_mlp_and_no_dropout_change_the_saved_tensors():
    h, s = 8192, 4096
    llama = TransformerSpec(num_layers=80, hidden_size=h, num_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
                            vocab_size=32000, gated_mlp=True)
    per_token = transformer_layer_activation_bytes(llama, s, 1, dropout=False) / s
    # norm/GEMM inputs 4 x 2h; Q, out 2 x 2h; K, V 2 x 2 x 1024; SwiGLU 3 x 2 x ffn; scores 2 a s.
    assert per_token == 8 * h + 4 * h + 4 * 1024 + 6 * 28672 + 2 * 64 * s


def test_embedding_and_output_terms():
    emb = transformer_embedding_activation_bytes(GPT3, 2048, 1, tp=8, sequence_parallel=True)
    assert emb == 2048 * (8 + 12288 / 8)
    out = transformer_output_activation_bytes(GPT3, 2048, 1, tp=8)
    assert out == pytest.approx(2048 * (4 * 12288 + 6 * 50257 / 8), abs=1)


@pytest.mark.parametrize(
    ("schedule", "pp", "stage", "m", "v", "expected"),
    [
        ("1f1b", 1, 0, 8, 1, 1),
        ("gpipe", 1, 0, 8, 1, 1),
        ("1f1b", 4, 0, 8, 1, 4),
        ("1f1b", 4, 3, 8, 1, 1),
        ("1f1b", 4, 0, 2, 1, 2),
        ("gpipe", 4, 2, 8, 1, 8),
        ("interleaved-1f1b", 4, 0, 16, 2, 4 * (1 + 3 / 8)),  # Korthikanti et al. sec. 4.2.3
        ("interleaved-1f1b", 8, 0, 64, 4, 8 * (1 + 7 / 32)),
        # One chunk keeps Megatron's interleaved warm-up, 2(p - 1) forwards on stage 0, plus the one in flight.
        ("interleaved-1f1b", 4, 0, 16, 1, 7),
        # m = p: Megatron's all_warmup_microbatches, every forward first on every stage (a probe found 2.5 here).
        ("interleaved-1f1b", 4, 3, 4, 2, 4),
        ("interleaved-1f1b", 4, 0, 4, 2, 4),
    ],
)
def test_in_flight_micro_batches(schedule, pp, stage, m, v, expected):
    assert in_flight_micro_batches(schedule, pp, stage, m, v) == pytest.approx(expected)


def test_torch_interleaving_has_no_all_warmup_case():
    """torch.distributed.pipelining's ScheduleInterleaved1F1B warms up (v - 1) p + 2 (p - 1 - rank) chunks whatever
    m (get_rank_warmup_ops): at m = p the last stage holds 5 chunks of 8, as at m = 2p."""
    assert in_flight_micro_batches("interleaved-1f1b", 4, 3, 4, 2, megatron=False) == pytest.approx(2.5)
    assert in_flight_micro_batches("interleaved-1f1b", 4, 3, 8, 2, megatron=False) == pytest.approx(2.5)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b"]), st.integers(2, 8), st.integers(1, 4),
       st.integers(1, 6), st.booleans(), st.data())
def test_in_flight_is_the_simulated_schedules_peak(schedule, pp, v, groups, megatron, data):
    """The memory model's in-flight micro-batches are the most forwards the simulated schedule has outstanding
    (run, not yet run backward) on that rank, in whole micro-batches: the two read one schedule."""
    from simddp.sim.pipeline import schedule as make

    v = v if schedule == "interleaved-1f1b" else 1
    m = pp * groups if schedule == "interleaved-1f1b" else data.draw(st.integers(1, 24))
    stage = data.draw(st.integers(0, pp - 1))
    outstanding = peak = 0
    for op in make(schedule, pp, m, stage, v, all_warmup=megatron):
        outstanding += 1 if op.kind == "F" else -1
        peak = max(peak, outstanding)
    assert in_flight_micro_batches(schedule, pp, stage, m, v, megatron) == pytest.approx(peak / v)


# -------------------------------------------------------------------------------- properties
@st.composite
def transformer_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16) if heads % k == 0]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    num_layers = draw(st.integers(2, 8))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= num_layers]))
    dp = draw(st.sampled_from([1, 2, 4]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b"]))
    interleaved = schedule == "interleaved-1f1b" and pp > 1
    v = draw(st.sampled_from([v for v in (1, 2) if pp * v <= num_layers])) if interleaved else 1
    mbs = draw(st.integers(1, 4))
    m = draw(st.integers(1, 6)) * (pp if schedule == "interleaved-1f1b" else 1)  # Megatron: m % pp == 0
    return {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1, "gpus_per_node": tp * pp * dp},
        "model": {"transformer": {
            "num_layers": num_layers, "hidden_size": heads * draw(st.sampled_from([16, 32, 64])),
            "num_heads": heads, "num_kv_heads": kv, "ffn_hidden_size": draw(st.sampled_from([128, 256, 344])),
            "vocab_size": draw(st.sampled_from([1000, 4096])), "gated_mlp": draw(st.booleans()),
        }},
        "parallelism": {"tp": tp, "pp": pp, "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
                        "pipeline_schedule": schedule, "virtual_stages": v},
        "training": {"micro_batch_size": mbs, "global_batch_size": mbs * dp * m,
                     "seq_len": draw(st.sampled_from([16, 128, 512])),
                     "precision": draw(st.sampled_from(["fp32", "bf16-mixed"]))},
    }


def with_keys(data: dict[str, Any], **sections: dict[str, Any]) -> Scenario:
    return scenario_from_dict(deep_merge(data, sections))


@settings(max_examples=60, deadline=None)
@given(data=transformer_scenarios())
def test_recompute_never_raises_activations(data):
    by = {r: memory_breakdown(with_keys(data, training={"recompute": r})) for r in ("none", "selective", "full")}
    for stage in range(data["parallelism"]["pp"]):
        acts = {r: memory_breakdown(with_keys(data, training={"recompute": r}), stage=stage).activations_bytes
                for r in by}
        assert acts["none"] >= acts["selective"] >= acts["full"]
    # The most loaded stage may change with recompute; its total never rises.
    assert by["none"].total_bytes >= by["selective"].total_bytes >= by["full"].total_bytes


@settings(max_examples=150, deadline=None)
@given(data=transformer_scenarios(), recompute=st.sampled_from(["selective", "selective-op", "full"]),
       sp=st.booleans(), bias=st.booleans(), ffn_per_h=st.sampled_from([0.5, 1.0, 2.6875, 4.0]))
def test_the_recompute_working_set_is_what_the_saved_set_lacks(data, recompute, sp, bias, ffn_per_h):
    """The working set is at least zero and at most a layer's activations without recompute, and a breakdown is
    built for every mode (selective-op at tp >= 4 with sequence parallelism saves more than that whole set where
    the MLP is narrow, which made the working set negative and memory_breakdown raise)."""
    spec = data["model"]["transformer"]
    ffn = int(spec["hidden_size"] * ffn_per_h) // 8 * 8
    data = deep_merge(data, {"model": {"transformer": {"bias": bias, "ffn_hidden_size": ffn}}})
    scenario = with_keys(data, training={"recompute": recompute},
                         parallelism={"sequence_parallel": sp and data["parallelism"]["tp"] > 1})
    spec, tr, par = scenario.model.transformer, scenario.training, scenario.parallelism
    shape = dict(seq_len=tr.seq_len, micro_batch_size=tr.micro_batch_size, tp=par.tp,
                 sequence_parallel=par.sequence_parallel, act_bytes=2 if tr.precision == "bf16-mixed" else 4,
                 dropout=False, attention=tr.attention)
    full = transformer_layer_activation_bytes(spec, recompute="none", **shape)
    assert 0 <= recompute_working_set_bytes(spec, recompute=recompute, **shape) <= full
    for stage in range(par.pp):
        items = memory_breakdown(scenario, stage=stage).items
        assert all(i.size_bytes >= 0 for i in items)


def test_selective_op_working_set_by_hand() -> None:
    """Llama-2-7B (h 4096, ffn 11008, 32 heads), tp 8 with SP, 2,048 tokens, bf16, flash attention. Without
    recompute a layer saves 33,718,272 B; torchtitan's op-level SAC saves 35,028,992 B, of which the w2 matmul
    output (full width, 4096 x 2 B per token) and the two reduce-scatter outputs (2 x 512 x 2 B) are not in that
    set: 2,048 x 10,240 = 20,971,520 B. The working set is 33,718,272 - (35,028,992 - 20,971,520) = 19,660,800 B."""
    scenario = scenario_from_dict({"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1},
                                   "model": {"preset": "llama2-7b"},
                                   "parallelism": {"tp": 8, "sequence_parallel": True},
                                   "training": {"recompute": "selective-op", "seq_len": 2048, "micro_batch_size": 1}})
    spec = scenario.model.transformer
    shape = dict(seq_len=2048, micro_batch_size=1, tp=8, sequence_parallel=True, act_bytes=2, dropout=False,
                 attention="flash")
    assert transformer_layer_activation_bytes(spec, recompute="none", **shape) == 33_718_272
    assert transformer_layer_activation_bytes(spec, recompute="selective-op", **shape) == 35_028_992
    assert recompute_working_set_bytes(spec, recompute="selective-op", **shape) == 19_660_800
    line = next(i for i in memory_breakdown(scenario).items if i.name == "recompute working set")
    assert line.size_bytes == 19_660_800
    assert simddp.simulate(scenario, trace=False).step_time_s > 0  # raised a ValidationError before


@settings(max_examples=60, deadline=None)
@given(data=transformer_scenarios(), recompute=st.sampled_from(["none", "selective", "full"]))
def test_sequence_parallel_never_raises_activations(data, recompute):
    if data["parallelism"]["tp"] == 1:
        data = deep_merge(data, {"parallelism": {"tp": 2}, "cluster": {
            "gpus_per_node": data["cluster"]["gpus_per_node"] * 2}})
        spec = data["model"]["transformer"]
        if spec["num_heads"] % 2 or (spec["num_kv_heads"] % 2 and spec["num_kv_heads"] != 1):
            return
    plain = with_keys(data, training={"recompute": recompute}, parallelism={"sequence_parallel": False})
    sp = with_keys(data, training={"recompute": recompute}, parallelism={"sequence_parallel": True})
    for stage in range(data["parallelism"]["pp"]):
        sp_bytes = memory_breakdown(sp, stage=stage).activations_bytes
        assert sp_bytes <= memory_breakdown(plain, stage=stage).activations_bytes
    assert memory_breakdown(sp).total_bytes <= memory_breakdown(plain).total_bytes


@pytest.mark.parametrize("grows", [False, True])
def test_every_stage_total_of_a_parameter_list_pipeline_is_its_own_lines(grows: bool) -> None:
    """Each stage's total (worked out once per kind of stage: twins share their fixed sums) equals its own
    lines' sum, for middle stages that are twins (equal layers) and for stages whose layers' activations grow
    (a layer's kernels move its activations, so those are no twins)."""
    layers = 8
    data = {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "model": {
            "parameters": [{"name": f"w{i}", "numel": 1024} for i in range(layers)],
            "layers": [{"name": f"l{i}", "param_indices": [i], "fwd_time_s": 1e-3, "bwd_time_s": 2e-3,
                        "activation_numel_per_sample": 1000 * (i + 1 if grows else 1)} for i in range(layers)],
        },
        "parallelism": {"pp": 8, "dp": 1},
        "training": {"precision": "fp32", "optimizer": "sgd", "seq_len": 1, "micro_batch_size": 1,
                     "global_batch_size": 16},
    }
    sc = scenario_from_dict(data)
    twins = [first for first, _ in build_workload(sc).rank_twins(8)]
    assert twins == ([0, 1, 2, 3, 4, 5, 6, 7] if grows else [0, 1, 1, 1, 1, 1, 1, 7])
    m = memory_breakdown(sc)
    for stage, total in enumerate(m.stage_total_bytes):
        one = memory_breakdown(sc, stage=stage)
        assert one.total_bytes == total == sum(i.size_bytes for i in one.items)
    # 1F1B: stage s holds 8 - s micro-batches of its layer's 1000 (s + 1) (or 1000) fp32 elements
    assert [memory_breakdown(sc, stage=s).activations_bytes for s in range(8)] == [
        4 * 1000 * (s + 1 if grows else 1) * (8 - s) for s in range(8)]


@settings(max_examples=60, deadline=None)
@given(data=transformer_scenarios(), stage=st.sampled_from([1, 2, 3]), more=st.sampled_from([2, 4]))
def test_scenario_model_states_never_grow_with_dp(data, stage, more):
    par = data["parallelism"]
    base = with_keys(data, parallelism={"zero_stage": stage})
    gpus = data["cluster"]["gpus_per_node"] * more
    bigger = with_keys(data, parallelism={"zero_stage": stage}, cluster={"gpus_per_node": gpus},
                       training={"global_batch_size": data["training"]["global_batch_size"] * more})
    assert bigger.dp == base.dp * more
    for s in range(par["pp"]):
        more_dp = memory_breakdown(bigger, stage=s).model_states_bytes
        assert more_dp <= memory_breakdown(base, stage=s).model_states_bytes


@settings(max_examples=40, deadline=None)
@given(data=transformer_scenarios())
def test_breakdown_adds_up(data):
    m = memory_breakdown(with_keys(data))
    cats = m.params_bytes + m.grads_bytes + m.optimizer_bytes + m.activations_bytes + m.buffers_bytes
    assert m.total_bytes == cats + m.overhead_bytes == sum(i.size_bytes for i in m.items)
    assert m.total_bytes == max(m.stage_total_bytes)
    assert m.fits == (m.total_bytes <= m.capacity_bytes)
    assert m.headroom_bytes == m.capacity_bytes - m.total_bytes
    assert all(i.size_bytes >= 0 for i in m.items)
    # Every stage's total comes from its sizes alone; its lines, when it is the one reported, add up to it.
    for stage, total in enumerate(m.stage_total_bytes):
        one = memory_breakdown(with_keys(data), stage=stage)
        assert one.stage_total_bytes == m.stage_total_bytes
        assert one.total_bytes == total == sum(i.size_bytes for i in one.items)


@settings(max_examples=60, deadline=None)
@given(data=transformer_scenarios())
def test_blocks_per_rank_from_the_layout_equal_the_walk_over_every_layer(data):
    # The memory model counts each rank's blocks from their first layers (Workload.blocks); a walk over every
    # layer of every rank, and the walk of a workload that does not say where its blocks are, give the same.
    from simddp.memory.breakdown import _blocks_per_rank

    scenario = with_keys(data)
    workload = build_workload(scenario)
    pp = scenario.parallelism.pp
    walked = [len({la.block for la in workload.rank_layers(r, pp) if la.block is not None}) for r in range(pp)]
    assert workload.blocks is not None
    assert _blocks_per_rank(workload, pp) == walked
    assert _blocks_per_rank(dataclasses.replace(workload, blocks=None), pp) == walked
    assert sum(walked) == scenario.model.transformer.num_layers


# ------------------------------------------------------------------------------------ buffers
def test_ddp_bucket_copies_vanish_with_gradient_as_bucket_view():
    s = make({"parallelism": {"dp": 8}})
    m = memory_breakdown(s)
    assert item(m, "DDP bucket copies") == m.grads_bytes
    view = memory_breakdown(make({"parallelism": {"dp": 8}, "ddp": {"gradient_as_bucket_view": True}}))
    assert not any(i.name == "DDP bucket copies" for i in view.items)
    assert view.total_bytes < m.total_bytes


def test_deepspeed_zero2_keeps_its_contiguous_reduce_buffers():
    # DeepSpeed allocates reduce_bucket_size elements (5e8) of contiguous gradient buffer in backward(), two
    # with overlap_comm, and flattens each bucket for its all-reduce (stage_1_and_2.py).
    ds = {"parallelism": {"dp": 8, "zero_stage": 2}, "ddp": {"implementation": "deepspeed"}}
    m = memory_breakdown(make(ds))
    assert item(m, "DeepSpeed reduce buffers") == 500_000_000 * 2
    grads = sum(2 * p.numel for p in build_workload(make(ds)).parameters)  # gpt2 fits in one 5e8 bucket
    assert item(m, "DeepSpeed flattened bucket") == grads
    overlapped = memory_breakdown(make(deep_merge(ds, {"ddp": {"overlap": True}})))
    assert item(overlapped, "DeepSpeed reduce buffers") == 2 * 500_000_000 * 2
    small = memory_breakdown(make(deep_merge(ds, {"ddp": {"bucket_cap_mb": 25}})))
    assert item(small, "DeepSpeed reduce buffers") == 25 * MiB
    assert not any(i.name == "DDP bucket copies" for i in m.items)


def test_zero3_gathers_the_largest_unit_plus_prefetch_and_root():
    s = llama70b()
    m = memory_breakdown(s)
    block = sum(p.numel for p in build_workload(s).parameters if p.name.startswith("model.layers.0."))
    root = 2 * 32000 * 8192 + 8192
    assert item(m, "ZeRO-3 gathered parameters") == 2 * (2 * block + root)
    # The unit computing (bf16) and the one whose reduce-scatter is in flight (its input, bf16 here).
    assert item(m, "ZeRO-3 unsharded gradients") == 2 * block + 2 * block
    # The untied output layer and the final norm: their gradients wait through backward for the root's
    # reduce-scatter.
    assert item(m, "FSDP root gradients") == 2 * (32000 * 8192 + 8192)  # output layer and final norm
    more = memory_breakdown(llama70b().model_copy(update={"memory": s.memory.model_copy(
        update={"fsdp_prefetch_layers": 2})}))
    assert item(more, "ZeRO-3 gathered parameters") - item(m, "ZeRO-3 gathered parameters") == 2 * block


def test_nccl_buffers_per_communicator_and_overheads():
    one = memory_breakdown(make({"cluster": {"gpus_per_node": 1}}))
    assert not any(i.name == "NCCL" for i in one.items)
    three = memory_breakdown(make({"parallelism": {"tp": 2, "pp": 2}}))
    assert item(three, "NCCL") == 3 * 588 * MiB
    assert item(one, "CUDA context") == 512 * MiB
    transient = one.activations_bytes + one.buffers_bytes
    assert item(one, "allocator fragmentation") == pytest.approx(0.1 * transient, abs=1)


# ------------------------------------------------------------------------------- results & helpers
def test_json_form_and_dataframe():
    m = memory_breakdown(llama70b())
    data = json.loads(json.dumps(m.to_json_dict()))["memory"]
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
                "overhead_bytes", "total_bytes", "capacity_bytes", "fits", "rank", "stage", "items"):
        assert key in data
    df = m.to_dataframe()
    assert list(df.columns) == ["category", "name", "size_bytes", "note"]
    assert df["size_bytes"].sum() == m.total_bytes


def test_llama2_70b_zero3_on_64_h100s():
    m = memory_breakdown(llama70b())
    assert (m.dp, m.rank, m.stage) == (64, 0, 0)
    assert m.model_states_bytes == pytest.approx(16 * m.num_params / 64, rel=1e-6)
    assert m.fits and 20 * GiB < m.total_bytes < 60 * GiB
    no_recompute = memory_breakdown(llama70b().model_copy(update={"training": llama70b().training.model_copy(
        update={"recompute": "none"})}))
    assert not no_recompute.fits


def test_most_loaded_stage_is_reported():
    s = make({"model": {"preset": "llama3-8b"}, "parallelism": {"pp": 4},
              "training": {"global_batch_size": 64, "micro_batch_size": 1, "seq_len": 4096}})
    m = memory_breakdown(s)
    assert m.total_bytes == max(m.stage_total_bytes)
    assert m.stage == m.stage_total_bytes.index(m.total_bytes)
    assert m.rank == m.stage * s.parallelism.tp * s.dp


def test_simulate_result_carries_the_breakdown(capsys):
    r = simddp.simulate(make({"cluster": {"gpus_per_node": 2}}), trace=False)
    assert isinstance(r.memory, MemoryBreakdown)
    assert r.to_json_dict()["memory"]["total_bytes"] == r.memory.total_bytes


def test_max_micro_batch_that_fits():
    s = llama70b()
    best = max_micro_batch_that_fits(s)
    assert best >= 1
    fits = lambda b: memory_breakdown(s.model_copy(update={"training": s.training.model_copy(  # noqa: E731
        update={"micro_batch_size": b})})).fits
    assert fits(best)
    per_rank = 512 // s.dp
    assert all(not fits(b) for b in range(best + 1, per_rank + 1) if per_rank % b == 0)
    free = make({"training": {"seq_len": 1024, "global_batch_size": None}})
    b = max_micro_batch_that_fits(free)
    assert fits_free(free, b) and not fits_free(free, b + 1)


def fits_free(s: Scenario, b: int) -> bool:
    return memory_breakdown(s.model_copy(update={"training": s.training.model_copy(
        update={"micro_batch_size": b})})).fits


def test_max_micro_batch_skips_layouts_the_schedule_forbids():
    s = make({"model": {"preset": "gpt2-xl"}, "parallelism": {"pp": 4, "pipeline_schedule": "interleaved-1f1b",
                                                              "virtual_stages": 2},
              "training": {"global_batch_size": 64, "micro_batch_size": 1}})
    best = max_micro_batch_that_fits(s)  # mbs 16 would leave 2 micro-batches, not a multiple of pp(4)
    assert best == 8 and fits_free(s, best)
    assert fits_free(s, 16)  # memory alone allows 16; the schedule does not


def test_nothing_fits_gives_zero():
    s = make({"model": {"preset": "gpt3-175b"}, "cluster": {"gpus_per_node": 1},
              "training": {"global_batch_size": None}})
    assert max_micro_batch_that_fits(s) == 0


def test_smallest_layout_that_fits_llama70b_on_64_h100s():
    s = llama70b().model_copy(update={"training": llama70b().training.model_copy(update={"recompute": "none"})})
    search = smallest_layout_that_fits(s)
    assert search.num_gpus == 64
    assert search.current is not None and not search.current.fits
    assert search.smallest_zero_stage is None  # no ZeRO stage alone: activations are ~260 GiB
    assert search.smallest_tp is not None and search.smallest_tp.fits
    tp = search.smallest_tp.tp
    smaller = [r for r in (1, 2, 4, 8) if r < tp]
    for r in smaller:
        v = s.model_copy(update={"parallelism": s.parallelism.model_copy(update={"tp": r, "dp": None})})
        assert not memory_breakdown(v).fits
    assert search.best is not None and search.best.fits
    fitting = smallest_layout_that_fits(llama70b())
    assert fitting.best == fitting.current == fitting.smallest_zero_stage


def test_smallest_zero_stage_on_fewer_gpus():
    s = make({"model": {"preset": "llama2-7b"}, "cluster": {"num_nodes": 2},
              "training": {"recompute": "full", "seq_len": 4096, "micro_batch_size": 1}})
    search = smallest_layout_that_fits(s, num_gpus=8)
    assert search.num_gpus == 8
    assert search.smallest_zero_stage is not None and search.smallest_zero_stage.zero_stage >= 1
    assert search.current is not None and not search.current.fits  # 16 B/param x 6.7 B > 80 GB


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: zero_model_states_bytes(0, 8, 3), "num_params(0) must be > 0"),
        (lambda: zero_model_states_bytes(10, 0, 3), "dp(0) must be >= 1"),
        (lambda: zero_model_states_bytes(10, 8, 4), "zero_stage(4) must be 0, 1, 2 or 3"),
        (lambda: zero_model_states_bytes(10, 8, 1, "fp8"), "unknown precision 'fp8'"),
        (lambda: transformer_layer_activation_bytes(GPT3, 0, 1), "seq_len(0) must be > 0"),
        (lambda: transformer_layer_activation_bytes(GPT3, 2048, 1, tp=5), "tp(5) does not divide num_heads(96)"),
        (lambda: transformer_layer_activation_bytes(GPT3, 2048, 1, recompute="some"), "unknown recompute 'some'"),
        (lambda: in_flight_micro_batches("1f1b", 4, 4, 8), "stage(4) must be in 0..3 for pp(4)"),
        (lambda: in_flight_micro_batches("zb", 4, 0, 8), "unknown pipeline schedule 'zb'"),
        (lambda: memory_breakdown(make(), stage=1), "stage(1) must be in 0..0 for pp(1)"),
        (lambda: smallest_layout_that_fits(make(), num_gpus=12), "num_gpus(12) is neither a multiple nor a divisor"),
        (lambda: smallest_layout_that_fits(make(), num_gpus=0), "num_gpus(0) must be a whole number >= 1"),
    ],
)
def test_bad_input_gives_one_line_errors(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_impossible_layout_is_a_scenario_error():
    with pytest.raises(ScenarioError, match=r"tp\(3\)"):
        make({"parallelism": {"tp": 3}})


# -------------------------------------------------------------------------------------------- CLI
LLAMA70B_ARGS = ["--set", "model.preset=llama2-70b", "--set", "cluster.num_nodes=8", "--set", "parallelism.dp=64",
                 "--set", "parallelism.zero_stage=3", "--set", "training.recompute=full"]


def test_cli_memory_prints_a_readable_breakdown(capsys):
    assert main(["memory", *LLAMA70B_ARGS]) == 0
    out = capsys.readouterr().out
    for text in ("parameters", "gradients", "optimizer states", "activations", "buffers", "overhead", "total",
                 "rank 0 (pipeline stage 0 of 1)", "ZeRO-3 gathered parameters", "fits"):
        assert text in out


def test_cli_memory_json_and_helpers(capsys):
    assert main(["memory", *LLAMA70B_ARGS, "--json", "--max-micro-batch", "--fit-layout"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory"]["fits"] is True
    assert data["max_micro_batch"] >= 1
    assert data["layout"]["best"]["fits"] is True


def test_cli_memory_helpers_human(capsys):
    assert main(["memory", *LLAMA70B_ARGS, "--max-micro-batch", "--fit-layout", "--num-gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert "Largest micro-batch that fits:" in out
    assert "Layouts on 64 GPUs" in out


def test_cli_simulate_prints_memory_line(capsys):
    assert main(["simulate", "--set", "cluster.num_nodes=1", "--set", "parallelism.dp=8",
                 "--set", "model.preset=gpt2", "--set", "training.global_batch_size=8"]) == 0
    assert "memory per GPU" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "training.micro_batch_size=0"], "training.micro_batch_size"),
        (["--stage", "3"], "stage(3) must be in 0..0 for pp(1)"),
        (["--num-gpus", "8"], "--num-gpus needs --fit-layout"),
        (["--fit-layout", "--num-gpus", "12"], "num_gpus(12)"),
        (["--set", "parallelism.pp=3"], "pp(3)"),
    ],
)
def test_cli_memory_errors_are_one_line(capsys, args, message):
    assert main(["memory", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simddp: error:") and message in err
    assert "\n" not in err


# ---------------------------------------------------------------------------------- architecture
def test_memory_module_imports_neither_results_nor_sim():
    for path in Path(simddp.__file__).with_name("memory").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        top_level = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)} | {
            a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        assert not any(m and (m.startswith("simddp.results") or m.startswith("simddp.sim")) for m in imported), path
        assert not any(m and m.split(".")[0] in ("torch", "streamlit", "plotly", "pandas") for m in top_level), path


def test_layout_search_varies_recompute_and_sequence_parallelism():
    """The planner's case: nothing fits at the scenario's recompute, yet ZeRO-3 with full recompute does."""
    s = llama70b(zero_stage=0).model_copy(
        update={"training": llama70b().training.model_copy(update={"recompute": "none"})})
    search = smallest_layout_that_fits(s)
    assert search.smallest_zero_stage is None and search.smallest_pp is None
    best = search.best
    assert best is not None and (best.zero_stage, best.tp, best.pp, best.recompute) == (3, 1, 1, "full")
    assert best.total_bytes == memory_breakdown(llama70b()).total_bytes  # exactly that scenario's memory
    assert {f.recompute for f in search.evaluated} == {"none", "selective", "full"}
    assert {f.sequence_parallel for f in search.evaluated if f.tp > 1} == {False, True}
    assert not any(f.sequence_parallel for f in search.evaluated if f.tp == 1)
    assert len(search.evaluated) == search.num_layouts
    assert len({(f.zero_stage, f.tp, f.pp, f.sequence_parallel, f.recompute) for f in search.evaluated}) == \
        search.num_layouts
    fits = [f.fits for f in search.evaluated]
    assert fits == sorted(fits, reverse=True) and search.evaluated[0] == best  # fitting first, best first
    z3 = smallest_layout_that_fits(llama70b(zero_stage=3).model_copy(
        update={"training": llama70b().training.model_copy(update={"recompute": "none"})}))
    assert z3.least_recompute is not None and z3.least_recompute.recompute == "full"
    for f in search.evaluated[::37]:  # each listed figure is the memory model's for that layout
        v = s.model_copy(update={
            "parallelism": s.parallelism.model_copy(update={"tp": f.tp, "pp": f.pp, "dp": None, "zero_stage":
                                                            f.zero_stage, "sequence_parallel": f.sequence_parallel}),
            "training": s.training.model_copy(update={"recompute": f.recompute})})
        assert memory_breakdown(v).total_bytes == f.total_bytes


def test_fit_layout_cli_lists_every_layout_evaluated():
    import json
    import subprocess
    import sys

    args = [sys.executable, "-m", "simddp.cli", "memory", "--fit-layout", "--set", "model.preset=llama2-13b",
            "--set", "cluster.num_nodes=1", "--set", "parallelism.zero_stage=0", "--set", "training.recompute=none"]
    text = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    data = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120).stdout)
    layout = data["layout"]
    assert len(layout["evaluated"]) == layout["num_layouts"]
    assert {"sequence_parallel", "recompute", "total_bytes", "fits"} <= set(layout["evaluated"][0])
    out = text.stdout
    assert f"Layouts on 8 GPUs: {layout['num_layouts']} evaluated (ZeRO stage x tp x pp x sequence parallelism " \
           f"x recompute), {sum(f['fits'] for f in layout['evaluated'])} fit" in out
    listed = out.split("Every layout evaluated")[1].splitlines()[2:]
    assert len(listed) == layout["num_layouts"]
    assert "least recompute" in out and "least model parallel" in out


# ------------------------------------------------------------------ a probe of the memory model (2026-11-29)
def _interleaved_m_eq_p(implementation: str) -> Scenario:
    """pp 4, 2 chunks, 4 micro-batches (m = p), a 256k untied vocabulary: the last stage's loss dominates."""
    return scenario_from_dict({
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 4},
        "model": {"transformer": {"num_layers": 8, "hidden_size": 1024, "num_heads": 16, "ffn_hidden_size": 4096,
                                  "vocab_size": 256000, "tied_embeddings": False}},
        "parallelism": {"pp": 4, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2},
        "training": {"micro_batch_size": 4, "global_batch_size": 16, "seq_len": 4096, "recompute": "none"},
        "ddp": {"implementation": implementation},
    })


def test_megatron_interleaving_at_m_eq_p_holds_every_micro_batch():
    """Megatron runs every forward first where m = p: each stage holds all 4 micro-batches, the loss's too (the
    layout read as fitting at 34.2 GiB on its last stage; 4 losses of 23.5 GiB do not fit). torch's schedule has
    no such case: 2.5 micro-batches and one loss on the last stage."""
    mega = memory_breakdown(_interleaved_m_eq_p("megatron"), stage=3)
    torch_ = memory_breakdown(_interleaved_m_eq_p("torch"), stage=3)
    assert mega.in_flight_micro_batches == 4 and torch_.in_flight_micro_batches == 2.5
    loss = {m.in_flight_micro_batches: sum(i.size_bytes for i in m.items if i.category == "activations"
                                           and "output" in i.name.lower()) for m in (mega, torch_)}
    assert loss[4] == 4 * loss[2.5] > 0
    assert not mega.fits and torch_.fits


def test_memory_stage_flag_keeps_the_layouts_verdict(tmp_path, capsys):
    """--stage reports a lighter stage's lines; the top-level fits and headline stay the layout's (a probe saw
    'fits': true for a layout whose last stage needs 114 GiB of 80)."""
    path = tmp_path / "s.json"
    data = _interleaved_m_eq_p("torch").model_dump(mode="json")
    data["parallelism"].update(pipeline_schedule="1f1b", virtual_stages=1)
    data["training"].update(micro_batch_size=16, global_batch_size=64)
    path.write_text(json.dumps(data))
    assert main(["memory", str(path), "--stage", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["memory_bytes"] == max(out["memory"]["stage_total_bytes"])
    assert out["memory"]["stage"] == 1 and out["memory"]["fits"] is True
    assert main(["memory", str(path), "--stage", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("DOES NOT FIT") and "fits," in text.split("total")[1]


def test_fit_layout_finds_torch_fsdp_beside_pipelining():
    """torch FSDP with pp is a valid layout (simddp plan tries it): --fit-layout said 'invalid layout' for it."""
    s = make({"cluster": {"num_nodes": 2}, "parallelism": {"zero_stage": 3, "pp": 2},
              "training": {"global_batch_size": 64}})
    search = smallest_layout_that_fits(s)
    assert search.current is not None and (search.current.zero_stage, search.current.pp) == (3, 2)
    assert search.current.total_bytes == memory_breakdown(s).total_bytes
    assert any(f.zero_stage >= 2 and f.pp > 1 for f in search.evaluated)


def test_max_micro_batch_counts_an_out_of_range_micro_batch_as_not_fitting():
    """A larger micro-batch whose bytes are beyond the range answered for does not fit (it ended the search in an
    error though the scenario itself was answered)."""
    s = make({"training": {"seq_len": 1_000_000, "attention": "unfused", "recompute": "none",
                           "micro_batch_size": 1, "global_batch_size": 262144}})
    memory_breakdown(s)  # the scenario itself is answered
    assert max_micro_batch_that_fits(s) == 0


def test_parameter_list_pipeline_leaves_no_stage_empty():
    """A first layer with almost all the FLOP is a stage of its own and the three small ones follow, one a stage
    (stages 1 and 2 were empty, stage 3 held three layers)."""
    s = make({"model": {"preset": None, "parameters": [
        {"name": f"{c}.weight", "numel": n, "dtype": "float32"}
        for c, n in zip("abcd", (10**8, 1000, 1000, 1000), strict=True)],
        "layers": [{"name": c, "param_indices": [k], "activation_numel_per_sample": 1000}
                   for k, c in enumerate("abcd")]},
        "parallelism": {"pp": 4}, "training": {"global_batch_size": 64}})
    assert [la.stage for la in build_workload(s).layers] == [0, 1, 2, 3]


def test_activation_functions_check_attention_whatever_the_recompute():
    with pytest.raises(ValueError, match="unknown attention 'bogus'"):
        transformer_layer_activation_bytes(GPT3, 16, 1, recompute="full", attention="bogus")
    with pytest.raises(ValueError, match="unknown attention 'bogus'"):
        recompute_working_set_bytes(GPT3, 16, 1, recompute="none", attention="bogus")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**8), min_size=2, max_size=10), st.data())
def test_parameter_list_stages_are_contiguous_and_never_empty(sizes, data):
    pp = data.draw(st.sampled_from([p for p in (2, 4, 8) if p <= len(sizes)]))  # dividing 8 GPUs
    s = make({"model": {"preset": None, "parameters": [
        {"name": f"l{k}.weight", "numel": n, "dtype": "float32"} for k, n in enumerate(sizes)],
        "layers": [{"name": f"l{k}", "param_indices": [k], "activation_numel_per_sample": 10}
                   for k in range(len(sizes))]},
        "parallelism": {"pp": pp}, "training": {"global_batch_size": None}})
    stages = [la.stage for la in build_workload(s).layers]
    assert stages[0] == 0 and stages[-1] == pp - 1
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(stages))
