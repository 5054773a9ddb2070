"""One training step: compute streams, DDP buckets on one NCCL stream per rank, pipeline, optimizer.

Model (PyTorch DDP, Li et al., VLDB 2020, "PyTorch Distributed"): backward runs layer by layer in
reverse; a parameter's gradient is ready when its layer's weight-grad finishes; a bucket is all-reduced
once all its gradients are ready, buckets in index order on one stream, overlapping the rest of
backward; the optimizer steps after the last all-reduce. With gradient accumulation only the last
micro-step communicates (``no_sync`` on the others). ZeRO-1/2 reduce-scatter the buckets instead and
all-gather the updated parameters after a sharded optimizer step (Rajbhandari et al., SC'20).

Tensor parallelism (Megatron-LM) adds blocking all-reduces (or all-gather + reduce-scatter with
sequence parallelism) of one activation inside each block, on the compute stream. Pipeline parallelism
runs the schedules of :mod:`simddp.sim.pipeline`, one process per pipeline rank, with activation and
gradient send/recv between stages; each rank's gradients become ready during its last backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import simpy

from simddp.analytical import in_order_overlap_step_s, no_overlap_step_s, perfect_overlap_step_s
from simddp.bucketing import Bucket, ddp_buckets
from simddp.collectives import Op, collective_cost
from simddp.compute import LayerTiming, layer_timing, optimizer_step_s
from simddp.config import ParameterSpec, Scenario
from simddp.memory import memory_breakdown
from simddp.results import Bounds, BucketTiming, Span, StepResult, Trace
from simddp.sim.fsdp import FsdpUnit, fsdp_micro_step
from simddp.sim.pipeline import PipelineClock, PipeOp, pipeline_rank, schedule
from simddp.sim.processes import BucketPlan, StreamState, comm_stream, compute_stream
from simddp.topology import dp_group, group, tp_group
from simddp.units import dtype_bytes
from simddp.workload import Layer, Workload, build_workload, grad_reduce_spec


def not_modelled(scenario: Scenario) -> list[str]:
    """What this scenario asks for that the step time does not include, said plainly."""
    par, notes = scenario.parallelism, []
    if par.zero_stage == 3 and par.pp > 1:
        notes.append(
            "zero_stage=3 with pp > 1: timed as ZeRO-2 (gradient reduce-scatter, parameter all-gather after "
            "the step); per-layer parameter all-gathers are only timed without pipeline parallelism"
        )
    if par.zero_stage >= 1 and scenario.ddp.algorithm != "auto":
        notes.append(
            f"ddp.algorithm={scenario.ddp.algorithm} applies to all-reduce; ZeRO's reduce-scatter and "
            "all-gather use NCCL's own choice (ring)"
        )
    if par.tp > 1 and scenario.model.transformer is None:
        notes.append(f"tp={par.tp}: tensor-parallel collectives are only timed for transformer models")
    if par.pp > 1 and scenario.model.transformer is None:
        notes.append(f"pp={par.pp}: activation send/recv between stages is not timed for parameter-list models")
    return notes


@dataclass
class _Rank:
    """One pipeline rank (all dp ranks of it behave the same): its layers, buckets and streams."""

    index: int
    layers: tuple[Layer, ...]
    timings: list[LayerTiming]
    params: list[ParameterSpec]
    local: dict[int, int]
    buckets: list[Bucket]
    plans: list[BucketPlan]
    state: StreamState
    ready_events: list[simpy.Event]
    remaining: list[int]
    ready_at: dict[int, float]
    timing_of: dict[int, tuple[float, float]]
    opt_s: float = 0.0
    gather_s: float = 0.0
    compute_end_s: float = 0.0
    end_s: float = 0.0
    rounds: int = 1  # micro-batches whose gradients are communicated
    fsdp_units: list[FsdpUnit] = field(default_factory=list)
    _bucket_of: dict[int, int] | None = None

    def grads_of(self, layer: Layer) -> list[int]:
        """The bucket of each of the layer's gradients (one entry per gradient)."""
        if self._bucket_of is None:
            self._bucket_of = {p: b.index for b in self.buckets for p in b.param_indices}
        return [self._bucket_of[self.local[g]] for g in layer.param_indices]

    def grad_ready(self, env: simpy.Environment) -> Callable[[int], None]:
        def ready(bucket_index: int) -> None:
            self.remaining[bucket_index] -= 1
            if self.remaining[bucket_index] == 0:
                self.ready_at[bucket_index] = env.now
                self.ready_events[bucket_index].succeed()

        return ready

    @property
    def busy_s(self) -> float:
        return sum(t.compute_s + t.tp_comm_s for t in self.timings)


def _timings(scenario: Scenario, layers: tuple[Layer, ...]) -> list[LayerTiming]:
    """Layer timings with tensor-parallel collectives (blocking, on the compute stream) added."""
    tr = scenario.training
    out = []
    tp = tp_group(scenario)
    gpu = scenario.cluster.gpu
    if scenario.model.matmul_efficiency is not None:
        gpu = gpu.model_copy(update={"matmul_efficiency": scenario.model.matmul_efficiency})
    for layer in layers:
        t = layer_timing(layer, gpu, tr)
        if scenario.parallelism.tp > 1 and (layer.tp_fwd_comm_bytes or layer.tp_bwd_comm_bytes):
            fwd = collective_cost("all-reduce", layer.tp_fwd_comm_bytes, tp).time_s
            bwd = collective_cost("all-reduce", layer.tp_bwd_comm_bytes, tp).time_s
            redo = fwd if (tr.recompute == "full" and layer.is_block) else 0.0
            t = replace(t, tp_fwd_s=fwd, tp_bwd_s=bwd, recompute_tp_s=redo)
        out.append(t)
    return out


@dataclass(frozen=True)
class RankGradients:
    """What DDP on one pipeline rank sees: its parameters (in the reduction dtype), ready order, buckets."""

    global_ids: list[int]
    params: list[ParameterSpec]
    ready_order: list[int]
    buckets: list[Bucket]


def rank_gradients(scenario: Scenario, workload: Workload, index: int = 0) -> RankGradients:
    """Parameters and DDP buckets of pipeline rank ``index`` (its tp shard), as the simulator uses them."""
    ddp = scenario.ddp
    layers = workload.rank_layers(index, scenario.parallelism.pp)
    global_ids = sorted({i for layer in layers for i in layer.param_indices})
    local = {g: k for k, g in enumerate(global_ids)}
    params = [grad_reduce_spec(workload.parameters[g], ddp.reduce_in_fp32) for g in global_ids]
    ready_order = [local[g] for g in workload.grad_ready_order if g in local]
    buckets = ddp_buckets(params, ready_order, ddp.bucket_cap_mb) if params else []
    return RankGradients(global_ids, params, ready_order, buckets)


def _make_rank(scenario: Scenario, workload: Workload, index: int, env: simpy.Environment) -> _Rank:
    par, tr, gpu = scenario.parallelism, scenario.training, scenario.cluster.gpu
    layers = workload.rank_layers(index, par.pp)
    grads = rank_gradients(scenario, workload, index)
    global_ids, params, buckets = grads.global_ids, grads.params, grads.buckets
    local = {g: k for k, g in enumerate(global_ids)}
    working = [workload.parameters[g] for g in global_ids]
    ddp = scenario.ddp

    dp = dp_group(scenario)
    op: Op = "reduce-scatter" if par.zero_stage >= 1 else "all-reduce"
    algorithm = ddp.algorithm if op == "all-reduce" else "auto"
    plans = []
    for b in buckets:
        cost = collective_cost(op, b.size_bytes, dp, algorithm)
        plans.append(BucketPlan(b.index, b.size_bytes, len(b.param_indices), cost.time_s,
                                f"{cost.algorithm}/{cost.protocol}"))
    shard = scenario.dp if par.zero_stage >= 1 else 1
    # ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch (DeepSpeed); DDP and
    # ZeRO-1 accumulate locally (no_sync) and communicate on the last micro-batch only.
    rounds = scenario.num_micro_batches if (par.zero_stage == 2 and par.pp == 1) else 1
    stage_workload = replace(workload, parameters=tuple(params))
    opt_s = optimizer_step_s(stage_workload, gpu, tr, shard=shard) if params else 0.0
    gather_s = 0.0
    if par.zero_stage >= 1 and params and not (par.zero_stage == 3 and par.pp == 1):
        gather_s = collective_cost("all-gather", sum(p.numel * dtype_bytes(p.dtype) for p in working), dp).time_s
    return _Rank(
        index=index,
        layers=layers,
        timings=_timings(scenario, layers),
        params=params,
        local=local,
        buckets=buckets,
        plans=plans,
        state=StreamState(interference=scenario.cluster.comm_compute_interference),
        rounds=rounds,
        ready_events=[env.event() for _ in range(rounds) for _ in buckets],
        remaining=[len(b.param_indices) for _ in range(rounds) for b in buckets],
        ready_at={},
        timing_of={},
        opt_s=opt_s,
        gather_s=gather_s,
    )


def _finish(env: simpy.Environment, rank: _Rank, compute: simpy.Event, comm: simpy.Event, spans: list[Span],
            suffix: str) -> simpy.events.ProcessGenerator:
    """After this rank's compute and gradient communication: optimizer step, then the ZeRO all-gather."""
    yield compute
    rank.compute_end_s = env.now
    yield comm
    start = env.now
    yield env.timeout(rank.opt_s)
    spans.append(Span(name="optimizer step", stream=f"compute{suffix}", start_s=start, end_s=env.now))
    if rank.gather_s:
        start = env.now
        yield env.timeout(rank.gather_s)
        spans.append(Span(name="all-gather params", stream=f"comm{suffix}", start_s=start, end_s=env.now))
    rank.end_s = env.now


def simulate_step(scenario: Scenario, trace: bool = True) -> StepResult:
    """Simulate one optimizer step of ``scenario`` and return its typed breakdown."""
    from simddp.limits import check_simulation_size

    check_simulation_size(scenario)  # a pipeline or ZeRO-3 step simulates every micro-batch: bound it
    cluster, tr, ddp, par = scenario.cluster, scenario.training, scenario.ddp, scenario.parallelism
    workload = build_workload(scenario)
    env = simpy.Environment()
    spans: list[Span] = []
    ranks = [_make_rank(scenario, workload, r, env) for r in range(par.pp)]
    m = scenario.num_micro_batches

    fsdp = par.zero_stage == 3 and par.pp == 1
    if fsdp:
        _run_fsdp(env, scenario, workload, ranks[0], spans)
    elif par.pp == 1:
        rank = ranks[0]

        def record(plan: BucketPlan, start: float, end: float) -> None:
            rank.timing_of[plan.index] = (start, end)

        nb = len(rank.buckets)
        compute = env.process(compute_stream(env, rank.timings, m, [rank.grads_of(la) for la in rank.layers],
                                             rank.grad_ready(env), spans, rank.state, rank.rounds, nb))
        plans = [replace(p, index=k * nb + p.index) for k in range(rank.rounds) for p in rank.plans]
        comm = env.process(comm_stream(env, plans, rank.ready_events, None if ddp.overlap else compute,
                                       record, spans, rank.state))
        env.process(_finish(env, rank, compute, comm, spans, ""))
    else:
        _run_pipeline(env, scenario, workload, ranks, spans)
    env.run()
    step_s = max(r.end_s for r in ranks) + cluster.host_overhead_s
    if step_s <= 0:
        raise ValueError("the step takes no time: every layer has zero FLOP and no measured time")

    # Report the rank that finishes last (ties: the busiest).
    rank = max(ranks, key=lambda r: (r.end_s, r.busy_s))
    last = (rank.rounds - 1) * len(rank.buckets)  # report the last communicating micro-batch
    costs = [p.cost_s for p in rank.plans]
    readies = [rank.ready_at[last + b.index] for b in rank.buckets]
    compute_s = m * sum(t.compute_s for t in rank.timings)
    tp_comm_s = m * sum(t.tp_comm_s for t in rank.timings)
    tail_s = rank.opt_s + rank.gather_s + cluster.host_overhead_s
    comm_s = rank.rounds * sum(costs) + rank.gather_s
    # Waiting on the reported rank: with a pipeline, idle time inside the schedule is the bubble (and
    # send/recv); otherwise (DDP, FSDP) any wait inside or after the compute timeline is communication.
    pre_tail_s = rank.end_s - rank.opt_s - rank.gather_s
    if par.pp > 1:
        bubble_s = max(0.0, rank.compute_end_s - compute_s - tp_comm_s)
        exposed_dp_s = max(0.0, pre_tail_s - rank.compute_end_s) + rank.gather_s
    else:
        bubble_s = 0.0
        exposed_dp_s = max(0.0, pre_tail_s - compute_s - tp_comm_s) + rank.gather_s
    if fsdp:
        # Every micro-batch gathers each unit twice and reduce-scatters it once.
        comm_s = m * sum(u.gather_s * 2 + u.reduce_s for u in rank.fsdp_units)
    if fsdp or rank.rounds > 1:
        bounds = Bounds(
            no_overlap_s=compute_s + tp_comm_s + comm_s + tail_s,
            perfect_overlap_s=max(compute_s + tp_comm_s, comm_s) + tail_s,
            in_order_overlap_s=None,
        )
    else:
        # Bounds take compute without interference; with a pipeline, its timeline (bubbles included).
        end = rank.compute_end_s if par.pp > 1 else compute_s + tp_comm_s
        bounds = Bounds(
            no_overlap_s=no_overlap_step_s(end, costs, tail_s),
            perfect_overlap_s=perfect_overlap_step_s(end, readies, costs, tail_s),
            in_order_overlap_s=in_order_overlap_step_s(end, readies, costs, tail_s),
        )
    gbs = scenario.global_batch_size
    gpu = cluster.gpu
    # The same per-GPU work (including a sharded optimizer step) without communication or bubbles.
    one_gpu_s = compute_s + rank.opt_s + cluster.host_overhead_s
    return StepResult(
        scenario=scenario.name,
        model=scenario.model.name,
        cluster=cluster.preset or "custom",
        num_gpus=cluster.num_gpus,
        dp=scenario.dp,
        tp=par.tp,
        pp=par.pp,
        num_micro_batches=m,
        global_batch_size=gbs,
        step_time_s=step_s,
        compute_time_s=compute_s,
        optimizer_time_s=rank.opt_s,
        host_overhead_s=cluster.host_overhead_s,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_dp_s + tp_comm_s,
        tp_comm_time_s=tp_comm_s,
        pipeline_bubble_time_s=bubble_s,
        samples_per_s=gbs / step_s,
        tokens_per_s=gbs * tr.seq_len / step_s,
        mfu=workload.model_flop_per_sample * gbs / step_s / (cluster.num_gpus * gpu.peak_flop_per_s(tr.precision)),
        scaling_efficiency=one_gpu_s / step_s,
        num_params=sum(p.numel for p in rank.params),
        reported_rank=f"pipeline stage {rank.index} of {par.pp}" if par.pp > 1 else "every rank (data parallel)",
        buckets=[
            BucketTiming(
                index=b.index,
                size_bytes=b.size_bytes,
                num_params=len(b.param_indices),
                ready_s=rank.ready_at[last + b.index],
                start_s=rank.timing_of[last + b.index][0],
                end_s=rank.timing_of[last + b.index][1],
                algorithm=rank.plans[b.index].label.split("/")[0],
                protocol=rank.plans[b.index].label.split("/")[1],
            )
            for b in rank.buckets
        ],
        bounds=bounds,
        not_modelled=not_modelled(scenario) + workload.notes,
        memory=memory_breakdown(scenario, workload),
        trace=Trace(spans=spans) if trace else None,
    )


def _run_pipeline(
    env: simpy.Environment, scenario: Scenario, workload: Workload, ranks: list[_Rank], spans: list[Span]
) -> None:
    """Start one process per pipeline rank running its schedule, plus its DP comm and finish processes."""
    par, ddp = scenario.parallelism, scenario.ddp
    p, v, m = par.pp, par.virtual_stages, scenario.num_micro_batches
    clock = PipelineClock.create(env)
    neighbour = group(scenario.cluster, 2, stride=par.tp * scenario.dp)
    p2p_bytes = workload.boundary_activation_bytes
    p2p_s = collective_cost("send-recv", p2p_bytes, neighbour).time_s if p2p_bytes else 0.0

    for rank in ranks:
        suffix = f" {rank.index}"
        by_stage: dict[int, list[int]] = {}
        for i, layer in enumerate(rank.layers):
            by_stage.setdefault(layer.stage, []).append(i)
        fwd_s = {s: sum(rank.timings[i].fwd_total_s for i in idx) for s, idx in by_stage.items()}
        bwd_s = {s: sum(rank.timings[i].bwd_s for i in idx) for s, idx in by_stage.items()}
        ready = rank.grad_ready(env)
        grads = [rank.grads_of(la) for la in rank.layers]

        def run_op(op: PipeOp, last: bool, rank: _Rank = rank, by_stage=by_stage, fwd_s=fwd_s, bwd_s=bwd_s,
                   ready=ready, grads=grads) -> simpy.events.ProcessGenerator:
            if op.kind == "F":
                yield env.timeout(fwd_s.get(op.virtual_stage, 0.0))
                return
            if not last:
                yield env.timeout(bwd_s.get(op.virtual_stage, 0.0) * rank.state.scale())
                return
            # The last backward of this virtual stage: layer by layer, releasing gradients to DDP.
            for i in reversed(by_stage.get(op.virtual_stage, [])):
                yield env.timeout(rank.timings[i].bwd_s * rank.state.scale())
                for b in grads[i]:
                    ready(b)

        def record(plan: BucketPlan, start: float, end: float, rank: _Rank = rank) -> None:
            rank.timing_of[plan.index] = (start, end)

        ops = schedule(par.pipeline_schedule, p, m, rank.index, v)
        compute = env.process(pipeline_rank(env, rank.index, ops, p * v, clock, run_op, lambda op: p2p_s, spans))
        comm = env.process(comm_stream(env, rank.plans, rank.ready_events, None if ddp.overlap else compute,
                                       record, spans, rank.state, stream=f"comm{suffix}"))
        env.process(_finish(env, rank, compute, comm, spans, suffix))


def _fsdp_units(scenario: Scenario, rank: _Rank) -> list[FsdpUnit]:
    """One unit per transformer block (root unit: embeddings, head), or per layer of other models."""
    groups: dict[str, list[int]] = {}
    for i, layer in enumerate(rank.layers):
        parts = layer.name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 2 else layer.name
        if scenario.model.transformer is not None and not layer.name.startswith("layers."):
            key = "embed" if i == 0 else "head"
        groups.setdefault(key, []).append(i)
    dp = dp_group(scenario)
    units = []
    for k, (name, idx) in enumerate(groups.items()):
        gids = sorted({g for i in idx for g in rank.layers[i].param_indices})
        grad_bytes = sum(rank.params[rank.local[g]].numel * dtype_bytes(rank.params[rank.local[g]].dtype)
                         for g in gids)
        working = sum(p.numel * dtype_bytes(p.dtype) for p in (rank.params[rank.local[g]] for g in gids))
        gather = collective_cost("all-gather", working, dp).time_s if gids else 0.0
        reduce = collective_cost("reduce-scatter", grad_bytes, dp).time_s if gids else 0.0
        units.append(FsdpUnit(k, name, tuple(idx), gather, reduce, grad_bytes))
    return units


def _run_fsdp(env: simpy.Environment, scenario: Scenario, workload: Workload, rank: _Rank,
              spans: list[Span]) -> None:
    """ZeRO-3 / FSDP: every micro-batch gathers and reduce-scatters unit by unit; then the sharded step."""
    rank.fsdp_units = _fsdp_units(scenario, rank)
    gather_lock, reduce_lock = simpy.Resource(env, 1), simpy.Resource(env, 1)
    m = scenario.num_micro_batches
    rank.buckets = [
        Bucket(index=u.index, param_indices=[], size_bytes=u.grad_bytes, dtype="mixed", cap_bytes=0)
        for u in rank.fsdp_units
    ]
    rank.plans = [BucketPlan(u.index, u.grad_bytes, 0, u.reduce_s, "reduce-scatter/unit") for u in rank.fsdp_units]

    def record(unit: FsdpUnit, ready: float, start: float, end: float) -> None:
        rank.ready_at[unit.index] = ready
        rank.timing_of[unit.index] = (start, end)

    def micro_steps() -> simpy.events.ProcessGenerator:
        for k in range(m):
            yield from fsdp_micro_step(env, rank.timings, rank.fsdp_units, gather_lock, reduce_lock, spans,
                                       record if k == m - 1 else None, scenario.cluster.comm_compute_interference)

    compute = env.process(micro_steps())
    done = env.event().succeed()
    env.process(_finish(env, rank, compute, done, spans, ""))
