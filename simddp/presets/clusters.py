"""Cluster presets: GPU spec sheets, NVLink/PCIe fabrics and NICs, with measured NCCL efficiencies.

Link latencies default to NCCL's own tuning constants (src/graph/tuning.cc, ``hwLat`` for the ring /
Simple protocol: NVLink 3.4 us, PCI 5.7 us, NET 14 us per hop). Efficiencies are the fraction of the
spec-sheet bandwidth that published nccl-tests runs reach at large messages; each is cited next to it
and reproduced in ``tests/validation/test_nccl_tests.py``.
"""

from __future__ import annotations

from typing import Any

from simddp.presets import Preset
from simddp.units import GB, GBIT, TFLOP, US, MiB

NCCL_HWLAT_NVLINK_S = 3.4 * US
NCCL_HWLAT_PCI_S = 5.7 * US
NCCL_HWLAT_NET_S = 14.0 * US


def _a100(name: str, hbm_mib: int, hbm_gb_per_s: float) -> dict[str, Any]:
    # NVIDIA A100 datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 dense TFLOP/s.
    # matmul_efficiency 0.5: Megatron-LM on 3072 A100s sustained 44-52% of peak
    # (Narayanan et al., SC'21, Table 1).
    return {
        "name": name,
        "peak_fp32_flop_per_s": 19.5 * TFLOP,
        "peak_tf32_flop_per_s": 156 * TFLOP,
        "peak_bf16_flop_per_s": 312 * TFLOP,
        "peak_fp16_flop_per_s": 312 * TFLOP,
        "hbm_bytes": hbm_mib * MiB,
        "hbm_bandwidth_bytes_per_s": hbm_gb_per_s * GB,
        "matmul_efficiency": 0.5,
    }


def _h100() -> dict[str, Any]:
    # NVIDIA H100 SXM5 datasheet: FP32 67, TF32 494.5, BF16/FP16 989.4 dense TFLOP/s, 3.35 TB/s HBM3;
    # nvidia-smi reports 81559 MiB. matmul_efficiency 0.4: Llama 3 pre-training on 16K H100s reached
    # 38-43% BF16 MFU (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4).
    return {
        "name": "H100-SXM5-80GB",
        "peak_fp32_flop_per_s": 67 * TFLOP,
        "peak_tf32_flop_per_s": 494.5 * TFLOP,
        "peak_bf16_flop_per_s": 989.4 * TFLOP,
        "peak_fp16_flop_per_s": 989.4 * TFLOP,
        "hbm_bytes": 81559 * MiB,
        "hbm_bandwidth_bytes_per_s": 3350 * GB,
        "matmul_efficiency": 0.4,
    }


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
    # NVLink 3: 12 links x 25 GB/s = 300 GB/s per direction per GPU. nccl-tests all_reduce_perf on
    # 8x A100-80GB reaches 231.6 GB/s busbw at 8 GB (Azure/AI-benchmarking-guide,
    # Azure_Results/ND_A100_v4_results.md; NCCL 2.18.5) -> 0.77; NCCL itself caps SM80 at 235.
    # 8x ConnectX-6 HDR 200 Gb/s. ~24 GB/s per NIC "on perfect setups" (S. Jeaugey,
    # NVIDIA/nccl-tests#160); multi-node DGX A100 all_reduce busbw 192 GB/s (NVIDIA/nccl#812).
    return _node(
        _a100("A100-SXM4-80GB", 81920, 2039),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 300, 0.77),
        _network("infiniband", 8, 200, 0.96),
    )


def dgx_h100_80gb() -> dict[str, Any]:
    # NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction per GPU. Ring all_reduce on 8x H100 peaks
    # at ~370 GB/s busbw and NVLS at ~480 GB/s busbw = ~275 GB/s algbw (S. Jeaugey,
    # NVIDIA/nccl-tests#212; NVIDIA/nccl#1455). NCCL's table says 23 us for NVLS latency; 60 us fits the
    # measured 1 MiB..8 GiB NVLS curve of 8x H200 on the same NVSwitch (Azure ND H200 v5: 240 GB/s at
    # 16 MiB, 432 at 256 MiB; MAPE 17% -> 1.6%).
    # 8x ConnectX-7 NDR 400 Gb/s; "46-48 GB/s per NIC" expected (NVIDIA/nccl-tests#290) -> 0.94.
    return _node(
        _h100(),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 450, 0.82, nvls_algbw_bytes_per_s=275 * GB, nvls_latency_s=60 * US),
        _network("infiniband", 8, 400, 0.94),
    )


def pcie_a100_80gb() -> dict[str, Any]:
    # A100 80GB PCIe datasheet: same tensor peaks, 1,935 GB/s HBM2e.
    # PCIe Gen4 x16: 32 GB/s per direction. A100s whose ring crosses PCIe measure 20 GB/s busbw
    # (NVIDIA/nccl-tests#178) -> 0.63. (SimAI's calbusbw.h models A100 PCIe at 25.6 = 32 x 0.8.)
    # A typical enterprise PCIe server: 2x 100 GbE RoCE (ConnectX-6 Dx); efficiency assumed close to the
    # HDR figure (not validated against a published run).
    return _node(
        _a100("A100-PCIe-80GB", 81920, 1935),
        _link("pcie", NCCL_HWLAT_PCI_S, 32, 0.63),
        _network("roce", 2, 100, 0.9),
    )


def aws_p4d() -> dict[str, Any]:
    # p4d.24xlarge: 8x A100-SXM4-40GB (1,555 GB/s HBM2), NVSwitch (AWS instance page).
    # p4dn, 8 GPUs, 1 GiB: 230.77 GB/s busbw (NVIDIA/nccl#527) -> 0.77 of 300 GB/s.
    # EFA: 4x 100 Gb/s per instance (Ethernet, SRD transport). 4 instances / 32 GPUs measured
    # 29.6 GB/s busbw at 1 GiB with NCCL 2.9.9 + aws-ofi-nccl (NVIDIA/nccl#527) -> 0.59 of 50 GB/s.
    return _node(
        _a100("A100-SXM4-40GB", 40960, 1555),
        _link("nvlink", NCCL_HWLAT_NVLINK_S, 300, 0.77),
        _network("efa", 4, 100, 0.59),
    )


CLUSTER_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("dgx-a100-80gb", "NVIDIA DGX A100: 8x A100-SXM4-80GB, NVSwitch, 8x HDR 200G IB",
               "A100 datasheet; nccl-tests (Azure ND A100 v4, NVIDIA/nccl#812)", dgx_a100_80gb),
        Preset("dgx-h100-80gb", "NVIDIA DGX H100: 8x H100-SXM5-80GB, NVSwitch (NVLS), 8x NDR 400G IB",
               "H100 datasheet; nccl-tests (NVIDIA/nccl-tests#212, #290)", dgx_h100_80gb),
        Preset("pcie-a100-80gb", "PCIe-only server: 8x A100-PCIe-80GB, no NVLink, 2x 100GbE RoCE",
               "A100 PCIe datasheet; nccl-tests (NVIDIA/nccl-tests#178)", pcie_a100_80gb),
        Preset("aws-p4d-24xlarge", "AWS p4d.24xlarge: 8x A100-SXM4-40GB, NVSwitch, 4x 100G EFA (Ethernet)",
               "AWS instance page; nccl-tests (NVIDIA/nccl#527)", aws_p4d),
    )
}
