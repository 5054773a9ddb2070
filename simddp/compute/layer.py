"""A layer's kernels into forward, input-grad (dgrad) and weight-grad (wgrad) time; measured times win.

Each kernel of :mod:`simddp.workload` is timed by its kind: GEMMs by :mod:`simddp.compute.gemm`, the fused
attention by :mod:`simddp.compute.attention`, memory-bound kernels by :mod:`simddp.compute.elementwise`;
kernels of one pass run back to back on the compute stream, so a pass takes their sum. Activation
recompute re-runs forward kernels inside backward (Korthikanti et al. 2022): every block layer with
``full``, the attention core with ``selective``. A layer with measured times (calibration) keeps them:
its backward is split between dgrad and wgrad in proportion to their FLOP. Tensor-parallel collectives are
not here: the simulator runs them on the links (:mod:`simddp.sim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from simddp.compute.attention import flash_s
from simddp.compute.elementwise import memory_s
from simddp.compute.gemm import dense_s, gemm_s
from simddp.config import GPU, Training
from simddp.units import dtype_bytes
from simddp.workload import PRECISION_ACT_BYTES, Kernel, Layer, Param, Workload

#: Bytes the optimizer step reads and writes per parameter (fused multi-tensor kernels, memory-bound):
#: AdamW/Adam read param, grad, m, v and write param, m, v (fp32: 7 x 4 = 28 B); mixed precision reads the
#: 16-bit grad, updates the fp32 master, m, v and writes the 16-bit param (2+12+12+2 = 28 B); SGD reads
#: param and grad, writes param; momentum adds a read and a write of the buffer; Adafactor keeps
#: factored second moments (~param + grad + update, 3 reads 1 write).
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 28, "adam": 28, "sgd": 12, "sgd-momentum": 20, "adafactor": 16}

#: The same for torch.optim's foreach path (its default on GPUs; torch/optim/adam.py ``_multi_tensor_adam``,
#: adamw.py, sgd.py ``_multi_tensor_sgd``): one multi-tensor kernel per elementwise operation, each reading
#: its fp32 operands and writing its result (4 B each per parameter). Adam: ``_foreach_lerp_(m, g)`` 12,
#: ``_foreach_mul_(v)`` 8, ``_foreach_addcmul_(v, g, g)`` 16 (both g operands are loaded), ``_foreach_sqrt(v)``
#: into a new list 8, ``_foreach_div_`` 8 and ``_foreach_add_(eps)`` 8 on it, ``_foreach_addcdiv_(p, m, denom)``
#: 16: 76 B. AdamW first decays the params, ``_foreach_mul_(p)`` 8: 84 B. SGD: ``_foreach_add_(p, g)`` 12;
#: with momentum ``_foreach_mul_(buf)`` 8 and ``_foreach_add_(buf, g)`` 12 before it: 32 B. Adafactor has no
#: foreach path here (its fused figure). torch AMP keeps fp32 params, grads and states, so mixed precision
#: moves the same bytes.
FOREACH_OPTIMIZER_BYTES_PER_PARAM = {"adamw": 84, "adam": 76, "sgd": 12, "sgd-momentum": 32, "adafactor": 16}


@dataclass(frozen=True)
class LayerTiming:
    """Kernel time of one layer for one micro-batch: forward, recomputed forward, dgrad, wgrad."""

    name: str
    fwd_s: float
    dgrad_s: float
    wgrad_s: float
    recompute_s: float = 0.0  # forward kernels re-run inside backward
    # Derived once here, not in a property per read: a step sums them over every layer (a 1T model's 1,400).
    bwd_s: float = field(init=False, compare=False, repr=False)  # recompute + dgrad + wgrad
    compute_s: float = field(init=False, compare=False, repr=False)  # forward + backward (recompute included)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bwd_s", self.recompute_s + self.dgrad_s + self.wgrad_s)
        object.__setattr__(self, "compute_s", self.fwd_s + self.recompute_s + self.dgrad_s + self.wgrad_s)


def kernel_s(kernel: Kernel, gpu: GPU, precision: str, compute_efficiency: float = 1.0) -> float:
    """Time of one kernel on ``gpu`` in the matmul dtype of ``precision``."""
    if kernel.op == "gemm":
        return gemm_s(kernel.m, kernel.n, kernel.k, gpu, precision, PRECISION_ACT_BYTES[precision], kernel.batch)
    if kernel.op in ("flash-fwd", "flash-bwd"):
        return flash_s(kernel.flop, kernel.tiles, kernel.k, gpu, precision, backward=kernel.op == "flash-bwd")
    if kernel.op == "memory":
        return memory_s(kernel.bytes, gpu)
    return dense_s(kernel.flop, kernel.bytes, gpu, precision, compute_efficiency)


def pass_s(kernels: tuple[Kernel, ...], gpu: GPU, precision: str, compute_efficiency: float = 1.0) -> float:
    """Kernels of one pass, back to back on the compute stream."""
    return sum(kernel_s(k, gpu, precision, compute_efficiency) for k in kernels)


def recomputed(layer: Layer, recompute: str) -> float:
    """How much of ``layer``'s forward runs again in backward under the training's ``recompute``: all of a
    block's layers under full, the attention core under selective, and under selective-op (torchtitan's
    op-level checkpointing) everything but the matmul outputs it keeps and the FlashAttention output."""
    if recompute == "full":
        return 1.0 if layer.recompute in ("block", "core") else 0.0
    if recompute == "selective":
        return 1.0 if layer.recompute == "core" else 0.0
    if recompute == "selective-op":
        return layer.sac_recompute if layer.recompute in ("block", "core") else 0.0
    return 0.0


def layer_timing(layer: Layer, gpu: GPU, training: Training, compute_efficiency: float = 1.0,
                 accumulate_s: float = 0.0) -> LayerTiming:
    """Timing of one layer: measured when the layer carries times, else its kernels. ``accumulate_s``: the
    gradient accumulation added to its weight-gradient time (:func:`grad_accumulation_s`)."""
    p = training.precision
    if layer.fwd_time_s is not None and layer.bwd_time_s is not None:
        total = layer.dgrad_flop + layer.wgrad_flop
        w_share = layer.wgrad_flop / total if total else 0.0
        fwd, bwd = layer.fwd_time_s, layer.bwd_time_s
        dgrad, wgrad = bwd * (1 - w_share), bwd * w_share
    else:
        fwd = pass_s(layer.fwd, gpu, p, compute_efficiency)
        dgrad = pass_s(layer.dgrad, gpu, p, compute_efficiency)
        wgrad = pass_s(layer.wgrad, gpu, p, compute_efficiency)
    share = recomputed(layer, training.recompute)
    recompute = fwd * share if share else 0.0  # never inf x 0: an overflowing forward recomputes nothing
    if accumulate_s:
        wgrad += accumulate_s
    return LayerTiming(layer.name, fwd, dgrad, wgrad, recompute)


def workload_timings(workload: Workload, gpu: GPU, training: Training, stage: int = 0) -> list[LayerTiming]:
    """Timings of the layers of one pipeline stage, in forward order."""
    return [layer_timing(layer, gpu, training) for layer in workload.stage_layers(stage)]


def optimizer_step_s(workload: Workload | int, gpu: GPU, training: Training, shard: float = 1,
                     impl: str = "fused") -> float:
    """Optimizer step over this GPU's parameters (a workload's, or this many), divided by ``shard`` under
    ZeRO; memory-bound: the bytes the ``impl`` path (``fused`` or torch's ``foreach``, :func:`optimizer_impl`)
    moves per parameter.

    A measured ``training.optimizer_time_s`` (calibration, whole unsharded model) is used instead when set;
    ZeRO divides it by ``shard`` like the bytes, since the step is elementwise over the parameters.
    """
    if training.optimizer_time_s is not None:
        return training.optimizer_time_s / shard
    num_params = (workload if isinstance(workload, int) else workload.num_params) / shard
    table = FOREACH_OPTIMIZER_BYTES_PER_PARAM if impl == "foreach" else OPTIMIZER_BYTES_PER_PARAM
    return num_params * table[training.optimizer] / gpu.streaming_bandwidth_bytes_per_s


def grad_accumulation_s(params: Sequence[Param], accumulation: str, micro_batches: int, main_grad_fp32: bool,
                        gpu: GPU) -> float:
    """Time per micro-batch of adding a layer's fresh gradients to the ones accumulated before, averaged
    over the step's ``micro_batches`` (memory-bound, one kernel per parameter):

    - ``autograd`` (torch, DeepSpeed ZeRO-0/1): the first backward after ``zero_grad(set_to_none=True)``
      keeps the gradient it was handed; every later one adds in place (``variable.grad += new_grad``,
      torch/csrc/autograd/functions/accumulate_grad.h), reading both and writing one: 3 x the gradient's
      bytes, in m - 1 of the m micro-batches;
    - ``main-grad`` (Megatron without gradient accumulation fusion): a hook on every parameter runs
      ``param.main_grad.add_(param.grad)`` in every micro-batch (megatron/model/distributed.py), reading the
      gradient and reading and writing ``main_grad`` (fp32 with ``main_grad_fp32``, else the parameter's dtype);
    - ``fused`` (Megatron's default): the weight-gradient GEMM accumulates into ``main_grad`` in its epilogue;
      ``sharded`` (FSDP, ZeRO-2/3 reduce every micro-batch): only a 1/dp shard accumulates. Neither is timed.
    """
    if accumulation == "main-grad":
        return sum(memory_s(p.numel * (dtype_bytes(p.dtype) + 2 * (4 if main_grad_fp32 else dtype_bytes(p.dtype))),
                            gpu) for p in params)
    if accumulation == "autograd" and micro_batches > 1:
        share = (micro_batches - 1) / micro_batches
        return share * sum(memory_s(3 * p.numel * dtype_bytes(p.dtype), gpu) for p in params)
    return 0.0


def optimizer_impl(training: Training, implementation: str) -> str:
    """``training.optimizer_impl``, or the data-parallel implementation's default: torch.optim's foreach path
    under torch (DDP, ZeroRedundancyOptimizer and FSDP wrap a torch optimizer), the fused kernels of
    Megatron-LM and DeepSpeed (apex FusedAdam, DeepSpeed's FusedAdam)."""
    if training.optimizer_impl is not None:
        return training.optimizer_impl
    return "foreach" if implementation == "torch" else "fused"


def param_bytes(workload: Workload) -> int:
    return sum(p.numel * dtype_bytes(p.dtype) for p in workload.parameters)
