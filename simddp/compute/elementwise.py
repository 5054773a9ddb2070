"""Memory-bound kernels (norms, activations, dropout, residual adds, softmax, rotary, the loss).

Their time is the bytes they read and write at the bandwidth a streaming kernel reaches
(``GPU.memory_efficiency`` of the HBM spec, from STREAM-like benchmarks cited in the presets), plus the
fixed cost of a kernel (``GPU.kernel_launch_s``). Which tensors each kernel moves is the workload's
business (:mod:`simddp.workload`).
"""

from __future__ import annotations

from simddp.config import GPU


def memory_s(num_bytes: float, gpu: GPU) -> float:
    """Time of a kernel that moves ``num_bytes`` through device memory."""
    if num_bytes <= 0:
        return 0.0
    return gpu.kernel_launch_s + num_bytes / gpu.streaming_bandwidth_bytes_per_s
