"""Kernel and layer times: what one GPU spends on a layer's forward, input-grad and weight-grad.

``gemm`` (shape-aware GEMM throughput), ``attention`` (FlashAttention), ``elementwise`` (memory-bound
kernels) and ``layer`` (a layer's kernels into pass times; calibrated times win).
"""

from __future__ import annotations

from simddp.compute.attention import flash_s
from simddp.compute.elementwise import memory_s
from simddp.compute.gemm import dense_s, gemm_s
from simddp.compute.layer import (
    FOREACH_OPTIMIZER_BYTES_PER_PARAM,
    OPTIMIZER_BYTES_PER_PARAM,
    LayerTiming,
    grad_accumulation_s,
    kernel_s,
    layer_timing,
    optimizer_impl,
    optimizer_step_s,
    param_bytes,
    pass_s,
    recomputed,
    workload_timings,
)

__all__ = [
    "FOREACH_OPTIMIZER_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "LayerTiming",
    "dense_s",
    "flash_s",
    "gemm_s",
    "grad_accumulation_s",
    "kernel_s",
    "layer_timing",
    "memory_s",
    "optimizer_impl",
    "optimizer_step_s",
    "param_bytes",
    "pass_s",
    "recomputed",
    "workload_timings",
]
