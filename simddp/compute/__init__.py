"""Kernel and layer times: what one GPU spends on a layer's forward, input-grad and weight-grad."""

from __future__ import annotations

from simddp.compute.layer import (
    OPTIMIZER_BYTES_PER_PARAM,
    LayerTiming,
    layer_timing,
    optimizer_step_s,
    param_bytes,
    roofline_s,
    workload_timings,
)

__all__ = [
    "OPTIMIZER_BYTES_PER_PARAM",
    "LayerTiming",
    "layer_timing",
    "optimizer_step_s",
    "param_bytes",
    "roofline_s",
    "workload_timings",
]
