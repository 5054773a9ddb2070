"""Layer time from FLOP and bytes: a roofline with efficiency factors, or measured times.

time = max(FLOP / (peak x matmul_efficiency), bytes / (HBM bandwidth x memory_efficiency))
(Williams, Waterman and Patterson, "Roofline", CACM 2009). ``matmul_efficiency`` is an end-to-end factor
measured on real training runs (see the GPU presets), so the roofline reproduces published MFU for the
GEMM-dominated layers; memory-bound layers (norms, embedding, loss) take their bytes at HBM speed.
Activation recompute re-runs the forward of the recomputed layers inside backward (Korthikanti et al.
2022): every block layer with ``full``, the attention core with ``selective``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simddp.config import GPU, Training
from simddp.units import dtype_bytes
from simddp.workload import Layer, Workload

#: Bytes the optimizer step reads and writes per parameter (fused multi-tensor kernels, memory-bound):
#: AdamW/Adam read param, grad, m, v and write param, m, v (fp32: 7 x 4 = 28 B); mixed precision reads the
#: 16-bit grad, updates the fp32 master, m, v and writes the 16-bit param (2+12+12+2 = 28 B); SGD reads
#: param and grad, writes param; momentum adds a read and a write of the buffer; Adafactor keeps
#: factored second moments (~param + grad + update, 3 reads 1 write).
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 28, "adam": 28, "sgd": 12, "sgd-momentum": 20, "adafactor": 16}


@dataclass(frozen=True)
class LayerTiming:
    """Forward and backward (input-grad then weight-grad) time of one layer for one micro-batch."""

    name: str
    fwd_s: float
    dgrad_s: float
    wgrad_s: float
    recompute_s: float = 0.0  # forward kernels re-run inside backward
    tp_fwd_s: float = 0.0  # blocking tensor-parallel collective after the forward
    tp_bwd_s: float = 0.0  # blocking tensor-parallel collective on the input gradient
    recompute_tp_s: float = 0.0  # forward TP collectives repeated by full recompute

    @property
    def fwd_total_s(self) -> float:
        return self.fwd_s + self.tp_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.recompute_s + self.recompute_tp_s + self.dgrad_s + self.tp_bwd_s + self.wgrad_s

    @property
    def compute_s(self) -> float:
        """Kernel time of forward + backward, without tensor-parallel communication."""
        return self.fwd_s + self.recompute_s + self.dgrad_s + self.wgrad_s

    @property
    def tp_comm_s(self) -> float:
        return self.tp_fwd_s + self.tp_bwd_s + self.recompute_tp_s


def roofline_s(flop: float, num_bytes: float, gpu: GPU, precision: str) -> float:
    """Time of a kernel doing ``flop`` and moving ``num_bytes``."""
    compute_s = flop / (gpu.peak_flop_per_s(precision) * gpu.matmul_efficiency)
    memory_s = num_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency)
    return max(compute_s, memory_s)


def layer_timing(layer: Layer, gpu: GPU, training: Training) -> LayerTiming:
    """Timing of one layer: measured when the layer carries times, else the roofline."""
    p = training.precision
    if layer.fwd_time_s is not None and layer.bwd_time_s is not None:
        # A measured backward is split between dgrad and wgrad in proportion to their FLOP.
        total = layer.dgrad_flop + layer.wgrad_flop
        w_share = layer.wgrad_flop / total if total else 0.0
        fwd, bwd = layer.fwd_time_s, layer.bwd_time_s
        dgrad, wgrad = bwd * (1 - w_share), bwd * w_share
    else:
        fwd = roofline_s(layer.fwd_flop, layer.fwd_bytes, gpu, p)
        total_flop = layer.dgrad_flop + layer.wgrad_flop
        share = layer.dgrad_flop / total_flop if total_flop else 1.0
        dgrad = roofline_s(layer.dgrad_flop, layer.bwd_bytes * share, gpu, p)
        wgrad = roofline_s(layer.wgrad_flop, layer.bwd_bytes * (1 - share), gpu, p)
    recompute = 0.0
    if training.recompute == "full" and layer.is_block:
        recompute = fwd
    elif training.recompute == "selective" and layer.is_attention_core:
        recompute = fwd
    return LayerTiming(layer.name, fwd, dgrad, wgrad, recompute)


def workload_timings(workload: Workload, gpu: GPU, training: Training, stage: int = 0) -> list[LayerTiming]:
    """Timings of the layers of one pipeline stage, in forward order."""
    return [layer_timing(layer, gpu, training) for layer in workload.stage_layers(stage)]


def optimizer_step_s(workload: Workload, gpu: GPU, training: Training, shard: int = 1) -> float:
    """Optimizer step over this GPU's parameters (divided by ``shard`` under ZeRO), memory-bound.

    A measured ``training.optimizer_time_s`` (calibration, whole unsharded model) is used instead when set;
    ZeRO divides it by ``shard`` like the bytes, since the step is elementwise over the parameters.
    """
    if training.optimizer_time_s is not None:
        return training.optimizer_time_s / shard
    num_params = workload.num_params / shard
    num_bytes = num_params * OPTIMIZER_BYTES_PER_PARAM[training.optimizer]
    return num_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency)


def param_bytes(workload: Workload) -> int:
    return sum(p.numel * dtype_bytes(p.dtype) for p in workload.parameters)
