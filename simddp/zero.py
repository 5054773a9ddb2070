"""Data-parallel implementations: which collectives each ZeRO stage runs, when, and what buffers it keeps.

A ZeRO stage says what is sharded (Rajbhandari et al., SC'20); how the gradients and parameters travel,
and which buffers that takes, depends on who implements it. ``ddp.implementation`` names it, and one rule
per implementation (:func:`zero_rule`) gives both the step simulator's plan (:mod:`simddp.sim.plan`) and the
memory model's buffers (:mod:`simddp.memory.buffers`), so the two cannot disagree.

torch (PyTorch)
    0: ``DistributedDataParallel``: bucketed all-reduce during backward (buckets of ``bucket_cap_mb``, 25 MiB
    after a 1 MiB first one, :mod:`simddp.bucketing`), gradient accumulation under ``no_sync``; DDP keeps a
    flat copy of every bucket unless ``gradient_as_bucket_view`` (Li et al., VLDB'20).
    1: ``ZeroRedundancyOptimizer`` on DDP: DDP's all-reduce and bucket copies, a sharded optimizer step, then
    ``_sync_params`` broadcasts every parameter from the rank that owns it (``parameters_as_bucket_view=False``,
    the default; torch/distributed/optim/zero_redundancy_optimizer.py).
    2: FSDP ``SHARD_GRAD_OP`` and 3: FSDP ``FULL_SHARD`` (Zhao et al., VLDB'23): one flat parameter per unit
    (a transformer block; the rest is the root), all-gathered before the unit's forward and, with
    ``FULL_SHARD``, again before its backward, ``memory.fsdp_prefetch_layers`` units ahead; its gradients
    reduce-scattered after its backward, every micro-batch. The root is not resharded after forward. With
    pipeline parallelism (``torch.distributed.pipelining``, as torchtitan runs it) FSDP neither reshards
    parameters between micro-batches nor reduces gradients before the last one: each unit's reduce-scatter
    follows the last backward, its all-gather precedes the next step's first forward, and the whole stage's
    parameters and gradients are unsharded meanwhile.
deepspeed (deepspeed/runtime/zero/config.py, stage_1_and_2.py, stage3.py, partitioned_param_coordinator.py)
    1 and 2: gradients copied into a contiguous buffer of ``reduce_bucket_size`` elements (5e8; two buffers with
    ``overlap_comm``), each full buffer flattened and all-reduced (``use_multi_rank_bucket_allreduce``, the
    default: ``allreduce_and_scatter``), the owner keeping its slice; stage 1 reduces once, at the gradient
    accumulation boundary, stage 2 in every micro-batch; ``overlap_comm`` is false for both by default, so the
    reduction does not run beside backward; after the step each rank's updated partition is all-gathered.
    3: parameters gathered per module (small ones, under ``stage3_param_persistence_threshold`` = 1e5
    elements, are never partitioned), ``stage3_prefetch_bucket_size`` (5e7) elements ahead, and kept
    gathered while the parameters met before their next use stay under ``stage3_max_reuse_distance`` (1e9);
    gradients reduce-scattered in ``reduce_bucket_size`` buckets, overlapped (``overlap_comm`` defaults to true
    for stage 3). DeepSpeed's pipeline engine refuses stages 2 and 3. Stage 0 is the engine's own data
    parallelism: ``buffered_allreduce_fallback`` after backward, in 5e8-element flattened buffers.
megatron (Megatron-LM / Megatron-Core ``DistributedDataParallel``, ``DistributedOptimizer``)
    0 and 1: gradients accumulate in one contiguous buffer, fp32 for bf16 training (Megatron-LM forces
    ``accumulate_allreduce_grads_in_fp32`` with ``--bf16``); buckets of max(4e7, 1e6 x dp) elements with
    ``--overlap-grad-reduce``, one bucket without it (its default: false); stage 0 all-reduces them, stage 1
    (``--use-distributed-optimizer``) reduce-scatters them and all-gathers the updated parameters after the step,
    or bucket by bucket during the next forward with ``--overlap-param-gather`` (default false). Buckets are
    views of the buffer: no copies. Megatron has no ZeRO-2/3 here (Megatron-FSDP is not modelled).

Defaults are what a user of the named framework gets; every one is a ``ddp`` key left null.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from simddp.bucketing import BucketSpec, ParamLike, assign_in_order, bucket_assignment
from simddp.config import (
    SUPPORTED_ZERO_STAGES,
    DDPConfig,
    Implementation,
    Scenario,
    default_overlap,
    default_reduce_in_fp32,
)
from simddp.engine_caches import KeyedCache, kept_fields_hash, state_without_hash
from simddp.units import MiB, dtype_bytes
from simddp.workload import Layer, Workload, fsdp_unit_layers

ReduceOp = Literal["all-reduce", "reduce-scatter"]
BucketRule = Literal["torch", "deepspeed", "megatron", "units"]
#: How a micro-batch's gradients join the ones before it (:func:`simddp.compute.grad_accumulation_s`).
GradAccumulation = Literal["autograd", "main-grad", "fused", "sharded"]

#: DeepSpeed ``reduce_bucket_size`` and ``allgather_bucket_size`` defaults, elements (zero/config.py).
DEEPSPEED_REDUCE_BUCKET_NUMEL = 500_000_000
#: DeepSpeed engine ``MEMORY_OPT_ALLREDUCE_SIZE``: the non-ZeRO all-reduce buffer, elements (runtime/engine.py).
DEEPSPEED_ALLREDUCE_BUCKET_NUMEL = 500_000_000
#: ``stage3_prefetch_bucket_size`` default, elements.
DEEPSPEED_PREFETCH_NUMEL = 50_000_000
#: ``stage3_max_reuse_distance`` default, elements.
DEEPSPEED_MAX_REUSE_DISTANCE_NUMEL = 1_000_000_000
#: ``stage3_param_persistence_threshold`` default, elements.
DEEPSPEED_PERSISTENCE_THRESHOLD_NUMEL = 100_000
#: Megatron-Core's default bucket: max(4e7, 1e6 x dp) elements (distributed_data_parallel.py).
MEGATRON_MIN_BUCKET_NUMEL = 40_000_000
MEGATRON_BUCKET_NUMEL_PER_DP_RANK = 1_000_000

_NAMES = {
    ("torch", 0): "torch DDP",
    ("torch", 1): "torch ZeroRedundancyOptimizer on DDP",
    ("torch", 2): "torch FSDP SHARD_GRAD_OP",
    ("torch", 3): "torch FSDP FULL_SHARD",
    ("deepspeed", 0): "DeepSpeed data parallel (no ZeRO)",
    ("deepspeed", 1): "DeepSpeed ZeRO-1",
    ("deepspeed", 2): "DeepSpeed ZeRO-2",
    ("deepspeed", 3): "DeepSpeed ZeRO-3",
    ("megatron", 0): "Megatron DDP",
    ("megatron", 1): "Megatron distributed optimizer",
}


@dataclass(frozen=True)
class ZeroRule:
    """How one implementation runs one ZeRO stage: the data both the simulator and the memory model read."""

    implementation: Implementation
    stage: int
    name: str
    #: Parameters are gathered unit by unit around their compute (FSDP, DeepSpeed ZeRO-3; pp = 1 only).
    sharded_params: bool
    #: Collective of each gradient bucket (bucket mode); units always reduce-scatter.
    reduce_op: ReduceOp
    #: Gradients are reduced in fp32 (Megatron's fp32 main grads).
    reduce_in_fp32: bool
    #: Gradient reduction runs beside backward (else it starts when backward has finished).
    overlap: bool
    #: Gradients are reduced in every micro-batch (else once, after the last: accumulation, ``no_sync``).
    every_micro_batch: bool
    #: After the optimizer step: nothing, an all-gather of each rank's shard, or per-parameter broadcasts.
    param_sync: Literal["none", "all-gather", "broadcast"]
    #: Megatron --overlap-param-gather: each bucket's all-gather runs before its layers' next forward.
    overlap_param_gather: bool
    #: How gradient buckets are formed (bucket mode; "units": one bucket per FSDP unit, FSDP with pp > 1).
    bucket_rule: BucketRule
    #: DDP's flat bucket copies of the gradients (torch, without ``gradient_as_bucket_view``).
    bucket_copies: bool
    #: DeepSpeed contiguous-gradient (ipg) buffers of ``bucket_numel`` elements each.
    reduce_buffers: int
    #: DeepSpeed flattens each bucket's slices into a new tensor for its all-reduce.
    flatten_copy: bool
    #: Element count of a DeepSpeed bucket, or of a Megatron bucket (None: one bucket).
    bucket_numel: int | None
    #: torch DDP's ``bucket_cap_mb`` (None: torch's 25 MiB after 1 MiB).
    bucket_cap_mb: float | None
    #: FSDP unit grouping: transformer blocks plus a root (torch), or modules (DeepSpeed ZeRO-3).
    unit_rule: Literal["block", "module"]
    #: Units are gathered again for backward (FSDP FULL_SHARD, DeepSpeed ZeRO-3; not SHARD_GRAD_OP).
    reshard_after_forward: bool
    #: FSDP units gathered ahead of the one computing (torch).
    prefetch_units: int
    #: DeepSpeed ZeRO-3: elements gathered ahead, kept-gathered reuse distance, persistence threshold.
    prefetch_numel: int
    reuse_distance_numel: int
    persistence_threshold_numel: int
    #: Reduce-scatters of sharded units on a process group of their own (``ddp.separate_reduce_scatter_group``).
    separate_reduce_scatter: bool
    #: FSDP with pipeline parallelism: parameters and gradients stay unsharded across micro-batches.
    unsharded_across_micro_batches: bool
    #: Gradient accumulation across micro-batches: autograd's in-place add (torch, DeepSpeed ZeRO-0/1),
    #: Megatron's hook into main_grad, Megatron's fused weight-gradient GEMMs, or reduced shards (every
    #: micro-batch reduces, so only a 1/dp shard accumulates; not timed).
    grad_accumulation: GradAccumulation

    @property
    def gradient_dtype_bytes(self) -> int:
        return 4 if self.reduce_in_fp32 else 2

    @property
    def partitions_whole_tensors(self) -> bool:
        """torch's ZeRO-1: ZeroRedundancyOptimizer stepping a DDP model. Its partition is of whole tensors
        (:func:`zero_redundancy_busiest`), and DDP leaves every gradient whole on every rank."""
        return self.implementation == "torch" and self.stage == 1

    __hash__ = kept_fields_hash  # a rule keys the memos of every rank's gradients
    __getstate__ = state_without_hash


def zero_redundancy_busiest(counts: Sequence[tuple[tuple[int, str], int]], dp: int) -> int:
    """The elements torch's ZeroRedundancyOptimizer (ZeRO-1 under torch) gives its busiest rank:
    ``_partition_parameters`` assigns whole tensors, largest first, each to the rank holding the fewest elements so
    far, so the busiest can hold well over 1/dp (Llama-2-7B at dp 128: the 131 M-element embedding, 2.5x the even
    share). Every rank steps its own partition, then broadcasts it: the step waits for the busiest. ``counts``: a
    rank's parameters as (elements, dtype) counts (:func:`simddp.memory.states.param_size_counts`), one parameter
    group.

    Equal tensors go to the least-loaded ranks a whole class at a time: while the least load L is held by k ranks,
    the next min(k, left) tensors of n elements each go to k of them (each then holds L + n > L), which is what
    giving them one by one does; so the loads (not which rank holds what) come out of a few steps per size, where
    one heap operation per tensor cost the default 0.22 ms an evaluation."""
    ranks_at = {0: dp}  # load -> how many ranks hold it
    loads = [0]  # the distinct loads, a heap
    for (numel, _), left in sorted(counts, key=lambda c: -c[0][0]):
        while left:
            least = loads[0]
            k = ranks_at[least]
            take = min(k, left)
            if take == k:
                heapq.heappop(loads)
                del ranks_at[least]
            else:
                ranks_at[least] = k - take
            if least + numel in ranks_at:
                ranks_at[least + numel] += take
            else:
                ranks_at[least + numel] = take
                heapq.heappush(loads, least + numel)
            left -= take
    return max(ranks_at)


def busiest_partition(workload: Workload, rank: int, pp: int, dp: int) -> int:
    """:func:`zero_redundancy_busiest` of pipeline rank ``rank``'s parameters (:meth:`Workload.stage_size_counts`),
    once per workload structure: the plan's optimizer step and the memory model's states read the same."""
    key = ("zero-1 busiest", rank, pp, dp)
    got = workload.shared.get(key)
    if got is None:
        got = workload.shared[key] = zero_redundancy_busiest(workload.stage_size_counts(rank, pp)[1], dp)
    return got  # type: ignore[no-any-return]


def zero_redundancy_share(counts: Sequence[tuple[tuple[int, str], int]],
                          dp: int) -> tuple[tuple[tuple[int, str], int], ...]:
    """The tensors of :func:`zero_redundancy_busiest`'s busiest rank, as (elements, dtype) counts: tensor by tensor,
    largest first (a stable sort, as torch's), each to the least-loaded rank, the first of equals
    (``_get_min_index``); of equally loaded busiest ranks, the first. Where the parameters share one dtype the
    memory model needs only the busiest's elements (:func:`simddp.memory.states.model_states_of_sizes` is linear in
    them but for a factored optimizer's states), and reads this only otherwise."""
    loads = [(0, r) for r in range(dp)]  # (elements held, rank): heap order is _get_min_index's
    held: dict[int, dict[tuple[int, str], int]] = {}
    for size, count in sorted(counts, key=lambda c: -c[0][0]):
        for _ in range(count):
            load, r = loads[0]
            heapq.heapreplace(loads, (load + size[0], r))
            mine = held.setdefault(r, {})
            mine[size] = mine.get(size, 0) + 1
    busiest = max(loads, key=lambda lr: (lr[0], -lr[1]))[1]
    return tuple(held.get(busiest, {}).items())


#: Rules by every input :func:`zero_rule` reads (a step asks for its rule from the plan, the memory model and
#: the limits; a sweep's configurations share a few).
_RULES = KeyedCache(maxsize=1024)


def zero_rule(scenario: Scenario) -> ZeroRule:
    """The rule of ``scenario``'s implementation and ZeRO stage, its ``ddp`` keys and defaults applied."""
    par = scenario.parallelism
    key = (scenario.ddp, par.zero_stage, par.pp, scenario.dp, scenario.training.precision,
           scenario.memory.fsdp_prefetch_layers)
    return _RULES.get(key, lambda: _zero_rule(scenario))


def _zero_rule(scenario: Scenario) -> ZeroRule:
    ddp, par, tr = scenario.ddp, scenario.parallelism, scenario.training
    impl, stage, pp, dp = ddp.implementation, par.zero_stage, par.pp, scenario.dp
    overlap = ddp.overlap if ddp.overlap is not None else default_overlap(impl, stage)
    fp32 = ddp.reduce_in_fp32 if ddp.reduce_in_fp32 is not None else default_reduce_in_fp32(impl, tr.precision)
    grad_bytes = 4 if fp32 else dtype_bytes(_param_dtype(tr.precision))
    # The fields every rule starts from, as a dict: each rule is then built once (dataclasses.replace of 25
    # fields cost as much as the rest of the rule).
    base: dict[str, Any] = dict(
        implementation=impl, stage=stage, name=_NAMES[(impl, stage)], sharded_params=False, reduce_op="all-reduce",
        reduce_in_fp32=fp32, overlap=overlap, every_micro_batch=False, param_sync="none", overlap_param_gather=False,
        bucket_rule="torch", bucket_copies=False, reduce_buffers=0, flatten_copy=False, bucket_numel=None,
        bucket_cap_mb=None, unit_rule="block", reshard_after_forward=True,
        prefetch_units=scenario.memory.fsdp_prefetch_layers,
        prefetch_numel=_or(ddp.stage3_prefetch_numel, DEEPSPEED_PREFETCH_NUMEL),
        reuse_distance_numel=_or(ddp.stage3_max_reuse_distance_numel, DEEPSPEED_MAX_REUSE_DISTANCE_NUMEL),
        persistence_threshold_numel=_or(ddp.stage3_persistence_threshold_numel, DEEPSPEED_PERSISTENCE_THRESHOLD_NUMEL),
        unsharded_across_micro_batches=False, grad_accumulation="autograd",
        separate_reduce_scatter=ddp.separate_reduce_scatter_group,
    )
    if impl == "torch":
        if stage <= 1:  # DDP, with ZeroRedundancyOptimizer's broadcasts after the step for stage 1
            return _rule(base, bucket_copies=not ddp.gradient_as_bucket_view, bucket_cap_mb=ddp.bucket_cap_mb,
                         param_sync="broadcast" if stage == 1 else "none")
        fsdp = {**base, "reduce_op": "reduce-scatter", "bucket_rule": "units", "reshard_after_forward": stage == 3}
        if pp > 1:  # torch.distributed.pipelining: reduce after the last micro-batch, gather before the first
            return _rule(fsdp, overlap=False, param_sync="all-gather", unsharded_across_micro_batches=True)
        return _rule(fsdp, sharded_params=True, every_micro_batch=True, grad_accumulation="sharded")
    if impl == "deepspeed":
        if stage == 0:  # the engine's buffered_allreduce_fallback, after backward
            return _rule(base, overlap=False, flatten_copy=True, bucket_rule="deepspeed",
                         bucket_numel=_numel(ddp, grad_bytes, DEEPSPEED_ALLREDUCE_BUCKET_NUMEL))
        reduce_numel = _numel(ddp, grad_bytes, DEEPSPEED_REDUCE_BUCKET_NUMEL)
        if stage == 3:
            return _rule(base, sharded_params=True, reduce_op="reduce-scatter", every_micro_batch=True,
                         bucket_rule="deepspeed", unit_rule="module", reduce_buffers=1, bucket_numel=reduce_numel,
                         grad_accumulation="sharded")
        return _rule(base, every_micro_batch=stage == 2, param_sync="all-gather", bucket_rule="deepspeed",
                     reduce_buffers=2 if overlap else 1, flatten_copy=True, bucket_numel=reduce_numel,
                     grad_accumulation="sharded" if stage == 2 else "autograd")
    megatron_numel: int | None = None
    if overlap:  # Megatron sets bucket_size to None (one bucket) without --overlap-grad-reduce
        megatron_numel = _numel(ddp, grad_bytes,
                                max(MEGATRON_MIN_BUCKET_NUMEL, MEGATRON_BUCKET_NUMEL_PER_DP_RANK * dp))
    return _rule(base, reduce_op="reduce-scatter" if stage == 1 else "all-reduce",
                 param_sync="all-gather" if stage == 1 else "none", overlap_param_gather=ddp.overlap_param_gather,
                 bucket_rule="megatron", bucket_numel=megatron_numel,
                 grad_accumulation="main-grad" if ddp.gradient_accumulation_fusion is False else "fused")


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _numel(ddp: DDPConfig, grad_bytes: int, default: int) -> int:
    """A bucket in elements: ``bucket_cap_mb`` converted at the gradient's width, or the framework's default."""
    if ddp.bucket_cap_mb is None:
        return default
    return max(1, int(ddp.bucket_cap_mb * MiB) // grad_bytes)


def _param_dtype(precision: str) -> str:
    return "float32" if precision == "fp32" else ("float16" if precision == "fp16-mixed" else "bfloat16")


# -------------------------------------------------------------------------------------- buckets
def gradient_buckets(rule: ZeroRule, grads: Sequence[ParamLike], ready_order: Sequence[int],
                     layers: Sequence[Layer] = (), global_ids: Sequence[int] = (), *,
                     order_checked: bool = False) -> list[BucketSpec]:
    """The gradient buckets of ``rule`` over ``grads`` (as reduction sees them), in reduction order.

    ``ready_order`` lists local indices in gradient-ready order (``order_checked``: known to list each once,
    :func:`simddp.bucketing.assign_in_order`). ``layers`` and ``global_ids`` (the global index of each local
    parameter) are needed by the FSDP-with-pipeline rule, whose buckets are its units.
    """
    if not grads:
        return []
    assign = assign_in_order if order_checked else bucket_assignment
    if rule.bucket_rule == "torch":
        return assign(grads, ready_order, rule.bucket_cap_mb)
    if rule.bucket_rule == "megatron":
        total = sum(p.numel * dtype_bytes(p.dtype) for p in grads)
        cap = total if rule.bucket_numel is None else rule.bucket_numel * rule.gradient_dtype_bytes
        return assign(grads, ready_order, max(cap, 1) / MiB)
    if rule.bucket_rule == "deepspeed":
        assert rule.bucket_numel is not None
        # Stage 0 and stage 1 without overlap_comm walk the parameters in definition order after backward;
        # the hooks of stage 2 (and of overlap_comm) meet them in gradient-ready order.
        order = ready_order if (rule.stage >= 2 or rule.overlap) else range(len(grads))
        return deepspeed_buckets(grads, order, rule.bucket_numel)
    local = {g: k for k, g in enumerate(global_ids)}
    layers = tuple(layers)  # read position by position below
    units, root = fsdp_unit_layers(layers)
    out: list[BucketSpec] = []
    seen: set[int] = set()
    for positions in [*reversed(units), root]:  # reduce-scattered in backward order, the root last
        ids = [local[g] for i in positions for g in layers[i].param_indices if g in local and local[g] not in seen]
        seen.update(ids)
        if ids:
            out.append(_bucket(len(out), ids, grads, sum(grads[k].numel * dtype_bytes(grads[k].dtype) for k in ids)))
    rest = [k for k in range(len(grads)) if k not in seen]  # a tied copy that no layer of this stage owns
    if rest:
        out.append(_bucket(len(out), rest, grads, sum(grads[k].numel * dtype_bytes(grads[k].dtype) for k in rest)))
    return out


def stage_gradient_buckets(rule: ZeroRule, workload: Workload, stage: int, ids: Sequence[int],
                           grads: Sequence[ParamLike], order: Sequence[int],
                           layers: Sequence[Layer]) -> list[BucketSpec]:
    """:func:`gradient_buckets` of pipeline rank ``stage`` (its ``layers``) holding ``ids``, where ``order``
    lists every local index in gradient-ready order; the simulator and the memory model ask for the same.

    The buckets of the size-and-order rules (torch, megatron) depend on nothing else: they are computed once
    per workload structure for each distinct (sizes, order), kept in its ``shared`` memo, so the identical
    middle stages of a pipeline share one assignment.
    """
    if rule.bucket_rule not in ("torch", "megatron"):
        return gradient_buckets(rule, grads, order, layers, ids)
    rule_key = (rule.bucket_rule, rule.bucket_cap_mb, rule.bucket_numel, rule.gradient_dtype_bytes, rule.reduce_in_fp32)
    key = ("stage buckets", stage, *rule_key, tuple(ids))  # the plan's and the memory model's question
    memo = workload.shared
    got: list[BucketSpec] | None = memo.get(key)
    if got is None:  # each key hashed twice, not three times (a tuple's hash is not kept: one per parameter)
        # The sizes as the plan and the memory model give them (Workload.reduced_gradients: ParamSize, the
        # (numel, dtype) pair itself; named parameters would only make a finer key).
        content = ("gradient buckets", *rule_key, tuple(grads), tuple(order))
        got = memo.get(content)
        if got is None:
            # ``order`` lists every local index once (the plan asks with a full order, the memory model pads its
            # own): a restriction of the workload's ready order, checked when it was made. One of another length
            # is checked again, and refused with bucket_assignment's error.
            got = memo[content] = gradient_buckets(rule, grads, order, order_checked=len(order) == len(grads))
        memo[key] = got
    return got


def _bucket(index: int, ids: list[int], grads: Sequence[ParamLike], cap: int) -> BucketSpec:
    size = sum(grads[k].numel * dtype_bytes(grads[k].dtype) for k in ids)
    return BucketSpec(index, ids, size, grads[ids[0]].dtype, cap)


def deepspeed_buckets(grads: Sequence[ParamLike], order: Sequence[int], bucket_numel: int) -> list[BucketSpec]:
    """DeepSpeed's ipg buckets: parameters in ``order`` are appended until the next one would take the bucket
    past ``bucket_numel`` elements, which reduces the bucket first (``reduce_independent_p_g_buckets_and_
    remove_grads``); a parameter larger than the bucket is reduced alone."""
    out: list[BucketSpec] = []
    ids: list[int] = []
    numel = 0
    for k in order:
        if ids and numel + grads[k].numel > bucket_numel:
            out.append(_bucket(len(out), ids, grads, bucket_numel * dtype_bytes(grads[ids[0]].dtype)))
            ids, numel = [], 0
        ids.append(k)
        numel += grads[k].numel
    if ids:
        out.append(_bucket(len(out), ids, grads, bucket_numel * dtype_bytes(grads[ids[0]].dtype)))
    return out


# ---------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class ParamUnit:
    """A unit whose parameters are gathered together: an FSDP flat parameter, or a DeepSpeed module.

    ``positions`` are the unit's layers (positions in the rank's forward-ordered layers); ``param_ids`` the
    global indices of the parameters it gathers (DeepSpeed's persistent ones excluded); ``gather_bwd`` whether
    it is gathered again for backward; ``prefetch_fwd``/``prefetch_bwd`` how many of the following units (in
    that pass's order) are being gathered while it computes; ``reduce_ids`` the global indices of the
    gradients reduce-scattered right after its backward (one FSDP unit, or a DeepSpeed bucket that this
    unit's backward completes; empty while a DeepSpeed bucket is still filling).
    """

    index: int
    name: str
    positions: tuple[int, ...]
    param_ids: tuple[int, ...]
    gather_bwd: bool
    prefetch_fwd: int
    prefetch_bwd: int
    reduce_ids: tuple[int, ...]


@dataclass(frozen=True)
class ParamUnits:
    """The units of one pipeline rank, their root (FSDP: gathered once per micro-batch, kept) and the
    parameters never partitioned (DeepSpeed's persistent ones)."""

    units: list[ParamUnit]
    root: ParamUnit | None
    persistent_ids: tuple[int, ...]


def param_units(rule: ZeroRule, layers: Sequence[Layer], params: Sequence[ParamLike]) -> ParamUnits:
    """The gather units of ``rule`` over a rank's ``layers``; ``params`` are the workload's (global)."""
    layers = tuple(layers)  # read position by position below (a transformer's BlockLayers: made once here)
    if rule.unit_rule == "module":
        return _module_units(rule, layers, params)
    units_pos, root_pos = fsdp_unit_layers(layers)
    # No more units can be in flight than there are: the engines' loops over those ahead stay bounded whatever
    # memory.fsdp_prefetch_layers says (a probe's 10**18 never returned), with the same answer.
    ahead = min(rule.prefetch_units, len(units_pos))
    owner: set[int] = set()
    units: list[ParamUnit] = []
    for positions in units_pos:
        ids = tuple(dict.fromkeys(g for i in positions for g in layers[i].param_indices if g not in owner))
        owner.update(ids)
        first = layers[positions[0]]
        name = f"block {first.block}" if first.block is not None else first.name
        units.append(ParamUnit(len(units), name, tuple(positions), ids, rule.reshard_after_forward,
                               ahead, ahead, ids))
    root = None
    if root_pos:
        ids = tuple(dict.fromkeys(g for i in root_pos for g in layers[i].param_indices if g not in owner))
        root = ParamUnit(len(units), "root", tuple(root_pos), ids, False, 0, 0, ids)
    return ParamUnits(units, root, ())


def _module_units(rule: ZeroRule, layers: Sequence[Layer], params: Sequence[ParamLike]) -> ParamUnits:
    """DeepSpeed ZeRO-3: a unit per layer that owns a partitioned parameter; layers without one (and those
    whose parameters all persist) join the unit before them (the first one, before any)."""
    persistent = tuple(sorted({g for la in layers for g in la.param_indices
                               if params[g].numel < rule.persistence_threshold_numel}))
    pset = set(persistent)
    groups: list[_Group] = []
    pending: list[int] = []
    seen: set[int] = set()
    for pos, la in enumerate(layers):
        ids = [g for g in la.param_indices if g not in seen]
        seen.update(ids)
        gathered = [g for g in ids if g not in pset]
        if gathered:
            groups.append(_Group([*pending, pos], pos, gathered, [g for g in ids if g in pset]))
            pending = []
        elif groups:
            groups[-1].positions.append(pos)
            groups[-1].persistent.extend(ids)
        else:
            pending.append(pos)
    if not groups:  # every parameter persists: one unit that gathers nothing and reduces them all
        groups.append(_Group(pending, 0, [], [g for la in layers for g in la.param_indices]))
    else:
        groups[-1].positions.extend(pending)
    numel = [sum(params[g].numel for g in grp.gathered) for grp in groups]
    # DeepSpeed counts every parameter of the modules it walks toward the reuse distance, persistent included.
    traced = [n + sum(params[g].numel for g in grp.persistent) for n, grp in zip(numel, groups, strict=True)]
    n = len(groups)
    after = [sum(traced[k + 1:]) for k in range(n)]
    # A module's parameters stay gathered after its forward if, before their use in backward, DeepSpeed
    # meets fewer than max_reuse_distance elements: the rest of the forward and the backward down to it.
    kept = [2 * after[k] < rule.reuse_distance_numel for k in range(n)]
    fwd = [_window(numel[k + 1:], rule.prefetch_numel) for k in range(n)]
    bwd_numel = [0 if kept[j] else numel[j] for j in range(n)]
    bwd = [_window(bwd_numel[:k][::-1], rule.prefetch_numel) for k in range(n)]
    reduce_at = _bucket_ends(groups, params, rule)
    units = [ParamUnit(k, layers[grp.named].name, tuple(sorted(grp.positions)), tuple(grp.gathered), not kept[k],
                       fwd[k], bwd[k], reduce_at.get(k, ())) for k, grp in enumerate(groups)]
    return ParamUnits(units, None, persistent)


@dataclass
class _Group:
    positions: list[int]
    named: int
    gathered: list[int]
    persistent: list[int]


def _window(following: Sequence[int], prefetch_numel: int) -> int:
    """How many of the ``following`` units (element counts; 0 = nothing to gather) DeepSpeed's prefetcher has
    in flight: units until ``prefetch_numel`` elements are being fetched, at least one."""
    if prefetch_numel <= 0:
        return 0
    total, count = 0, 0
    for numel in following:
        count += 1
        total += numel
        if total >= prefetch_numel:
            break
    return count


def _bucket_ends(groups: list[_Group], params: Sequence[ParamLike], rule: ZeroRule) -> dict[int, tuple[int, ...]]:
    """DeepSpeed ZeRO-3 gradient buckets, filled in backward order: unit index -> the gradients whose
    reduce-scatter starts after that unit's backward (a bucket is reduced when the next gradient would take
    it past ``bucket_numel`` elements, so during the backward of the unit that gradient belongs to; the
    last, partial bucket at the end of backward). Persistent parameters' gradients are reduced too."""
    assert rule.bucket_numel is not None
    out: dict[int, tuple[int, ...]] = {}
    ids: list[int] = []
    numel = 0
    for k in range(len(groups) - 1, -1, -1):
        for g in [*reversed(groups[k].gathered), *reversed(groups[k].persistent)]:
            if ids and numel + params[g].numel > rule.bucket_numel:
                out[k] = out.get(k, ()) + tuple(ids)
                ids, numel = [], 0
            ids.append(g)
            numel += params[g].numel
    if ids:
        out[0] = out.get(0, ()) + tuple(ids)
    return out


# -------------------------------------------------------------------------------------- helpers
def param_bytes(params: Sequence[ParamLike], ids: Sequence[int]) -> int:
    return sum(params[g].numel * dtype_bytes(params[g].dtype) for g in ids)


def describe(rule: ZeroRule) -> str:
    """One line: the implementation, what it reduces and when."""
    when = "beside backward" if rule.overlap else "after backward"
    every = "every micro-batch" if rule.every_micro_batch else "once per step"
    if rule.sharded_params:
        return f"{rule.name}: per-unit all-gather and reduce-scatter, {every}"
    sync = {"none": "", "all-gather": ", all-gather after the step", "broadcast": ", broadcasts after the step"}
    return f"{rule.name}: bucketed {rule.reduce_op} {when}, {every}{sync[rule.param_sync]}"


__all__ = [
    "DEEPSPEED_ALLREDUCE_BUCKET_NUMEL",
    "DEEPSPEED_MAX_REUSE_DISTANCE_NUMEL",
    "DEEPSPEED_PERSISTENCE_THRESHOLD_NUMEL",
    "DEEPSPEED_PREFETCH_NUMEL",
    "DEEPSPEED_REDUCE_BUCKET_NUMEL",
    "MEGATRON_BUCKET_NUMEL_PER_DP_RANK",
    "MEGATRON_MIN_BUCKET_NUMEL",
    "SUPPORTED_ZERO_STAGES",
    "Implementation",
    "ParamUnit",
    "ParamUnits",
    "ZeroRule",
    "busiest_partition",
    "deepspeed_buckets",
    "default_overlap",
    "default_reduce_in_fp32",
    "describe",
    "gradient_buckets",
    "param_bytes",
    "param_units",
    "stage_gradient_buckets",
    "zero_redundancy_busiest",
    "zero_redundancy_share",
    "zero_rule",
]


def _rule(fields: dict[str, Any], **changes: Any) -> ZeroRule:
    """The rule of ``fields`` with ``changes``, built once."""
    return ZeroRule(**{**fields, **changes})
