"""Activation bytes a transformer saves for backward, and micro-batches a pipeline stage holds.

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
dtype and the fp32 softmax the fused cross-entropy saves) add to the first and last stage. torchtitan's
op-level selective checkpointing ("selective-op") keeps a block's input, every other matmul output and the
attention output (:func:`_op_sac_per_token`). With recompute, backward re-creates one layer's activations at
a time (one micro-batch), counted as a working set.

Pipelines hold several micro-batches (Narayanan et al., SC'21; Korthikanti et al. sec. 4.2.3): 1F1B's stage
i holds min(p - i, m), GPipe all m, interleaved 1F1B with v chunks min(mv, 2(p - i - 1) + (v - 1)p + 1)
chunks, which is p(1 + (p - 1)/(pv)) micro-batches on the first stage. Parameter-list models use their
layers' ``activation_numel_per_sample`` and are not recomputed.
"""

from __future__ import annotations

from simddp.config import TransformerSpec

_TOKEN_ID_BYTES = 8  # int64 input ids
_LSE_BYTES = 4  # FlashAttention's fp32 log-sum-exp per head and token
_SOFTMAX_BYTES = 4  # fp32 softmax saved by the fused (vocab-parallel) cross-entropy
_RECOMPUTE = ("none", "selective", "selective-op", "full")
_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


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
    attention: str = "unfused",
) -> int:
    """Bytes one transformer layer saves for backward, one micro-batch (Korthikanti et al. 2022, Table 2).

    ``attention="unfused"`` saves the s x s softmax output, its dropout mask and the dropout output
    (Korthikanti's 5as/h term); FlashAttention (Dao et al. 2022) saves none of them, only the softmax
    statistics (one fp32 log-sum-exp per head and token) and regenerates dropout from the RNG state.

    For a GPT layer (4h MLP, no GQA, dropout, 16-bit) this is exactly sbh(34 + 5as/h) at t = 1,
    sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht)) with sequence parallelism;
    selective recompute drops the 5as/h term, full recompute keeps the layer input 2sbh (/t with SP).
    """
    _check_shape(spec, seq_len, micro_batch_size, tp, act_bytes)
    if recompute not in _RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; expected one of {list(_RECOMPUTE)}")
    _check_attention(attention)  # before full recompute's answer, which does not read it
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
    if attention == "flash":
        core = _LSE_BYTES * (a / tp)
    if recompute == "selective-op":
        return round(_op_sac_per_token(spec, tp, sp, act_bytes, attention, q_width, kv_width) * tokens)
    per_token = replicated + sharded + (core if recompute == "none" else 0.0)
    return round(per_token * tokens)


def _check_attention(attention: str) -> None:
    if attention not in ("flash", "unfused"):
        raise ValueError(f"unknown attention {attention!r}; expected 'flash' or 'unfused'")


def recompute_working_set_bytes(
    spec: TransformerSpec,
    seq_len: int,
    micro_batch_size: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    act_bytes: int = 2,
    dropout: bool = True,
    attention: str = "unfused",
) -> int:
    """What backward holds beyond a recomputed layer's saved activations while it re-creates them (one layer,
    one micro-batch): the activations the layer would save without recompute that its saved set does not
    already hold. Full and selective recompute save subsets of those: the difference of the two totals.
    torchtitan's selective-op also saves tensors that a layer without recompute frees (:func:`_op_sac_unshared`:
    the row-parallel w2's matmul output, the reduce-scatter outputs of sequence parallelism); they are not in
    that layer's set, so they are taken out of the saved set before the difference (at tp >= 4 with sequence
    parallelism its saved set is larger than the whole set without recompute, which the plain difference made a
    negative working set)."""
    if recompute == "none":
        _check_attention(attention)
        return 0
    full, saved = (transformer_layer_activation_bytes(spec, seq_len, micro_batch_size, tp, sequence_parallel, r,
                                                      act_bytes, dropout, attention) for r in ("none", recompute))
    if recompute == "selective-op":
        sp = tp if sequence_parallel else 1
        saved -= round(_op_sac_unshared(spec, tp, sp, act_bytes) * seq_len * micro_batch_size)
    return max(0, full - saved)  # max: rounding of the two totals apart


def _op_sac_unshared(spec: TransformerSpec, tp: int, sp: int, act_bytes: int) -> float:
    """Bytes per token of :func:`_op_sac_per_token`'s saved set that a layer without recompute does not save:
    the w2 (down projection) matmul output of a bias-free gated MLP, full width (row-parallel partial sums
    before their reduction; without recompute only the residual add reads it, which saves nothing), and the
    reduce-scatter outputs after wo and w2 under sequence parallelism (read by residual adds). The other kept
    outputs (q, v, w1, the attention output and log-sum-exp, the block input) are tensors the layer saves anyway
    (attention's and the MLP's inputs, the first norm's input)."""
    h = spec.hidden_size
    w2_out = h if (spec.gated_mlp and not spec.bias) else 0.0
    scattered = 2 * h / sp if (tp > 1 and sp > 1) else 0.0
    return act_bytes * (w2_out + scattered)


def _op_sac_per_token(spec: TransformerSpec, tp: int, sp: int, act_bytes: int, attention: str, q_width: float,
                      kv_width: float) -> float:
    """torchtitan's op-level selective activation checkpointing (``selective_ac_option = "op"``,
    torchtitan/models/llama/parallelize_llama.py ``_save_list``): a block keeps its input (the checkpoint's),
    the output of every other matmul (``aten.mm`` counted in forward order, odd ones saved), the attention
    kernel's output and log-sum-exp (flash or efficient SDPA), and the reduce-scatter outputs of sequence
    parallelism; everything else is re-run in backward. A Llama block's matmuls are wq, wk, wv, wo, w1, w3, w2:
    wq, wv, w1 and w2 are kept; a GPT block's are the fused QKV, out, fc1, fc2: QKV and fc1 are kept. Linears
    with a bias run ``addmm``, which the policy does not keep."""
    h, a, ffn = spec.hidden_size, spec.num_heads, spec.ffn_hidden_size
    kept = 0.0
    if not spec.bias:
        kept = (q_width + kv_width + ffn / tp + h) if spec.gated_mlp else (q_width + 2 * kv_width + ffn / tp)
    core = (act_bytes * q_width + _LSE_BYTES * a / tp) if attention == "flash" else 0.0
    scattered = 2 * h / sp if (tp > 1 and sp > 1) else 0.0  # reduce_scatter_tensor outputs after wo and w2
    return act_bytes * (h / sp + kept + scattered) + core


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
    cross_entropy: str = "fused",
) -> int:
    """Last stage, one micro-batch: final-norm and output-layer inputs, the logits and what the loss holds.

    The vocabulary-parallel output layer and cross-entropy divide the logits by tp (Megatron). The fused
    loss keeps an fp32 softmax (4 bytes per logit) beside the logits in the activation dtype and computes its
    gradient in place. The unfused one, ``F.cross_entropy(logits.float())``, keeps the fp32 log-probabilities
    (``log_softmax`` saves its output; the 16-bit logits are freed); at the start of backward
    ``nll_loss_backward`` writes a dense fp32 gradient and ``log_softmax_backward`` another before either is
    freed: 12 bytes per logit at once.
    """
    _check_shape(spec, seq_len, micro_batch_size, tp, act_bytes)
    tokens = seq_len * micro_batch_size
    sp = tp if sequence_parallel else 1
    norm_and_head_inputs = 2 * act_bytes * spec.hidden_size / sp
    if cross_entropy == "fused":
        per_logit = act_bytes + _SOFTMAX_BYTES
    elif cross_entropy == "unfused":
        per_logit = 3 * _SOFTMAX_BYTES
    else:
        raise ValueError(f"unknown cross_entropy {cross_entropy!r}; expected 'fused' or 'unfused'")
    return round(tokens * (norm_and_head_inputs + per_logit * spec.vocab_size / tp))


def in_flight_micro_batches(
    schedule: str, pp: int, stage: int, num_micro_batches: int, virtual_stages: int = 1, megatron: bool = True
) -> float:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak.

    1F1B: min(p - stage, m) (Narayanan et al., SC'21); GPipe: m (Huang et al., NeurIPS'19); interleaved
    1F1B with v chunks per stage: Megatron's warm-up of 2(p - stage - 1) + (v - 1)p chunks plus the one in
    flight, capped at mv, in units of whole micro-batches (chunks / v); on the first stage this is
    p(1 + (p - 1)/(pv)) (Korthikanti et al. 2022, sec. 4.2.3); one chunk (v = 1) keeps that warm-up, 2(p - stage
    - 1) forwards, as the interleaved functions run it. With m = p, Megatron's interleaved schedule runs every
    forward first (``all_warmup_microbatches`` in ``megatron/core/pipeline_parallel/schedules.py``): every stage
    holds all m. torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` (``megatron=False``) has no such case.
    Both as :func:`simddp.sim.pipeline.interleaved_1f1b` orders them, and the simulator runs them.
    """
    _check_schedule(schedule, pp, num_micro_batches, virtual_stages)
    if not 0 <= stage < pp:
        raise ValueError(f"stage({stage}) must be in 0..{pp - 1} for pp({pp})")
    return _in_flight(schedule, pp, stage, num_micro_batches, virtual_stages, megatron)


def in_flight_per_stage(schedule: str, pp: int, num_micro_batches: int, virtual_stages: int = 1,
                        megatron: bool = True) -> list[float]:
    """:func:`in_flight_micro_batches` of every stage, ``0 .. pp - 1`` (the inputs checked once)."""
    _check_schedule(schedule, pp, num_micro_batches, virtual_stages)
    return [_in_flight(schedule, pp, stage, num_micro_batches, virtual_stages, megatron) for stage in range(pp)]


def _check_schedule(schedule: str, pp: int, num_micro_batches: int, virtual_stages: int) -> None:
    if schedule not in _SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected one of {list(_SCHEDULES)}")
    for name, value in (("pp", pp), ("num_micro_batches", num_micro_batches), ("virtual_stages", virtual_stages)):
        if value < 1:
            raise ValueError(f"{name}({value}) must be >= 1")


def all_warmup(schedule: str, pp: int, num_micro_batches: int, megatron: bool = True) -> bool:
    """Whether every stage runs all its forwards before its first backward: GPipe, and Megatron's interleaved
    1F1B with as many micro-batches as stages (its ``all_warmup_microbatches``, whatever the chunks)."""
    return schedule == "gpipe" or (schedule == "interleaved-1f1b" and megatron and num_micro_batches == pp)


def _in_flight(schedule: str, pp: int, stage: int, num_micro_batches: int, virtual_stages: int,
               megatron: bool = True) -> float:
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(num_micro_batches)
    if schedule == "interleaved-1f1b":  # one chunk too: Megatron's interleaved warm-up, as simulated
        v = virtual_stages
        if all_warmup(schedule, pp, num_micro_batches, megatron):
            return float(num_micro_batches)
        chunks = min(num_micro_batches * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
        return chunks / v
    return float(min(pp - stage, num_micro_batches))

