"""Buffers beside model states and activations: DDP bucket copies, ZeRO reduce buckets, FSDP gathers, p2p, NCCL.

Buffers: DDP's bucket copies of the gradients (none with ``gradient_as_bucket_view``, Li et al., VLDB'20);
ZeRO-2's reduce buckets (two: one filling, one reducing); ZeRO-3/FSDP gathered parameters of the unit
computing, of ``fsdp_prefetch_layers`` prefetched units and of the root unit (embedding and output layer,
which FSDP does not reshard after forward), plus one unit's unsharded gradients; pipeline send/receive
tensors; NCCL buffers of each communicator. Overheads: the CUDA context and the caching allocator's
fragmentation. Their defaults and sources are in :class:`simddp.config.MemoryConfig`.
"""

from __future__ import annotations

from simddp.bucketing import bucket_assignment
from simddp.config import Scenario
from simddp.memory.items import MemoryItem
from simddp.units import dtype_bytes
from simddp.workload import PRECISION_ACT_BYTES, Workload, fsdp_unit_layers, grad_reduce_spec


def buffer_items(scenario: Scenario, workload: Workload, stage: int, ids: list[int]) -> list[MemoryItem]:
    tr, par, ddp, mem = scenario.training, scenario.parallelism, scenario.ddp, scenario.memory
    items: list[MemoryItem] = []
    zero = par.zero_stage
    grads = [grad_reduce_spec(workload.parameters[i], ddp.reduce_in_fp32) for i in ids]
    if zero <= 2 and ids and (zero == 2 or not ddp.gradient_as_bucket_view):
        local = {g: k for k, g in enumerate(ids)}
        order = [local[g] for g in workload.grad_ready_order if g in local]
        seen = set(order)
        order += [k for k in range(len(ids)) if k not in seen]  # a tied copy not in this stage's order
        key = ("memory buckets", stage, ddp.bucket_cap_mb, ddp.reduce_in_fp32, tuple(ids))
        if key not in workload.memo:  # the same for every ZeRO stage and layout sharing this workload
            workload.memo[key] = bucket_assignment(grads, order, ddp.bucket_cap_mb)
        buckets = workload.memo[key]
        if zero == 2:
            largest = max(b.size_bytes for b in buckets)
            items.append(MemoryItem(category="buffers", name="ZeRO-2 reduce buckets", size_bytes=2 * largest,
                                    note="2 x largest bucket (one filling, one reducing)"))
        else:
            items.append(MemoryItem(category="buffers", name="DDP bucket copies",
                                    size_bytes=sum(b.size_bytes for b in buckets),
                                    note=f"{len(buckets)} buckets; none with gradient_as_bucket_view"))
    if zero == 3 and ids:
        units, root = fsdp_units(scenario, workload, stage, ids)
        width = {i: dtype_bytes(workload.parameters[i].dtype) for i in ids}
        gwidth = {g: dtype_bytes(spec.dtype) for g, spec in zip(ids, grads, strict=True)}
        unit_bytes = max((sum(workload.parameters[i].numel * width[i] for i in u) for u in units), default=0)
        unit_grads = max((sum(workload.parameters[i].numel * gwidth[i] for i in u) for u in units), default=0)
        root_bytes = sum(workload.parameters[i].numel * width[i] for i in root)
        gathered = (1 + mem.fsdp_prefetch_layers) * unit_bytes + root_bytes
        items.append(MemoryItem(category="buffers", name="ZeRO-3 gathered parameters", size_bytes=gathered,
                                note=f"(1 + {mem.fsdp_prefetch_layers} prefetched) x largest unit + root unit"))
        items.append(MemoryItem(category="buffers", name="ZeRO-3 unsharded gradients", size_bytes=unit_grads,
                                note="largest unit, before its reduce-scatter"))
    spec = scenario.model.transformer
    if par.pp > 1 and spec is not None:
        sp = par.tp if par.sequence_parallel else 1
        tokens = tr.seq_len * tr.micro_batch_size
        p2p = round(2 * PRECISION_ACT_BYTES[tr.precision] * spec.hidden_size * tokens / sp)
        items.append(MemoryItem(category="buffers", name="pipeline send/recv", size_bytes=p2p,
                                note="one activation sent, one gradient received"))
    comms = [name for name, size in (("dp", scenario.dp), ("tp", par.tp), ("pp", par.pp)) if size > 1]
    if comms:
        nccl = len(comms) * mem.nccl_bytes_per_communicator
        items.append(MemoryItem(category="buffers", name="NCCL", size_bytes=nccl,
                                note=f"{len(comms)} ({', '.join(comms)}) x memory.nccl_bytes_per_communicator"))
    return items


def fsdp_units(
    scenario: Scenario, workload: Workload, stage: int, ids: list[int]
) -> tuple[list[list[int]], list[int]]:
    """Parameter indices of each FSDP unit of ``stage``, and of the root unit.

    The units are :func:`simddp.workload.fsdp_unit_layers`' (one per transformer block, or per layer of a
    parameter list), the rule the simulator times them by; the root holds every other parameter.
    """
    layers = workload.rank_layers(stage, scenario.parallelism.pp)
    unit_layers, _ = fsdp_unit_layers(layers)
    owner: set[int] = set()
    units: list[list[int]] = []
    for positions in unit_layers:
        params = [i for pos in positions for i in layers[pos].param_indices if i not in owner]
        owner.update(params)
        if params:
            units.append(params)
    root = [i for i in ids if i not in owner]
    return units, root
