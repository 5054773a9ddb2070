"""Everything the step simulation needs, computed once from a scenario: per pipeline rank its layers with
kernel times and tensor-parallel collectives, its DDP buckets and their collectives, pipeline send/recv,
FSDP units, optimizer and parameter all-gather. Plain dataclasses: no pydantic object is built while the
simulation runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from simddp.bucketing import Bucket, ddp_buckets, ddp_initial_buckets
from simddp.collectives import CollectiveCost, Op, collective_cost
from simddp.compute import LayerTiming, layer_timing, memory_s, optimizer_step_s
from simddp.config import ParameterSpec, Scenario
from simddp.sim.layers import LayerPlan, pass_alone
from simddp.sim.pipeline import PipeOp, schedule
from simddp.topology import CommGroup, dp_group, group, pp_boundary_group, tp_group
from simddp.units import dtype_bytes
from simddp.workload import Collective, Layer, Workload, build_workload, fsdp_unit_layers, grad_reduce_spec


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
    if params and searches_unused(scenario):  # torch never rebuilds these buckets (bucketing.ddp_initial_buckets)
        buckets = ddp_initial_buckets(params, ddp.bucket_cap_mb)
    else:
        buckets = ddp_buckets(params, ready_order, ddp.bucket_cap_mb) if params else []
    return RankGradients(global_ids, params, ready_order, buckets)


def searches_unused(scenario: Scenario) -> bool:
    """torch DDP searches the graph for unused parameters every step: find_unused_parameters without
    static_graph (DDP proper: ZeRO stage 0, no pipeline)."""
    ddp, par = scenario.ddp, scenario.parallelism
    return (ddp.find_unused_parameters and not ddp.static_graph and ddp.implementation == "ddp"
            and par.zero_stage == 0 and par.pp == 1)


@dataclass(frozen=True)
class BucketPlan:
    """A gradient bucket: its collective, and the parameter all-gather of the same bucket (ZeRO)."""

    index: int
    size_bytes: int
    num_params: int
    reduce: CollectiveCost
    gather: CollectiveCost | None


@dataclass(frozen=True)
class FsdpUnitPlan:
    """An FSDP unit (one block, or the root): layer positions, parameter all-gather, gradient reduce-scatter."""

    index: int
    name: str
    layers: tuple[int, ...]
    gather: CollectiveCost
    reduce: CollectiveCost
    grad_bytes: int


@dataclass
class RankPlan:
    """One pipeline rank (its data- and tensor-parallel peers behave the same)."""

    index: int
    layers: tuple[Layer, ...]
    plans: list[LayerPlan]
    grads: RankGradients
    bucket_of_layer: list[list[int]]  # bucket index of each gradient a layer releases
    buckets: list[BucketPlan]
    rounds: int  # micro-batches whose gradients are reduced (1: no_sync accumulation)
    opt_s: float
    gather_after_step: CollectiveCost | None  # ZeRO-1/2 parameter all-gather of the whole shard
    embedding_sync: CollectiveCost | None  # tied embedding gradient all-reduce, first and last stage
    fsdp_units: list[FsdpUnitPlan] = field(default_factory=list)
    fsdp_root: FsdpUnitPlan | None = None
    fwd_alone_s: dict[int, float] = field(default_factory=dict)  # virtual stage -> forward, idle GPU
    bwd_alone_s: dict[int, float] = field(default_factory=dict)
    fwd_busy_s: dict[int, float] = field(default_factory=dict)  # compute stream busy during it (kernels, slowed)
    bwd_busy_s: dict[int, float] = field(default_factory=dict)
    fwd_work_s: dict[int, float] = field(default_factory=dict)  # kernels only
    bwd_work_s: dict[int, float] = field(default_factory=dict)
    bwd_recompute_s: dict[int, float] = field(default_factory=dict)
    # DDP's unused-parameter handling (torch reducer.cpp): host time of the graph search after each forward
    # whose backward reduces (before that backward starts); parameters without a gradient, per bucket, marked
    # ready at the first gradient hook of that backward (they are left out of bucket_of_layer); the all-reduce
    # of the used-parameter map, queued on the DP stream after the last bucket.
    traversal_s: float = 0.0
    unused_per_bucket: dict[int, int] = field(default_factory=dict)
    unused_map_reduce: CollectiveCost | None = None
    # Gradient clipping before the optimizer (after the embedding sync): the norm's pass over the gradients,
    # its scalar all-reduces (tp, pp, then dp under ZeRO) one after another, and the scaling pass.
    clip_norm_s: float = 0.0
    clip_reduces: tuple[CollectiveCost, ...] = ()
    clip_scale_s: float = 0.0

    @property
    def kernel_s(self) -> float:
        """Kernel time (forward, recompute, backward) of one micro-batch on this rank."""
        return sum(p.timing.compute_s for p in self.plans)

    @property
    def recompute_s(self) -> float:
        return sum(p.timing.recompute_s for p in self.plans)

    @property
    def tp_comm_s(self) -> float:
        return sum(p.tp_comm_s for p in self.plans)


@dataclass
class StepPlan:
    scenario: Scenario
    workload: Workload
    ranks: list[RankPlan]
    num_micro_batches: int
    mode: str  # "dp" (pp = 1, DDP / ZeRO-1/2), "fsdp" (ZeRO-3, pp = 1) or "pipeline"
    ops: list[list[PipeOp]]  # pipeline schedule of each rank
    p2p: dict[int, CollectiveCost]  # virtual stage boundary (vs -> vs + 1) -> activation/gradient send
    p2p_gather: CollectiveCost | None  # the receiver's all-gather of the slices (scatter/gather), if any
    overlap: str  # parallelism.tp_comm_overlap
    interference: float
    cache: dict[str, Any] = field(default_factory=dict)  # derived values computed once per plan


def _tp_costs(colls: Sequence[Collective], where: str, tp: CommGroup) -> tuple[CollectiveCost, ...]:
    return tuple(collective_cost(c.op, c.size_bytes, tp) for c in colls if c.where == where)


def layer_plans(scenario: Scenario, layers: Sequence[Layer]) -> list[LayerPlan]:
    """Kernel times and TP collective costs of ``layers``."""
    tr, par = scenario.training, scenario.parallelism
    gpu = scenario.cluster.gpu
    eff = scenario.model.compute_efficiency or 1.0
    tp = tp_group(scenario)
    out = []
    for layer in layers:
        t: LayerTiming = layer_timing(layer, gpu, tr, eff)
        if par.tp > 1 and layer.collectives:
            cs = layer.collectives
            out.append(LayerPlan(
                t, fwd_pre=_tp_costs(cs, "fwd-pre", tp), fwd_post=_tp_costs(cs, "fwd-post", tp),
                bwd_pre=_tp_costs(cs, "bwd-pre", tp), dgrad_post=_tp_costs(cs, "dgrad-post", tp),
                wgrad_pre=_tp_costs(cs, "wgrad-pre", tp), recompute_comm=t.recompute_s > 0,
            ))
        else:
            out.append(LayerPlan(t))
    return out


def boundary_group(scenario: Scenario, virtual_stage: int) -> CommGroup:
    """The pair of ranks that send/recv between virtual stage ``vs`` and ``vs + 1`` (pipeline neighbours).

    With interleaving, virtual stage ``vs + 1`` of the last rank's chunk is the first rank's next chunk: that
    pair spans every stage, so it crosses nodes unless the whole pipeline fits in one.
    """
    par, cluster = scenario.parallelism, scenario.cluster
    rank = virtual_stage % par.pp
    if rank < par.pp - 1:
        return pp_boundary_group(scenario, rank)
    crosses = par.pp * par.tp * scenario.dp > cluster.gpus_per_node
    return group(cluster, 2, stride=cluster.gpus_per_node if crosses else 1)


def build_plan(scenario: Scenario, workload: Workload | None = None) -> StepPlan:
    """Everything the simulation of ``scenario``'s step needs (costs computed once)."""
    workload = workload or build_workload(scenario)
    par, tr, ddp, cluster = scenario.parallelism, scenario.training, scenario.ddp, scenario.cluster
    m = scenario.num_micro_batches
    dp = dp_group(scenario)
    mode = "fsdp" if (par.zero_stage == 3 and par.pp == 1) else ("pipeline" if par.pp > 1 else "dp")
    op: Op = "reduce-scatter" if par.zero_stage >= 1 else "all-reduce"
    algorithm = ddp.algorithm if op == "all-reduce" else "auto"
    shard = scenario.dp if par.zero_stage >= 1 else 1
    # ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch (DeepSpeed); DDP and
    # ZeRO-1 accumulate locally (no_sync) and communicate on the last micro-batch only.
    rounds = m if (par.zero_stage == 2 and par.pp == 1) else 1
    unused = set(scenario.model.unused_parameters or ())
    ranks = []
    for r in range(par.pp):
        layers = workload.rank_layers(r, par.pp)
        grads = rank_gradients(scenario, workload, r)
        local = {g: k for k, g in enumerate(grads.global_ids)}
        bucket_of_param = {p: b.index for b in grads.buckets for p in b.param_indices}
        bucket_of_layer = [[bucket_of_param[local[g]] for g in la.param_indices if g not in unused] for la in layers]
        working = [workload.parameters[g] for g in grads.global_ids]
        buckets = []
        for b in grads.buckets:
            gather = None
            if par.zero_stage in (1, 2) and ddp.overlap_param_gather:
                gather = collective_cost("all-gather", sum(working[i].numel * dtype_bytes(working[i].dtype)
                                                           for i in b.param_indices), dp)
            buckets.append(BucketPlan(b.index, b.size_bytes, len(b.param_indices),
                                      dp_collective(scenario, op, b.size_bytes, dp, algorithm), gather))
        stage_workload = replace(workload, parameters=tuple(grads.params))
        opt_s = optimizer_step_s(stage_workload, cluster.gpu, tr, shard=shard) if grads.params else 0.0
        gather_after = None
        if par.zero_stage >= 1 and grads.params and mode != "fsdp" and not ddp.overlap_param_gather:
            gather_after = collective_cost("all-gather", sum(p.numel * dtype_bytes(p.dtype) for p in working), dp)
        rank = RankPlan(r, layers, layer_plans(scenario, layers), grads, bucket_of_layer, buckets, rounds,
                        opt_s, gather_after, _embedding_sync(scenario, workload, r))
        _ddp_options(scenario, rank, unused, dp)
        for vs in sorted({la.stage for la in layers}):
            idx = [i for i, la in enumerate(layers) if la.stage == vs]
            stage_plans = [rank.plans[i] for i in idx]
            interference = cluster.comm_compute_interference
            rank.fwd_alone_s[vs], rank.fwd_busy_s[vs] = pass_alone(stage_plans, par.tp_comm_overlap, "F",
                                                                   interference)
            rank.bwd_alone_s[vs], rank.bwd_busy_s[vs] = pass_alone(stage_plans, par.tp_comm_overlap, "B",
                                                                   interference)
            rank.fwd_work_s[vs] = sum(p.timing.fwd_s for p in stage_plans)
            rank.bwd_work_s[vs] = sum(p.timing.bwd_s for p in stage_plans)
            rank.bwd_recompute_s[vs] = sum(p.timing.recompute_s for p in stage_plans)
        if mode == "fsdp":
            rank.fsdp_units, rank.fsdp_root = _fsdp_plans(scenario, workload, rank, dp)
        ranks.append(rank)
    ops = [schedule(par.pipeline_schedule, par.pp, m, r, par.virtual_stages) for r in range(par.pp)] \
        if mode == "pipeline" else [[] for _ in range(par.pp)]
    p2p: dict[int, CollectiveCost] = {}
    gather = None
    if mode == "pipeline" and workload.boundary_activation_bytes:
        for vs in range(workload.num_stages - 1):
            p2p[vs] = collective_cost("send-recv", workload.boundary_activation_bytes, boundary_group(scenario, vs))
        if workload.boundary_gather_bytes:
            gather = collective_cost("all-gather", workload.boundary_gather_bytes, tp_group(scenario))
    return StepPlan(scenario, workload, ranks, m, mode, ops, p2p, gather, par.tp_comm_overlap,
                    cluster.comm_compute_interference)


def dp_collective(scenario: Scenario, op: Op, size_bytes: int, group: CommGroup,
                  algorithm: str = "auto") -> CollectiveCost:
    """A collective of the data-parallel process group on its backend (NCCL, or gloo staged through the host)."""
    if scenario.ddp.backend == "gloo":
        from simddp.gloo import gloo_cost

        return gloo_cost(op, size_bytes, group, scenario.cluster.gloo)
    return collective_cost(op, size_bytes, group, algorithm)  # type: ignore[arg-type]


def autograd_nodes(scenario: Scenario, rank: RankPlan) -> int:
    """Nodes of the rank's forward graph: the calibrated count, else one per forward kernel and one
    AccumulateGrad per parameter (what DDP's search visits)."""
    counted = scenario.model.num_autograd_nodes
    if counted is not None:
        return counted
    return sum(len(la.fwd) for la in rank.layers) + len(rank.grads.global_ids)


def _ddp_options(scenario: Scenario, rank: RankPlan, unused: set[int], dp: CommGroup) -> None:
    """Fill the plan data of find_unused_parameters / static_graph, unused parameters and gradient clipping."""
    local = {g: k for k, g in enumerate(rank.grads.global_ids)}
    for b in rank.grads.buckets:
        count = sum(1 for i in b.param_indices if rank.grads.global_ids[i] in unused)
        if count:
            rank.unused_per_bucket[b.index] = count
    if searches_unused(scenario) and rank.grads.params:
        rank.traversal_s = autograd_nodes(scenario, rank) * scenario.cluster.autograd_node_traversal_s
        # Reducer::all_reduce_local_used_map: one int32 per parameter tensor.
        rank.unused_map_reduce = dp_collective(scenario, "all-reduce", 4 * len(local), dp)
    clip = scenario.training.grad_clip_norm
    if clip is None or not rank.grads.params:
        return
    par, gpu = scenario.parallelism, scenario.cluster.gpu
    grad_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in rank.grads.params)
    if par.zero_stage >= 1:  # each rank holds (and norms) its shard of the reduced gradients
        grad_bytes = -(-grad_bytes // scenario.dp)
    rank.clip_norm_s = memory_s(grad_bytes, gpu)  # torch._foreach_norm reads every gradient
    rank.clip_scale_s = memory_s(2 * grad_bytes, gpu)  # torch._foreach_mul_ reads and writes them
    reduces = []
    norm_bytes = 4  # one fp32 partial sum of squares
    if par.tp > 1:
        reduces.append(collective_cost("all-reduce", norm_bytes, tp_group(scenario)))
    if par.pp > 1:
        reduces.append(collective_cost("all-reduce", norm_bytes,
                                       group(scenario.cluster, par.pp, stride=par.tp * scenario.dp)))
    if par.zero_stage >= 1 and scenario.dp > 1:
        reduces.append(dp_collective(scenario, "all-reduce", norm_bytes, dp))
    rank.clip_reduces = tuple(reduces)


def _embedding_sync(scenario: Scenario, workload: Workload, rank: int) -> CollectiveCost | None:
    """Megatron all-reduces the tied word-embedding gradient between the first and the last stage."""
    tf, pp = scenario.model.transformer, scenario.parallelism.pp
    if tf is None or not tf.tied_embeddings or pp == 1 or rank not in (0, pp - 1):
        return None
    word = workload.parameters[0]
    spec = grad_reduce_spec(word, scenario.ddp.reduce_in_fp32)
    pair = group(scenario.cluster, 2, stride=scenario.parallelism.tp * scenario.dp * (pp - 1))
    return collective_cost("all-reduce", spec.numel * dtype_bytes(spec.dtype), pair)


def _fsdp_plans(scenario: Scenario, workload: Workload, rank: RankPlan,
                dp: CommGroup) -> tuple[list[FsdpUnitPlan], FsdpUnitPlan | None]:
    """Per-unit all-gather (parameters in their own dtype) and reduce-scatter (gradients in the reduction
    dtype) of the FSDP units of :func:`simddp.workload.fsdp_unit_layers`."""
    units, root = fsdp_unit_layers(rank.layers)
    local = {g: k for k, g in enumerate(rank.grads.global_ids)}

    def plan(index: int, name: str, positions: Sequence[int]) -> FsdpUnitPlan:
        gids = sorted({g for i in positions for g in rank.layers[i].param_indices})
        param_bytes = sum(workload.parameters[g].numel * dtype_bytes(workload.parameters[g].dtype) for g in gids)
        grad_bytes = sum(rank.grads.params[local[g]].numel * dtype_bytes(rank.grads.params[local[g]].dtype)
                         for g in gids)
        return FsdpUnitPlan(index, name, tuple(positions), collective_cost("all-gather", param_bytes, dp),
                            collective_cost("reduce-scatter", grad_bytes, dp), grad_bytes)

    plans = []
    for k, positions in enumerate(units):
        first = rank.layers[positions[0]]
        name = f"block {first.block}" if first.block is not None else first.name
        plans.append(plan(k, name, positions))
    root_plan = plan(len(plans), "root", root) if root else None
    return plans, root_plan
