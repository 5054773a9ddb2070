"""Everything the step simulation needs, computed once from a scenario: per pipeline rank its layers with
kernel times and tensor-parallel collectives, its DDP buckets and their collectives, pipeline send/recv,
FSDP units, optimizer and parameter all-gather. Plain dataclasses: no pydantic object is built while the
simulation runs.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from simddp.bucketing import BucketSpec, ddp_initial_buckets
from simddp.collectives import CollectiveCost, Op, UnsupportedAlgorithm, collective_cost
from simddp.compute import (
    LayerTiming,
    grad_accumulation_s,
    layer_timing,
    memory_s,
    optimizer_impl,
    optimizer_step_s,
)
from simddp.config import Scenario, interleaved_all_warmup
from simddp.engine_caches import without_init
from simddp.errors import ScenarioError
from simddp.sim.layers import LayerPlan, layer_alone, layer_tp_s
from simddp.sim.pipeline import PipeOp, last_backward, schedule
from simddp.topology import (
    CommGroup,
    dp_group,
    group,
    pp_boundaries_crossing_nodes,
    pp_boundary_group,
    stage_pair_group,
    tp_group,
)
from simddp.units import dtype_bytes
from simddp.workload import (
    LAYER_KIND,
    BlockLayers,
    Collective,
    Layer,
    Param,
    ParamSize,
    RankLayers,
    Workload,
    build_workload,
    grad_reduce_spec,
    indexable,
)
from simddp.zero import (
    ParamUnit,
    ZeroRule,
    busiest_partition,
    gradient_buckets,
    param_bytes,
    param_units,
    stage_gradient_buckets,
    zero_rule,
)


@dataclass(frozen=True)
class RankGradients:
    """What DDP on one pipeline rank sees: its parameters' sizes (in the reduction dtype), ready order, buckets."""

    global_ids: Sequence[int]  # a list (a twin rank's: made on first use, _ShiftedIds)
    params: Sequence[ParamSize]  # a list of sizes, as reduced (a twin rank's: its first's); names: the workload's
    ready_order: list[int]
    buckets: list[BucketSpec]
    #: Values derived from these gradients (and the inputs in their keys), computed once: rank_gradients keeps
    #: one object per workload and inputs, so the configurations of a sweep that share it share these.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def num_params(self) -> int:
        """Elements of the rank's parameters."""
        return sum(p.numel for p in self.params)


def rank_gradients(scenario: Scenario, workload: Workload, index: int = 0,
                   rule: ZeroRule | None = None) -> RankGradients:
    """Parameters and gradient buckets of pipeline rank ``index`` (its tp shard), as the simulator uses them:
    the buckets of the data-parallel implementation's rule (:func:`simddp.zero.gradient_buckets`)."""
    rule = rule or zero_rule(scenario)
    key = _rank_gradients_key(scenario, index, rule)
    grads = workload.shared.get(key)
    if grads is None:  # once per workload structure and these inputs (a sweep's configurations share it)
        grads = workload.shared[key] = _rank_gradients(workload, index, scenario.parallelism.pp, rule, key[-1])
    return grads  # type: ignore[no-any-return]


def _rank_gradients_key(scenario: Scenario, index: int, rule: ZeroRule,
                        unused: bool | None = None) -> tuple[Any, ...]:
    """Where :func:`rank_gradients` keeps rank ``index``'s gradients in the workload's shared memo (its last
    item: whether torch DDP searches for unused parameters, :func:`searches_unused`, where not given)."""
    return ("rank gradients", index, scenario.parallelism.pp, rule,
            searches_unused(scenario) if unused is None else unused)


def _rank_gradients(workload: Workload, index: int, pp: int, rule: ZeroRule, unused: bool) -> RankGradients:
    layers = workload.held_layers(index, pp)
    global_ids = workload.rank_param_ids(index, pp)
    params, ready_order = workload.reduced_gradients(global_ids, rule.reduce_in_fp32)
    if params and unused:  # torch never rebuilds these buckets (bucketing.ddp_initial_buckets)
        # Only torch DDP searches for unused parameters, and its rule carries ddp.bucket_cap_mb.
        buckets = [BucketSpec(b.index, b.param_indices, b.size_bytes, b.dtype, b.cap_bytes)
                   for b in ddp_initial_buckets(params, rule.bucket_cap_mb)]
    elif params and len(ready_order) == len(params):  # the memory model's buckets (simddp.memory.buffers)
        buckets = stage_gradient_buckets(rule, workload, index, global_ids, params, ready_order, layers)
    else:
        buckets = gradient_buckets(rule, params, ready_order, layers, global_ids) if params else []
    return RankGradients(global_ids, params, ready_order, buckets)


def searches_unused(scenario: Scenario) -> bool:
    """torch DDP searches the graph for unused parameters every step: find_unused_parameters without
    static_graph (DDP proper: ZeRO stage 0, or 1, ZeroRedundancyOptimizer stepping a DDP model; no pipeline).
    Until 2026-11-29 stage 1 was left out: its DDP's search, used-map all-reduce and unrebuilt buckets went
    untimed, and a model with unused parameters that torch stops on was accepted."""
    ddp, par = scenario.ddp, scenario.parallelism
    return (ddp.find_unused_parameters and not ddp.static_graph and ddp.wrapper == "ddp"
            and ddp.implementation == "torch" and par.zero_stage <= 1 and par.pp == 1)


@dataclass(slots=True)
class BucketPlan:
    """A gradient bucket: its collective, and the parameter all-gather of the same bucket (ZeRO). Not frozen:
    a 7B model's step builds 226 of them, and a frozen dataclass's constructor is the cost; nothing changes
    one after :func:`build_plan`, and plans whose gradients and data-parallel collectives are the same share
    them (``RankGradients.memo``)."""

    index: int
    size_bytes: int
    num_params: int
    reduce: CollectiveCost
    gather: CollectiveCost | None


#: The NCCL stream of the all-gathers of units whose parameters are sharded (FSDP, DeepSpeed ZeRO-3), and of their
#: reduce-scatters unless these have a process group of their own (:func:`fsdp_reduce_scatter_stream`).
FSDP_STREAM = "fsdp"


def fsdp_reduce_scatter_stream(rule: ZeroRule) -> str:
    """The stream of a unit's reduce-scatter. ProcessGroupNCCL runs every collective of one process group on one
    internal NCCL stream, in issue order, whatever CUDA stream issues it (pytorch/pytorch#65299: "one process
    group to run single NCCL stream only, this is expected"; #95705; #186335: "one NCCL communicator, which
    processes one collective at a time and so serializes them on the wire"). FSDP (1 and 2), Megatron-FSDP and
    DeepSpeed ZeRO-3 gather and reduce-scatter over the same data-parallel group, so the two run one at a time;
    with ``ddp.separate_reduce_scatter_group`` (FSDP2's ``set_separate_reduce_scatter_group``) the reduce-scatters
    have a communicator, so a stream, of their own and share the link with the gathers. Until 2026-11-29 they
    always had their own (a Llama-2-7B ZeRO-3 step at sequence 1,024 on 128 H100 read 555 ms for 592 ms)."""
    return "fsdp reduce-scatter" if rule.separate_reduce_scatter else FSDP_STREAM


def root_prefetch(rule: ZeroRule, units: Sequence[FsdpUnitPlan]) -> int:
    """How many of the last units' backward gathers are issued when backward starts, before the root's own layers
    after the blocks (final norm, output layer, loss) run backward: FSDP's root is a unit like the others, and its
    pre-backward hook prefetches the next handle in backward order (FSDP1 ``_get_handle_to_backward_prefetch``:
    in ``handles_post_forward_order`` the root comes last, so the next is the last block), as many as each unit's
    prefetch. Until 2026-11-29 the last block was gathered only after the root's backward (0.2-0.6% slower).
    DeepSpeed ZeRO-3's prefetcher follows its module trace from each module's own hook: 0."""
    if rule.unit_rule != "block" or not units:
        return 0
    return min(units[-1].prefetch_bwd, len(units))


@dataclass(frozen=True)
class FsdpUnitPlan:
    """A unit whose parameters are gathered together (an FSDP unit or the root, a DeepSpeed ZeRO-3 module).

    ``layers``: its layer positions. ``gather``: the all-gather of its parameters, run before its forward and,
    when ``gather_bwd``, again before its backward (FSDP FULL_SHARD; not SHARD_GRAD_OP, not a DeepSpeed module
    kept within its reuse distance, not the root). ``prefetch_fwd``/``prefetch_bwd``: how many of the next units
    in that pass's order have their gather issued when this one starts computing (FSDP: 1; DeepSpeed: as many
    as its prefetch bucket covers). ``reduce``: the gradient reduce-scatter issued after its backward in every
    micro-batch (None: a DeepSpeed bucket still filling); ``reduce_blocks``: the compute stream waits for it
    (reduction not overlapped). ``grad_bytes``: the reduce-scatter's size; ``reduce_ids``: the global indices of
    the parameters whose gradients it reduces.
    """

    index: int
    name: str
    layers: tuple[int, ...]
    gather: CollectiveCost
    reduce: CollectiveCost | None
    grad_bytes: int
    gather_bwd: bool = True
    prefetch_fwd: int = 1
    prefetch_bwd: int = 1
    reduce_blocks: bool = False
    reduce_ids: tuple[int, ...] = ()


#: Most entries of one kind a gradients' memo keeps (:func:`memo_put`).
MEMO_KIND_LIMIT = 16


def memo_put(memo: dict[Any, Any], key: tuple[Any, ...], value: Any) -> None:
    """``memo[key] = value``, keeping only the :data:`MEMO_KIND_LIMIT` latest entries of its kind (``key[0]``).

    A gradients' memo lives as long as its workload, and entries such as the bucket plans depend on more than
    the gradients (the data-parallel group): a sweep over 100 cluster sizes and 20 bucket caps kept 2,000 sets
    of bucket plans and reduction costs, 34 KB a point (a hostile-input probe's 100,000-point sweep: 3.7 GB).
    A dropped entry is computed again when asked for."""
    order = memo.get(("memo order", key[0]))
    if order is None:
        order = memo[("memo order", key[0])] = deque()
    memo[key] = value
    order.append(key)
    if len(order) > MEMO_KIND_LIMIT:
        old = order.popleft()
        if old not in order:
            memo.pop(old, None)


_COMPUTE_S, _RECOMPUTE_S = attrgetter("timing.compute_s"), attrgetter("timing.recompute_s")


class LayerPlans(list[LayerPlan]):
    """A rank's layer plans in forward order, with their sums worked out once per list: configurations that
    share their layer plans (:func:`build_plan` keeps them in the workload's memo) share these too."""

    @functools.cached_property
    def memo(self) -> dict[Any, Any]:
        """Values derived from these plans and the inputs in their keys, computed once (as
        :attr:`RankGradients.memo`)."""
        return {}

    @functools.cached_property
    def kernel_s(self) -> float:
        """Kernel time (forward, recompute, backward) of one micro-batch."""
        return sum(map(_COMPUTE_S, self))  # the plans in order, as a loop would add them, read in C

    @functools.cached_property
    def recompute_s(self) -> float:
        return sum(map(_RECOMPUTE_S, self))

    @functools.cached_property
    def tp_comm_s(self) -> float:
        if not self.has_tp_collectives:  # every layer's is sum(()) == 0, as the loop below would add up
            return 0
        total: float = 0  # as sum() starts
        per_timing: dict[int, float] = {}  # layers sharing a timing share their collectives (layer_plans)
        for p in self:
            key = id(p.timing)
            if key not in per_timing:
                per_timing[key] = p.tp_comm_s
            total += per_timing[key]
        return total

    @functools.cached_property
    def backward_work(self) -> list[tuple[float, float]]:
        """Each layer's backward (kernel work, its recompute part), in backward (reverse) order."""
        per_timing: dict[int, tuple[float, float]] = {}  # layers of identical blocks share one timing object
        out = []
        for plan in reversed(self):
            timing_id = id(plan.timing)
            if timing_id not in per_timing:
                per_timing[timing_id] = (plan.timing.bwd_s, plan.timing.recompute_s)
            out.append(per_timing[timing_id])
        return out

    @functools.cached_property
    def has_tp_collectives(self) -> bool:
        """Whether any layer has a collective of its own (TP, sequence parallelism)."""
        return any(p.fwd_pre or p.fwd_post or p.bwd_pre or p.dgrad_post or p.wgrad_pre for p in self)


@dataclass
class RankPlan:
    """One pipeline rank (its data- and tensor-parallel peers behave the same)."""

    index: int
    layers: Sequence[Layer]  # Workload.held_layers: a transformer's made when read (BlockLayers, RankLayers)
    plans: LayerPlans
    grads: RankGradients
    bucket_of_layer: list[list[int]]  # bucket index of each gradient a layer releases
    buckets: list[BucketPlan]
    rounds: int  # micro-batches whose gradients are reduced (1: no_sync accumulation)
    opt_s: float
    gather_after_step: CollectiveCost | None  # parameter sync after the step: shard all-gather, or broadcasts
    embedding_sync: CollectiveCost | None  # tied embedding gradient all-reduce, first and last stage
    fsdp_units: list[FsdpUnitPlan] = field(default_factory=list)
    fsdp_root: FsdpUnitPlan | None = None
    overlap: bool = True  # bucket reduction starts as buckets fill during backward (else after the compute)
    fwd_alone_s: dict[int, float] = field(default_factory=dict)  # virtual stage -> forward, idle GPU
    bwd_alone_s: dict[int, float] = field(default_factory=dict)
    fwd_busy_s: dict[int, float] = field(default_factory=dict)  # compute stream busy during it (kernels, slowed)
    bwd_busy_s: dict[int, float] = field(default_factory=dict)
    fwd_work_s: dict[int, float] = field(default_factory=dict)  # kernels only
    bwd_work_s: dict[int, float] = field(default_factory=dict)
    bwd_recompute_s: dict[int, float] = field(default_factory=dict)
    fwd_tp_s: dict[int, float] = field(default_factory=dict)  # TP collectives, each alone, added (layer_tp_s)
    bwd_tp_s: dict[int, float] = field(default_factory=dict)
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
        return self.plans.kernel_s

    @property
    def reduced_units(self) -> list[FsdpUnitPlan]:
        """The FSDP units (or DeepSpeed ZeRO-3 reduce buckets) whose gradients are reduce-scattered, in order,
        the root last: what ``simddp buckets`` lists and the step's records time under ZeRO-3."""
        units = self.fsdp_units + ([self.fsdp_root] if self.fsdp_root else [])
        return [u for u in units if u.reduce is not None]

    @property
    def recompute_s(self) -> float:
        return self.plans.recompute_s

    @property
    def tp_comm_s(self) -> float:
        """TP collective time of one micro-batch on this rank, each collective alone on its link."""
        return self.plans.tp_comm_s


@dataclass
class StepPlan:
    scenario: Scenario
    workload: Workload
    ranks: list[RankPlan]
    num_micro_batches: int
    mode: str  # "dp" (pp = 1, DDP / ZeRO-1/2), "fsdp" (ZeRO-3, pp = 1) or "pipeline"
    ops: list[Sequence[PipeOp]]  # pipeline schedule of each rank (operations computed on access)
    p2p: dict[int, CollectiveCost]  # virtual stage boundary (vs -> vs + 1) -> activation/gradient send
    p2p_gather: CollectiveCost | None  # the receiver's all-gather of the slices (scatter/gather), if any
    overlap: str  # parallelism.tp_comm_overlap
    interference: float
    rule: ZeroRule  # the data-parallel implementation's rule the plan was built from
    cache: dict[str, Any] = field(default_factory=dict)  # derived values computed once per plan


def _tp_costs(colls: Sequence[Collective], where: str, tp: CommGroup) -> tuple[CollectiveCost, ...]:
    return tuple(collective_cost(c.op, c.size_bytes, tp) for c in colls if c.where == where)


def layer_plans(scenario: Scenario, layers: Sequence[Layer], parameters: Sequence[Param],
                seen: dict[tuple[Any, ...], LayerPlan] | None = None,
                rule: ZeroRule | None = None) -> list[LayerPlan]:
    """Kernel times and TP collective costs of ``layers`` (whose ``param_indices`` index ``parameters``).

    A layer's weight-grad time includes adding its gradients to those of earlier micro-batches
    (:func:`simddp.compute.grad_accumulation_s`, as the data-parallel implementation accumulates).
    ``seen`` keeps each distinct layer's plan across calls (pipeline ranks of one plan share their blocks'
    kernel tuples, so a 64-stage pipeline times its ~8 distinct layers once, not once per rank); ``rule`` is
    the scenario's :func:`simddp.zero.zero_rule`, when the caller has it. A transformer's layers
    (:class:`simddp.workload.BlockLayers`) are planned from block 0 (:func:`_pieces_plans`)."""
    rule = rule or zero_rule(scenario)
    # Identical blocks have identical kernels: time each distinct layer once.
    seen = {} if seen is None else seen
    if isinstance(layers, BlockLayers):  # copies of block 0: its plans, without making the copies
        return _pieces_plans(scenario, layers.run_pieces(0, len(layers)), layers.first_block, parameters, seen, rule)
    tr, par = scenario.training, scenario.parallelism
    gpu = scenario.cluster.gpu
    eff = scenario.model.compute_efficiency or 1.0
    tp: CommGroup | None = None  # made on the first layer with TP collectives not seen yet
    m = scenario.num_micro_batches
    out: list[LayerPlan] = []
    for layer in layers:
        # Identical blocks share their kernel and collective tuples (simddp.workload): identity identifies them.
        # Layers sharing kernel tuples come from one template and own parameters of the same shapes
        # (tests/test_workload.py checks it), so the accumulation time goes with them; layers without kernels
        # (measured times) may share the empty tuple, so their parameter shapes join the key.
        fwd, dgrad, wgrad, colls, recompute, fwd_time_s, bwd_time_s = LAYER_KIND(layer)
        shapes = tuple(parameters[g][1:] for g in layer.param_indices) if not (fwd or dgrad or wgrad) else ()
        key = (id(fwd), id(dgrad), id(wgrad), id(colls), recompute, fwd_time_s, bwd_time_s, shapes)
        plan = seen.get(key)
        if plan is None:
            accumulate = grad_accumulation_s([parameters[g] for g in layer.param_indices], rule.grad_accumulation,
                                             m, rule.reduce_in_fp32, gpu)
            t: LayerTiming = layer_timing(layer, gpu, tr, eff, accumulate)
            if par.tp > 1 and colls:
                tp = tp or tp_group(scenario)
                plan = seen[key] = LayerPlan(
                    t, fwd_pre=_tp_costs(colls, "fwd-pre", tp), fwd_post=_tp_costs(colls, "fwd-post", tp),
                    bwd_pre=_tp_costs(colls, "bwd-pre", tp), dgrad_post=_tp_costs(colls, "dgrad-post", tp),
                    wgrad_pre=_tp_costs(colls, "wgrad-pre", tp), recompute_comm=t.recompute_s > 0,
                )
            else:
                plan = seen[key] = LayerPlan(t)
        out.append(plan)  # shared by identical layers: a layer's name is its Layer's (RankPlan.layers)
    return out


def _pieces_plans(scenario: Scenario, pieces: Sequence[Sequence[Layer] | int], first: Sequence[Layer],
                  parameters: Sequence[Param], seen: dict[tuple[Any, ...], LayerPlan],
                  rule: ZeroRule) -> list[LayerPlan]:
    """:func:`layer_plans` of layers given as pieces (:meth:`simddp.workload.BlockLayers.run_pieces`): a number
    ``n`` stands for ``n`` whole copies of block 0 (``first``), which take its plans without being made
    (identical blocks share their kernel tuples, so their layers would look up the same plans)."""
    out: list[LayerPlan] = []
    template: list[LayerPlan] | None = None
    for piece in pieces:
        if isinstance(piece, int):
            if template is None:
                template = layer_plans(scenario, first, parameters, seen, rule)
            out += template * piece
        else:
            out += layer_plans(scenario, piece, parameters, seen, rule)
    return out


def rank_layer_plans(scenario: Scenario, workload: Workload, rank: int, pp: int,
                     seen: dict[tuple[Any, ...], LayerPlan] | None = None,
                     rule: ZeroRule | None = None) -> list[LayerPlan]:
    """:func:`layer_plans` of pipeline rank ``rank``'s layers (:meth:`Workload.rank_layers`); a transformer's
    from its pieces, without making its blocks (:meth:`Workload.rank_pieces`)."""
    rule = rule or zero_rule(scenario)
    seen = {} if seen is None else seen
    pieces = workload.rank_pieces(rank, pp)
    if pieces is None:
        return layer_plans(scenario, workload.rank_layers(rank, pp), workload.parameters, seen, rule)
    assert isinstance(workload.layers, BlockLayers)
    return _pieces_plans(scenario, pieces, workload.layers.first_block, workload.parameters, seen, rule)


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


def boundary_groups(scenario: Scenario, num_boundaries: int) -> list[CommGroup]:
    """:func:`boundary_group` of virtual stages ``0 .. num_boundaries - 1``, each distinct pair made once and
    shared: a rank's pair to the next depends only on whether it crosses nodes, and every pair from the last
    rank to the first's next chunk is one: a 1T pipeline's 63 boundaries hold two."""
    pp = scenario.parallelism.pp
    crossing = pp_boundaries_crossing_nodes(scenario)
    made: dict[bool | None, CommGroup] = {}  # by crossing nodes; None: the last rank's pairs
    groups = []
    for vs in range(num_boundaries):
        rank = vs % pp
        key = crossing[rank] if rank < pp - 1 else None
        pair = made.get(key)
        if pair is None:
            pair = made[key] = boundary_group(scenario, vs)
        groups.append(pair)
    return groups


def boundary_sends(scenario: Scenario, num_boundaries: int, size_bytes: int) -> list[CollectiveCost]:
    """The send-recv of ``size_bytes`` over each of :func:`boundary_groups`' pairs, each distinct pair costed
    once (2 of a 1T pipeline's 63)."""
    costs: dict[int, CollectiveCost] = {}
    sends = []
    for pair in boundary_groups(scenario, num_boundaries):
        send = costs.get(id(pair))
        if send is None:
            send = costs[id(pair)] = collective_cost("send-recv", size_bytes, pair)
        sends.append(send)
    return sends


def last_backwards(plan: StepPlan) -> list[dict[int, int]]:
    """Each rank's :func:`simddp.sim.pipeline.last_backward` (virtual stage -> position), once per plan: the fast
    engine's releases and tail and the bounds' schedules all start from them. Shared: callers must not change
    them."""
    got = plan.cache.get("last backwards")
    if got is None:
        v = plan.scenario.parallelism.virtual_stages
        got = plan.cache["last backwards"] = [last_backward(ops, v) for ops in plan.ops]
    return got  # type: ignore[no-any-return]


def build_plan(scenario: Scenario, workload: Workload | None = None) -> StepPlan:
    """Everything the simulation of ``scenario``'s step needs (costs computed once).

    Which collective each bucket or unit runs, how many micro-batches reduce, whether reduction overlaps
    backward and how parameters come back all follow the data-parallel implementation's rule
    (:func:`simddp.zero.zero_rule`), the same rule the memory model sizes its buffers by.
    """
    workload = workload or build_workload(scenario)
    par, tr, ddp, cluster = scenario.parallelism, scenario.training, scenario.ddp, scenario.cluster
    rule = zero_rule(scenario)
    m = scenario.num_micro_batches
    dp = dp_group(scenario)
    mode = "fsdp" if (rule.sharded_params and par.pp == 1) else ("pipeline" if par.pp > 1 else "dp")
    op = rule.reduce_op
    algorithm = ddp.algorithm if op == "all-reduce" else "auto"
    shard = scenario.dp if par.zero_stage >= 1 else 1
    impl = optimizer_impl(tr, ddp.implementation)
    # ZeRO-2 (DeepSpeed) keeps only its gradient shard, so it reduces every micro-batch; DDP, ZeRO-1 and
    # Megatron accumulate locally (no_sync) and communicate on the last micro-batch only.
    rounds = m if (rule.every_micro_batch and mode == "dp") else 1
    unused = set(scenario.model.unused_parameters or ())
    reduces: dict[int, CollectiveCost] = {}  # bucket size -> its reduction (most buckets have the cap's size)
    timed: dict[tuple[Any, ...], LayerPlan] = {}  # distinct layer -> its plan, shared by every rank
    passes: dict[int, tuple[float, ...]] = {}  # distinct timing -> its pass values (_stage_passes)
    # Everything layer_plans reads besides the workload: configurations sharing a workload (a sweep over
    # bucket caps, ZeRO stages or clusters with this GPU and TP group) share their layer plans.
    timing_key = (par.pp, cluster.gpu, tr.precision, tr.recompute, scenario.model.compute_efficiency,
                  tp_group(scenario), rule.grad_accumulation, rule.reduce_in_fp32, m)
    # Per rank, under keys hashed once per plan (hashing the GPU's model 64 times would cost a 1T pipeline
    # more than it saves).
    rank_plans: dict[int, LayerPlans] = workload.memo.setdefault(("layer plans", timing_key), {})
    rank_passes: dict[int, dict[str, dict[int, float]]] = workload.memo.setdefault(
        ("stage passes", timing_key, par.tp_comm_overlap, cluster.comm_compute_interference), {})
    ranks: list[RankPlan] = []
    # Pipeline ranks of one shape (a pipeline's middle ranks: the same blocks, their parameters shifted) plan
    # alike: the first of each shape is planned, the others are copies of it (_twin).
    twins = workload.rank_twins(par.pp) if mode == "pipeline" and not unused else None
    searched = searches_unused(scenario)  # in every rank's gradients' key
    protos: dict[int, tuple[dict[str, Any], int | None, list[tuple[str, float]]]] = {}  # _prototype, by first
    in_order: bool | None = None  # whether the layers own their parameters in order (_bucket_of_layer)
    for r in range(par.pp):
        if twins is not None and twins[r][0] != r:
            first, shift = twins[r]
            proto = protos.get(first)
            if proto is None:  # first's fields in a plain dict, and its pass values (one virtual stage: each item)
                proto = protos[first] = _prototype(ranks[first])
            ranks.append(_twin(scenario, workload, ranks[first], proto, shift, r, RankLayers(workload, r, par.pp),
                               rule, searched))
            continue
        layers = workload.held_layers(r, par.pp)
        grads = rank_gradients(scenario, workload, r, rule)
        bucket_of_layer = grads.memo.get("bucket of layer")  # unused parameters are the model's: in the workload
        if bucket_of_layer is None:
            if in_order is None:  # once per plan
                in_order = isinstance(workload.layers, BlockLayers) and workload.layers.owns_in_order
            grads.memo["bucket of layer"] = bucket_of_layer = _bucket_of_layer(
                grads, workload.rank_layer_params(r, par.pp), unused, in_order)
        working = grads.memo.get("working")
        if working is None:  # the parameters' own sizes: reduced in their own dtype, the gradients' are they
            sizes = workload.param_sizes()
            working = grads.memo["working"] = (grads.params if not rule.reduce_in_fp32
                                               else list(map(sizes.__getitem__, grads.global_ids)))
        # The buckets' collectives: once per gradients and everything dp_collective reads besides the size
        # (the points of a sweep over batch, cluster or ZeRO stage that share a group share them).
        gloo = scenario.cluster.gloo if ddp.backend == "gloo" else None
        plans_key = ("bucket plans", op, algorithm, dp, ddp.backend, gloo, rule.overlap_param_gather)
        buckets = grads.memo.get(plans_key)
        if buckets is None:
            for size in {b.size_bytes for b in grads.buckets}.difference(reduces):
                reduces[size] = _bucket_reduction(scenario, op, size, dp, algorithm)
            gathers: list[CollectiveCost | None] = [None] * len(grads.buckets)
            if rule.overlap_param_gather:
                gathers = [collective_cost("all-gather", sum(working[i].numel * dtype_bytes(working[i].dtype)
                                                             for i in b.param_indices), dp)
                           for b in grads.buckets]
            buckets = [BucketPlan(b.index, b.size_bytes, len(b.param_indices), reduces[b.size_bytes], gather)
                       for b, gather in zip(grads.buckets, gathers, strict=True)]
            memo_put(grads.memo, plans_key, buckets)
        opt_s = 0.0
        if grads.params:
            opt_s = optimizer_step_s(grads.num_params, cluster.gpu, tr,
                                     _optimizer_shard(workload, r, par.pp, grads, rule, shard), impl)
        gather_after = None
        if grads.params and mode != "fsdp" and not rule.overlap_param_gather:
            sync_key = ("param sync", rule.param_sync, dp)
            if sync_key in grads.memo:
                gather_after = grads.memo[sync_key]
            else:
                gather_after = _param_sync(rule, working, dp)
                memo_put(grads.memo, sync_key, gather_after)
        plans = rank_plans.get(r)
        if plans is None:
            plans = rank_plans[r] = LayerPlans(rank_layer_plans(scenario, workload, r, par.pp, timed, rule))
            if par.tp == 1:  # layer_plans gives a layer collectives of its own only with tp > 1: no walk for it
                plans.has_tp_collectives = False
        rank = RankPlan(r, layers, plans, grads, bucket_of_layer, buckets, rounds, opt_s, gather_after,
                        _embedding_sync(scenario, workload, r, rule), overlap=rule.overlap)
        _ddp_options(scenario, rank, unused, dp, rule)
        # Each virtual stage's passes, once per layer plans and the two inputs they add.
        stage_values = rank_passes.get(r)
        if stage_values is None:
            positions = workload.rank_stage_positions(r, par.pp)
            # Every virtual stage of the rank, one without layers too (a parameter-list model split by size can
            # leave a stage empty: its passes take no time, and the engines still look them up).
            for vs in range(r, max(workload.num_stages, par.pp), par.pp):
                where = positions.get(vs, ())
                stage_plans = rank.plans if len(positions) == 1 and where else [rank.plans[i] for i in where]
                _stage_passes(rank, vs, stage_plans, par.tp_comm_overlap, cluster.comm_compute_interference,
                              passes, par.tp > 1)
            stage_values = rank_passes[r] = {name: dict(getattr(rank, name)) for name in _PASS_FIELDS}
        else:
            for name, values in stage_values.items():
                getattr(rank, name).update(values)
        if mode == "fsdp":
            rank.fsdp_units, rank.fsdp_root = _fsdp_plans(workload, rank, dp, rule)
        ranks.append(rank)
    all_warmup = interleaved_all_warmup(scenario.ddp.implementation)
    ops: list[Sequence[PipeOp]] = [schedule(par.pipeline_schedule, par.pp, m, r, par.virtual_stages, all_warmup)
                                   for r in range(par.pp)] if mode == "pipeline" else [[] for _ in range(par.pp)]
    p2p: dict[int, CollectiveCost] = {}
    gather = None
    if mode == "pipeline" and workload.boundary_activation_bytes:
        p2p = dict(enumerate(boundary_sends(scenario, workload.num_stages - 1, workload.boundary_activation_bytes)))
        if workload.boundary_gather_bytes:
            gather = collective_cost("all-gather", workload.boundary_gather_bytes, tp_group(scenario))
    plan = StepPlan(scenario, workload, ranks, m, mode, ops, p2p, gather, par.tp_comm_overlap,
                    cluster.comm_compute_interference, rule)
    plan.cache["rank twins"] = twins  # which ranks were planned as copies of which (None: each its own)
    return plan


def _optimizer_shard(workload: Workload, rank: int, pp: int, grads: RankGradients, rule: ZeroRule, dp: int) -> float:
    """What the optimizer step divides the rank's parameters by: ``dp`` under ZeRO, or for torch's
    ZeroRedundancyOptimizer the share its busiest rank steps (:func:`simddp.zero.busiest_partition`; until
    2026-11-29 an even 1/dp: Llama-2-7B at dp 128 stepped 52.6 M elements for the busiest rank's 131.1 M)."""
    if dp == 1 or not rule.partitions_whole_tensors:
        return dp
    return grads.num_params / busiest_partition(workload, rank, pp, dp)


def _bucket_of_layer(grads: RankGradients, owned: list[tuple[int, ...]], unused: set[int],
                     in_order: bool = False) -> list[list[int]]:
    """Per layer of a rank (``owned``: the global indices of each one's parameters), the buckets of its
    parameters, unused ones left out. Where the layers own the rank's parameters one after another, each once (a
    transformer's whose blocks' layers own theirs in order, ``in_order``: :attr:`BlockLayers.owns_in_order`), a
    layer's are a slice of the buckets by parameter, not looked up one by one; the check costs a whole model's
    layers more than the lookups where they do not (the 7B default's), so it is made only where they may."""
    ids = grads.global_ids
    none: list[int] = []  # one list for every layer without parameters (most of a block's; the lists are read only)
    if in_order and not unused and [*itertools.chain.from_iterable(owned)] == ids:
        local: list[int | None] = [None] * len(ids)  # each of the rank's parameters' bucket
        for b in grads.buckets:
            for p in b.param_indices:
                local[p] = b.index
        if None not in local:  # every parameter in a bucket (else the lookup's error, below)
            out: list[list[int]] = []
            at = 0
            for own in owned:
                if own:
                    out.append(local[at:at + len(own)])  # type: ignore[arg-type]  # no None: checked
                    at += len(own)
                else:
                    out.append(none)
            return out
    bucket_of = {ids[p]: b.index for b in grads.buckets for p in b.param_indices}.__getitem__  # global id
    if unused:
        return [[bucket_of(g) for g in own if g not in unused] for own in owned]
    return [list(map(bucket_of, own)) if own else none for own in owned]


def _prototype(first: RankPlan) -> tuple[dict[str, Any], int | None, list[tuple[str, float]]]:
    """What :func:`_twin` copies for each twin of ``first``: its fields in a plain dict (a copy of its
    key-sharing instance dict would read slower; a plain dict copies whole), and where it has one virtual stage
    (1F1B) that stage and its pass values, by field (else None and none)."""
    fields = {**first.__dict__}
    if len(first.fwd_alone_s) != 1:
        return fields, None, []
    (stage,) = first.fwd_alone_s
    return fields, stage, [(name, fields[name][stage]) for name in _PASS_FIELDS]


def _twin(scenario: Scenario, workload: Workload, first: RankPlan,
          proto: tuple[dict[str, Any], int | None, list[tuple[str, float]]], delta: int, r: int,
          layers: Sequence[Layer], rule: ZeroRule, searched: bool) -> RankPlan:
    """The plan of middle pipeline rank ``r``, alike ``first`` with parameter indices shifted by ``delta``
    (:meth:`simddp.workload.Workload.rank_twins`): ``first``'s plan with its own index, layers, gradients and
    virtual stages.

    Everything else the plan holds (layer plans, buckets and their collectives, optimizer, parameter sync,
    gradient clipping, per-stage pass times) depends only on the layers' shape and the parameters' sizes and
    order, so it is ``first``'s. The gradients are stored where :func:`rank_gradients` keeps them, for the
    memory model and the exports to find (``searched``: :func:`searches_unused`, once per plan).
    """
    key = _rank_gradients_key(scenario, r, rule, searched)
    grads = workload.shared.get(key)
    if grads is None:
        src = first.grads
        # Both made when something reads them (the fast engine reads neither: a 1T pipeline's 62 middle ranks).
        global_ids = _ShiftedIds(src.global_ids, delta)
        # Twins' parameters have the same sizes and dtypes in the same order: the first's sizes are theirs.
        reduced = src.params
        grads = workload.shared[key] = without_init(RankGradients, {
            "global_ids": global_ids, "params": reduced, "ready_order": src.ready_order, "buckets": src.buckets,
            "memo": {"bucket of layer": first.bucket_of_layer}})
    else:
        grads.memo.setdefault("bucket of layer", first.bucket_of_layer)
    shift = r - first.index  # virtual stage vs of first is vs + shift here
    # dataclasses.replace's result (every other field the same object): first's fields (_prototype), then the
    # rank's own.
    fields, stage, values = proto
    fields = fields.copy()
    fields["index"], fields["layers"], fields["grads"] = r, layers, grads
    if stage is not None:  # one virtual stage (1F1B): each pass dict holds one item
        k = stage + shift
        for name, value in values:
            fields[name] = {k: value}
    else:
        for name in _PASS_FIELDS:
            fields[name] = {vs + shift: value for vs, value in fields[name].items()}
    return without_init(RankPlan, fields)


class _ShiftedIds(Sequence[int]):
    """A twin rank's global parameter indices, the first rank's shifted by ``delta``: a list made on first use,
    read as one (the fast engine never reads them; the exports, the memory model and the reported rank do)."""

    __slots__ = ("_from", "_items")

    def __init__(self, ids: Sequence[int], delta: int) -> None:
        self._items: list[int] | None = None
        self._from = (ids, delta)

    def _list(self) -> list[int]:
        if self._items is None:
            ids, delta = self._from
            self._items = [g + delta for g in ids]
        return self._items

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._list())

    def __len__(self) -> int:
        return len(self._from[0])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._list() == list(other)

    __hash__ = None  # type: ignore[assignment]  # as a list's


#: The RankPlan fields :func:`_stage_passes` fills (virtual stage -> seconds).
_PASS_FIELDS = ("fwd_alone_s", "fwd_busy_s", "bwd_alone_s", "bwd_busy_s", "fwd_work_s", "bwd_work_s",
                "bwd_recompute_s", "fwd_tp_s", "bwd_tp_s")


def _stage_passes(rank: RankPlan, vs: int, plans: Sequence[LayerPlan], overlap: str, interference: float,
                  per_timing: dict[int, tuple[float, ...]], tp: bool) -> None:
    """Forward and backward of virtual stage ``vs`` on an idle GPU (:func:`simddp.sim.layers.pass_alone`) and
    their kernel sums, in one pass over its layers, and with ``tp`` (layers have TP collectives only then)
    their TP collectives added (:func:`simddp.sim.layers.layer_tp_s`, for the no-overlap bound; else 0).
    Layers of identical blocks share one timing object, whose numbers are worked out once per plan
    (``per_timing``, shared by the ranks: the timing objects live as long as the plan's layer plans do). Each
    sum is ``sum()``'s over the layers, in layer order (one column of the layers' values each)."""
    rows = []
    for plan in plans:
        key = id(plan.timing)
        values = per_timing.get(key)
        if values is None:
            t = plan.timing
            values = per_timing[key] = (*layer_alone(plan, overlap, "F", interference),
                                        *layer_alone(plan, overlap, "B", interference),
                                        t.fwd_s, t.bwd_s, t.recompute_s,
                                        *((layer_tp_s(plan, "F"), layer_tp_s(plan, "B")) if tp else (0.0, 0.0)))
        rows.append(values)
    sums = [sum(column, 0.0) for column in zip(*rows, strict=True)] if rows else [0.0] * 9
    rank.fwd_alone_s[vs], rank.fwd_busy_s[vs], rank.bwd_alone_s[vs], rank.bwd_busy_s[vs] = sums[:4]
    rank.fwd_work_s[vs], rank.bwd_work_s[vs], rank.bwd_recompute_s[vs] = sums[4:7]
    rank.fwd_tp_s[vs], rank.bwd_tp_s[vs] = sums[7:]  # 0 without tp (their values are)


def dp_collective(scenario: Scenario, op: Op, size_bytes: int, group: CommGroup,
                  algorithm: str = "auto") -> CollectiveCost:
    """A collective of the data-parallel process group on its backend (NCCL, or gloo staged through the host)."""
    if scenario.ddp.backend == "gloo":
        from simddp.gloo import gloo_cost

        return gloo_cost(op, size_bytes, group, scenario.cluster.gloo)
    return collective_cost(op, size_bytes, group, algorithm)  # type: ignore[arg-type]


def _bucket_reduction(scenario: Scenario, op: Op, size_bytes: int, group: CommGroup, algorithm: str) -> CollectiveCost:
    """:func:`dp_collective` of a bucket; an algorithm the user chose that cannot run on this group (nvls without
    NVSwitch SHARP or with one data-parallel rank per node) is a :class:`ScenarioError` naming ``ddp.algorithm``."""
    try:
        return dp_collective(scenario, op, size_bytes, group, algorithm)
    except UnsupportedAlgorithm as e:  # (with algorithm "auto" nothing was asked for: never raised)
        raise ScenarioError(f"ddp.algorithm: {algorithm} cannot run the data-parallel {op} here: {e}") from None


def autograd_nodes(scenario: Scenario, rank: RankPlan) -> int:
    """Nodes of the rank's forward graph: the calibrated count, else one per forward kernel and one
    AccumulateGrad per parameter (what DDP's search visits)."""
    counted = scenario.model.num_autograd_nodes
    if counted is not None:
        return counted
    return sum(len(la.fwd) for la in rank.layers) + len(rank.grads.global_ids)


def _ddp_options(scenario: Scenario, rank: RankPlan, unused: set[int], dp: CommGroup,
                 rule: ZeroRule) -> None:
    """Fill the plan data of find_unused_parameters / static_graph, unused parameters and gradient clipping."""
    for b in rank.grads.buckets if unused else ():
        count = sum(1 for i in b.param_indices if rank.grads.global_ids[i] in unused)
        if count:
            rank.unused_per_bucket[b.index] = count
    if searches_unused(scenario) and rank.grads.params:
        rank.traversal_s = autograd_nodes(scenario, rank) * scenario.cluster.autograd_node_traversal_s
        # Reducer::all_reduce_local_used_map: one int32 per parameter tensor.
        rank.unused_map_reduce = dp_collective(scenario, "all-reduce", 4 * len(rank.grads.global_ids), dp)
    clip = scenario.training.grad_clip_norm
    if clip is None or not rank.grads.params:
        return
    par, gpu = scenario.parallelism, scenario.cluster.gpu
    grad_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in rank.grads.params)
    # Each rank holds (and norms) its shard of the reduced gradients, and their norms are summed over the
    # data-parallel group; not under torch's ZeroRedundancyOptimizer, whose DDP leaves every rank every gradient
    # (clip_grad_norm_ of the model's parameters: the whole norm, no all-reduce).
    sharded = par.zero_stage >= 1 and not rule.partitions_whole_tensors
    if sharded:
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
    if sharded and scenario.dp > 1:
        reduces.append(dp_collective(scenario, "all-reduce", norm_bytes, dp))
    rank.clip_reduces = tuple(reduces)


def _param_sync(rule: ZeroRule, working: Sequence[ParamSize], dp: CommGroup) -> CollectiveCost | None:
    """The parameter sync after the optimizer step: an all-gather of the updated shards (DeepSpeed, Megatron,
    FSDP with pipelines), or torch ZeroRedundancyOptimizer's broadcast of every parameter from its owner
    (``_sync_params`` with ``parameters_as_bucket_view=False``), one after another on the DP communicator."""
    if rule.param_sync == "all-gather":
        return collective_cost("all-gather", sum(p.numel * dtype_bytes(p.dtype) for p in working), dp)
    if rule.param_sync == "broadcast":
        # One broadcast per parameter (a 7B model's 291), one after another: costed once per distinct size;
        # their sizes, times and hops add (each distinct size's times its count of parameters).
        costs: dict[int, CollectiveCost] = {}
        size_bytes, time_s, latency_s = 0, 0.0, 0.0
        for (numel, dtype), n in Counter(working).items():  # sizes (ParamSize: the (numel, dtype) pair)
            size = numel * dtype_bytes(dtype)
            cost = costs.get(size)
            if cost is None:
                cost = costs[size] = collective_cost("broadcast", size, dp)
            size_bytes += cost.size_bytes * n
            time_s += cost.time_s * n
            latency_s += cost.latency_s * n
        first = costs[working[0].numel * dtype_bytes(working[0].dtype)]
        return CollectiveCost(first.op, size_bytes, first.num_ranks, first.algorithm, first.protocol, time_s,
                              latency_s, first.tier)
    return None


def _embedding_sync(scenario: Scenario, workload: Workload, rank: int, rule: ZeroRule) -> CollectiveCost | None:
    """Megatron all-reduces the tied word-embedding gradient between the first and the last stage."""
    tf, pp = scenario.model.transformer, scenario.parallelism.pp
    if tf is None or not tf.tied_embeddings or pp == 1 or rank not in (0, pp - 1):
        return None
    word = workload.parameters[0]
    spec = grad_reduce_spec(word, rule.reduce_in_fp32)
    return collective_cost("all-reduce", spec.numel * dtype_bytes(spec.dtype), stage_pair_group(scenario, 0, pp - 1))


def _fsdp_plans(workload: Workload, rank: RankPlan, dp: CommGroup,
                rule: ZeroRule) -> tuple[list[FsdpUnitPlan], FsdpUnitPlan | None]:
    """Per-unit all-gather (parameters in their own dtype) and reduce-scatter (gradients in the reduction
    dtype) of the units of :func:`simddp.zero.param_units`, the rule the memory model sizes them by."""
    params = indexable(workload.parameters)  # every unit reads its parameters by index
    units = param_units(rule, rank.layers, params)

    def plan(u: ParamUnit) -> FsdpUnitPlan:
        grads = [grad_reduce_spec(params[g], rule.reduce_in_fp32) for g in u.reduce_ids]
        grad_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in grads)
        reduce = collective_cost("reduce-scatter", grad_bytes, dp) if u.reduce_ids else None
        return FsdpUnitPlan(u.index, u.name, u.positions,
                            collective_cost("all-gather", param_bytes(params, u.param_ids), dp),
                            reduce, grad_bytes, u.gather_bwd, u.prefetch_fwd, u.prefetch_bwd, not rule.overlap,
                            u.reduce_ids)

    return [plan(u) for u in units.units], (plan(units.root) if units.root else None)
