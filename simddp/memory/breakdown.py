"""Peak per-GPU memory of a scenario: every pipeline stage's items, the most loaded one reported.

Parameters are those of :func:`simddp.workload.build_workload`: already divided by tp, each on its
pipeline stage (Megatron: blocks split evenly, embedding on the first stage, output layer on the last; a
tied output embedding keeps a copy of the word embedding on the last stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from simddp.config import Scenario, interleaved_all_warmup
from simddp.errors import pipeline_stage
from simddp.memory.activations import (
    all_warmup,
    in_flight_micro_batches,
    in_flight_per_stage,
    recompute_working_set_bytes,
    transformer_embedding_activation_bytes,
    transformer_layer_activation_bytes,
    transformer_output_activation_bytes,
)
from simddp.memory.buffers import buffer_items
from simddp.memory.items import Item, MemoryBreakdown, MemoryItem
from simddp.memory.states import OPTIMIZER_STATE_BYTES_PER_PARAM, model_states_of_sizes
from simddp.sanity import check_memory
from simddp.scenario_io import as_scenario
from simddp.units import fmt_bytes
from simddp.workload import PRECISION_ACT_BYTES, BlockLayers, Workload, build_workload, uses_dropout
from simddp.zero import ZeroRule, busiest_partition, describe, zero_redundancy_share, zero_rule

_ITEM_LIST = TypeAdapter(list[MemoryItem])


def memory_breakdown(scenario: Scenario | dict[str, Any] | str | Path, workload: Workload | None = None,
                     stage: int | None = None) -> MemoryBreakdown:
    """Peak per-GPU memory of ``scenario`` (a scenario, a dict of its keys or a path): the most loaded pipeline
    stage, or ``stage`` when given."""
    if not isinstance(scenario, Scenario):
        scenario = as_scenario(scenario)
    par = scenario.parallelism
    if stage is not None:
        stage = pipeline_stage(stage, par.pp)
    workload = workload or build_workload(scenario)
    rule = zero_rule(scenario)
    same: dict[tuple[object, ...], Any] = {}  # what every stage computes alike, computed once
    twins = workload.rank_twins(par.pp) if par.pp > 1 else [(0, 0)]
    # Every stage's total from its sizes alone; the lines, with their notes, of the reported one only.
    totals = _stage_totals(scenario, workload, rule, same, twins)
    chosen = stage if stage is not None else max(range(par.pp), key=lambda s: (totals[s], -s))
    check_memory(totals[chosen], "the most loaded GPU" if stage is None else f"a GPU of stage {chosen}")
    items, num_params, in_flight = _stage_items(scenario, workload, chosen, rule, same, twins[chosen])
    if sum(i.size_bytes for i in items) != totals[chosen]:  # one formula each way: a bug here, not user input
        raise AssertionError(f"stage {chosen}'s lines do not add up to its total")

    def cat(c: str) -> int:
        return sum(i.size_bytes for i in items if i.category == c)

    total = totals[chosen]
    capacity = scenario.cluster.gpu.hbm_bytes
    return MemoryBreakdown(
        scenario=scenario.name,
        model=scenario.model.name,
        gpu=scenario.cluster.gpu.name,
        num_gpus=scenario.cluster.num_gpus,
        dp=scenario.dp,
        tp=par.tp,
        pp=par.pp,
        zero_stage=par.zero_stage,
        precision=scenario.training.precision,
        optimizer=scenario.training.optimizer,
        recompute=scenario.training.recompute,
        stage=chosen,
        rank=chosen * par.tp * scenario.dp,
        num_params=num_params,
        in_flight_micro_batches=in_flight,
        params_bytes=cat("params"),
        grads_bytes=cat("grads"),
        optimizer_bytes=cat("optimizer"),
        activations_bytes=cat("activations"),
        buffers_bytes=cat("buffers"),
        overhead_bytes=cat("overhead"),
        total_bytes=total,
        capacity_bytes=capacity,
        fits=total <= capacity,
        headroom_bytes=capacity - total,
        stage_total_bytes=totals,
        items=_ITEM_LIST.validate_python([i._asdict() for i in items]),
        notes=_notes(scenario) + list(workload.notes),
    )


def _notes(scenario: Scenario) -> list[str]:
    notes = [f"data parallel: {describe(zero_rule(scenario))}"] if scenario.dp > 1 else []
    if scenario.model.transformer is None and scenario.training.recompute != "none":
        notes.append(
            f"recompute={scenario.training.recompute!r} is not applied to parameter-list models (no transformer blocks)"
        )
    return notes


def _stage_params(scenario: Scenario, workload: Workload, stage: int) -> list[int]:
    """Global indices of the parameters a GPU of ``stage`` holds (a tied output layer's copy on the last stage
    is a parameter of the workload's: ``lm_head.weight`` where pp > 1)."""
    return list(workload.rank_param_ids(stage, scenario.parallelism.pp))


def _stage_fixed(scenario: Scenario, workload: Workload, stage: int, rule: ZeroRule,
                 same: dict[tuple[object, ...], Any], twin: tuple[int, int]) -> tuple[list[Item], int, list[Item]]:
    """:func:`_fixed_items` of ``stage``, or of ``twin[0]``, the first stage alike it
    (:meth:`simddp.workload.Workload.rank_twins`), whose states and buffers it holds too."""
    fixed = same.get(("stage", twin[0]))
    if fixed is None:
        fixed = same[("stage", stage)] = _fixed_items(scenario, workload, stage, rule)
    return fixed  # type: ignore[no-any-return]


def _in_flight(scenario: Scenario, stage: int, same: dict[tuple[object, ...], Any]) -> float:
    par = scenario.parallelism
    m = same.get(("micro-batches",))
    if m is None:
        m = same[("micro-batches",)] = scenario.num_micro_batches
    return in_flight_micro_batches(par.pipeline_schedule, par.pp, stage, m, par.virtual_stages, _megatron(scenario))


def _stage_totals(scenario: Scenario, workload: Workload, rule: ZeroRule, same: dict[tuple[object, ...], Any],
                  twins: list[tuple[int, int]]) -> list[int]:
    """What :func:`_stage_items`' lines of each stage add up to, without the lines: a 1T pipeline sizes 64
    stages and reports one. Twin stages differ only in their micro-batches in flight; their fixed part is
    summed once. One loop over the stages, each line's bytes by :func:`_line_bytes`, as the lines have them."""
    context, fraction = _overhead(scenario, same)
    par = scenario.parallelism
    flights = in_flight_per_stage(par.pipeline_schedule, par.pp, scenario.num_micro_batches, par.virtual_stages,
                                  _megatron(scenario))
    # A transformer's twin stage has the fixed sums and activation lines of the first stage of its kind (as
    # many blocks, neither the first nor the last stage): found once per kind, not per stage. A parameter-list
    # model's lines stay per stage: twins compare kernels, not activation sizes (a layer's kernel bytes carry
    # them today, so its twins hold the same; nothing here relies on that).
    kinds: dict[tuple[int, bool, bool], tuple[int, int, list[tuple[str, float, int, str]]]] = {}
    per_stage = scenario.model.transformer is None
    totals = []
    for stage, twin in enumerate(twins):
        kind = (stage if per_stage else twin[0], stage == 0, stage == par.pp - 1)
        got = kinds.get(kind)
        if got is None:
            got = kinds[kind] = (*_fixed_sums(scenario, workload, stage, rule, same, twin),
                                 _activation_parts(scenario, workload, stage, same))
        fixed, buffers_transient, parts = got
        in_flight = flights[stage]
        out_flight = _output_in_flight(scenario, in_flight, same)
        activations = 0
        for _, per_mb, scale, _ in parts:
            activations += _line_bytes(per_mb, scale, in_flight, out_flight)
        totals.append(fixed + activations + context.size_bytes + round(fraction * (activations + buffers_transient)))
    return totals


def _fixed_sums(scenario: Scenario, workload: Workload, stage: int, rule: ZeroRule,
                same: dict[tuple[object, ...], Any], twin: tuple[int, int]) -> tuple[int, int]:
    """The bytes of :func:`_stage_fixed`'s states and buffers, and of the buffers fragmentation counts (all but
    NCCL's), once per kind of stage."""
    sums = same.get(("fixed sums", twin[0]))
    if sums is None:
        states, _, buffers = _stage_fixed(scenario, workload, stage, rule, same, twin)
        sums = same[("fixed sums", twin[0])] = (
            sum(i.size_bytes for i in states) + sum(i.size_bytes for i in buffers),
            sum(i.size_bytes for i in buffers if i.name != "NCCL"))
    return sums  # type: ignore[no-any-return]


def _overhead(scenario: Scenario, same: dict[tuple[object, ...], Any]) -> tuple[Item, float]:
    """The CUDA context's line and the fragmentation fraction (of activations and transient buffers)."""
    got = same.get(("overhead",))
    if got is None:
        mem = scenario.memory
        got = same[("overhead",)] = (
            Item(category="overhead", name="CUDA context", size_bytes=mem.cuda_context_bytes,
                 note="memory.cuda_context_bytes"), mem.fragmentation_fraction)
    return got  # type: ignore[no-any-return]


def _stage_items(scenario: Scenario, workload: Workload, stage: int, rule: ZeroRule,
                 same: dict[tuple[object, ...], Any], twin: tuple[int, int]) -> tuple[list[Item], int, float]:
    """The memory items of a GPU of ``stage`` (``twin``: as :func:`_stage_fixed`'s); its states and buffers
    are its twin's, only its activations (micro-batches in flight differ by stage) are worked out again."""
    states, num_params, buffers = _stage_fixed(scenario, workload, stage, rule, same, twin)
    in_flight = _in_flight(scenario, stage, same)
    activations = _activation_items(scenario, workload, stage, in_flight, same)
    items = states + activations + buffers
    transient = sum(i.size_bytes for i in activations) + _fixed_sums(scenario, workload, stage, rule, same, twin)[1]
    context, fraction = _overhead(scenario, same)
    items.append(context)
    items.append(Item(category="overhead", name="allocator fragmentation", size_bytes=round(fraction * transient),
                      note=f"{fraction:.0%} of activations and buffers"))
    return items, num_params, in_flight


def _fixed_items(scenario: Scenario, workload: Workload, stage: int,
                 rule: ZeroRule) -> tuple[list[Item], int, list[Item]]:
    """What a GPU of ``stage`` holds whatever the micro-batches in flight: its model-state items, parameter
    count and buffers."""
    tr, par = scenario.training, scenario.parallelism
    dp, zero = scenario.dp, par.zero_stage
    # FSDP keeps fp32 sharded parameters (the master weights) and fp32 sharded gradients whatever dtype it
    # reduces in: the ZeRO paper's 16 bytes per parameter (states.py); reduce_in_fp32 adds no gradient bytes.
    fp32_grads = rule.reduce_in_fp32 and not (rule.implementation == "torch" and zero >= 2)
    ids = _stage_params(scenario, workload, stage)
    # A stage's parameter count and how many parameters have each size (a few distinct sizes: a short key),
    # once per workload; a transformer's blocks counted from block 0.
    num_params, counts = workload.stage_size_counts(stage, par.pp)
    # torch's ZeroRedundancyOptimizer partitions whole tensors: the most loaded rank's own (simddp.zero).
    uneven = dp > 1 and rule.partitions_whole_tensors
    key = ("states", counts, tr.precision, tr.optimizer, zero, dp, fp32_grads, uneven)
    states = workload.shared.get(key)
    if states is None:
        share = None
        if uneven:  # the busiest rank's tensors; with one dtype and states linear in them, only their elements
            dtypes = {dtype for (_, dtype), _ in counts}
            linear = len(dtypes) == 1 and OPTIMIZER_STATE_BYTES_PER_PARAM[tr.optimizer] is not None
            share = (((busiest_partition(workload, stage, par.pp, dp), dtypes.pop()), 1),) if linear else \
                zero_redundancy_share(counts, dp)
        states = workload.shared[key] = model_states_of_sizes(counts, tr.precision, tr.optimizer, zero, dp,
                                                              fp32_grads, share)
    shard = f" / {dp} dp ranks" if dp > 1 else ""
    items = [
        Item(category="params", name="parameters", size_bytes=states.params_bytes,
                   note=f"{num_params:,} params" + (shard if zero >= 3 else "")),
        Item(category="grads", name="gradients", size_bytes=states.grads_bytes,
                   note=("fp32 main grads" if fp32_grads else "param dtype") + (shard if zero >= 2 else "")),
    ]
    owned = " of the rank owning the most (ZeroRedundancyOptimizer's partition by whole tensors)" if uneven else shard
    if states.master_bytes:
        items.append(Item(category="optimizer", name="fp32 master weights", size_bytes=states.master_bytes,
                                note="4 B/param" + (owned if zero >= 1 else "")))
    if states.optimizer_state_bytes or not states.master_bytes:
        items.append(Item(category="optimizer", name=f"{tr.optimizer} states",
                                size_bytes=states.optimizer_state_bytes,
                                note=_state_note(tr.optimizer) + (owned if zero >= 1 else "")))
    return items, num_params, buffer_items(scenario, workload, stage, ids, rule)


def _state_note(optimizer: str) -> str:
    per_param = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer]
    if per_param is None:
        return "factored second moments, fp32"
    return f"{per_param} B/param"


#: How an activation line scales with the micro-batches a stage holds (:func:`_activation_parts`).
_IN_FLIGHT, _OUTPUT, _ONCE = 0, 1, 2


def _activation_parts(scenario: Scenario, workload: Workload, stage: int,
                      same: dict[tuple[object, ...], Any]) -> list[tuple[str, float, int, str]]:
    """A stage's activation lines before the micro-batches in flight: (name, bytes of one micro-batch, how it
    scales, its note as a template of ``{k}``, the micro-batches in flight, and ``{out}``, the output layer's).

    Stages with as many blocks that are neither the first nor the last have the same lines (a 1T pipeline's
    62 middle stages): they are worked out once."""
    tr, par = scenario.training, scenario.parallelism
    spec = scenario.model.transformer
    if spec is None:
        layers = workload.rank_layers(stage, par.pp)
        return [("layer activations", sum(layer.activation_bytes for layer in layers), _IN_FLIGHT,
                 f"{len(layers)} layers' activation_numel_per_sample {{k}}")]
    if ("layer", tr.recompute) not in same:  # what every stage computes alike
        shape: dict[str, Any] = {
            "seq_len": tr.seq_len,
            "micro_batch_size": tr.micro_batch_size,
            "tp": par.tp,
            "sequence_parallel": par.sequence_parallel,
        }
        act = PRECISION_ACT_BYTES[tr.precision]
        dropout = uses_dropout(scenario)
        same[("layer", tr.recompute)] = transformer_layer_activation_bytes(
            spec, **shape, recompute=tr.recompute, act_bytes=act, dropout=dropout, attention=tr.attention)
        same[("working set",)] = recompute_working_set_bytes(
            spec, **shape, recompute=tr.recompute, act_bytes=act, dropout=dropout, attention=tr.attention)
        same[("activation inputs",)] = shape, act, dropout, fmt_bytes(same[("layer", tr.recompute)])
    blocks_key = ("blocks per rank", par.pp)
    if blocks_key not in workload.shared:
        workload.shared[blocks_key] = _blocks_per_rank(workload, par.pp)
    num_blocks = workload.shared[blocks_key][stage]
    key = ("activation parts", num_blocks, stage == 0, stage == par.pp - 1)
    parts: list[tuple[str, float, int, str]] | None = same.get(key)
    if parts is not None:
        return parts
    shape, act, dropout, per_layer_text = same[("activation inputs",)]
    per_layer = same[("layer", tr.recompute)]
    parts = [("transformer layers", num_blocks * per_layer, _IN_FLIGHT,
              f"{num_blocks} layers x {per_layer_text} {{k}} (recompute {tr.recompute})")]
    if stage == 0:
        emb = transformer_embedding_activation_bytes(spec, **shape, dropout=dropout)
        parts.append(("embedding", emb, _IN_FLIGHT, f"token ids{', dropout mask' if dropout else ''} {{k}}"))
    if stage == par.pp - 1:
        out = transformer_output_activation_bytes(spec, **shape, act_bytes=act, cross_entropy=tr.cross_entropy)
        what = "logits, fp32 softmax" if tr.cross_entropy == "fused" else "fp32 log-probs and their gradients"
        parts.append(("output layer and loss", out, _OUTPUT, f"norm/head inputs, {what} x {{out}}"))
    if tr.recompute != "none" and num_blocks:
        parts.append(("recompute working set", same[("working set",)], _ONCE, "one layer re-created in backward"))
    same[key] = parts
    return parts


def _blocks_per_rank(workload: Workload, pp: int) -> list[int]:
    """How many transformer blocks each pipeline rank holds (all its virtual stages): a block's layers share
    one stage; a transformer's (:class:`BlockLayers`) are read without making its blocks."""
    ranks: list[set[int]] = [set() for _ in range(pp)]
    layers = workload.layers
    if isinstance(layers, BlockLayers):  # block i's stage, without making the blocks
        for block, stage in enumerate(layers.block_stages):
            ranks[stage % pp].add(block)
        return [len(blocks) for blocks in ranks]
    for la in layers:
        if la.block is not None:
            ranks[la.stage % pp].add(la.block)
    return [len(blocks) for blocks in ranks]


def _activation_sizes(scenario: Scenario, workload: Workload, stage: int, in_flight: float,
                      same: dict[tuple[object, ...], Any]) -> list[tuple[int, tuple[str, float, int, str]]]:
    """Each activation line's bytes on ``stage`` with ``in_flight`` micro-batches, beside its part."""
    out_flight = _output_in_flight(scenario, in_flight, same)
    return [(_line_bytes(part[1], part[2], in_flight, out_flight), part)
            for part in _activation_parts(scenario, workload, stage, same)]


def _line_bytes(per_mb: float, scale: int, in_flight: float, out_flight: float) -> int:
    """An activation line's bytes: one micro-batch's, scaled as its part says (:func:`_activation_parts`)."""
    return int(per_mb if scale == _ONCE else round(per_mb * (in_flight if scale == _IN_FLIGHT else out_flight)))


def _output_in_flight(scenario: Scenario, in_flight: float, same: dict[tuple[object, ...], Any]) -> float:
    """Micro-batches whose output-layer and loss activations the last stage holds: the loss sits in the last
    virtual stage, whose micro-batches run forward then backward at once (1F1B, interleaved); a schedule that
    runs every forward first keeps every micro-batch's (GPipe, and interleaving with as many micro-batches as
    stages, :func:`simddp.memory.activations.all_warmup`: there ``in_flight`` is every micro-batch)."""
    first = same.get(("all warm-up",))
    if first is None:  # once per breakdown (every stage asks)
        par = scenario.parallelism
        first = same[("all warm-up",)] = all_warmup(par.pipeline_schedule, par.pp, scenario.num_micro_batches,
                                                    _megatron(scenario))
    return in_flight if first else 1.0


def _megatron(scenario: Scenario) -> bool:
    """Whether the pipeline's interleaving runs every forward first at m == pp, as the simulator orders it."""
    return interleaved_all_warmup(scenario.ddp.implementation)


def _activation_items(scenario: Scenario, workload: Workload, stage: int, in_flight: float,
                      same: dict[tuple[object, ...], Any]) -> list[Item]:
    out_flight = _output_in_flight(scenario, in_flight, same)
    k = f"x {in_flight:g} micro-batch{'es' if in_flight != 1 else ''}"
    out = f"{out_flight:g} micro-batch{'es' if out_flight != 1 else ''}"
    return [Item(category="activations", name=name, size_bytes=size, note=note.format(k=k, out=out))
            for size, (name, _, _, note) in _activation_sizes(scenario, workload, stage, in_flight, same)]
