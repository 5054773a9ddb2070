"""Step simulator: equal to the analytical model with overlap off, inside the bounds with it on."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios import base_scenario

from simddp import simulate
from simddp.analytical import in_order_overlap_step_s, in_order_schedule
from simddp.config import deep_merge


def _params_model(sizes: list[int]) -> dict:
    return {"parameters": [{"name": f"w{i}", "numel": n, "dtype": "float32"} for i, n in enumerate(sizes)]}


def test_overlap_off_equals_no_overlap_bound_exactly() -> None:
    r = simulate(deep_merge(base_scenario(), {"ddp": {"overlap": False}}))
    assert r.step_time_s == pytest.approx(r.bounds.no_overlap_s, rel=1e-12)
    assert r.exposed_comm_time_s == pytest.approx(r.comm_time_s, rel=1e-9)


def test_overlap_on_within_bounds_and_equal_to_fifo_recurrence() -> None:
    # Without interference nothing but the buckets' own order delays a reduction: the FIFO recurrence is exact.
    r = simulate(deep_merge(base_scenario(), {"cluster": {"comm_compute_interference": 0.0}}))
    assert r.bounds.perfect_overlap_s <= r.step_time_s * (1 + 1e-12)
    assert r.step_time_s <= r.bounds.no_overlap_s * (1 + 1e-12)
    assert r.step_time_s == pytest.approx(r.bounds.in_order_overlap_s, rel=1e-12)


def test_buckets_start_in_order_after_ready() -> None:
    r = simulate(base_scenario())
    prev_end = 0.0
    for b in r.buckets:
        assert b.start_s >= b.ready_s - 1e-15
        assert b.start_s >= prev_end - 1e-15
        prev_end = b.end_s


def test_hand_derived_two_layer_step() -> None:
    # Two fp32 parameter layers on 2 ranks of a 1-node cluster with measured times:
    # forward 1 ms + 1 ms; backward of w1 (runs first) 2 ms, w0 2 ms. Buckets: cap 1 MiB; w1 = 1 MiB
    # closes bucket 0 ready at fwd 2 ms + 2 ms = 4 ms; w0 (bucket 1) ready at 6 ms.
    mib = 262144  # fp32 elements in 1 MiB
    scenario = {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 2},
        "model": {
            "parameters": [{"name": "w0", "numel": mib}, {"name": "w1", "numel": mib}],
            "layers": [
                {"name": "l0", "param_indices": [0], "fwd_time_s": 1e-3, "bwd_time_s": 2e-3},
                {"name": "l1", "param_indices": [1], "fwd_time_s": 1e-3, "bwd_time_s": 2e-3},
            ],
        },
        "training": {"precision": "fp32", "optimizer": "sgd", "seq_len": 1},
        "ddp": {"bucket_cap_mb": 1},
    }
    r = simulate(deep_merge(scenario, {"cluster": {"comm_compute_interference": 0.0}}))
    assert [b.ready_s for b in r.buckets] == pytest.approx([4e-3, 6e-3])
    assert r.compute_time_s == pytest.approx(6e-3)
    cost = r.buckets[0].end_s - r.buckets[0].start_s
    assert r.buckets[0].start_s == pytest.approx(4e-3)
    assert r.buckets[1].start_s == pytest.approx(max(6e-3, 4e-3 + cost))
    expected = max(6e-3, r.buckets[1].end_s) + r.optimizer_time_s
    assert r.step_time_s == pytest.approx(expected)
    # With interference i, l0's backward (2 ms from 4 ms) runs at 1 / (1 + i) while bucket 0's all-reduce
    # (c < 2 ms) is in flight: it ends at 4 + c + (2 - c / (1 + i)) ms = 6 ms + c i / (1 + i).
    i = 0.5
    slowed = simulate(deep_merge(scenario, {"cluster": {"comm_compute_interference": i}}))
    assert slowed.buckets[1].ready_s == pytest.approx(6e-3 + cost * i / (1 + i), rel=1e-9)
    assert slowed.interference_time_s == pytest.approx(cost * i / (1 + i), rel=1e-9)


def _autograd_adds_s(data: dict) -> float:
    """One micro-batch's in-place adds of every gradient into the accumulated one (torch's AccumulateGrad:
    read both, write one), by hand from the workload's parameters."""
    from simddp.compute import memory_s
    from simddp.scenario_io import scenario_from_dict
    from simddp.units import dtype_bytes
    from simddp.workload import build_workload

    sc = scenario_from_dict(data)
    w = build_workload(sc)
    return sum(memory_s(3 * w.parameters[g].numel * dtype_bytes(w.parameters[g].dtype), sc.cluster.gpu)
               for la in w.layers for g in la.param_indices)


def test_gradient_accumulation_communicates_once() -> None:
    one = simulate(deep_merge(base_scenario(), {"training": {"global_batch_size": 64}}))
    data = deep_merge(base_scenario(), {"training": {"global_batch_size": 256}})
    four = simulate(data)
    assert four.num_micro_batches == 4 * one.num_micro_batches
    assert four.comm_time_s == pytest.approx(one.comm_time_s)
    # four micro-batches of compute, and micro-batches 2..4 add their gradients to the first's
    assert four.compute_time_s == pytest.approx(4 * one.compute_time_s + 3 * _autograd_adds_s(data), rel=1e-9)
    assert four.exposed_comm_fraction <= one.exposed_comm_fraction + 1e-12


def test_single_gpu_has_no_communication() -> None:
    r = simulate({"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1, "gpus_per_node": 1},
                  "model": {"preset": "gpt2"}})
    assert r.comm_time_s == 0 and r.exposed_comm_time_s == 0
    assert r.scaling_efficiency == pytest.approx(1.0)


def test_llama_throughput_matches_mfu_definition() -> None:
    # MFU = model FLOP/s / (GPUs x peak). Model FLOP per token of Llama-2-7B ~ 6N + 12 L h s (Megatron).
    r = simulate("simddp/default_scenario.yaml")
    n, layers, h, s = 6.738e9, 32, 4096, 4096
    flop_per_token = 6 * n + 12 * layers * h * s
    mfu = r.tokens_per_s * flop_per_token / (128 * 989.4e12)
    assert r.mfu == pytest.approx(mfu, rel=0.05)
    # Model FLOP run on GEMMs at best at the GPU's GEMM ceiling, and the step does more than GEMMs.
    assert 0.3 < r.mfu < r.compute_time_s / r.step_time_s * 0.760


def test_interference_slows_overlapped_backward() -> None:
    base = simulate(base_scenario())
    slowed = simulate(deep_merge(base_scenario(), {"cluster": {"comm_compute_interference": 0.5}}))
    assert slowed.step_time_s > base.step_time_s
    off = deep_merge(base_scenario(), {"ddp": {"overlap": False}})
    assert simulate(deep_merge(off, {"cluster": {"comm_compute_interference": 0.5}})).step_time_s == pytest.approx(
        simulate(off).step_time_s
    )


def test_trace_is_chrome_format(tmp_path) -> None:
    r = simulate(base_scenario())
    assert r.trace is not None
    path = tmp_path / "t.json"
    r.trace.write(path)
    import json

    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {"compute", "comm"}
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["name"].startswith("all-reduce bucket") for e in spans)
    assert all(e["dur"] >= 0 for e in spans)


def test_not_modelled_is_said() -> None:
    r = simulate(deep_merge(base_scenario(), {"parallelism": {"tp": 2, "pp": 2, "zero_stage": 3}}))
    assert "FSDP FULL_SHARD with pp > 1" in " ".join(r.not_modelled)
    params = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
              "model": {"parameters": [{"name": f"w{i}", "numel": 1000} for i in range(4)]},
              "parallelism": {"tp": 2, "pp": 2}}
    text = " ".join(simulate(params).not_modelled)
    assert "tp=2" in text and "pp=2" in text


def test_zero_stage_1_reduce_scatters_and_gathers() -> None:
    from simddp.memory.states import param_size_counts
    from simddp.scenario_io import scenario_from_dict
    from simddp.workload import build_workload
    from simddp.zero import zero_redundancy_share

    ddp = simulate(base_scenario())
    z1 = simulate(deep_merge(base_scenario(), {"parallelism": {"zero_stage": 1}}))
    # torch's ZeroRedundancyOptimizer steps whole tensors: the busiest of the 16 ranks' share, not 1/16
    params = build_workload(scenario_from_dict(base_scenario())).parameters
    busiest = sum(n * c for (n, _), c in zero_redundancy_share(param_size_counts(params), 16))
    assert busiest > sum(p.numel for p in params) / 16
    assert z1.optimizer_time_s == pytest.approx(ddp.optimizer_time_s * busiest / sum(p.numel for p in params))
    assert z1.comm_time_s > 0


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3_000_000), min_size=1, max_size=12),
    cap=st.floats(0.05, 8.0),
    factor=st.floats(1.0, 8.0),
    nodes=st.sampled_from([1, 2, 4]),
    overlap=st.booleans(),
)
def test_more_bandwidth_never_slows_a_step(sizes, cap, factor, nodes, overlap) -> None:
    def run(scale: float) -> float:
        data = {
            "cluster": {
                "preset": "dgx-a100-80gb",
                "num_nodes": nodes,
                "intra_node": {"bandwidth_bytes_per_s": 300e9 * scale},
                "inter_node": {"nic_bandwidth_bytes_per_s": 25e9 * scale},
            },
            "model": _params_model(sizes),
            "training": {"precision": "fp32", "seq_len": 8},
            "ddp": {"bucket_cap_mb": cap, "overlap": overlap},
        }
        return simulate(data, trace=False).step_time_s

    assert run(factor) <= run(1.0) * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 3_000_000), min_size=1, max_size=12), cap=st.floats(0.05, 8.0),
       nodes=st.sampled_from([1, 2, 8]))
def test_simulator_within_analytical_bounds(sizes, cap, nodes) -> None:
    data = {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": nodes},
        "model": _params_model(sizes),
        "training": {"precision": "fp32", "seq_len": 16},
        "ddp": {"bucket_cap_mb": cap},
    }
    r = simulate(data, trace=False)
    assert r.bounds.perfect_overlap_s <= r.step_time_s * (1 + 1e-12)
    assert r.step_time_s <= r.bounds.no_overlap_s * (1 + 1e-12)
    assert sum(b.size_bytes for b in r.buckets) == 4 * sum(sizes)


def test_fifo_schedule() -> None:
    assert in_order_schedule([0, 1, 1.5], [2, 1, 1]) == [(0, 2), (2, 3), (3, 4)]


_TIMES = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_TIMES, _TIMES), min_size=1, max_size=30), _TIMES, _TIMES)
def test_in_order_step_is_the_latest_end_of_the_fifo_schedule(buckets: list[tuple[float, float]], compute: float,
                                                               tail: float) -> None:
    """The step keeps only the stream's last end: exactly the latest of the schedule's ends and the compute."""
    ready, cost = [r for r, _ in buckets], [c for _, c in buckets]
    ends = [end for _, end in in_order_schedule(ready, cost)]
    assert in_order_overlap_step_s(compute, ready, cost, tail) == max([compute, *ends]) + tail
    assert in_order_overlap_step_s(0.0, [0.0, 1.0, 1.5], [2.0, 1.0, 1.0], 0.5) == 4.5


def test_fsdp_gathers_twice_and_reduce_scatters_once_per_micro_batch() -> None:
    data = deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3},
                                        "training": {"global_batch_size": 128}})
    r = simulate(data)
    assert r.num_micro_batches == 2
    assert len(r.buckets) == 12 + 1  # one FSDP unit per block, plus the root (embedding, final norm, head)
    assert r.bounds.perfect_overlap_s <= r.step_time_s <= r.bounds.no_overlap_s * (1 + 1e-12)
    spans = r.trace.spans if r.trace else []
    gathers = [s for s in spans if s.name.startswith("all-gather")]
    reduces = [s for s in spans if s.name.startswith("reduce-scatter")]
    # Per micro-batch: every block unit gathered for forward and again for backward, the root once.
    assert len(gathers) == 2 * (2 * 12 + 1) and len(reduces) == 2 * 13
    assert r.comm_time_s == pytest.approx(sum(s.end_s - s.start_s for s in gathers + reduces))


def test_fsdp_on_a_slow_network_exposes_communication() -> None:
    fast = simulate(deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3}}))
    slow = simulate(deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3},
                                                 "cluster": {"inter_node": {"nic_bandwidth_bytes_per_s": 1e8}}}))
    assert slow.exposed_comm_time_s > fast.exposed_comm_time_s
    assert slow.step_time_s == pytest.approx(sum(p.time_s for p in slow.breakdown), rel=1e-9)


def test_overlap_off_equals_sum_of_parts_computed_independently() -> None:
    # Independent of the simulator's own bookkeeping: layer timings from compute.py, bucket costs from
    # collectives.py, summed by hand.
    from simddp.bucketing import ddp_buckets
    from simddp.collectives import collective_cost
    from simddp.compute import layer_timing, optimizer_step_s
    from simddp.scenario_io import scenario_from_dict
    from simddp.topology import dp_group
    from simddp.workload import build_workload

    data = deep_merge(base_scenario(), {"ddp": {"overlap": False}, "training": {"global_batch_size": 128}})
    sc = scenario_from_dict(data)  # no overlap: no collective beside compute, interference plays no part
    w = build_workload(sc)
    compute = sc.num_micro_batches * sum(
        (t := layer_timing(la, sc.cluster.gpu, sc.training)).fwd_s + t.bwd_s for la in w.layers
    ) + (sc.num_micro_batches - 1) * _autograd_adds_s(data)
    comm = sum(collective_cost("all-reduce", b.size_bytes, dp_group(sc)).time_s
               for b in ddp_buckets(w.parameters, w.grad_ready_order, sc.ddp.bucket_cap_mb))
    # torch DDP steps a torch.optim optimizer: its foreach path
    expected = compute + comm + optimizer_step_s(w, sc.cluster.gpu, sc.training, impl="foreach")
    assert simulate(data).step_time_s == pytest.approx(expected, rel=1e-9)


def test_deepspeed_zero2_reduces_every_micro_batch_zero1_only_the_last() -> None:
    one = {"parallelism": {"zero_stage": 1}, "training": {"global_batch_size": 256},
           "ddp": {"implementation": "deepspeed"}}
    two = deep_merge(one, {"parallelism": {"zero_stage": 2}})
    z1, z2 = simulate(deep_merge(base_scenario(), one)), simulate(deep_merge(base_scenario(), two))
    assert z1.num_micro_batches == 4

    def gather(r):
        return sum(s.end_s - s.start_s for s in (r.trace.spans if r.trace else []) if s.name == "all-gather params")

    assert gather(z1) == pytest.approx(gather(z2)) and gather(z1) > 0
    assert z2.comm_time_s == pytest.approx(4 * sum(b.end_s - b.start_s for b in z2.buckets) + gather(z2))
    assert z1.comm_time_s == pytest.approx(sum(b.end_s - b.start_s for b in z1.buckets) + gather(z1))


def test_a_torch_fsdp_step_says_what_published_runs_found() -> None:
    """simddp's eager-PyTorch FSDP throughput is high on 21 published runs (tests/validation/
    test_published_throughput.py): simulate says so for torch ZeRO-2/3 on a transformer, and only there."""
    def said(**sections: dict) -> bool:  # type: ignore[type-arg]
        return any("published FSDP runs" in n for n in simulate(deep_merge(base_scenario(), sections),
                                                                 trace=False).not_modelled)

    assert said(parallelism={"zero_stage": 3}) and said(parallelism={"zero_stage": 2})
    assert not said(parallelism={"zero_stage": 1})
    assert not said(parallelism={"zero_stage": 3}, ddp={"implementation": "deepspeed"})


def test_in_order_bound_waits_for_backward_without_overlap() -> None:
    # Without overlap the reductions start after the whole backward: the FIFO recurrence is then the step itself
    # (nothing else shares the link), as its description says. Until 2026-11-29 it read the gradients' ready
    # times regardless (0.329 s for a 0.390 s step, a probe's llama2-7b on one DGX H100).
    data = {"cluster": {"preset": "dgx-h100-80gb", "comm_compute_interference": 0.0}, "model": {"preset": "llama2-7b"},
            "ddp": {"overlap": False}}
    r = simulate(data, trace=False)
    assert r.bounds.in_order_overlap_s == pytest.approx(r.step_time_s, rel=1e-12)
    assert r.step_time_s == pytest.approx(r.bounds.no_overlap_s, rel=1e-12)
    on = simulate({**data, "ddp": {"overlap": True}}, trace=False)
    assert on.bounds.in_order_overlap_s == pytest.approx(on.step_time_s, rel=1e-12)
    assert on.step_time_s < r.step_time_s


# ------------------------------------------------------- a probe of the pipeline model (2026-11-29, 33rd pass)
def _tied_pipeline(gpus: int, **parallelism: object) -> dict:
    """A tied-embedding transformer on one node of ``gpus`` GPUs (Megatron, which syncs the tied gradient)."""
    return {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1, "gpus_per_node": gpus},
        "model": {"transformer": {"num_layers": 8, "hidden_size": 2048, "num_heads": 16, "ffn_hidden_size": 8192,
                                  "vocab_size": 50304, "tied_embeddings": True}},
        "parallelism": {"pipeline_schedule": "1f1b", **parallelism},
        "training": {"micro_batch_size": 1, "global_batch_size": 8 * int(str(parallelism.get("dp", 1))),
                     "seq_len": 2048},
        "ddp": {"implementation": "megatron"},
    }


@pytest.mark.parametrize(("gpus", "parallelism"), [
    (4, {"pp": 4, "dp": 1}), (8, {"pp": 8, "dp": 1}), (8, {"pp": 4, "tp": 2, "dp": 1}), (8, {"pp": 4, "dp": 2})])
def test_one_node_puts_nothing_on_the_network(gpus: int, parallelism: dict) -> None:
    """The tied embedding's all-reduce pairs stage 0 with the last; on one node it runs over NVLink (it was timed
    over the NIC whenever the pair's stride was over half a node: 4.4 ms of a 62.4 ms step on 4 GPUs)."""
    r = simulate(_tied_pipeline(gpus, **parallelism), trace=False)
    assert r.link_busy_s.get("inter", 0.0) == 0.0 and r.link_busy_s["intra"] > 0


def test_tied_embedding_sync_crosses_nodes_only_where_its_ranks_do() -> None:
    from simddp.scenario_io import as_scenario
    from simddp.topology import stage_pair_group

    two_nodes = as_scenario(deep_merge(_tied_pipeline(4, pp=4, dp=1), {"cluster": {"num_nodes": 2,
                                                                                   "gpus_per_node": 2}}))
    assert stage_pair_group(two_nodes, 0, 3).num_nodes == 2
    assert stage_pair_group(two_nodes, 0, 1).num_nodes == 1  # ranks 0 and 1 share the first node
    one_node = as_scenario(_tied_pipeline(4, pp=4, dp=1))
    assert stage_pair_group(one_node, 0, 3).num_nodes == 1


def test_sequence_parallel_stages_gather_nothing_they_receive() -> None:
    """With sequence parallelism each tp rank sends its own 1/t of the sequence and the next stage reads it as it
    is; Megatron gathers received slices only without it (the gather was charged either way)."""
    from simddp.scenario_io import as_scenario
    from simddp.sim.plan import build_plan

    for sp, gathered in ((False, True), (True, False)):
        plan = build_plan(as_scenario(_tied_pipeline(8, pp=4, tp=2, dp=1, sequence_parallel=sp)))
        assert (plan.p2p_gather is not None) is gathered


def test_equal_layers_split_evenly_over_many_virtual_stages() -> None:
    """44 equal layers over pp 11 x 2 chunks: two a chunk (60/88 x 22 rounded to 14.999999999999998 put three
    layers on one chunk and one on the next: +7.7% on the step)."""
    from simddp.scenario_io import as_scenario
    from simddp.workload import build_workload

    data = base_scenario(
        cluster={"preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": 11},
        model={**_params_model([1000] * 44),
               "layers": [{"name": f"l{i}", "param_indices": [i], "activation_numel_per_sample": 10}
                          for i in range(44)]},
        parallelism={"pp": 11, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2},
        training={"micro_batch_size": 1, "global_batch_size": 22, "seq_len": 1})
    stages = [la.stage for la in build_workload(as_scenario(data)).layers]
    assert stages == [k // 2 for k in range(44)]


def test_blocking_pipeline_sends_are_their_own_part() -> None:
    """A stage's own blocking sends are `pipeline_p2p`, in both engines: they were booked as waits and then read
    as stage imbalance (43.3 ms of a 74.4 ms step whose stages' work differs by 2.3%), and no field held them.
    Each send is one activation (2,048 tokens x 2,048 x 2 B) at 4.5 GB/s, once per micro-batch each way."""
    data = _tied_pipeline(4, pp=4, dp=1)
    data["model"]["transformer"].update(tied_embeddings=False, vocab_size=8)
    data["cluster"]["intra_node"] = {"bandwidth_bytes_per_s": 4.5e9}
    fast, exact = simulate(data, trace=False), simulate(data, trace=False, exact=True)
    assert fast.pipeline_p2p_time_s == pytest.approx(exact.pipeline_p2p_time_s, rel=1e-9)
    from simddp.scenario_io import as_scenario
    from simddp.sim.plan import build_plan

    plan, stage = build_plan(as_scenario(data)), fast.reported_stage
    assert plan.p2p[0].size_bytes == 2048 * 2048 * 2  # one activation
    # The reported stage sends forward and backward for each of its 8 micro-batches, one direction only on the
    # first and last stage; nothing else holds its p2p stream.
    own = [plan.p2p[k].time_s for k in (stage, stage - 1) if k in plan.p2p]
    assert fast.pipeline_p2p_time_s == pytest.approx(8 * sum(own), rel=1e-9)
    assert fast.part("pipeline_p2p") == fast.pipeline_p2p_time_s
    data["cluster"]["intra_node"] = {"bandwidth_bytes_per_s": 4.5e13}
    quick = simulate(data, trace=False)
    assert quick.pipeline_p2p_time_s < fast.pipeline_p2p_time_s / 100
    assert quick.stage_imbalance_time_s < 0.02 * quick.step_time_s  # stages of equal work


def test_a_tied_output_layer_is_its_own_weight_on_the_last_stage() -> None:
    """With pp > 1 the last stage holds the output layer's copy of a tied embedding (Megatron's
    output_layer.weight): in its gradients, buckets and optimizer step as in the memory model (a probe's plan had
    100,673,536 parameters there, the memory model 203,696,128; its optimizer ran 0.93 ms for 1.89 ms)."""
    from simddp.memory import memory_breakdown
    from simddp.scenario_io import as_scenario
    from simddp.sim.plan import build_plan

    scenario = as_scenario(_tied_pipeline(4, pp=4, dp=1))
    plan = build_plan(scenario)
    first, last = plan.ranks[0], plan.ranks[-1]
    assert last.grads.num_params == memory_breakdown(scenario, stage=3).num_params
    vocab_x_hidden = 50304 * 2048
    assert vocab_x_hidden in [p.numel for p in last.grads.params]  # the copy, beside two blocks and the norm
    # The same weights but for the first stage's position table (4.2 M) and the last's final norm; it was half.
    assert last.opt_s == pytest.approx(first.opt_s, rel=0.03)
    one_stage = build_plan(as_scenario(_tied_pipeline(4, pp=1, dp=4)))  # one weight, shared in place
    assert sum(r.grads.num_params for r in plan.ranks) == one_stage.ranks[0].grads.num_params + vocab_x_hidden


def _fsdp_spans(r) -> list:  # type: ignore[no-untyped-def]
    return sorted((s for s in (r.trace.spans if r.trace else [])
                   if s.name.startswith(("all-gather", "reduce-scatter"))), key=lambda s: s.start_s)


def test_fsdp_gathers_and_reduce_scatters_take_turns_on_the_groups_one_stream() -> None:
    """ProcessGroupNCCL runs one process group's collectives on one NCCL stream, in issue order
    (pytorch/pytorch#65299, #95705): FSDP's all-gathers and reduce-scatters never overlap, so each takes the time
    it takes alone (tp 1: nothing else on the NIC), and the communication total is their sum. Until 2026-11-29
    they ran on two streams, sharing the link: 555 ms for 588 ms on a probe's Llama-2-7B at sequence 1,024, and
    a communication total 1.5x the sum of the collectives alone."""
    from simddp.scenario_io import scenario_from_dict
    from simddp.sim import build_plan

    data = deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3}, "training": {"global_batch_size": 128}})
    r = simulate(data)
    spans = _fsdp_spans(r)
    assert len(spans) == 2 * (2 * 12 + 1) + 2 * 13
    for a, b in itertools.pairwise(spans):
        assert b.start_s >= a.end_s - 1e-15, (a.name, b.name)
    plan = build_plan(scenario_from_dict(data))
    units = [*plan.ranks[0].fsdp_units, plan.ranks[0].fsdp_root]
    alone = {f"all-gather {u.name}": u.gather.time_s for u in units} | {
        f"reduce-scatter {u.name}": u.reduce.time_s for u in units if u.reduce is not None}
    for s in spans:
        assert s.end_s - s.start_s == pytest.approx(alone[s.name.removesuffix(" (fwd)").removesuffix(" (bwd)")],
                                                     rel=1e-9), s.name
    assert r.comm_time_s == pytest.approx(sum(alone[s.name.removesuffix(" (fwd)").removesuffix(" (bwd)")]
                                              for s in spans), rel=1e-9)

    # FSDP2's set_separate_reduce_scatter_group: a communicator of their own, so they overlap the gathers (and share
    # the link), for one more communicator's NCCL buffers.
    apart = simulate(deep_merge(data, {"ddp": {"separate_reduce_scatter_group": True}}))
    spans = _fsdp_spans(apart)
    assert any(b.start_s < a.end_s - 1e-9 for a, b in itertools.pairwise(spans))
    assert apart.step_time_s < r.step_time_s
    nccl = {i.name: i.size_bytes for i in r.memory.items}["NCCL"]
    nccl_apart = {i.name: i.size_bytes for i in apart.memory.items}["NCCL"]
    assert nccl_apart - nccl == scenario_from_dict(data).memory.nccl_bytes_per_communicator


def test_a_separate_reduce_scatter_group_is_refused_where_nothing_is_gathered_unit_by_unit() -> None:
    from simddp.scenario_io import scenario_from_dict

    with pytest.raises(ValueError, match=r"ddp.separate_reduce_scatter_group\(true\).*zero_stage\(0\)"):
        scenario_from_dict(deep_merge(base_scenario(), {"ddp": {"separate_reduce_scatter_group": True}}))


def test_fsdp_backward_waits_for_its_reduce_scatters_before_the_next_micro_batch() -> None:
    """FSDP's _post_backward_final_callback makes the compute stream wait for the post-backward stream, DeepSpeed
    ZeRO-3's epilogue synchronizes its reduce stream: the next micro-batch starts once the reduce-scatters of this
    one have ended. Seen with the reduce-scatters on a group of their own (on the shared stream the next
    micro-batch's first gather queues behind them anyway)."""
    data = deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3}, "training": {"global_batch_size": 128},
                                        "ddp": {"separate_reduce_scatter_group": True}})
    spans = (simulate(data).trace or pytest.fail("no trace")).spans
    first_reduces = sorted((s for s in spans if s.name.startswith("reduce-scatter")), key=lambda s: s.start_s)[:13]
    second_forward = sorted((s for s in spans if s.name.startswith("fwd ")), key=lambda s: s.start_s)
    per_micro_batch = len(second_forward) // 2
    assert second_forward[per_micro_batch].start_s >= max(s.end_s for s in first_reduces) - 1e-15


def test_fsdp_root_prefetches_the_last_block_when_backward_starts() -> None:
    """The root is an FSDP unit too: its pre-backward hook prefetches the next handle in backward order, the last
    block (FSDP1's handles_post_forward_order puts the root last), before the root's output layer and loss run
    backward. Until 2026-11-29 the last block was gathered after them."""
    data = deep_merge(base_scenario(), {"parallelism": {"zero_stage": 3}})
    spans = (simulate(data).trace or pytest.fail("no trace")).spans
    gather = next(s for s in spans if s.name == "all-gather block 11 (bwd)")
    loss_bwd = next(s for s in spans if s.name == "bwd loss")
    assert gather.start_s <= loss_bwd.start_s + 1e-15
    none = deep_merge(data, {"memory": {"fsdp_prefetch_layers": 0}})  # no prefetch: gathered when its turn comes
    spans = (simulate(none).trace or pytest.fail("no trace")).spans
    gather = next(s for s in spans if s.name == "all-gather block 11 (bwd)")
    assert gather.start_s >= next(s for s in spans if s.name == "bwd loss").end_s - 1e-15


@pytest.mark.parametrize("m", [2, 4])
def test_deepspeed_zero2_with_overlap_waits_for_each_micro_batch_s_reductions(m: int) -> None:
    """DeepSpeed ZeRO-2 reduces every micro-batch, and with overlap_comm its epilogue
    (independent_gradient_partition_epilogue) synchronizes the device at the end of each backward: every micro-batch
    then repeats the one-micro-batch step up to its tail (optimizer and parameter all-gather), so
    step(m) = m step(1) - (m - 1) tail, by hand. Until 2026-11-29 the reductions ran on into the next micro-batch
    (a probe's 8 micro-batches: 934 ms for 1,108 ms)."""
    one = deep_merge(base_scenario(), {"parallelism": {"zero_stage": 2}, "training": {"global_batch_size": 64},
                                       "ddp": {"implementation": "deepspeed", "overlap": True}})
    r1 = simulate(one)
    assert r1.num_micro_batches == 1
    gather = sum(s.end_s - s.start_s for s in (r1.trace.spans if r1.trace else []) if s.name == "all-gather params")
    tail = r1.optimizer_time_s + gather
    assert gather > 0
    rm = simulate(deep_merge(one, {"training": {"global_batch_size": 64 * m}}), trace=False)
    assert rm.num_micro_batches == m
    assert rm.step_time_s == pytest.approx(m * r1.step_time_s - (m - 1) * tail, rel=1e-9)
