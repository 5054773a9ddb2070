"""The fused attention kernel: FlashAttention's forward and backward.

FlashAttention (Dao et al., NeurIPS 2022; FlashAttention-2, Dao 2023) tiles queries in blocks of 128 rows
and keeps scores on chip, so its time is its FLOP at the fraction of the dense peak the kernel reaches
(``GPU.flash_fwd_fraction`` / ``flash_bwd_fraction``, from the published FlashAttention benchmarks cited
in the presets), with two corrections: the thread blocks come in waves over the SMs (a short sequence or
few heads leave SMs idle in the last wave), and each block pays a fixed cost (loading its queries, the
softmax rescaling and writing its output) worth ``GPU.flash_key_overhead`` keys, so a block over n keys
(s/2 on average with a causal mask, whose skipped blocks the workload's FLOP already leave out) reaches
n / (n + overhead) of the rate. The
unfused attention of Megatron's ``CoreAttention`` is not here: it is batched GEMMs and memory-bound
kernels, timed by :mod:`simddp.compute.gemm` and :mod:`simddp.compute.elementwise`.
"""

from __future__ import annotations

import math

from simddp.config import GPU


def flash_s(flop: float, tiles: int, keys: float, gpu: GPU, precision: str, backward: bool) -> float:
    """Time of a FlashAttention pass doing ``flop`` useful FLOP in ``tiles`` query blocks of ``keys`` keys."""
    if flop <= 0:
        return 0.0
    fraction = gpu.flash_bwd_fraction if backward else gpu.flash_fwd_fraction
    rate = gpu.peak_flop_per_s(precision) * fraction
    waves = tiles / gpu.num_sms
    utilisation = waves / math.ceil(waves) if tiles else 1.0
    block_cost = (keys + gpu.flash_key_overhead) / keys if keys > 0 else 1.0
    return gpu.kernel_launch_s + flop / (rate * utilisation) * block_cost
