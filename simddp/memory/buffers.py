"""Buffers beside model states and activations, by the data-parallel implementation's rule; p2p; NCCL.

The gradient and parameter buffers follow :func:`simddp.zero.zero_rule`, the rule the step simulator times
the same implementation by (its buckets, units, prefetch and reuse), so the two cannot disagree:

* torch DDP (and ZeroRedundancyOptimizer on it): a flat copy of every bucket, none with
  ``gradient_as_bucket_view`` (Li et al., VLDB'20).
* DeepSpeed ZeRO-1/2 (and its stage 0): the contiguous gradient buffers of ``reduce_bucket_size`` elements
  (two with ``overlap_comm``), the flattened copy each bucket's all-reduce makes, and for ZeRO-1 the copy of
  this rank's gradient partition (``grads_in_partition``) beside the full gradients.
* Megatron: none; buckets and the parameter all-gather are views of its contiguous buffers.
* ZeRO-3 (FSDP ``FULL_SHARD``, DeepSpeed): the parameters in flight, the largest over the forward of the
  unit computing plus the units being prefetched, besides the units kept gathered (FSDP's root, which is not
  resharded after forward; DeepSpeed modules within ``stage3_max_reuse_distance``); the unsharded gradients
  in flight: the unit computing (parameter dtype) and, for FSDP, the previous unit's reduce-scatter input
  (reduction dtype); DeepSpeed's contiguous gradient buffer and its never-partitioned small parameters.
* FSDP with pipeline parallelism: the stage's parameters and gradients stay unsharded across micro-batches.

Also pipeline send/receive tensors and NCCL buffers of each communicator. Overheads (CUDA context,
allocator fragmentation) and their sources are in :class:`simddp.config.MemoryConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence

from simddp.bucketing import ParamLike
from simddp.config import Scenario
from simddp.memory.items import Item
from simddp.units import dtype_bytes
from simddp.workload import PRECISION_ACT_BYTES, Layer, Workload, indexable
from simddp.zero import ZeroRule, param_bytes, param_units, stage_gradient_buckets, zero_rule


def buffer_items(scenario: Scenario, workload: Workload, stage: int, ids: list[int],
                 rule: ZeroRule | None = None) -> list[Item]:
    tr, par, mem = scenario.training, scenario.parallelism, scenario.memory
    items: list[Item] = []
    if ids and scenario.dp > 1:  # one data-parallel rank needs no data-parallel wrapper
        items += data_parallel_buffers(rule or zero_rule(scenario), scenario, workload, stage, ids)
    spec = scenario.model.transformer
    if par.pp > 1 and spec is not None:
        sp = par.tp if par.sequence_parallel else 1
        tokens = tr.seq_len * tr.micro_batch_size
        p2p = round(2 * PRECISION_ACT_BYTES[tr.precision] * spec.hidden_size * tokens / sp)
        items.append(Item(category="buffers", name="pipeline send/recv", size_bytes=p2p,
                                note="one activation sent, one gradient received"))
    comms = [name for name, size in (("dp", scenario.dp), ("tp", par.tp), ("pp", par.pp)) if size > 1]
    if scenario.dp > 1 and scenario.ddp.separate_reduce_scatter_group:  # FSDP2's second data-parallel group
        comms.append("dp reduce-scatter")
    if comms:
        nccl = len(comms) * mem.nccl_bytes_per_communicator
        items.append(Item(category="buffers", name="NCCL", size_bytes=nccl,
                                note=f"{len(comms)} ({', '.join(comms)}) x memory.nccl_bytes_per_communicator"))
    return items


def data_parallel_buffers(rule: ZeroRule, scenario: Scenario, workload: Workload, stage: int,
                          ids: list[int]) -> list[Item]:
    """The gradient and parameter buffers ``rule`` keeps on a GPU of pipeline ``stage`` holding ``ids``."""
    params = workload.parameters
    # The gradients as reduced and their ready order, as the plan's rank gradients have them.
    grads, order = workload.reduced_gradients(ids, rule.reduce_in_fp32)
    if len(order) < len(ids):
        seen = set(order)
        order = order + [k for k in range(len(ids)) if k not in seen]  # a tied copy not in this stage's order
    layers = workload.held_layers(stage, scenario.parallelism.pp)  # read by the FSDP rules only
    dp = scenario.dp
    if rule.unsharded_across_micro_batches:
        out = []
        if rule.stage == 3:
            out.append(Item(category="buffers", name="FSDP unsharded parameters",
                                  size_bytes=param_bytes(params, ids),
                                  note="pipeline: not resharded between micro-batches"))
        out.append(Item(category="buffers", name="FSDP unsharded gradients", size_bytes=_bytes(grads),
                              note="pipeline: accumulated unsharded until the last micro-batch"))
        return out
    if rule.sharded_params:
        return _unit_buffers(rule, workload, layers, ids, dp)
    # Size buckets over the ready order: the same for every ZeRO stage and layout sharing this workload.
    buckets = stage_gradient_buckets(rule, workload, stage, ids, grads, order, layers)
    out = []
    if rule.bucket_copies:
        out.append(Item(category="buffers", name="DDP bucket copies",
                              size_bytes=sum(b.size_bytes for b in buckets),
                              note=f"{len(buckets)} buckets; none with gradient_as_bucket_view"))
    if rule.reduce_buffers:
        assert rule.bucket_numel is not None
        size = rule.reduce_buffers * rule.bucket_numel * dtype_bytes(params[ids[0]].dtype)  # the model's dtype
        out.append(Item(category="buffers", name="DeepSpeed reduce buffers", size_bytes=size,
                              note=f"{rule.reduce_buffers} x reduce_bucket_size {rule.bucket_numel:,} elements"
                              + (" (overlap_comm)" if rule.reduce_buffers > 1 else "")))
    if rule.flatten_copy:
        out.append(Item(category="buffers", name="DeepSpeed flattened bucket",
                              size_bytes=max(b.size_bytes for b in buckets),
                              note="largest bucket, flattened for its all-reduce"))
    if rule.implementation == "deepspeed" and rule.stage == 1:
        out.append(Item(category="buffers", name="ZeRO-1 gradient partition", size_bytes=-(-_bytes(grads) // dp),
                              note=f"this rank's gradients copied out of the reduced buckets (1/{dp})"))
    return out


def _unit_buffers(rule: ZeroRule, workload: Workload, layers: Sequence[Layer], ids: list[int],
                  dp: int) -> list[Item]:
    params = indexable(workload.parameters)  # every unit reads its parameters by index
    units = param_units(rule, layers, params)
    out = []
    gbytes = [param_bytes(params, u.param_ids) for u in units.units]
    if rule.stage == 3:
        kept = sum(b for u, b in zip(units.units, gbytes, strict=True) if not u.gather_bwd)
        root = param_bytes(params, units.root.param_ids) if units.root else 0
        window = max((gbytes[k] + sum(gbytes[k + 1:k + 1 + u.prefetch_fwd]) for k, u in enumerate(units.units)
                      if u.gather_bwd), default=0)
        ahead = f"{rule.prefetch_units} prefetched" if rule.unit_rule == "block" else \
            f"stage3_prefetch_bucket_size {rule.prefetch_numel:,} elements"
        kept_note = " + root unit" if rule.unit_rule == "block" else \
            f" + {sum(not u.gather_bwd for u in units.units)} modules kept (stage3_max_reuse_distance)"
        out.append(Item(category="buffers", name="ZeRO-3 gathered parameters", size_bytes=kept + root + window,
                              note=f"largest unit + {ahead}{kept_note}"))
    reduce_bytes = 4 if rule.reduce_in_fp32 else 2
    largest = max((sum(params[g].numel for g in u.param_ids) for u in units.units), default=0)
    own = max((param_bytes(params, u.param_ids) for u in units.units), default=0)
    if rule.unit_rule == "block":
        out.append(Item(category="buffers", name="ZeRO-3 unsharded gradients" if rule.stage == 3 else
                              "FSDP unsharded gradients", size_bytes=own + largest * reduce_bytes,
                              note="unit computing + unit reduce-scattering, largest unit"))
        if units.root is not None and units.units:
            first = units.units[0].positions[0]
            held = [g for i in units.root.positions if i > first for g in layers[i].param_indices]
            if held:  # e.g. an untied output layer: its gradients wait for the root's reduce-scatter
                out.append(Item(category="buffers", name="FSDP root gradients",
                                      size_bytes=param_bytes(params, held),
                                      note="root parameters after the blocks, held until the root's reduce-scatter"))
        return out
    assert rule.bucket_numel is not None
    out.append(Item(category="buffers", name="ZeRO-3 unsharded gradients", size_bytes=own,
                          note="largest module's gradients before they enter the reduce buffer"))
    out.append(Item(category="buffers", name="DeepSpeed reduce buffers",
                          size_bytes=rule.bucket_numel * dtype_bytes(params[ids[0]].dtype),
                          note=f"reduce_bucket_size {rule.bucket_numel:,} elements"))
    if units.persistent_ids:
        persistent = param_bytes(params, units.persistent_ids)
        out.append(Item(category="buffers", name="ZeRO-3 persistent parameters",
                              size_bytes=persistent - -(-persistent // dp),
                              note=f"{len(units.persistent_ids)} tensors under stage3_param_persistence_threshold "
                              f"{rule.persistence_threshold_numel:,}, never partitioned"))
    return out


def _bytes(specs: Sequence[ParamLike]) -> int:
    return sum(p.numel * dtype_bytes(p.dtype) for p in specs)
