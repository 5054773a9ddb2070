"""ZeRO stages name their implementation, and one rule (simddp.zero) gives both the timing and the buffers.

Issue 9: ZeRO-1 was timed DeepSpeed-style while its memory carried torch DDP's bucket copies, so ZeRO-1 ->
ZeRO-2 saved 25.7 GiB on Llama-2-7B instead of the ZeRO paper's 2Psi(1 - 1/Nd), about 12.5 GiB. Every test
here names ``ddp.implementation``, a key the code this started from did not have.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios import base_scenario

from simddp import ScenarioError, simulate
from simddp.config import deep_merge
from simddp.memory import MemoryBreakdown, memory_breakdown
from simddp.scenario_io import scenario_from_dict
from simddp.sim.plan import build_plan
from simddp.units import GiB
from simddp.workload import build_workload
from simddp.zero import zero_rule

LLAMA7B_128 = {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 16}, "model": {"preset": "llama2-7b"},
               "training": {"micro_batch_size": 1, "global_batch_size": 512, "seq_len": 4096,
                            "recompute": "selective"}}


def scenario(data: dict[str, Any], impl: str, stage: int, **ddp: Any) -> Any:
    return scenario_from_dict(deep_merge(data, {"parallelism": {"zero_stage": stage},
                                                "ddp": {"implementation": impl, **ddp}}))


def item(m: MemoryBreakdown, name: str) -> int:
    return sum(i.size_bytes for i in m.items if i.name == name)


def spans(r: Any, prefix: str) -> list[Any]:
    return [s for s in (r.trace.spans if r.trace else []) if s.name.startswith(prefix)]


# ------------------------------------------------------------------------------- the figure
def test_deepspeed_zero1_to_zero2_saves_the_gradients_as_the_zero_paper_says():
    # ZeRO paper: stage 2 saves 2Psi(1 - 1/Nd) of 16-bit gradients over stage 1; DeepSpeed's reduce buffers
    # are the same in both stages, so the saving is exactly that (was 25.7 GiB: torch bucket copies too).
    z1 = memory_breakdown(scenario(LLAMA7B_128, "deepspeed", 1))
    z2 = memory_breakdown(scenario(LLAMA7B_128, "deepspeed", 2))
    psi, nd = 6_738_415_616, 128
    paper = 2 * psi * (1 - 1 / nd)
    saving = z1.total_bytes - z2.total_bytes
    assert saving / GiB == pytest.approx(paper / GiB, rel=0.02)  # 12.45 GiB; ZeRO-1's partition copy is +0.8%
    assert item(z1, "DeepSpeed reduce buffers") == item(z2, "DeepSpeed reduce buffers") == 500_000_000 * 2
    assert not any(i.name == "DDP bucket copies" for i in z1.items + z2.items)


def test_torch_zero1_keeps_ddp_bucket_copies_and_broadcasts_after_the_step():
    # torch's ZeroRedundancyOptimizer sits on DDP: DDP's all-reduce and bucket copies, then every parameter
    # broadcast from its owner (parameters_as_bucket_view=False).
    data = base_scenario()
    ddp, z1 = simulate(scenario(data, "torch", 0)), simulate(scenario(data, "torch", 1))
    assert [b.algorithm for b in z1.buckets] == [b.algorithm for b in ddp.buckets]
    assert sum(b.size_bytes for b in z1.buckets) == sum(b.size_bytes for b in ddp.buckets)
    plan = build_plan(scenario(data, "torch", 1))
    sync = plan.ranks[0].gather_after_step
    assert sync is not None and sync.op == "broadcast"
    assert sync.size_bytes == sum(2 * p.numel for p in plan.workload.parameters)
    assert z1.comm_time_s == pytest.approx(ddp.comm_time_s + sync.time_s, rel=1e-9)
    m = memory_breakdown(scenario(data, "torch", 1))
    assert item(m, "DDP bucket copies") == m.grads_bytes  # unsharded gradients, and their bucket copies


def test_megatron_distributed_optimizer_defaults():
    # Megatron-LM: fp32 main grads with bf16 (accumulate_allreduce_grads_in_fp32), --overlap-grad-reduce off,
    # so one bucket reduce-scattered after backward; buckets are views of the grad buffer (no copies).
    s = scenario(LLAMA7B_128, "megatron", 1)
    rule = zero_rule(s)
    assert (rule.reduce_in_fp32, rule.overlap, rule.reduce_op, rule.param_sync) == (True, False, "reduce-scatter",
                                                                                     "all-gather")
    r = simulate(s, trace=False)
    assert len(r.buckets) == 1 and r.buckets[0].size_bytes == 4 * 6_738_415_616
    assert r.exposed_comm_time_s == pytest.approx(r.comm_time_s, rel=1e-9)  # nothing overlaps
    m = memory_breakdown(s)
    assert m.grads_bytes == 4 * 6_738_415_616 and m.buffers_bytes == item(m, "NCCL")
    on = simulate(scenario(LLAMA7B_128, "megatron", 1, overlap=True), trace=False)
    # max(4e7, 1e6 x dp) = 1.28e8 elements per bucket at dp = 128.
    assert max(b.size_bytes for b in on.buckets[:-1]) < 4 * 128_000_000 + 4 * 131_072_000
    assert len(on.buckets) > 30 and on.exposed_comm_time_s < r.exposed_comm_time_s
    assert zero_rule(scenario_from_dict(deep_merge(LLAMA7B_128, {
        "training": {"precision": "fp16-mixed"}, "ddp": {"implementation": "megatron"}}))).reduce_in_fp32 is False


def test_deepspeed_zero1_and_2_reduce_after_backward_zero3_overlaps():
    # DeepSpeed's overlap_comm defaults to false for stages 1 and 2, true for 3 (overlap_comm_valid); its ZeRO-1/2
    # buckets hold reduce_bucket_size = 5e8 elements and are all-reduced (use_multi_rank_bucket_allreduce).
    for stage, overlap in ((1, False), (2, False), (3, True)):
        assert zero_rule(scenario(LLAMA7B_128, "deepspeed", stage)).overlap is overlap
    r = simulate(scenario(LLAMA7B_128, "deepspeed", 1), trace=False)
    assert {b.algorithm for b in r.buckets} <= {"ring", "tree", "nvls", "nvls-tree"}  # all-reduce algorithms
    assert all(b.size_bytes <= 2 * 500_000_000 for b in r.buckets) and len(r.buckets) == 14
    assert all(b.start_s >= max(x.ready_s for x in r.buckets) for b in r.buckets)  # after backward


def test_deepspeed_zero3_keeps_modules_within_reuse_distance_and_skips_persistent_ones():
    s = scenario(LLAMA7B_128, "deepspeed", 3)
    units = build_plan(s).ranks[0].fsdp_units
    params = build_workload(s).parameters
    gathered = {u.name for u in units}
    assert "model.layers.0.input_layernorm" not in gathered  # 4096 elements < 1e5: never partitioned
    kept = [u for u in units if not u.gather_bwd]
    # Kept gathered from forward to backward while 2 x (the elements after it) < 1e9: the model's tail.
    tail = sum(p.numel for p in params[-8:])
    assert kept[-1].name == "lm_head" and 0 < len(kept) < len(units) and tail < 500_000_000
    r = simulate(s)
    gathers = spans(r, "all-gather")
    bwd = [x for x in gathers if x.name.endswith("(bwd)")]
    m = r.num_micro_batches
    assert len(bwd) == m * (len(units) - len(kept)) and len(gathers) == m * (2 * len(units) - len(kept))
    never = scenario(LLAMA7B_128, "deepspeed", 3, stage3_max_reuse_distance_numel=0)
    assert all(u.gather_bwd for u in build_plan(never).ranks[0].fsdp_units)
    assert item(memory_breakdown(never), "ZeRO-3 gathered parameters") < item(memory_breakdown(s),
                                                                               "ZeRO-3 gathered parameters")


def test_fsdp_shard_grad_op_gathers_once_per_micro_batch():
    data = deep_merge(base_scenario(), {"training": {"global_batch_size": 128}})
    full = simulate(scenario(data, "torch", 3))
    grad_op = simulate(scenario(data, "torch", 2))
    blocks = 12
    assert len(spans(full, "all-gather")) == 2 * (2 * blocks + 1)
    assert len(spans(grad_op, "all-gather")) == 2 * (blocks + 1)  # no re-gather for backward
    assert len(spans(grad_op, "reduce-scatter")) == len(spans(full, "reduce-scatter")) == 2 * (blocks + 1)


def test_fsdp_with_pipelines_keeps_the_stage_unsharded():
    # torch.distributed.pipelining with FSDP (torchtitan): no reshard between micro-batches, gradients
    # accumulated unsharded (in the reduction dtype) until the last one.
    s = scenario(deep_merge(LLAMA7B_128, {"parallelism": {"pp": 4}}), "torch", 3, reduce_in_fp32=True)
    m = memory_breakdown(s)
    stage_params = m.num_params
    assert item(m, "FSDP unsharded parameters") == 2 * stage_params
    assert item(m, "FSDP unsharded gradients") == 4 * stage_params
    r = simulate(s, trace=False)
    assert all(b.algorithm in ("ring", "nvls", "nvls-tree", "measured") for b in r.buckets)
    assert "FSDP FULL_SHARD with pp > 1" in " ".join(r.not_modelled)


def test_fsdp_prefetch_is_timed_and_sized_by_the_same_setting():
    data = deep_merge(base_scenario(), {"cluster": {"inter_node": {"nic_bandwidth_bytes_per_s": 2e9}}})
    times, gathered = {}, {}
    for ahead in (0, 1, 2):
        s = scenario(deep_merge(data, {"memory": {"fsdp_prefetch_layers": ahead}}), "torch", 3)
        times[ahead] = simulate(s, trace=False).step_time_s
        gathered[ahead] = item(memory_breakdown(s), "ZeRO-3 gathered parameters")
        assert {u.prefetch_fwd for u in build_plan(s).ranks[0].fsdp_units} == {ahead}
    assert times[0] > times[1] >= times[2] * (1 - 1e-9)  # gathering on demand exposes every gather
    assert gathered[0] < gathered[1] < gathered[2]


def test_one_rule_gives_the_plan_and_the_buffers():
    # The memory model's buffers are the simulator's buckets and units, for every implementation and stage.
    data = deep_merge(base_scenario(), {"training": {"global_batch_size": 64}})
    for impl, stages in (("torch", (0, 1, 2, 3)), ("deepspeed", (0, 1, 2, 3)), ("megatron", (0, 1))):
        for stage in stages:
            s = scenario(data, impl, stage)
            rank, m = build_plan(s).ranks[0], memory_breakdown(s)
            sizes = [b.size_bytes for b in rank.buckets]
            if impl == "torch" and stage <= 1:
                assert item(m, "DDP bucket copies") == sum(sizes)
            if impl == "deepspeed" and stage <= 2:
                assert item(m, "DeepSpeed flattened bucket") == max(sizes)
            if stage == 3:
                units = rank.fsdp_units
                root = rank.fsdp_root.gather.size_bytes if rank.fsdp_root else 0
                kept = sum(u.gather.size_bytes for u in units if not u.gather_bwd)
                size = [u.gather.size_bytes for u in units]
                window = max((size[k] + sum(size[k + 1:k + 1 + u.prefetch_fwd]) for k, u in enumerate(units)
                              if u.gather_bwd), default=0)
                assert item(m, "ZeRO-3 gathered parameters") == root + kept + window, (impl, stage)


@pytest.mark.parametrize(("keys", "message"), [
    ({"parallelism": {"zero_stage": 2}, "ddp": {"implementation": "megatron"}}, "Megatron-FSDP is not modelled"),
    ({"parallelism": {"zero_stage": 3, "pp": 2}, "ddp": {"implementation": "deepspeed"}},
     "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3"),
    ({"parallelism": {"zero_stage": 1}, "ddp": {"overlap_param_gather": True}}, "--overlap-param-gather"),
    ({"parallelism": {"zero_stage": 1}, "ddp": {"implementation": "megatron", "overlap_param_gather": True}},
     "overlap(False)"),
])
def test_combinations_a_framework_does_not_offer_are_refused(keys, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenario_from_dict(deep_merge(base_scenario(), keys))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 3_000_000), min_size=1, max_size=10),
       impl_stage=st.sampled_from([("torch", 0), ("torch", 1), ("torch", 2), ("torch", 3), ("deepspeed", 0),
                                   ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3), ("megatron", 0),
                                   ("megatron", 1)]),
       overlap=st.sampled_from([None, True, False]), micro=st.sampled_from([1, 3]),
       cap=st.sampled_from([None, 0.5, 4.0]))
def test_every_implementation_steps_within_its_bounds_on_parameter_lists(sizes, impl_stage, overlap, micro, cap):
    # Parameter lists reach the corners: parameters below DeepSpeed's persistence threshold (a ZeRO-3 unit
    # that gathers nothing), a bucket per parameter, one bucket for all.
    impl, stage = impl_stage
    r = simulate({"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
                  "model": {"parameters": [{"name": f"w{i}", "numel": n} for i, n in enumerate(sizes)]},
                  "parallelism": {"zero_stage": stage}, "training": {"global_batch_size": 16 * micro},
                  "ddp": {"implementation": impl, "overlap": overlap, "bucket_cap_mb": cap}}, trace=False)
    assert r.bounds.perfect_overlap_s <= r.step_time_s * (1 + 1e-9) <= r.bounds.no_overlap_s * (1 + 1e-9) ** 2
    assert sum(p.time_s for p in r.breakdown) == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.memory is not None and r.memory.total_bytes > 0


def test_kept_hash_is_the_fields_hash_and_is_not_pickled() -> None:
    """A rule keeps its hash after the first call (it keys the gradient memos; engine_caches.kept_fields_hash),
    as the hash of its fields, and leaves it out of a pickle: a string's hash differs between processes
    (`--jobs` workers)."""
    import dataclasses
    import pickle
    import subprocess
    import sys

    scenario = scenario_from_dict(base_scenario(parallelism={"zero_stage": 1}))
    obj = zero_rule(scenario)
    fields = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
    assert hash(obj) == hash(fields) == hash(obj)  # the second from the kept value
    other = dataclasses.replace(obj, stage=2)
    assert other != obj and hash(other) == hash(tuple(getattr(other, f.name) for f in dataclasses.fields(other)))
    data = pickle.dumps(obj)
    assert b"_hash" not in data and pickle.loads(data) == obj
    # In another process (another string hash seed) the unpickled object hashes as that process's fields do.
    code = ("import dataclasses, pickle, sys; r = pickle.loads(sys.stdin.buffer.read()); "
            "print(hash(r) == hash(tuple(getattr(r, f.name) for f in dataclasses.fields(r))))")
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True,
                          env={"PYTHONHASHSEED": "1"})
    assert done.stdout.strip() == b"True"


def test_a_group_hashes_its_shape_and_keys_costs_by_its_links_too() -> None:
    """A communicator hashes its shape, not its pydantic link tiers (simddp.topology.CommGroup.__hash__): equal
    groups hash alike, and a group of the same shape over another link is another key of the collective
    caches (told apart by ==), so its costs are its own. It pickles whole, as a `--jobs` worker reads it."""
    import dataclasses
    import pickle

    from simddp.collectives import collective_cost
    from simddp.topology import dp_group

    scenario = scenario_from_dict(base_scenario(parallelism={"zero_stage": 1}))
    group = dp_group(scenario)
    same = dataclasses.replace(group)
    assert same == group and same is not group and hash(same) == hash(group)
    slower = dataclasses.replace(group, inter=group.inter.model_copy(
        update={"nic_bandwidth_bytes_per_s": group.inter.nic_bandwidth_bytes_per_s / 4}))
    assert slower != group and hash(slower) == hash(group)  # one shape: the links tell them apart
    assert group.num_nodes > 1  # so the network's bandwidth counts
    fast, slow = collective_cost("all-reduce", 10**9, group), collective_cost("all-reduce", 10**9, slower)
    assert slow.time_s > fast.time_s and collective_cost("all-reduce", 10**9, same) is fast
    assert pickle.loads(pickle.dumps(group)) == group


def test_zero_redundancy_optimizer_partitions_whole_tensors_largest_first() -> None:
    """torch's ZeroRedundancyOptimizer._partition_parameters, by hand: tensors of 10, 7, 5, 4, 3 elements on 2 ranks
    go 10 -> r0, 7 -> r1, 5 -> r1 (7 < 10), 4 -> r0 (12 > 10), 3 -> r1 (12 < 14): the busiest holds 7 + 5 + 3 = 15."""
    from simddp.zero import zero_redundancy_share

    counts = tuple(((n, "float32"), 1) for n in (5, 10, 3, 7, 4))
    assert dict(zero_redundancy_share(counts, 2)) == {(7, "float32"): 1, (5, "float32"): 1, (3, "float32"): 1}
    assert dict(zero_redundancy_share(counts, 8)) == {(10, "float32"): 1}  # more ranks than tensors


@settings(max_examples=300, deadline=None)
@given(sizes=st.dictionaries(st.integers(0, 200), st.integers(1, 40), min_size=1, max_size=8),
       dp=st.integers(1, 64))
def test_zero_redundancy_loads_by_classes_equal_tensor_by_tensor(sizes: dict[int, int], dp: int) -> None:
    """zero_redundancy_busiest hands equal tensors to a whole class of least-loaded ranks at once: the busiest load
    equals the tensor-by-tensor partition's."""
    from simddp.zero import zero_redundancy_busiest, zero_redundancy_share

    counts = tuple(((n, "bfloat16"), c) for n, c in sizes.items())
    assert zero_redundancy_busiest(counts, dp) == sum(n * c for (n, _), c in zero_redundancy_share(counts, dp))


def test_torch_zero1_steps_and_holds_the_busiest_rank_s_partition() -> None:
    """Llama-2-7B at dp 128 under torch ZeRO-1: the busiest rank holds the 131,072,000-element embedding (the output
    layer another), 2.5x the even 52.6 M share; the optimizer step waits for it and its master weights and AdamW
    states are its own. Until 2026-11-29 both were an even 1/dp (1.47 ms, 200.8 MiB of master weights)."""
    import simddp
    from simddp.cli import default_scenario_path
    from simddp.compute import optimizer_step_s

    scenario = simddp.load_scenario(default_scenario_path())
    assert (scenario.dp, scenario.parallelism.zero_stage, scenario.ddp.implementation) == (128, 1, "torch")
    result = simddp.simulate(scenario, trace=False)
    embedding = 32000 * 4096
    assert result.optimizer_time_s == pytest.approx(
        optimizer_step_s(embedding, scenario.cluster.gpu, scenario.training, impl="foreach"), rel=1e-12)
    items = {i.name: i.size_bytes for i in result.memory.items}
    assert items["fp32 master weights"] == 4 * embedding and items["adamw states"] == 8 * embedding
    deepspeed = simddp.simulate(simddp.load_scenario(default_scenario_path(), ["ddp.implementation=deepspeed"]),
                                trace=False)  # DeepSpeed flattens and splits evenly
    assert {i.name: i.size_bytes for i in deepspeed.memory.items}["adamw states"] == -(-8 * 6_738_415_616 // 128)
