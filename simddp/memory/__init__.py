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
dtype and the fp32 softmax the fused cross-entropy saves, or the unfused one's fp32 log-probabilities and the
two gradients its backward holds) add to the first and last stage; torchtitan's op-level checkpointing
(``selective-op``) keeps a block's input, every other matmul output and the attention output. With recompute,
backward re-creates one layer's activations at a time (one micro-batch), counted as a working set.

Pipelines hold several micro-batches (Narayanan et al., SC'21; Korthikanti et al. sec. 4.2.3): 1F1B's stage
i holds min(p - i, m), GPipe all m, interleaved 1F1B with v chunks min(mv, 2(p - i - 1) + (v - 1)p + 1)
chunks, which is p(1 + (p - 1)/(pv)) micro-batches on the first stage. Parameter-list models use their
layers' ``activation_numel_per_sample`` and are not recomputed.

Buffers follow the data-parallel implementation's rule (:mod:`simddp.zero`, the one the simulator times):
torch DDP's bucket copies (none with ``gradient_as_bucket_view``), DeepSpeed's contiguous reduce buffers and
flattened buckets, nothing for Megatron's views; ZeRO-3 (FSDP, DeepSpeed) parameters in flight (the unit
computing, the prefetched ones, those kept gathered: FSDP's root, DeepSpeed's modules within the reuse
distance) and unsharded gradients (the unit computing and the one reduce-scattering; FSDP's root gradients
held through backward); FSDP with pipelines keeps the stage unsharded; pipeline send/receive tensors; NCCL
buffers of each communicator. Overheads: the CUDA context and the caching allocator's fragmentation. Their
defaults and sources are in :class:`simddp.config.MemoryConfig`. Measured peaks of real runs (torchtitan on
H100, simddp's own H100 steps) are compared in ``docs/memory.md``.

Not modelled: CPU/NVMe offload, activation offload, optimizer-step temporaries, context parallelism, MoE.
"""

from __future__ import annotations

from simddp.memory.activations import (
    in_flight_micro_batches,
    recompute_working_set_bytes,
    transformer_embedding_activation_bytes,
    transformer_layer_activation_bytes,
    transformer_output_activation_bytes,
)
from simddp.memory.breakdown import memory_breakdown
from simddp.memory.items import Category, MemoryBreakdown, MemoryItem
from simddp.memory.search import LayoutFit, LayoutSearch, max_micro_batch_that_fits, smallest_layout_that_fits
from simddp.memory.states import (
    FSDP_SHARDING_ZERO_STAGE,
    OPTIMIZER_STATE_BYTES_PER_PARAM,
    ModelStatesBytes,
    model_states_bytes,
    zero_model_states_bytes,
)

__all__ = [
    "FSDP_SHARDING_ZERO_STAGE",
    "OPTIMIZER_STATE_BYTES_PER_PARAM",
    "Category",
    "LayoutFit",
    "LayoutSearch",
    "MemoryBreakdown",
    "MemoryItem",
    "ModelStatesBytes",
    "in_flight_micro_batches",
    "max_micro_batch_that_fits",
    "memory_breakdown",
    "model_states_bytes",
    "recompute_working_set_bytes",
    "smallest_layout_that_fits",
    "transformer_embedding_activation_bytes",
    "transformer_layer_activation_bytes",
    "transformer_output_activation_bytes",
    "zero_model_states_bytes",
]
