"""DDP knobs: find_unused_parameters, static_graph, unused parameters, gradient clipping, gloo, DataParallel."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios import base_scenario

from simddp import simulate
from simddp.bucketing import ddp_buckets, ddp_initial_buckets
from simddp.cli import main
from simddp.collectives import collective_cost
from simddp.compute import memory_s
from simddp.config import ParameterSpec, ScenarioError, deep_merge
from simddp.gloo import gloo_cost
from simddp.sanity import check_step_result
from simddp.scenario_io import scenario_from_dict
from simddp.sim import build_plan, simulate_step
from simddp.sim.dataparallel import COALESCE_BYTES, dataparallel_plan
from simddp.topology import dp_group, group
from simddp.units import MiB

MB = 2**20


def params_model(sizes: list[int], unused: list[int] | None = None) -> dict[str, Any]:
    model: dict[str, Any] = {"parameters": [{"name": f"w{i}", "numel": n, "dtype": "float32"}
                                            for i, n in enumerate(sizes)]}
    if unused:
        model["unused_parameters"] = unused
    return model


def param_scenario(sizes: list[int], unused: list[int] | None = None, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
                            "model": params_model(sizes, unused),
                            "training": {"micro_batch_size": 8, "seq_len": 1, "precision": "fp32"}}
    return deep_merge(data, overrides)


def step(data: dict[str, Any]) -> Any:
    result = simulate(data)
    check_step_result(result)
    return result


# ---------------------------------------------------------------------------- find_unused_parameters
def test_initial_buckets_are_definition_order_reversed() -> None:
    """torch: _compute_bucket_assignment_by_size over definition order with limits [1 MiB, 25 MiB], then reversed."""
    params = [ParameterSpec(name=f"p{i}", numel=n // 4) for i, n in enumerate([MB // 2, MB, 10 * MB, 20 * MB])]
    initial = ddp_initial_buckets(params)
    # Definition order: p0 (0.5 MiB) + p1 (1 MiB) close the 1 MiB first bucket; p2 + p3 (30 MiB) the next.
    assert [b.param_indices for b in initial] == [[2, 3], [0, 1]]
    assert [b.index for b in initial] == [0, 1]
    # Rebuilt (ready order = reverse definition): p3 alone passes 1 MiB first, then p2 + p1 + p0.
    assert [b.param_indices for b in ddp_buckets(params)] == [[3], [2, 1, 0]]


def test_find_unused_parameters_costs_its_graph_search_and_map_all_reduce() -> None:
    sizes = [2 * MB] * 6
    plain = step(param_scenario(sizes))
    data = param_scenario(sizes, ddp={"find_unused_parameters": True})
    unused = step(data)
    scenario = scenario_from_dict(data)
    rank = build_plan(scenario).ranks[0]
    nodes = 6 + 6  # one forward kernel per layer (a layer per parameter) + one AccumulateGrad per parameter
    assert rank.traversal_s == pytest.approx(nodes * scenario.cluster.autograd_node_traversal_s)
    assert unused.part("ddp_host") == pytest.approx(rank.traversal_s)
    assert rank.unused_map_reduce is not None
    assert rank.unused_map_reduce.size_bytes == 4 * 6  # one int32 per parameter tensor
    assert rank.unused_map_reduce.time_s == collective_cost("all-reduce", 24, dp_group(scenario)).time_s
    assert [b.param_indices for b in rank.grads.buckets] == [b.param_indices for b in
                                                             ddp_initial_buckets(rank.grads.params)]
    assert unused.step_time_s > plain.step_time_s + rank.traversal_s


def test_the_graph_search_uses_a_calibrated_node_count() -> None:
    data = param_scenario([MB] * 4, ddp={"find_unused_parameters": True}, model={"num_autograd_nodes": 1000})
    scenario = scenario_from_dict(data)
    assert build_plan(scenario).ranks[0].traversal_s == pytest.approx(1000 * scenario.cluster.autograd_node_traversal_s)


def test_static_graph_steady_state_is_plain_ddp() -> None:
    sizes = [3 * MB, MB, 5 * MB, MB, 2 * MB]
    plain = step(param_scenario(sizes))
    for ddp in ({"static_graph": True}, {"static_graph": True, "find_unused_parameters": True}):
        r = step(param_scenario(sizes, ddp=ddp))
        assert r.step_time_s == plain.step_time_s
        assert [b.size_bytes for b in r.buckets] == [b.size_bytes for b in plain.buckets]


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 8 * MB), min_size=1, max_size=12), cap=st.sampled_from([1, 5, 25]))
def test_static_graph_with_find_unused_equals_plain_ddp_property(sizes: list[int], cap: int) -> None:
    plain = simulate(param_scenario(sizes, ddp={"bucket_cap_mb": cap}), trace=False)
    both = simulate(param_scenario(sizes, ddp={"bucket_cap_mb": cap, "static_graph": True,
                                               "find_unused_parameters": True}), trace=False)
    assert both.step_time_s == plain.step_time_s


def test_unused_parameters_need_find_unused_or_static_graph() -> None:
    with pytest.raises(ScenarioError, match=r"model.unused_parameters lists 1 parameter.*find_unused_parameters"):
        scenario_from_dict(param_scenario([MB] * 4, unused=[0]))
    with pytest.raises(ScenarioError, match=r"unused_parameters lists all 2 parameters"):
        scenario_from_dict(param_scenario([MB] * 2, unused=[0, 1], ddp={"find_unused_parameters": True}))
    with pytest.raises(ScenarioError, match=r"outside 0..1"):
        scenario_from_dict(param_scenario([MB] * 2, unused=[5], ddp={"find_unused_parameters": True}))
    for ddp in ({"find_unused_parameters": True}, {"static_graph": True}):
        check_step_result(simulate(param_scenario([MB] * 4, unused=[0], ddp=ddp)))


def test_a_bucket_of_unused_parameters_is_ready_at_the_first_gradient_hook() -> None:
    # Ready order is reverse definition: w3 gets its gradient first. w0 (unused) fills its own bucket (cap 1 MiB):
    # it is marked ready when w3's hook fires, so its reduction can start before anything else is ready.
    sizes = [MB // 4 * 4, MB // 4 * 4, MB // 4 * 4, MB // 4 * 4]  # 4 MiB of fp32 each
    r = step(param_scenario(sizes, unused=[0], ddp={"find_unused_parameters": True, "bucket_cap_mb": 1}))
    plain = step(param_scenario(sizes, ddp={"find_unused_parameters": True, "bucket_cap_mb": 1}))
    first_ready = min(b.ready_s for b in r.buckets)
    unused_bucket = r.buckets[-1]  # initial buckets reversed: the first-defined parameter's bucket goes last
    plain_last = plain.buckets[-1]
    assert unused_bucket.ready_s == pytest.approx(first_ready)
    assert plain_last.ready_s > first_ready  # with w0 used, its bucket waits for w0's own gradient


def test_unused_parameters_are_only_for_parameter_lists() -> None:
    with pytest.raises(ScenarioError, match="unused_parameters need an explicit parameters list"):
        scenario_from_dict(base_scenario(model={"preset": "gpt2", "unused_parameters": [0]}))


# --------------------------------------------------------------------------------------- clipping
def test_gradient_clipping_passes_and_no_reduction_for_replicated_gradients() -> None:
    sizes = [4 * MB] * 5
    data = param_scenario(sizes, training={"grad_clip_norm": 1.0})
    scenario = scenario_from_dict(data)
    rank = build_plan(scenario).ranks[0]
    grad_bytes = 5 * 4 * MB * 4
    gpu = scenario.cluster.gpu
    assert rank.clip_norm_s == pytest.approx(memory_s(grad_bytes, gpu))
    assert rank.clip_scale_s == pytest.approx(memory_s(2 * grad_bytes, gpu))
    assert rank.clip_reduces == ()  # DDP's all-reduce left every rank the whole gradient
    r, plain = step(data), step(param_scenario(sizes))
    assert r.part("grad_clip") == pytest.approx(rank.clip_norm_s + rank.clip_scale_s)
    assert r.step_time_s == pytest.approx(plain.step_time_s + r.part("grad_clip"))


@pytest.mark.parametrize("implementation", ["megatron", "torch"])
def test_gradient_clipping_reduces_over_every_sharding_group(implementation: str) -> None:
    """Megatron's distributed optimizer norms its gradient shard: the partial sums go over tp, pp and dp. torch's
    ZeroRedundancyOptimizer runs on DDP, which leaves every gradient on every rank: no data-parallel sum."""
    data = base_scenario(parallelism={"tp": 2, "pp": 2, "zero_stage": 1}, training={
        "micro_batch_size": 1, "seq_len": 1024, "global_batch_size": 32, "grad_clip_norm": 1.0},
        ddp={"implementation": implementation})
    scenario = scenario_from_dict(data)
    ranks = build_plan(scenario).ranks
    for rank in ranks:
        dp = [scenario.dp] if implementation == "megatron" else []
        assert [c.num_ranks for c in rank.clip_reduces] == [2, 2, *dp]
        assert all(c.size_bytes == 4 for c in rank.clip_reduces)
    check_step_result(simulate(data))


# ---------------------------------------------------------------------------- gradient accumulation
def _wgrad_s(data: dict[str, Any]) -> list[float]:
    return [p.timing.wgrad_s for p in build_plan(scenario_from_dict(data)).ranks[0].plans]


def test_autograd_accumulation_by_hand() -> None:
    """torch: micro-batches 2..m add in place (read 2, write 1 fp32 gradient); averaged over the m."""
    sizes = [4 * MB, MB, 2 * MB]
    gpu = scenario_from_dict(param_scenario(sizes)).cluster.gpu
    one = _wgrad_s(param_scenario(sizes, training={"global_batch_size": 8 * 16}))
    four = _wgrad_s(param_scenario(sizes, training={"global_batch_size": 4 * 8 * 16}))
    by_hand = [0.75 * memory_s(3 * n * 4, gpu) for n in sizes]
    assert [b - a for a, b in zip(one, four, strict=True)] == pytest.approx(by_hand, rel=1e-12)


def test_megatron_main_grad_accumulation_every_micro_batch() -> None:
    """Megatron without fusion adds every micro-batch's gradient into main_grad (read 4, read and write
    fp32 main_grad); with its default fused weight-gradient GEMMs nothing is added. Reduction runs after
    backward (Megatron's default), so the step grows by exactly m x that time."""
    sizes = [4 * MB, MB]
    training = {"global_batch_size": 4 * 8 * 16}
    fused = param_scenario(sizes, training=training, ddp={"implementation": "megatron"})
    hook = param_scenario(sizes, training=training,
                          ddp={"implementation": "megatron", "gradient_accumulation_fusion": False})
    gpu = scenario_from_dict(fused).cluster.gpu
    per_micro_batch = [memory_s(n * (4 + 2 * 4), gpu) for n in sizes]
    assert [b - a for a, b in zip(_wgrad_s(fused), _wgrad_s(hook), strict=True)] == pytest.approx(per_micro_batch)
    assert step(hook).step_time_s - step(fused).step_time_s == pytest.approx(4 * sum(per_micro_batch), rel=1e-9)


def test_sharded_gradients_do_not_accumulate_whole() -> None:
    """FSDP reduces every micro-batch: only a 1/dp shard accumulates, not timed."""
    sizes = [4 * MB, MB]
    one = _wgrad_s(param_scenario(sizes, parallelism={"zero_stage": 3}, training={"global_batch_size": 8 * 16}))
    four = _wgrad_s(param_scenario(sizes, parallelism={"zero_stage": 3}, training={"global_batch_size": 4 * 8 * 16}))
    assert one == four


def test_gradient_accumulation_fusion_is_megatron_only() -> None:
    with pytest.raises(ScenarioError, match=r"ddp.gradient_accumulation_fusion\(true\).*implementation 'megatron'"):
        scenario_from_dict(param_scenario([MB], ddp={"gradient_accumulation_fusion": True}))


# --------------------------------------------------------------------------------------------- gloo
def test_gloo_all_reduce_by_hand() -> None:
    scenario = scenario_from_dict(param_scenario([MB] * 2, ddp={"backend": "gloo"}))
    g = scenario.cluster.gloo
    grp = dp_group(scenario)  # 16 ranks on 2 nodes
    n, size = grp.num_ranks, 64 * MiB
    bw = min(g.bandwidth_bytes_per_s, grp.inter_bus_bandwidth_bytes_per_s)
    expected = 2 * (n - 1) * g.latency_s + 2 * (n - 1) / n * size / bw + 2 * size / g.host_copy_bandwidth_bytes_per_s
    cost = gloo_cost("all-reduce", size, grp, g)
    assert cost.time_s == pytest.approx(expected, rel=1e-12)
    assert cost.latency_s == pytest.approx(2 * (n - 1) * g.latency_s)
    assert not cost.sm_interference
    assert cost.time_s > 10 * collective_cost("all-reduce", size, grp).time_s  # NCCL on NVLink + IB


def test_gloo_reduces_every_bucket_and_never_slows_compute() -> None:
    sizes = [8 * MB] * 6
    r = step(param_scenario(sizes, ddp={"backend": "gloo"}))
    nccl = step(param_scenario(sizes))
    assert r.part("interference") == 0.0
    assert all(b.algorithm == "gloo-ring" for b in r.buckets)
    assert r.step_time_s > nccl.step_time_s
    scenario = scenario_from_dict(param_scenario(sizes, ddp={"backend": "gloo"}))
    plan = build_plan(scenario)
    assert [b.reduce.time_s for b in plan.ranks[0].buckets] == [
        gloo_cost("all-reduce", b.size_bytes, dp_group(scenario), scenario.cluster.gloo).time_s
        for b in plan.ranks[0].buckets]


def test_gloo_needs_plain_ddp() -> None:
    with pytest.raises(ScenarioError, match=r"ddp.backend gloo is modelled for DDP's all-reduce only"):
        scenario_from_dict(base_scenario(parallelism={"zero_stage": 1}, ddp={"backend": "gloo"}))


def test_tcp_ethernet_preset_is_slower_than_infiniband() -> None:
    tcp = step(base_scenario(cluster={"preset": "tcp-ethernet-25g", "num_nodes": 2}))
    ib = step(base_scenario(cluster={"preset": "pcie-a100-80gb", "num_nodes": 2}))
    assert tcp.comm_time_s > 2 * ib.comm_time_s


# ----------------------------------------------------------------------------------- DataParallel
def dataparallel(**overrides: Any) -> dict[str, Any]:
    return deep_merge({"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2-medium"},
                       "training": {"micro_batch_size": 2, "seq_len": 1024}}, overrides)


def test_dataparallel_loses_to_ddp_on_one_node_and_says_where() -> None:
    ddp = step(dataparallel())
    dpar = step(dataparallel(ddp={"wrapper": "dataparallel"}))
    assert dpar.step_time_s > 1.3 * ddp.step_time_s
    assert dpar.exposed_comm_time_s > 5 * ddp.exposed_comm_time_s  # DDP hides its all-reduce behind backward
    assert dpar.exposed_comm_time_s == pytest.approx(dpar.comm_time_s)  # nothing overlaps in DataParallel
    assert dpar.bounds.no_overlap_s == pytest.approx(dpar.step_time_s, rel=1e-9)


def test_dataparallel_costs_by_hand() -> None:
    scenario = scenario_from_dict(dataparallel(ddp={"wrapper": "dataparallel"}))
    plan = dataparallel_plan(scenario)
    node = group(scenario.cluster, 8)
    param_bytes = sum(p.numel * 2 for p in build_plan(scenario).workload.parameters)  # bf16 working copy
    full, rest = divmod(param_bytes, COALESCE_BYTES)
    expected = full * collective_cost("broadcast", COALESCE_BYTES, node).time_s + \
        collective_cost("broadcast", rest, node).time_s
    assert plan.replicate.time_s == pytest.approx(expected)
    assert plan.replicate.size_bytes == param_bytes
    tokens = 2 * 1024
    assert plan.scatter.size_bytes == 7 * tokens * 8  # int64 token ids to the 7 other GPUs
    assert plan.gather.size_bytes == 7 * tokens * 50257 * 2  # bf16 logits back to GPU 0
    r = simulate_step(scenario, trace=False)
    chain = plan.num_micro_batches * (sum(c.time_s for c in plan.comm_costs) + plan.forward_s + plan.loss_s
                                      + plan.bwd_kernels_s) + plan.opt_s
    assert r.step_time_s == pytest.approx(chain, rel=1e-9)


def test_dataparallel_forward_is_launch_bound_when_python_is_slow() -> None:
    slow = dataparallel(ddp={"wrapper": "dataparallel"}, cluster={"host_op_dispatch_s": 1e-3})
    plan = dataparallel_plan(scenario_from_dict(slow))
    assert plan.fwd_launch_s > plan.fwd_kernels_s
    r = step(slow)
    assert r.part("ddp_host") == pytest.approx(plan.fwd_launch_s - plan.fwd_kernels_s)


def test_dataparallel_is_one_node_plain_replication() -> None:
    with pytest.raises(ScenarioError, match=r"dataparallel drives the GPUs of one node.*num_nodes\(2\)"):
        scenario_from_dict(dataparallel(cluster={"num_nodes": 2}, ddp={"wrapper": "dataparallel"}))
    with pytest.raises(ScenarioError, match=r"dataparallel replicates the whole model.*tp\(2\)"):
        scenario_from_dict(dataparallel(parallelism={"tp": 2}, ddp={"wrapper": "dataparallel"}))


# ------------------------------------------------------------------------------------------- CLI
def test_knobs_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["knobs", "--set", "model.preset=gpt2", "--set", "parallelism.zero_stage=0",
                 "--set", "cluster.num_nodes=2", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {r["knob"]: r for r in table["rows"]}
    assert rows["ddp.find_unused_parameters"]["delta_s"] > 0
    assert rows["ddp.static_graph"]["delta_s"] == 0
    assert rows["ddp.backend"]["delta_s"] > 0
    assert rows["ddp.wrapper"]["delta_s"] > 0
    assert rows["training.grad_clip_norm"]["delta_s"] > 0
    assert table["startup_broadcast_s"] > 0
    assert main(["knobs", "--set", "model.preset=gpt2"]) == 0
    out = capsys.readouterr().out
    assert "does not apply: ddp.backend gloo" in out  # the default scenario runs ZeRO-1


def test_knob_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--set", "ddp.backend=mpi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ddp.backend" in err and "Traceback" not in err


def test_dataparallel_chunks_are_counted_not_listed() -> None:
    """A 2^53-element model (9e15, the largest count a scenario takes) is 3.4 x 10^9 chunks of 10 MiB: their time
    is the count times one chunk's (it used to build a list with one entry per chunk: 8 GB and a minute, or a
    MemoryError)."""
    huge = {"model": {"preset": None, "parameters": [{"name": "w", "numel": 2**53, "dtype": "float32"}],
                      "layers": [{"name": "l", "param_indices": [0], "fwd_time_s": 0.002, "bwd_time_s": 0.004}]},
            "training": {"precision": "fp32", "optimizer": "sgd", "seq_len": 1}}
    scenario = scenario_from_dict(dataparallel(ddp={"wrapper": "dataparallel"}, **huge))
    plan = dataparallel_plan(scenario)
    node = group(scenario.cluster, 8)
    full, rest = divmod(4 * 2**53, COALESCE_BYTES)
    assert full > 10**8
    expected = full * collective_cost("broadcast", COALESCE_BYTES, node).time_s + \
        collective_cost("broadcast", rest, node).time_s
    assert plan.replicate.time_s == pytest.approx(expected, rel=1e-12)


def test_knobs_beyond_the_longest_step(capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline beyond the 1e9 s `simulate` answers for is refused, as `simulate` refuses it; a knob that takes
    the step beyond it is listed as not timed."""
    assert main(["knobs", "--set", "model.preset=gpt2", "--set", "cluster.intra_node.latency_s=1e308"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "beyond the 1e+09 s" in err
    slow_gloo = ["--set", "model.preset=gpt2", "--set", "parallelism.zero_stage=0", "--set", "cluster.num_nodes=2",
                 "--set", "cluster.gloo.bandwidth_bytes_per_s=1e-3", "--json"]
    assert main(["knobs", *slow_gloo]) == 0
    rows = {r["knob"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["ddp.backend"]["step_time_s"] is None and "not timed" in rows["ddp.backend"]["note"]


def test_torch_zero1_is_ddp_for_its_knobs() -> None:
    """torch's ZeRO-1 is ZeroRedundancyOptimizer stepping a DDP model: DDP's find_unused_parameters (the graph
    search, the used-parameter map's all-reduce, buckets never rebuilt), its refusal of parameters without a gradient
    and a whole-gradient clip all apply. Until 2026-11-29 they were timed at stage 0 only: stage 1 accepted a model
    torch stops on ('Expected to have finished reduction in the prior iteration'), timed no search, and clipped a
    1/dp shard with a data-parallel all-reduce its gradients do not need."""
    from simddp import simulate
    from simddp.config import ScenarioError

    base = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
            "model": {"parameters": [{"name": f"w{i}", "numel": 2**21, "dtype": "float32"} for i in range(6)],
                      "unused_parameters": [0]},
            "training": {"micro_batch_size": 8, "seq_len": 1, "precision": "fp32", "global_batch_size": 128},
            "parallelism": {"zero_stage": 1}}
    with pytest.raises(ScenarioError, match="Expected to have finished reduction"):
        simulate(base)
    found = simulate({**base, "ddp": {"find_unused_parameters": True}})
    static = simulate({**base, "ddp": {"static_graph": True}})
    assert found.step_time_s > static.step_time_s
    assert any(s.name == "all-reduce used-parameter map" for s in (found.trace.spans if found.trace else []))
    assert not any("not timed here" in n for n in found.not_modelled)
    # A clip of every gradient, as at stage 0, with no data-parallel all-reduce of the norm.
    clipped = {**base, "model": {"parameters": base["model"]["parameters"]}, "training": {**base["training"],
                                                                                           "grad_clip_norm": 1.0}}
    part = {p.key: p.time_s for p in simulate(clipped, trace=False).breakdown}["grad_clip"]
    zero0 = {p.key: p.time_s for p in simulate({**clipped, "parallelism": {"zero_stage": 0}},
                                               trace=False).breakdown}["grad_clip"]
    assert part == pytest.approx(zero0, rel=1e-12) and part > 0
