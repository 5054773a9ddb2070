"""The fast engine equals the full simpy simulation (issue 10): every number of the result, to 1e-9.

Generated over the cases the fast engine takes (data parallel: DDP, ZeRO-1/2/3 and FSDP, TP with every
overlap and sequence parallelism, Megatron's overlapped parameter gather, gradient accumulation, overlap on
and off, interference, gradient clipping, DDP's find_unused_parameters and static_graph with parameters
that get no gradient, several clusters, bucket caps and prefetch depths; pipelines of every
schedule, interleaving, TP and sequence parallelism, every ZeRO stage and data-parallel implementation,
with Megatron's synchronous send/recv and gradient reduction overlapped or not), and over
scenarios it declines, which must fall back to the simpy engine.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simddp import ScenarioError, simulate
from simddp.sim import build_plan
from simddp.sim.fast import supported

CLUSTERS = ["dgx-a100-80gb", "dgx-h100-80gb", "aws-p4d-24xlarge", "pcie-a100-80gb"]


def _equal(a: Any, b: Any, path: str = "", zero: float | None = None) -> None:
    """Every number equal to 1e-9 relative. A quantity that is zero in exact arithmetic (interference with
    i = 0) comes out as the rounding residue of thousands of additions, different in each engine: below
    ``zero`` seconds (1e-10 of the step) counts as zero."""
    if zero is None:
        zero = max(1e-12, 1e-10 * b["step_time_s"]) if isinstance(b, dict) and "step_time_s" in b else 1e-12
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _equal(a[k], b[k], f"{path}.{k}", zero)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{path}[{k}]", zero)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=zero), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _check(data: dict) -> bool:
    """Fast and exact agree; returns whether the fast engine took the scenario."""
    try:
        exact = simulate(data, trace=False, exact=True)
    except ScenarioError:
        return False
    fast = simulate(data, trace=False)
    _equal(fast.model_dump(exclude={"trace"}), exact.model_dump(exclude={"trace"}))
    from simddp.scenario_io import scenario_from_dict
    return supported(build_plan(scenario_from_dict(data)))


transformer = st.fixed_dictionaries({
    "num_layers": st.sampled_from([4, 8]), "hidden_size": st.sampled_from([512, 1024]), "num_heads": st.just(16),
    "ffn_hidden_size": st.just(4096), "vocab_size": st.just(32000), "gated_mlp": st.booleans(),
    "tied_embeddings": st.booleans()})


@st.composite
def data_parallel(draw: st.DrawFn) -> dict:
    nodes = draw(st.sampled_from([1, 2, 4]))
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    micro = draw(st.sampled_from([1, 2, 3]))
    tp = draw(st.sampled_from([1, 1, 2, 8]))
    dp = nodes * 8 // tp
    mbs = draw(st.sampled_from([1, 2]))
    implementation = draw(st.sampled_from(["torch", "deepspeed", "megatron"]))
    overlap = draw(st.sampled_from([True, False, None]))
    return {
        "cluster": {"preset": draw(st.sampled_from(CLUSTERS)), "num_nodes": nodes,
                    "comm_compute_interference": draw(st.sampled_from([0.0, 0.189, 0.6]))},
        "model": {"transformer": draw(transformer)},
        "parallelism": {"zero_stage": zero, "tp": tp, "sequence_parallel": tp > 1 and draw(st.booleans()),
                        "tp_comm_overlap": draw(st.sampled_from(["none", "backward", "full"]))},
        "training": {"micro_batch_size": mbs, "global_batch_size": micro * dp * mbs,
                     "seq_len": draw(st.sampled_from([256, 1024])),
                     "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "precision": draw(st.sampled_from(["bf16-mixed", "fp32"])),
                     "grad_clip_norm": draw(st.sampled_from([None, 1.0]))},
        "ddp": {"implementation": implementation, "overlap": overlap,
                "bucket_cap_mb": draw(st.sampled_from([0.5, 4, 25])),
                "reduce_in_fp32": draw(st.booleans()),
                # Megatron's --overlap-param-gather (distributed optimizer with overlapped reduction)
                "overlap_param_gather": (implementation == "megatron" and zero == 1 and overlap is True
                                         and draw(st.booleans())),
                "stage3_prefetch_numel": draw(st.sampled_from([None, 0, 10**6])),
                # FSDP2's set_separate_reduce_scatter_group: the reduce-scatters beside the gathers
                "separate_reduce_scatter_group": ((zero == 3 and implementation != "megatron")
                                                  or (zero == 2 and implementation == "torch")) and draw(st.booleans()),
                "find_unused_parameters": draw(st.booleans()), "static_graph": draw(st.booleans())},
        "memory": {"fsdp_prefetch_layers": draw(st.sampled_from([0, 1, 2]))},
    }


@st.composite
def ddp_knobs(draw: st.DrawFn) -> dict:
    """torch DDP on a parameter list with parameters that get no gradient (find_unused_parameters or
    static_graph), gradient accumulation and clipping."""
    sizes = draw(st.lists(st.sampled_from([2**14, 2**18, 2**20, 3 * 2**20]), min_size=2, max_size=12))
    unused = draw(st.lists(st.integers(0, len(sizes) - 2), max_size=3, unique=True))
    nodes = draw(st.sampled_from([1, 2]))
    find, static = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    return {
        "cluster": {"preset": draw(st.sampled_from(CLUSTERS)), "num_nodes": nodes,
                    "comm_compute_interference": draw(st.sampled_from([0.0, 0.189]))},
        "model": {"parameters": [{"name": f"w{i}", "numel": n, "dtype": "float32"} for i, n in enumerate(sizes)],
                  "unused_parameters": sorted(unused) or None},
        "training": {"micro_batch_size": 8, "seq_len": 1, "precision": "fp32",
                     "global_batch_size": 8 * nodes * 8 * draw(st.sampled_from([1, 2])),
                     "grad_clip_norm": draw(st.sampled_from([None, 1.0]))},
        "ddp": {"find_unused_parameters": find, "static_graph": static,
                "bucket_cap_mb": draw(st.sampled_from([1, 4, 25])), "overlap": draw(st.sampled_from([True, None]))},
        # ZeRO-1 under torch is ZeroRedundancyOptimizer stepping a DDP model: the same knobs
        "parallelism": {"zero_stage": draw(st.sampled_from([0, 1]))},
    }


@st.composite
def pipelines(draw: st.DrawFn) -> dict:
    nodes = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([1, 2, 8]))
    pp = draw(st.sampled_from([2, 4]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b"]))
    v = 2 if schedule == "interleaved-1f1b" else 1
    micro = pp * draw(st.sampled_from([1, 2, 3]))
    dp = nodes * 8 // (tp * pp)
    return {
        "cluster": {"preset": draw(st.sampled_from(CLUSTERS)), "num_nodes": nodes,
                    "comm_compute_interference": draw(st.sampled_from([0.0, 0.189]))},
        "model": {"transformer": draw(transformer)},
        "parallelism": {"tp": tp, "pp": pp, "pipeline_schedule": schedule, "virtual_stages": v,
                        "sequence_parallel": tp > 1 and draw(st.booleans()),
                        "tp_comm_overlap": draw(st.sampled_from(["none", "backward", "full"])),
                        "zero_stage": draw(st.sampled_from([0, 1, 2, 3]))},
        "training": {"micro_batch_size": 1, "global_batch_size": max(1, micro * dp), "seq_len": 512,
                     "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "grad_clip_norm": draw(st.sampled_from([None, 1.0]))},
        # None: the implementation's default (torch overlaps: the fast engine runs the schedule's tail, from each
        # rank's first release of gradients, in simpy)
        "ddp": {"overlap": draw(st.sampled_from([False, None])),
                "implementation": draw(st.sampled_from(["torch", "deepspeed", "megatron"]))},
    }


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_parallel())
def test_fast_equals_simpy_data_parallel(data: dict) -> None:
    taken = _check(data)
    # Megatron has no ZeRO-2 or ZeRO-3 (the scenario is refused)
    assert taken or (data["parallelism"]["zero_stage"] >= 2 and data["ddp"]["implementation"] == "megatron")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ddp_knobs())
def test_fast_equals_simpy_ddp_knobs(data: dict) -> None:
    assert _check(data)


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines())
def test_fast_equals_simpy_pipelines(data: dict) -> None:
    _check(data)


def test_declined_scenarios_fall_back_to_simpy() -> None:
    # Overlapped pipeline send/recv, gloo: the simpy engine answers, and equally.
    for extra in ({"parallelism": {"pp": 2, "pp_p2p_overlap": True}}, {"ddp": {"backend": "gloo"}}):
        base: dict = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"},
                      "training": {"seq_len": 512, "micro_batch_size": 2}}
        base.update(extra)
        assert _check(base) is False


@st.composite
def deep_pipelines(draw: st.DrawFn) -> dict:
    """:func:`pipelines` with 4 or 8 stages over 8 to 16 blocks (stages of one or two blocks, even or not)."""
    data = draw(pipelines())
    pp = draw(st.sampled_from([4, 8]))
    tp = data["parallelism"]["tp"]
    nodes = max(data["cluster"]["num_nodes"], tp * pp // 8)
    data["cluster"]["num_nodes"] = nodes
    data["parallelism"]["pp"] = pp
    data["model"]["transformer"]["num_layers"] = draw(st.sampled_from([8, 12, 16]))
    micro = pp * draw(st.sampled_from([1, 2]))
    data["training"]["global_batch_size"] = micro * nodes * 8 // (tp * pp)
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deep_pipelines())
def test_middle_ranks_of_one_shape_plan_as_each_would_alone(data: dict) -> None:
    """build_plan copies the plan of a middle pipeline rank to later ranks of its shape (Workload.rank_twins),
    and the memory model its states and buffers: every rank's plan, and the memory breakdown, equal those
    when each rank is worked out itself."""
    from unittest import mock

    from simddp import engine_caches
    from simddp.memory import memory_breakdown
    from simddp.scenario_io import scenario_from_dict
    from simddp.workload import Workload

    try:
        scenario = scenario_from_dict(data)
    except ScenarioError:
        return
    engine_caches.clear()
    shared, shared_memory = build_plan(scenario), memory_breakdown(scenario)
    engine_caches.clear()  # a fresh workload: nothing the first plan kept in its memo
    with mock.patch.object(Workload, "rank_twins", lambda self, pp: [(r, 0) for r in range(pp)]):
        alone, alone_memory = build_plan(scenario), memory_breakdown(scenario)
    assert shared_memory == alone_memory  # the memory model's stages too
    assert len({id(r.plans) for r in alone.ranks}) == len(alone.ranks) or scenario.parallelism.pp == 1
    assert shared.ranks == alone.ranks
    for a, b in zip(shared.ranks, alone.ranks, strict=True):
        assert (a.grads.global_ids, a.grads.params, a.grads.ready_order) == (
            b.grads.global_ids, b.grads.params, b.grads.ready_order)
    engine_caches.clear()


def test_a_pipeline_plans_each_shape_of_middle_rank_once() -> None:
    from simddp.scenario_io import scenario_from_dict

    plan = build_plan(scenario_from_dict({
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8}, "model": {"preset": "gpt3-175b"},
        "parallelism": {"tp": 8, "pp": 8, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 3},
        "training": {"micro_batch_size": 1, "global_batch_size": 64, "seq_len": 2048}}))
    # First rank (embedding), last rank (output layer), and the six middle ranks of one shape planned once.
    assert len({id(r.plans) for r in plan.ranks}) == 3
    assert [sorted(r.fwd_alone_s) for r in plan.ranks] == [[r, r + 8, r + 16] for r in range(8)]
    assert plan.ranks[3].layers[0].name != plan.ranks[2].layers[0].name


@pytest.mark.parametrize("change", ["sizes", "ready order"])
def test_a_middle_rank_of_one_shape_but_other_parameters_is_planned_itself(change: str) -> None:
    """Ranks alike in their layers but not in their parameters' sizes or gradient-ready order are not copies
    (Workload.rank_twins checks both for the plan and the memory model)."""
    from dataclasses import replace
    from unittest import mock

    from simddp.memory import memory_breakdown
    from simddp.scenario_io import scenario_from_dict
    from simddp.workload import Param, Workload, build_workload

    scenario = scenario_from_dict({
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"},
        "parallelism": {"pp": 4}, "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": 512}})
    base = build_workload(scenario)
    owned = [g for la in base.rank_layers(2, 4) for g in la.param_indices]
    if change == "sizes":
        params = list(base.parameters)
        params[owned[0]] = Param(params[owned[0]].name, params[owned[0]].numel * 3, params[owned[0]].dtype)
        workload = replace(base, parameters=tuple(params), memo={}, shared={})
    else:  # two of its parameters' gradients become ready the other way round
        ready = list(base.grad_ready_order)
        i, j = ready.index(owned[0]), ready.index(owned[1])
        ready[i], ready[j] = ready[j], ready[i]
        workload = replace(base, grad_ready_order=tuple(ready), memo={}, shared={})
    assert base.rank_twins(4)[2][0] == 1  # the same shape as rank 1, and before the change alike it
    assert workload.rank_twins(4)[2] == (2, 0)  # after it, its own kind
    plan, memory = build_plan(scenario, workload), memory_breakdown(scenario, workload)
    with mock.patch.object(Workload, "rank_twins", lambda self, pp: [(r, 0) for r in range(pp)]):
        fresh = replace(workload, memo={}, shared={})
        alone, alone_memory = build_plan(scenario, fresh), memory_breakdown(scenario, fresh)
    assert plan.ranks == alone.ranks
    assert memory == alone_memory
    if change != "sizes":
        return
    assert (memory_breakdown(scenario, workload, stage=2).params_bytes
            > memory_breakdown(scenario, workload, stage=1).params_bytes)
    assert sum(b.size_bytes for b in plan.ranks[2].buckets) > sum(b.size_bytes for b in plan.ranks[1].buckets)


@pytest.mark.parametrize("cap_mb", [1, 25, 10_000])
def test_data_parallel_backward_runs_are_its_layers_between_releases(cap_mb: int) -> None:
    """The fast engine times backward as runs of layers, each ending where a layer completes buckets: the runs
    hold every layer's work, each bucket is released once, at the end of its run, in the layers' order."""
    import itertools

    from simddp.scenario_io import scenario_from_dict
    from simddp.sim.fast import _backward

    plan = build_plan(scenario_from_dict({
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 2}, "model": {"preset": "gpt2-xl"},
        "ddp": {"bucket_cap_mb": cap_mb}, "training": {"micro_batch_size": 2, "global_batch_size": 64}}))
    rank = plan.ranks[0]
    runs, costs = _backward(rank)
    work = rank.plans.backward_work
    assert sum(w for w, _, _ in runs) == pytest.approx(sum(w for w, _ in work), rel=1e-12)
    assert sum(r for _, r, _ in runs) == pytest.approx(sum(r for _, r in work), rel=1e-12)
    assert all(released for _, _, released in runs[:-1])  # only the last run may end without a release
    released = list(itertools.chain.from_iterable(b for _, _, b in runs))
    assert sorted(released) == list(range(len(rank.buckets))) == list(range(len(costs)))
    # A run ends at the layer that gives its buckets their last gradient, and releases exactly those buckets,
    # runs in backward order.
    last_layer: dict[int, int] = {}
    for position, buckets in enumerate(reversed(rank.bucket_of_layer)):
        for b in buckets:
            last_layer[b] = position
    by_layer: dict[int, set[int]] = {}
    for b, position in last_layer.items():
        by_layer.setdefault(position, set()).add(b)
    assert [set(r[2]) for r in runs if r[2]] == [by_layer[k] for k in sorted(by_layer)]
    assert _backward(rank)[0] is runs  # once per layer plans and gradients
