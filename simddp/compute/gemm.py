"""GEMM time from its shape: a sustained matmul ceiling, the pipeline cost of short K, and memory traffic.

A cuBLAS/CUTLASS GEMM computes output tiles; each tile streams its K dimension through the tensor cores
after a prologue that fills the pipeline and before an epilogue that writes the tile. At large K the
mainloop dominates and the kernel runs at the GPU's sustained matmul ceiling: the largest throughput
public GEMM benchmarks measure for that GPU and dtype (``GPU.matmul_ceiling_fraction`` of the dense peak,
cited in the presets). Prologue and epilogue cost about as much as ``GPU.gemm_k_overhead`` more steps of
K, so a GEMM of depth K reaches K / (K + k0) of the ceiling. A GEMM whose operands are too large for its
arithmetic (small K, or a thin M or N) is bound by device memory instead: its operands and result cross HBM
once at the streaming bandwidth (Williams, Waterman and Patterson, "Roofline", CACM 2009). A GEMM with
fewer output tiles (``gemm_tile_m`` x ``gemm_tile_n``) than the GPU has SMs leaves SMs idle, unless its K
is deep enough to split across more of them. Every kernel
pays a fixed ``GPU.kernel_launch_s`` (launch, ramp-up and tail):

    time = launch + max(2 M N (K + k0) / (ceiling x min(1, tiles / SMs)), (MK + KN + MN) x bytes / bandwidth)

Whole-wave quantisation is not modelled: on the H100 and A100 GEMM data the constants were fitted on, it
explains none of the spread (cuBLAS picks among many tile shapes, split-K and stream-K kernels); see
docs/compute.md for the fit data of every constant and the held-out errors.
"""

from __future__ import annotations

from simddp.config import GPU

#: Depth from which a GEMM with fewer output tiles than SMs splits K across CTAs (split-K, the standard
#: remedy for weight gradients over many tokens or pixels). Below it none is seen in the fit data: OpenXLA's
#: H100 table (K <= 4096) and simddp's H100 sweep (16-tile weight gradients at K = 8192) run at their
#: occupancy; a convolution's weight gradient (K = batch x pixels, 10^5-10^6) is split.
SPLIT_K_MIN_DEPTH = 16384


def gemm_s(m: int, n: int, k: int, gpu: GPU, precision: str, elem_bytes: int, batch: int = 1) -> float:
    """Time of ``batch`` (m x k) @ (k x n) GEMMs in the matmul dtype of ``precision``."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    tiles = batch * -(-m // gpu.gemm_tile_m) * -(-n // gpu.gemm_tile_n)
    if tiles < gpu.num_sms and k >= SPLIT_K_MIN_DEPTH:
        tiles *= min(-(-gpu.num_sms // tiles), k // SPLIT_K_MIN_DEPTH)  # split-K: K cut across more CTAs
    occupancy = min(1.0, tiles / gpu.num_sms)
    ceiling = gpu.peak_flop_per_s(precision) * gpu.matmul_ceiling_fraction * occupancy
    math_s = 2.0 * batch * m * n * (k + gpu.gemm_k_overhead) / ceiling
    memory_s = batch * (m * k + k * n + m * n) * elem_bytes / gpu.streaming_bandwidth_bytes_per_s
    return gpu.kernel_launch_s + max(math_s, memory_s)


def dense_s(flop: float, num_bytes: float, gpu: GPU, precision: str, efficiency: float = 1.0) -> float:
    """A kernel known only by its FLOP and bytes (parameter-list models): the ceiling, or memory-bound.

    ``efficiency`` scales the ceiling for kernels that reach less of it than large GEMMs (a model's
    ``compute_efficiency``, e.g. convolutions).
    """
    if flop <= 0 and num_bytes <= 0:
        return 0.0
    math_s = flop / (gpu.peak_flop_per_s(precision) * gpu.matmul_ceiling_fraction * efficiency)
    return gpu.kernel_launch_s + max(math_s, num_bytes / gpu.streaming_bandwidth_bytes_per_s)
