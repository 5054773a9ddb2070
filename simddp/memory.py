"""Per-GPU memory of one training step: model states, activations, buffers and overheads.

Model states (Rajbhandari et al., SC'20, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", sec. 3.1 and 5). With Ψ parameters on a GPU, mixed precision keeps a 16-bit working copy (2Ψ), its
16-bit gradient (2Ψ) and K = 12 bytes per parameter of fp32 master weight, Adam momentum and variance. ZeRO
shards over the Nd data-parallel ranks: stage 1 the K bytes (4Ψ + 12Ψ/Nd), stage 2 the gradients too
(2Ψ + 14Ψ/Nd), stage 3 everything (16Ψ/Nd). fp32 training keeps 4 + 4 + 8 (no master copy). SGD keeps
nothing beyond the master copy, SGD with momentum one fp32 buffer, Adafactor (Shazeer and Stern, 2018)
factored second moments: r + c values for an r x c matrix, taken as 2 sqrt(n) for a tensor of n elements
(square) and n for tensors smaller than that. A parameter list's own dtype is honoured: fp32 parameters
under mixed precision (torch.autocast) keep 4 + 4 bytes and no master copy, the same 16 bytes with Adam.
``ddp.reduce_in_fp32`` (Megatron's fp32 main grads) makes gradients 4 bytes. PyTorch FSDP maps onto the
same model: NO_SHARD = stage 0, SHARD_GRAD_OP = stage 2, FULL_SHARD = stage 3 (its fp32 sharded parameters,
gradients and Adam states are 4 + 4 + 8 = 16Ψ/Nd, the same total).

Parameters are those of :func:`simddp.workload.build_workload`: already divided by tp, each on its
pipeline stage (Megatron: blocks split evenly, embedding on the first stage, output layer on the last; a
tied output embedding keeps a copy of the word embedding on the last stage).

Activations of a transformer layer for one micro-batch (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Table 2), with s tokens, b samples, hidden h, a heads, tp t:
sbh(34 + 5as/h) bytes without parallelism, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
sbh(34/t + 5as/(ht)) with sequence parallelism; selective recompute drops the 5as/h attention-core term;
full recompute keeps only the layer input, 2sbh (2sbh/t with sequence parallelism). The terms are built
from the saved tensors so that they follow the real shape: norm inputs, GEMM inputs, Q, K and V (GQA
shrinks K and V), the attention core (softmax, dropout mask and output: 5 bytes per score, 2 without
dropout), and the MLP (GeLU input and output; a gated MLP saves the gate and up outputs and their product,
as Megatron's fused SwiGLU does). 16-bit activations are 2 bytes, fp32 ones 4; dropout masks 1 byte.
Embedding (int64 token ids, dropout mask) and output layer (final norm input, logits in the activation
dtype and the fp32 softmax the fused cross-entropy saves) add to the first and last stage. With recompute,
backward re-creates one layer's activations at a time (one micro-batch), counted as a working set.

Pipelines hold several micro-batches (Narayanan et al., SC'21; Korthikanti et al. sec. 4.2.3): 1F1B's stage
i holds min(p - i, m), GPipe all m, interleaved 1F1B with v chunks min(mv, 2(p - i - 1) + (v - 1)p + 1)
chunks, which is p(1 + (p - 1)/(pv)) micro-batches on the first stage. Parameter-list models use their
layers' ``activation_numel_per_sample`` and are not recomputed.

Buffers: DDP's bucket copies of the gradients (none with ``gradient_as_bucket_view``, Li et al., VLDB'20);
ZeRO-2's reduce buckets (two: one filling, one reducing); ZeRO-3/FSDP gathered parameters of the unit
computing, of ``fsdp_prefetch_layers`` prefetched units and of the root unit (embedding and output layer,
which FSDP does not reshard after forward), plus one unit's unsharded gradients; pipeline send/receive
tensors; NCCL buffers of each communicator. Overheads: the CUDA context and the caching allocator's
fragmentation. Their defaults and sources are in :class:`simddp.config.MemoryConfig`.

Not modelled: CPU/NVMe offload, activation offload, optimizer-step temporaries, context parallelism, MoE.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simddp.bucketing import ddp_buckets
from simddp.config import ParameterSpec, Scenario, ScenarioError, TransformerSpec, format_validation_error
from simddp.units import dtype_bytes, fmt_bytes
from simddp.workload import PRECISION_ACT_BYTES, PRECISION_PARAM_DTYPE, Workload, build_workload, grad_reduce_spec

__all__ = [
    "FSDP_SHARDING_ZERO_STAGE",
    "OPTIMIZER_STATE_BYTES_PER_PARAM",
    "LayoutFit",
    "LayoutSearch",
    "MemoryBreakdown",
    "MemoryItem",
    "ModelStatesBytes",
    "in_flight_micro_batches",
    "max_micro_batch_that_fits",
    "memory_breakdown",
    "model_states_bytes",
    "smallest_layout_that_fits",
    "transformer_embedding_activation_bytes",
    "transformer_layer_activation_bytes",
    "transformer_output_activation_bytes",
    "zero_model_states_bytes",
]

Category = Literal["params", "grads", "optimizer", "activations", "buffers", "overhead"]
Recompute = Literal["none", "selective", "full"]

#: PyTorch FSDP sharding strategies as ZeRO stages (Zhao et al., VLDB'23, "PyTorch FSDP", sec. 3).
FSDP_SHARDING_ZERO_STAGE: dict[str, int] = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}

#: fp32 optimizer-state bytes per parameter besides the master weights (None: Adafactor, per tensor).
OPTIMIZER_STATE_BYTES_PER_PARAM: dict[str, int | None] = {
    "adamw": 8,  # exp_avg + exp_avg_sq
    "adam": 8,
    "sgd": 0,
    "sgd-momentum": 4,  # momentum_buffer
    "adafactor": None,  # factored second moment, no first moment (beta1 = None, the default)
}

_TOKEN_ID_BYTES = 8  # int64 input ids
_SOFTMAX_BYTES = 4  # fp32 softmax saved by the fused (vocab-parallel) cross-entropy
_RECOMPUTE = ("none", "selective", "full")
_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
_FP32_BYTES = 4


# ------------------------------------------------------------------------------------ model states
class ModelStatesBytes(NamedTuple):
    """Model-state bytes on one GPU after ZeRO sharding."""

    params_bytes: int
    grads_bytes: int
    master_bytes: int
    optimizer_state_bytes: int

    @property
    def optimizer_bytes(self) -> int:
        """Master weights + optimizer states (the ZeRO paper's K bytes per parameter)."""
        return self.master_bytes + self.optimizer_state_bytes

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _optimizer_state_numel(optimizer: str, numel: int) -> int:
    per_param = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer]
    if per_param is not None:
        return per_param * numel // _FP32_BYTES
    return min(numel, 2 * math.isqrt(numel - 1) + 2)  # r + c of a square matrix, ceil(sqrt(n)) each


def model_states_bytes(
    params: Iterable[ParameterSpec],
    precision: str,
    optimizer: str,
    zero_stage: int = 0,
    dp: int = 1,
    reduce_in_fp32: bool = False,
) -> ModelStatesBytes:
    """Parameters, gradients, master weights and optimizer states of ``params`` on one of ``dp`` ranks.

    ZeRO shards flat buffers by element, so a shard is ``ceil(bytes / dp)`` (Rajbhandari et al., SC'20).
    """
    if precision not in PRECISION_ACT_BYTES:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_ACT_BYTES)}")
    if optimizer not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(OPTIMIZER_STATE_BYTES_PER_PARAM)}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage({zero_stage}) must be 0, 1, 2 or 3")
    if dp < 1:
        raise ValueError(f"dp({dp}) must be >= 1")
    p_bytes = g_bytes = master = state = 0
    for p in params:
        width = dtype_bytes(p.dtype)
        p_bytes += p.numel * width
        g_bytes += p.numel * (max(width, _FP32_BYTES) if reduce_in_fp32 else width)
        if precision != "fp32" and width < _FP32_BYTES:
            master += p.numel * _FP32_BYTES
        state += _optimizer_state_numel(optimizer, p.numel) * _FP32_BYTES

    def shard(num_bytes: int, sharded: bool) -> int:
        return -(-num_bytes // dp) if sharded else num_bytes

    return ModelStatesBytes(
        params_bytes=shard(p_bytes, zero_stage >= 3),
        grads_bytes=shard(g_bytes, zero_stage >= 2),
        master_bytes=shard(master, zero_stage >= 1),
        optimizer_state_bytes=shard(state, zero_stage >= 1),
    )


def zero_model_states_bytes(
    num_params: int, dp: int, zero_stage: int, precision: str = "bf16-mixed", optimizer: str = "adamw"
) -> ModelStatesBytes:
    """Model states of Ψ = ``num_params`` parameters in the training precision's dtype (the ZeRO formulas)."""
    if num_params <= 0:
        raise ValueError(f"num_params({num_params}) must be > 0")
    if precision not in PRECISION_PARAM_DTYPE:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_PARAM_DTYPE)}")
    param = ParameterSpec(name="params", numel=num_params, dtype=PRECISION_PARAM_DTYPE[precision])
    return model_states_bytes([param], precision, optimizer, zero_stage, dp)


# ------------------------------------------------------------------------------------ activations
def _check_shape(spec: TransformerSpec, seq_len: int, micro_batch_size: int, tp: int, act_bytes: int) -> None:
    for name, value in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size), ("tp", tp),
                        ("act_bytes", act_bytes)):
        if value <= 0:
            raise ValueError(f"{name}({value}) must be > 0")
    if spec.num_heads % tp:
        raise ValueError(f"tp({tp}) does not divide num_heads({spec.num_heads})")


def transformer_layer_activation_bytes(
    spec: TransformerSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    act_bytes: int = 2,
    dropout: bool = True,
) -> int:
    """Bytes one transformer layer saves for backward, one micro-batch (Korthikanti et al. 2022, Table 2).

    For a GPT layer (4h MLP, no GQA, dropout, 16-bit) this is exactly sbh(34 + 5as/h) at t = 1,
    sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht)) with sequence parallelism;
    selective recompute drops the 5as/h term, full recompute keeps the layer input 2sbh (/t with SP).
    """
    _check_shape(spec, seq_len, micro_batch_size, tp, act_bytes)
    if recompute not in _RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; expected one of {list(_RECOMPUTE)}")
    tokens = seq_len * micro_batch_size
    h, a = spec.hidden_size, spec.num_heads
    sp = tp if sequence_parallel else 1
    if recompute == "full":
        return round(act_bytes * h * tokens / sp)
    head_dim = h // a
    q_width = h / tp
    kv_width = max(spec.kv_heads // tp, 1) * head_dim  # tp > kv heads replicates K/V (Megatron GQA)
    mask = 1 if dropout else 0
    # Norm inputs, QKV and MLP inputs, two dropout masks: outside the tp-split GEMMs (SP shards them).
    replicated = (4 * act_bytes + 2 * mask) * h / sp
    # Q and K for QK^T, V, out-projection input; MLP: GeLU in/out, or gate, up and their product.
    mlp_tensors = 3 if spec.gated_mlp else 2
    sharded = act_bytes * (2 * q_width + 2 * kv_width) + mlp_tensors * act_bytes * spec.ffn_hidden_size / tp
    # Softmax output, its dropout mask and dropout output: a/t heads x s keys per token.
    core = ((2 * act_bytes + mask) if dropout else act_bytes) * (a / tp) * seq_len
    per_token = replicated + sharded + (core if recompute == "none" else 0.0)
    return round(per_token * tokens)


def transformer_embedding_activation_bytes(
    spec: TransformerSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    dropout: bool = True,
) -> int:
    """First stage, one micro-batch: int64 token ids and the embedding dropout mask (Megatron's report)."""
    _check_shape(spec, seq_len, micro_batch_size, tp, 1)
    tokens = seq_len * micro_batch_size
    sp = tp if sequence_parallel else 1
    return round(tokens * (_TOKEN_ID_BYTES + (spec.hidden_size / sp if dropout else 0.0)))


def transformer_output_activation_bytes(
    spec: TransformerSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    act_bytes: int = 2,
) -> int:
    """Last stage, one micro-batch: final-norm and output-layer inputs, the logits and the fp32 softmax.

    The vocabulary-parallel output layer and cross-entropy divide the logits by tp (Megatron); the loss
    keeps an fp32 softmax (4 bytes per logit) beside the logits in the activation dtype.
    """
    _check_shape(spec, seq_len, micro_batch_size, tp, act_bytes)
    tokens = seq_len * micro_batch_size
    sp = tp if sequence_parallel else 1
    norm_and_head_inputs = 2 * act_bytes * spec.hidden_size / sp
    logits = (act_bytes + _SOFTMAX_BYTES) * spec.vocab_size / tp
    return round(tokens * (norm_and_head_inputs + logits))


def in_flight_micro_batches(
    schedule: str, pp: int, stage: int, num_micro_batches: int, virtual_stages: int = 1
) -> float:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak.

    1F1B: min(p - stage, m) (Narayanan et al., SC'21); GPipe: m (Huang et al., NeurIPS'19); interleaved
    1F1B with v chunks per stage: Megatron's warm-up of 2(p - stage - 1) + (v - 1)p chunks plus the one in
    flight, capped at mv, in units of whole micro-batches (chunks / v); on the first stage this is
    p(1 + (p - 1)/(pv)) (Korthikanti et al. 2022, sec. 4.2.3).
    """
    if schedule not in _SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected one of {list(_SCHEDULES)}")
    for name, value in (("pp", pp), ("num_micro_batches", num_micro_batches), ("virtual_stages", virtual_stages)):
        if value < 1:
            raise ValueError(f"{name}({value}) must be >= 1")
    if not 0 <= stage < pp:
        raise ValueError(f"stage({stage}) must be in 0..{pp - 1} for pp({pp})")
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(num_micro_batches)
    if schedule == "interleaved-1f1b" and virtual_stages > 1:
        v = virtual_stages
        chunks = min(num_micro_batches * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
        return chunks / v
    return float(min(pp - stage, num_micro_batches))


# ------------------------------------------------------------------------------------------ results
class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryItem(_Frozen):
    """One line of the breakdown."""

    category: Category = Field(description="params, grads, optimizer, activations, buffers or overhead.")
    name: str = Field(description="What the bytes hold.")
    size_bytes: int = Field(ge=0, description="Bytes on the GPU.")
    note: str = Field(default="", description="How the size was obtained.")


class MemoryBreakdown(_Frozen):
    """Peak memory of the most loaded GPU in one training step, by category."""

    scenario: str
    model: str
    gpu: str
    num_gpus: int
    dp: int
    tp: int
    pp: int
    zero_stage: int
    precision: str
    optimizer: str
    recompute: str
    stage: int = Field(description="Pipeline stage of the most loaded GPU (0-based); every rank in it is alike.")
    rank: int = Field(description="Global rank of the first GPU of that stage (tp fastest, then dp, then pp).")
    num_params: int = Field(description="Parameters on this GPU before ZeRO sharding (its tp shard and stage).")
    in_flight_micro_batches: float = Field(description="Micro-batches whose activations the stage holds at peak.")
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int = Field(description="fp32 master weights + optimizer states.")
    activations_bytes: int
    buffers_bytes: int = Field(description="Bucket copies, gathered parameters, pipeline and NCCL buffers.")
    overhead_bytes: int = Field(description="CUDA context and allocator fragmentation.")
    total_bytes: int
    capacity_bytes: int = Field(description="Device memory (cluster.gpu.hbm_bytes).")
    fits: bool
    headroom_bytes: int = Field(description="capacity - total; negative when it does not fit.")
    stage_total_bytes: list[int] = Field(description="Total bytes of each pipeline stage.")
    items: list[MemoryItem]
    notes: list[str] = Field(default_factory=list)

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def verdict(self) -> str:
        """'fits, 12.3 GiB headroom (15% of 79.6 GiB)' or 'does not fit: 3.1 GiB over 79.6 GiB'."""
        cap = fmt_bytes(self.capacity_bytes)
        if self.fits:
            share = self.headroom_bytes / self.capacity_bytes
            return f"fits, {fmt_bytes(self.headroom_bytes)} headroom ({share:.0%} of {cap})"
        return f"does not fit: {fmt_bytes(-self.headroom_bytes)} over {cap}"

    def to_json_dict(self) -> dict[str, Any]:
        """The CLI's ``--json`` form: ``{"memory": {...}}``."""
        return {"memory": self.model_dump()}

    def to_dataframe(self) -> Any:
        """One row per item (pandas, imported lazily: the library does not depend on it)."""
        import pandas as pd

        return pd.DataFrame([i.model_dump() for i in self.items])


class LayoutFit(_Frozen):
    """One parallel layout and whether it fits."""

    zero_stage: int
    tp: int
    pp: int
    dp: int
    total_bytes: int
    capacity_bytes: int
    fits: bool


class LayoutSearch(_Frozen):
    """Smallest ZeRO stage, tp or pp that makes a scenario fit on ``num_gpus`` GPUs."""

    num_gpus: int
    current: LayoutFit | None = Field(description="The scenario's own layout (null if invalid on num_gpus).")
    smallest_zero_stage: LayoutFit | None = Field(description="Lowest ZeRO stage that fits at the same tp and pp.")
    smallest_tp: LayoutFit | None = Field(description="Lowest tp that fits at the same ZeRO stage and pp.")
    smallest_pp: LayoutFit | None = Field(description="Lowest pp that fits at the same ZeRO stage and tp.")
    best: LayoutFit | None = Field(
        description="Fitting layout with the least model parallelism (tp x pp), then ZeRO stage, then pp."
    )
    num_layouts: int = Field(description="Valid layouts evaluated.")

    def to_json_dict(self) -> dict[str, Any]:
        return {"layout": self.model_dump()}


# ------------------------------------------------------------------------------------- a scenario
def memory_breakdown(scenario: Scenario, workload: Workload | None = None, stage: int | None = None) -> MemoryBreakdown:
    """Peak per-GPU memory of ``scenario``: the most loaded pipeline stage, or ``stage`` when given."""
    par = scenario.parallelism
    if stage is not None and not 0 <= stage < par.pp:
        raise ValueError(f"stage({stage}) must be in 0..{par.pp - 1} for pp({par.pp})")
    workload = workload or build_workload(scenario)
    stages = [_stage_items(scenario, workload, s) for s in range(par.pp)]
    totals = [sum(i.size_bytes for i in items) for items, _, _ in stages]
    chosen = stage if stage is not None else max(range(par.pp), key=lambda s: (totals[s], -s))
    items, num_params, in_flight = stages[chosen]

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
        items=items,
        notes=_notes(scenario) + list(workload.notes),
    )


def _notes(scenario: Scenario) -> list[str]:
    par, notes = scenario.parallelism, []
    if par.zero_stage >= 2 and par.pp > 1:
        notes.append(f"zero_stage={par.zero_stage} with pp={par.pp}: DeepSpeed allows only ZeRO-1 with pipelines")
    if scenario.model.transformer is None and scenario.training.recompute != "none":
        notes.append(
            f"recompute={scenario.training.recompute!r} is not applied to parameter-list models (no transformer blocks)"
        )
    return notes


def _stage_params(scenario: Scenario, workload: Workload, stage: int) -> list[int]:
    """Global indices of the parameters a GPU of ``stage`` holds (a tied output layer keeps a copy)."""
    ids = sorted({i for layer in workload.rank_layers(stage, scenario.parallelism.pp) for i in layer.param_indices})
    tf = scenario.model.transformer
    pp = scenario.parallelism.pp
    if tf is not None and tf.tied_embeddings and pp > 1 and stage == pp - 1:
        word = [i for i, p in enumerate(workload.parameters) if p.name.endswith(("wte.weight", "embed_tokens.weight"))]
        ids = sorted(set(ids) | set(word[:1]))
    return ids


def _stage_items(scenario: Scenario, workload: Workload, stage: int) -> tuple[list[MemoryItem], int, float]:
    tr, par, ddp, mem = scenario.training, scenario.parallelism, scenario.ddp, scenario.memory
    dp, zero = scenario.dp, par.zero_stage
    ids = _stage_params(scenario, workload, stage)
    params = [workload.parameters[i] for i in ids]
    num_params = sum(p.numel for p in params)
    states = model_states_bytes(params, tr.precision, tr.optimizer, zero, dp, ddp.reduce_in_fp32)
    shard = f" / {dp} dp ranks" if dp > 1 else ""
    items = [
        MemoryItem(category="params", name="parameters", size_bytes=states.params_bytes,
                   note=f"{num_params:,} params" + (shard if zero >= 3 else "")),
        MemoryItem(category="grads", name="gradients", size_bytes=states.grads_bytes,
                   note=("fp32 main grads" if ddp.reduce_in_fp32 else "param dtype") + (shard if zero >= 2 else "")),
    ]
    if states.master_bytes:
        items.append(MemoryItem(category="optimizer", name="fp32 master weights", size_bytes=states.master_bytes,
                                note="4 B/param" + (shard if zero >= 1 else "")))
    if states.optimizer_state_bytes or not states.master_bytes:
        items.append(MemoryItem(category="optimizer", name=f"{tr.optimizer} states",
                                size_bytes=states.optimizer_state_bytes,
                                note=_state_note(tr.optimizer) + (shard if zero >= 1 else "")))
    in_flight = in_flight_micro_batches(par.pipeline_schedule, par.pp, stage, scenario.num_micro_batches,
                                        par.virtual_stages)
    items += _activation_items(scenario, workload, stage, in_flight)
    items += _buffer_items(scenario, workload, stage, ids)
    transient = sum(i.size_bytes for i in items if i.category in ("activations", "buffers") and i.name != "NCCL")
    items.append(MemoryItem(category="overhead", name="CUDA context", size_bytes=mem.cuda_context_bytes,
                            note="memory.cuda_context_bytes"))
    items.append(MemoryItem(category="overhead", name="allocator fragmentation",
                            size_bytes=round(mem.fragmentation_fraction * transient),
                            note=f"{mem.fragmentation_fraction:.0%} of activations and buffers"))
    return items, num_params, in_flight


def _state_note(optimizer: str) -> str:
    per_param = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer]
    if per_param is None:
        return "factored second moments, fp32"
    return f"{per_param} B/param"


def _dropout(scenario: Scenario, spec: TransformerSpec) -> bool:
    return scenario.memory.dropout if scenario.memory.dropout is not None else not spec.gated_mlp


def _activation_items(scenario: Scenario, workload: Workload, stage: int, in_flight: float) -> list[MemoryItem]:
    tr, par = scenario.training, scenario.parallelism
    layers = workload.rank_layers(stage, scenario.parallelism.pp)
    spec = scenario.model.transformer
    k = f"x {in_flight:g} micro-batch{'es' if in_flight != 1 else ''}"
    if spec is None:
        per_mb = sum(layer.activation_bytes for layer in layers)
        return [MemoryItem(category="activations", name="layer activations", size_bytes=round(per_mb * in_flight),
                           note=f"{len(layers)} layers' activation_numel_per_sample {k}")]
    shape: dict[str, Any] = {
        "seq_len": tr.seq_len,
        "micro_batch_size": tr.micro_batch_size,
        "tp": par.tp,
        "sequence_parallel": par.sequence_parallel,
    }
    act = PRECISION_ACT_BYTES[tr.precision]
    dropout = _dropout(scenario, spec)
    blocks = {int(layer.name.split(".")[1]) for layer in layers if layer.is_block}
    per_layer = transformer_layer_activation_bytes(spec, **shape, recompute=tr.recompute, act_bytes=act,
                                                   dropout=dropout)
    items = [MemoryItem(category="activations", name="transformer layers",
                        size_bytes=round(len(blocks) * per_layer * in_flight),
                        note=f"{len(blocks)} layers x {fmt_bytes(per_layer)} {k} (recompute {tr.recompute})")]
    if stage == 0:
        emb = transformer_embedding_activation_bytes(spec, **shape, dropout=dropout)
        items.append(MemoryItem(category="activations", name="embedding", size_bytes=round(emb * in_flight),
                                note=f"token ids{', dropout mask' if dropout else ''} {k}"))
    if stage == par.pp - 1:
        out = transformer_output_activation_bytes(spec, **shape, act_bytes=act)
        items.append(MemoryItem(category="activations", name="output layer and loss",
                                size_bytes=round(out * in_flight), note=f"norm/head inputs, logits, fp32 softmax {k}"))
    if tr.recompute != "none" and blocks:
        full = transformer_layer_activation_bytes(spec, **shape, recompute="none", act_bytes=act, dropout=dropout)
        items.append(MemoryItem(category="activations", name="recompute working set", size_bytes=full - per_layer,
                                note="one layer re-created in backward"))
    return items


def _buffer_items(scenario: Scenario, workload: Workload, stage: int, ids: list[int]) -> list[MemoryItem]:
    tr, par, ddp, mem = scenario.training, scenario.parallelism, scenario.ddp, scenario.memory
    items: list[MemoryItem] = []
    zero = par.zero_stage
    grads = [grad_reduce_spec(workload.parameters[i], ddp.reduce_in_fp32) for i in ids]
    if zero <= 2 and ids and (zero == 2 or not ddp.gradient_as_bucket_view):
        local = {g: k for k, g in enumerate(ids)}
        order = [local[g] for g in workload.grad_ready_order if g in local]
        order += [k for k in range(len(ids)) if k not in set(order)]  # a tied copy not in this stage's order
        buckets = ddp_buckets(grads, order, ddp.bucket_cap_mb)
        if zero == 2:
            largest = max(b.size_bytes for b in buckets)
            items.append(MemoryItem(category="buffers", name="ZeRO-2 reduce buckets", size_bytes=2 * largest,
                                    note="2 x largest bucket (one filling, one reducing)"))
        else:
            items.append(MemoryItem(category="buffers", name="DDP bucket copies",
                                    size_bytes=sum(b.size_bytes for b in buckets),
                                    note=f"{len(buckets)} buckets; none with gradient_as_bucket_view"))
    if zero == 3 and ids:
        units, root = _fsdp_units(scenario, workload, stage, ids)
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


def _fsdp_units(
    scenario: Scenario, workload: Workload, stage: int, ids: list[int]
) -> tuple[list[list[int]], list[int]]:
    """FSDP wrapping: one unit per transformer block (or per layer of a parameter list); the rest is the root."""
    owner: dict[int, int] = {}
    units: dict[Any, list[int]] = {}
    is_transformer = scenario.model.transformer is not None
    for n, layer in enumerate(workload.rank_layers(stage, scenario.parallelism.pp)):
        if is_transformer and not layer.is_block:
            continue
        key = int(layer.name.split(".")[1]) if is_transformer else n
        for i in layer.param_indices:
            if i not in owner:
                owner[i] = key
                units.setdefault(key, []).append(i)
    root = [i for i in ids if i not in owner]
    return list(units.values()), root


# --------------------------------------------------------------------------------------- helpers
def _variant(scenario: Scenario, **sections: dict[str, Any]) -> Scenario:
    """``scenario`` with some section keys replaced, validated again (raises ScenarioError)."""
    data = scenario.model_dump()
    if scenario.model.preset is not None:
        data["model"] = {"preset": scenario.model.preset}  # a preset cannot carry its own expanded keys
    for section, updates in sections.items():
        data[section] = {**data[section], **updates}
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None


def max_micro_batch_that_fits(scenario: Scenario, limit: int = 1 << 16) -> int:
    """The largest micro-batch size that fits (0 if none does).

    With a global batch size set, only micro-batches that divide it over dp are tried (the number of
    micro-batches, and with it the pipeline's in-flight activations, follows); without one, a larger
    micro-batch only adds activations, so a binary search up to ``limit`` finds it.
    """
    if limit < 1:
        raise ValueError(f"limit({limit}) must be >= 1")

    def fits(b: int) -> bool:
        try:
            variant = _variant(scenario, training={"micro_batch_size": b})
        except ScenarioError:  # e.g. an interleaved schedule needs the micro-batch count to divide by pp
            return False
        return memory_breakdown(variant).fits

    gbs = scenario.training.global_batch_size
    if gbs is not None:
        per_rank = gbs // scenario.dp
        for b in sorted((d for d in range(1, min(per_rank, limit) + 1) if per_rank % d == 0), reverse=True):
            if fits(b):
                return b
        return 0
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:  # fits(lo), not fits(hi) (or hi beyond the limit)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smallest_layout_that_fits(scenario: Scenario, num_gpus: int | None = None) -> LayoutSearch:
    """Search ZeRO stage x tp x pp on ``num_gpus`` GPUs (default: the scenario's) for layouts that fit.

    tp stays inside a node; dp = GPUs / (tp x pp); sequence parallelism and the schedule are kept where the
    layout allows them; a layout the scenario rules forbid (heads, layers, global batch) is skipped.
    """
    cluster = scenario.cluster
    n = num_gpus if num_gpus is not None else cluster.num_gpus
    per_node = cluster.gpus_per_node
    if n <= 0:
        raise ValueError(f"num_gpus({n}) must be > 0")
    if n % per_node == 0:
        cluster_update: dict[str, Any] = {"num_nodes": n // per_node}
    elif n < per_node and per_node % n == 0:
        cluster_update = {"num_nodes": 1, "gpus_per_node": n}
    else:
        raise ValueError(f"num_gpus({n}) is neither a multiple nor a divisor of gpus_per_node({per_node})")
    gpus_per_node = cluster_update.get("gpus_per_node", per_node)
    par = scenario.parallelism
    fits: dict[tuple[int, int, int], LayoutFit] = {}

    def evaluate(zero: int, tp: int, pp: int) -> LayoutFit | None:
        key = (zero, tp, pp)
        if key not in fits:
            parallelism = {"dp": None, "tp": tp, "pp": pp, "zero_stage": zero,
                           "sequence_parallel": par.sequence_parallel and tp > 1,
                           "virtual_stages": par.virtual_stages if pp > 1 else 1}
            try:
                variant = _variant(scenario, cluster=cluster_update, parallelism=parallelism)
            except ScenarioError:
                return None
            m = memory_breakdown(variant)
            fits[key] = LayoutFit(zero_stage=zero, tp=tp, pp=pp, dp=variant.dp, total_bytes=m.total_bytes,
                                  capacity_bytes=m.capacity_bytes, fits=m.fits)
        return fits[key]

    # ZeRO-2/3 with pipeline parallelism is not offered: DeepSpeed refuses it and simddp does not time it.
    layouts = [(z, tp, pp) for tp in _divisors(gpus_per_node) for pp in _divisors(n // tp) for z in range(4)
               if not (z >= 2 and pp > 1)]
    results = [r for r in (evaluate(*lay) for lay in layouts) if r is not None]

    def first(candidates: Iterable[LayoutFit]) -> LayoutFit | None:
        return next((c for c in candidates if c.fits), None)

    z0, tp0, pp0 = par.zero_stage, par.tp, par.pp
    by_key = {(r.zero_stage, r.tp, r.pp): r for r in results}
    return LayoutSearch(
        num_gpus=n,
        current=by_key.get((z0, tp0, pp0)),
        smallest_zero_stage=first(by_key[k] for k in sorted(by_key) if k[1:] == (tp0, pp0)),
        smallest_tp=first(by_key[k] for k in sorted(by_key, key=lambda k: k[1]) if (k[0], k[2]) == (z0, pp0)),
        smallest_pp=first(by_key[k] for k in sorted(by_key, key=lambda k: k[2]) if k[:2] == (z0, tp0)),
        best=first(sorted(results, key=lambda r: (r.tp * r.pp, r.zero_stage, r.pp, r.tp))),
        num_layouts=len(results),
    )
