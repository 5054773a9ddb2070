"""Cluster presets: GPU spec sheets, NVLink/PCIe fabrics and NICs, with measured NCCL efficiencies.

Link latencies default to NCCL's own tuning constants (src/graph/tuning.cc @ b6475625, NCCL 2.20.3, ``hwLat``
for the ring / Simple protocol: NVLink 3.4 us, PCI 5.7 us, NET 14 us per hop); the other protocols and
algorithms keep NCCL's ratios to them. Efficiencies are the fraction of the spec-sheet bandwidth that a
published nccl-tests run reaches at large messages. Each link constant names, next to it, the figure it was
set from ("fit: ..."); ``tests/validation/test_nccl_tests.py`` marks exactly those rows in-sample and asserts
them apart from every held-out row (docs/collectives.md).
"""

from __future__ import annotations

from typing import Any

from simddp.presets import Preset
from simddp.units import GB, GBIT, TFLOP, US, MiB

NCCL_HWLAT_NVLINK_S = 3.4 * US
NCCL_HWLAT_PCI_S = 5.7 * US
NCCL_HWLAT_NET_S = 14.0 * US


def a100_gpu(name: str, hbm_mib: int, hbm_gb_per_s: float, power_scale: float = 1.0) -> dict[str, Any]:
    """An A100: datasheet peaks (FP32 19.5, TF32 156, BF16/FP16 312 dense TFLOP/s; 108 SMs) and kernel constants.

    Kernel constants (benchmarks/fit_compute.py; fit data named with each, none from a training run):
    * GEMM ceiling 0.848 of peak, k0 512, launch 6 us: fitted on Azure ND A100 v4's cuBLASLt FP16 GEMMs
      (8 shapes, 10,000 warm-up iterations: sustained clocks; MAPE 3.3%). ``power_scale`` lowers the ceiling
      of a power-capped variant (PCIe 300 W: 252.9 / 271.2 = 0.933, the ratio of the two A100 rows of
      stas00/ml-engineering's maximum-achievable-matmul table).
    * Streaming bandwidth 0.834 of HBM: Azure ND A100 v4 STREAM add/triad, 1.70 of 2.039 TB/s.
    * FlashAttention forward 0.61 / backward 0.57 of peak, 192 keys per block: fitted on FlashAttention-2's
      A100 causal kernel benchmarks (Dao 2023, Fig. 5-6; MAPE 6.2%).
    """
    return {
        "name": name,
        "num_sms": 108,
        "peak_fp32_flop_per_s": 19.5 * TFLOP,
        "peak_tf32_flop_per_s": 156 * TFLOP,
        "peak_bf16_flop_per_s": 312 * TFLOP,
        "peak_fp16_flop_per_s": 312 * TFLOP,
        "hbm_bytes": hbm_mib * MiB,
        "hbm_bandwidth_bytes_per_s": hbm_gb_per_s * GB,
        "memory_efficiency": 0.834,
        "matmul_ceiling_fraction": round(0.848 * power_scale, 3),
        "gemm_k_overhead": 512,
        "kernel_launch_s": 6 * US,
        "flash_fwd_fraction": 0.61,
        "flash_bwd_fraction": 0.57,
        "flash_key_overhead": 192,
    }


def h100_gpu(name: str = "H100-SXM5-80GB", hbm_mib: int = 81559, hbm_gb_per_s: float = 3350,
             memory_efficiency: float = 0.90) -> dict[str, Any]:
    """An H100 SXM (700 W): datasheet peaks (FP32 67, TF32 494.5, BF16/FP16 989.4 dense TFLOP/s; 132 SMs).

    Kernel constants (benchmarks/fit_compute.py):
    * GEMM k0 192 and launch 5 us: fitted on OpenXLA's measured H100 bf16 GEMM table (375 shapes, MAPE 6.9%).
      Its own best ceiling (0.87) reflects boost clocks of short runs; under sustained load the GPU holds
      about 1.5 GHz at its power limit, so the ceiling, 0.760, is fitted on simddp's 15-second sustained
      8192^3 bf16 run on an H100 SXM 80GB HBM3 at 700 W (benchmarks/data/h100_kernels.json; 732 TFLOP/s).
    * Streaming bandwidth 0.90 of 3.35 TB/s: the same measurement, an elementwise add at 3.0 TB/s.
    * FlashAttention forward 0.86 / backward 0.61 of peak, 1088 keys per block: fitted on the same machine's
      torch SDPA FlashAttention-2 kernels (18 shapes, forward and backward; MAPE 9.9%).
    """
    return {
        "name": name,
        "num_sms": 132,
        "peak_fp32_flop_per_s": 67 * TFLOP,
        "peak_tf32_flop_per_s": 494.5 * TFLOP,
        "peak_bf16_flop_per_s": 989.4 * TFLOP,
        "peak_fp16_flop_per_s": 989.4 * TFLOP,
        "hbm_bytes": hbm_mib * MiB,
        "hbm_bandwidth_bytes_per_s": hbm_gb_per_s * GB,
        "memory_efficiency": memory_efficiency,
        "matmul_ceiling_fraction": 0.760,
        "gemm_k_overhead": 192,
        "kernel_launch_s": 5 * US,
        "flash_fwd_fraction": 0.86,
        "flash_bwd_fraction": 0.61,
        "flash_key_overhead": 1088,
    }


def h200_gpu() -> dict[str, Any]:
    """An H200 SXM: the H100's die and 700 W limit with 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 datasheet).

    Its GEMM and FlashAttention constants are the H100's (same SMs and clocks; "H200 is the same" in
    stas00/ml-engineering's maximum-achievable-matmul table); streaming bandwidth 0.865 of 4.8 TB/s from
    Azure ND H200 v5's STREAM add/triad (4.15 TB/s). nvidia-smi reports 143771 MiB.
    """
    return h100_gpu("H200-SXM-141GB", 143771, 4800, memory_efficiency=0.865)


def _node(gpu: dict[str, Any], intra: dict[str, Any], inter: dict[str, Any]) -> dict[str, Any]:
    """One 8-GPU node of a preset (users set num_nodes)."""
    return {"num_nodes": 1, "gpus_per_node": 8, "gpu": gpu, "intra_node": intra, "inter_node": inter}


def _link(kind: str, latency_s: float, gb_per_s: float, efficiency: float, **extra: float) -> dict[str, Any]:
    return {"kind": kind, "latency_s": latency_s, "bandwidth_bytes_per_s": gb_per_s * GB,
            "efficiency": efficiency, **extra}


def _network(kind: str, nics: int, gbit_per_s: float, efficiency: float) -> dict[str, Any]:
    return {"kind": kind, "nics_per_node": nics, "nic_bandwidth_bytes_per_s": gbit_per_s * GBIT,
            "latency_s": NCCL_HWLAT_NET_S, "efficiency": efficiency}


def dgx_a100_80gb() -> dict[str, Any]:
    # NVLink 3: 12 links x 25 GB/s = 300 GB/s per direction per GPU.
    # fit: efficiency 0.77 = 231.6 / 300, nccl-tests all_reduce_perf on 8x A100-80GB at 8 GiB
    # (Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md; NCCL 2.18.5). The rest of that curve
    # (1 MiB .. 4 GiB) and NVIDIA/nccl-tests#175 are held out.
    # 8x ConnectX-6 HDR 200 Gb/s.
    # fit: efficiency 0.96 = 24 / 25, "~24 GB/s per NIC on perfect setups" (S. Jeaugey, NVIDIA/nccl-tests#160),
    # the same figure as the 2-node DGX A100 all_reduce busbw 192 GB/s = 8 x 24 (NVIDIA/nccl#812): in-sample.
    return _node(
        a100_gpu("A100-SXM4-80GB", 81920, 2039),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 300, 0.77),
        _network("infiniband", 8, 200, 0.96),
    )


def dgx_h100_80gb() -> dict[str, Any]:
    # NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction per GPU.
    # fit: efficiency 0.82 = 370 / 450, ring all_reduce on 8x H100 "~370 GB/s" (S. Jeaugey,
    # NVIDIA/nccl-tests#212; restated for 2 hosts in NVIDIA/nccl-tests#309).
    # fit: NVLS all-reduce algbw 275 GB/s over all 8 GPUs ("~480 GB/s busbw, ~275 algbw", NVIDIA/nccl-tests#212)
    # and NVLS latency 60 us (NCCL's table says 23 us): both fitted on the measured 1 MiB..8 GiB NVLS curve of
    # 8x H200 on the same NVSwitch (Azure ND H200 v5, NCCL 2.20.5: 240 GB/s at 16 MiB, 432 at 256 MiB; MAPE
    # 17% -> 1.6%). The NVLS wire rate 275 x 9/8 = 309 GB/s then predicts, held out, NVLS on 4-7 GPUs
    # (NVIDIA/nccl#1455) and NVLS all-gather (NVIDIA/nccl#1506).
    # 8x ConnectX-7 NDR 400 Gb/s. Efficiency 0.94: "46-48 GB/s per NIC" expected (NVIDIA/nccl-tests#290), a
    # maintainer's rule of thumb, not a measured all-reduce; every multi-node H100 row is held out.
    return _node(
        h100_gpu(),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 450, 0.82, nvls_algbw_bytes_per_s=275 * GB, nvls_latency_s=60 * US,
              nvls_measured_gpus=8),
        _network("infiniband", 8, 400, 0.94),
    )


def dgx_h200_141gb() -> dict[str, Any]:
    # DGX/HGX H200: the DGX H100's NVLink 4 / NVSwitch fabric and 8x 400 Gb/s NICs with H200 GPUs. Its NVLS curve
    # (Azure ND H200 v5, NCCL 2.20.5; 480 GB/s busbw at 8 GiB) is the fit data of the H100 preset's NVLS constants.
    return _node(
        h200_gpu(),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 450, 0.82, nvls_algbw_bytes_per_s=275 * GB, nvls_latency_s=60 * US,
              nvls_measured_gpus=8),
        _network("infiniband", 8, 400, 0.94),
    )


def pcie_a100_80gb() -> dict[str, Any]:
    # A100 80GB PCIe datasheet: same tensor peaks, 1,935 GB/s HBM2e.
    # PCIe Gen4 x16: 32 GB/s per direction.
    # fit: efficiency 0.63 = 20 / 32, A100s whose ring crosses PCIe (NVIDIA/nccl-tests#178; no held-out row).
    # (SimAI's calbusbw.h models A100 PCIe at 25.6 = 32 x 0.8.)
    # A typical enterprise PCIe server: 2x 100 GbE RoCE (ConnectX-6 Dx); efficiency 0.9 assumed close to the
    # HDR figure (no published run sets or checks it).
    return _node(
        a100_gpu("A100-PCIe-80GB", 81920, 1935, power_scale=252.9 / 271.2),
        _link("pcie", NCCL_HWLAT_PCI_S, 32, 0.63),
        _network("roce", 2, 100, 0.9),
    )


def aws_p4d() -> dict[str, Any]:
    # p4d.24xlarge: 8x A100-SXM4-40GB (1,555 GB/s HBM2), NVSwitch (AWS instance page).
    # fit: NVLink efficiency 0.77 = 230.77 / 300, p4dn, 8 GPUs, 1 GiB (NVIDIA/nccl#527); the DGX A100's value.
    # EFA: 4x 100 Gb/s per instance (Ethernet, SRD transport).
    # fit: efficiency 0.59 = 29.6 / 50, 4 instances / 32 GPUs at 1 GiB with NCCL 2.9.9 + aws-ofi-nccl
    # (NVIDIA/nccl#527). Held out: 3 instances (-7.5%), and p5 (EFA 32x 100 Gb/s) with this same efficiency.
    return _node(
        a100_gpu("A100-SXM4-40GB", 40960, 1555),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 300, 0.77),
        _network("efa", 4, 100, 0.59),
    )


def tcp_ethernet_25g() -> dict[str, Any]:
    # A plain cluster: the PCIe A100 server above with one 25 GbE NIC and no RDMA, so NCCL falls back to its
    # socket transport (NET/Socket) and gloo runs its TCP ring. NCCL over TCP does not reliably reach more than
    # 60% of wire speed on 32 Gbps networks (NVIDIA/nccl#209): efficiency 0.6, a maintainer-thread figure, not
    # fitted here. NCCL's tuner keeps its NET latency (14 us) for sockets.
    return _node(
        a100_gpu("A100-PCIe-80GB", 81920, 1935, power_scale=252.9 / 271.2),
        _link("pcie", NCCL_HWLAT_PCI_S, 32, 0.63),
        _network("ethernet", 1, 25, 0.6),
    )


CLUSTER_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("dgx-a100-80gb", "NVIDIA DGX A100: 8x A100-SXM4-80GB, NVSwitch, 8x HDR 200G IB",
               "A100 datasheet; nccl-tests (Azure ND A100 v4, NVIDIA/nccl#812)", dgx_a100_80gb),
        Preset("dgx-h100-80gb", "NVIDIA DGX H100: 8x H100-SXM5-80GB, NVSwitch (NVLS), 8x NDR 400G IB",
               "H100 datasheet; nccl-tests (NVIDIA/nccl-tests#212, #290)", dgx_h100_80gb),
        Preset("dgx-h200-141gb", "HGX/DGX H200: 8x H200-SXM-141GB, NVSwitch (NVLS), 8x NDR 400G IB",
               "H200 datasheet; nccl-tests (Azure ND H200 v5)", dgx_h200_141gb),
        Preset("pcie-a100-80gb", "PCIe-only server: 8x A100-PCIe-80GB, no NVLink, 2x 100GbE RoCE",
               "A100 PCIe datasheet; nccl-tests (NVIDIA/nccl-tests#178)", pcie_a100_80gb),
        Preset("tcp-ethernet-25g", "Plain TCP cluster: 8x A100-PCIe-80GB per node, 1x 25 GbE, no RDMA (NCCL "
               "sockets, gloo)", "A100 PCIe datasheet; NCCL over TCP at <= 60% of wire speed (NVIDIA/nccl#209)",
               tcp_ethernet_25g),
        Preset("aws-p4d-24xlarge", "AWS p4d.24xlarge: 8x A100-SXM4-40GB, NVSwitch, 4x 100G EFA (Ethernet)",
               "AWS instance page; nccl-tests (NVIDIA/nccl#527)", aws_p4d),
    )
}
