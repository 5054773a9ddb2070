"""One training step of a data-parallel GPU: compute stream, DDP buckets on one NCCL stream, optimizer.

Model (PyTorch DDP, Li et al., VLDB 2020, "PyTorch Distributed"): backward runs layer by layer in
reverse; a parameter's gradient is ready when its layer's weight-grad finishes; a bucket is all-reduced
once all its gradients are ready, buckets in index order on one stream, overlapping the rest of
backward; the optimizer steps after the last all-reduce. With gradient accumulation only the last
micro-step communicates (``no_sync`` on the others). ZeRO-1/2 reduce-scatter the buckets instead and
all-gather the updated parameters after a sharded optimizer step (Rajbhandari et al., SC'20).
"""

from __future__ import annotations

import simpy

from simddp.analytical import in_order_overlap_step_s, no_overlap_step_s, perfect_overlap_step_s
from simddp.bucketing import ddp_buckets
from simddp.collectives import collective_cost
from simddp.compute import optimizer_step_s, workload_timings
from simddp.config import ParameterSpec, Scenario
from simddp.results import BucketTiming, Bounds, Span, StepResult, Trace
from simddp.sim.processes import BucketPlan, StreamState, comm_stream, compute_stream
from simddp.topology import dp_group
from simddp.units import dtype_bytes
from simddp.workload import build_workload


def not_modelled(scenario: Scenario) -> list[str]:
    """What this scenario asks for that the step time does not yet include, said plainly."""
    par, notes = scenario.parallelism, []
    if par.tp > 1:
        notes.append(
            f"tp={par.tp}: compute is divided by tp, but tensor-parallel all-reduce/all-gather inside "
            "each layer is not timed"
        )
    if par.pp > 1:
        notes.append(
            f"pp={par.pp}: the most loaded stage is timed with its micro-batches back to back; the "
            f"{par.pipeline_schedule} bubble and activation send/recv are not timed"
        )
    if par.zero_stage == 3:
        notes.append(
            "zero_stage=3: timed as ZeRO-2 (gradient reduce-scatter, parameter all-gather after the step); "
            "per-layer parameter all-gathers in forward and backward are not timed"
        )
    return notes


def simulate_step(scenario: Scenario, trace: bool = True) -> StepResult:
    """Simulate one optimizer step of ``scenario`` and return its typed breakdown."""
    cluster, tr, ddp, par = scenario.cluster, scenario.training, scenario.ddp, scenario.parallelism
    gpu = cluster.gpu
    workload = build_workload(scenario)
    stages = range(workload.num_stages)
    timings_by_stage = {s: workload_timings(workload, gpu, tr, s) for s in stages}
    stage = max(stages, key=lambda s: sum(t.fwd_s + t.bwd_s for t in timings_by_stage[s]))
    timings = timings_by_stage[stage]
    layers = workload.stage_layers(stage)

    # Parameters of this stage, re-indexed locally as DDP on this rank would see them.
    global_ids = sorted({i for layer in layers for i in layer.param_indices})
    local = {g: k for k, g in enumerate(global_ids)}
    params = [_reduce_dtype(workload.parameters[g], ddp.reduce_in_fp32) for g in global_ids]
    ready_order = [local[g] for g in workload.grad_ready_order if g in local]
    buckets = ddp_buckets(params, ready_order, ddp.bucket_cap_mb)
    bucket_of = {p: b.index for b in buckets for p in b.param_indices}

    group = dp_group(scenario)
    op = "reduce-scatter" if par.zero_stage >= 1 else "all-reduce"
    algorithm = ddp.algorithm if op == "all-reduce" else ("ring" if ddp.algorithm == "tree" else "auto")
    if algorithm == "hierarchical" and op != "all-reduce":
        algorithm = "auto"
    plans = []
    for b in buckets:
        cost = collective_cost(op, b.size_bytes, group, algorithm)  # type: ignore[arg-type]
        plans.append(BucketPlan(b.index, b.size_bytes, len(b.param_indices), cost.time_s,
                                f"{cost.algorithm}/{cost.protocol}"))

    shard = scenario.dp if par.zero_stage >= 1 else 1
    opt_s = optimizer_step_s(_subset(workload, params), gpu, tr, shard=shard)
    gather_s = 0.0
    if par.zero_stage >= 1:
        param_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in _working(workload, global_ids))
        gather_s = collective_cost("all-gather", param_bytes, group).time_s
    tail_s = opt_s + gather_s + cluster.host_overhead_s

    # ---- simpy
    env = simpy.Environment()
    state = StreamState(interference=cluster.comm_compute_interference)
    spans: list[Span] = []
    ready_events = [env.event() for _ in buckets]
    remaining = [len(b.param_indices) for b in buckets]
    ready_at: dict[int, float] = {}
    timing_of: dict[int, tuple[float, float]] = {}

    def grad_ready(bucket_index: int) -> None:
        remaining[bucket_index] -= 1
        if remaining[bucket_index] == 0:
            ready_at[bucket_index] = env.now
            ready_events[bucket_index].succeed()

    grads_of_layer = [[bucket_of[local[g]] for g in layer.param_indices] for layer in layers]

    def record(plan: BucketPlan, start: float, end: float) -> None:
        timing_of[plan.index] = (start, end)

    def training_step(env: simpy.Environment) -> simpy.events.ProcessGenerator:
        compute = env.process(
            compute_stream(env, timings, scenario.num_micro_batches, grads_of_layer, grad_ready, spans, state)
        )
        comm = env.process(
            comm_stream(env, plans, ready_events, None if ddp.overlap else compute, record, spans, state)
        )
        yield compute & comm
        start = env.now
        yield env.timeout(opt_s)
        spans.append(Span(name="optimizer step", stream="compute", start_s=start, end_s=env.now))
        if gather_s:
            start = env.now
            yield env.timeout(gather_s)
            spans.append(Span(name="all-gather params", stream="comm", start_s=start, end_s=env.now))
        yield env.timeout(cluster.host_overhead_s)

    env.process(training_step(env))
    env.run()
    step_s = env.now

    # Compute time as run: the backward spans carry any interference slowdown.
    compute_s = scenario.num_micro_batches * sum(t.fwd_s + t.bwd_s for t in timings)
    compute_end_s = max((s.end_s for s in spans if s.stream == "compute" and s.name != "optimizer step"),
                        default=0.0)
    compute_s = max(compute_s, compute_end_s)
    costs = [p.cost_s for p in plans]
    readies = [ready_at[b.index] for b in buckets]
    comm_s = sum(costs) + gather_s
    bounds = Bounds(
        no_overlap_s=no_overlap_step_s(compute_s, costs, tail_s),
        perfect_overlap_s=perfect_overlap_step_s(compute_s, readies, costs, tail_s),
        in_order_overlap_s=in_order_overlap_step_s(compute_s, readies, costs, tail_s),
    )
    gbs = scenario.global_batch_size
    model_flop = workload.model_flop_per_sample * gbs
    one_gpu_s = compute_s + optimizer_step_s(_subset(workload, params), gpu, tr) + cluster.host_overhead_s
    return StepResult(
        scenario=scenario.name,
        model=scenario.model.name,
        cluster=cluster.preset or "custom",
        num_gpus=cluster.num_gpus,
        dp=scenario.dp,
        tp=par.tp,
        pp=par.pp,
        num_micro_batches=scenario.num_micro_batches,
        global_batch_size=gbs,
        step_time_s=step_s,
        compute_time_s=compute_s,
        optimizer_time_s=opt_s,
        host_overhead_s=cluster.host_overhead_s,
        comm_time_s=comm_s,
        exposed_comm_time_s=max(0.0, step_s - compute_s - opt_s - cluster.host_overhead_s),
        samples_per_s=gbs / step_s,
        tokens_per_s=gbs * tr.seq_len / step_s,
        mfu=model_flop / step_s / (cluster.num_gpus * gpu.peak_flop_per_s(tr.precision)),
        scaling_efficiency=one_gpu_s / step_s,
        num_params=sum(p.numel for p in params),
        buckets=[
            BucketTiming(
                index=b.index,
                size_bytes=b.size_bytes,
                num_params=len(b.param_indices),
                ready_s=ready_at[b.index],
                start_s=timing_of[b.index][0],
                end_s=timing_of[b.index][1],
                algorithm=plans[b.index].label.split("/")[0],
                protocol=plans[b.index].label.split("/")[1],
            )
            for b in buckets
        ],
        bounds=bounds,
        not_modelled=not_modelled(scenario) + workload.notes,
        trace=Trace(spans=spans) if trace else None,
    )


def _reduce_dtype(p: ParameterSpec, reduce_in_fp32: bool) -> ParameterSpec:
    if reduce_in_fp32 and p.dtype in ("bfloat16", "float16"):
        return p.model_copy(update={"dtype": "float32"})
    return p


def _working(workload, global_ids):  # type: ignore[no-untyped-def]
    return [workload.parameters[g] for g in global_ids]


def _subset(workload, params):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(workload, parameters=tuple(params))
