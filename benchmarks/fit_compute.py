"""Fit the kernel-efficiency constants of the GPU presets from public and measured kernel data, and report
in-sample and held-out errors. Every constant of ``simddp/presets/clusters.py`` marked "fit_compute.py"
comes from here; ``tests/validation/test_compute_kernels.py`` checks the presets still equal this fit.

    python benchmarks/fit_compute.py            # prints the constants and the error tables (docs/compute.md)

Fit data (each constant names it):

* A100 GEMM (ceiling, k0, launch): Azure ND A100 v4 cuBLASLt FP16, 8 shapes, 10,000 warm-up iterations
  (``data/azure_a100_gemm_fp16.csv``).
* H100 GEMM shape constants (k0, launch): OpenXLA's measured H100 bf16 table, 375 shapes
  (``data/xla_matmul_h100_bf16.csv``); H100 ceiling: simddp's own 15-second sustained 8192^3 bf16 run on an
  H100 SXM 80GB HBM3 at 700 W (``data/h100_kernels.json``, "sustained"): XLA's short runs see boost clocks
  that a GPU under training load does not hold.
* A100 FlashAttention: FlashAttention-2 paper, Fig. 5-6 (``data/flash2_a100_causal.csv``); H100
  FlashAttention: simddp's measurement of torch SDPA (FlashAttention-2 backend) (``data/h100_kernels.json``).

Held out (never used to set a constant): simddp's H100 sweep of 478 transformer-shaped GEMMs and 14
attention batched GEMMs, and the transformer layers in ``data/h100_kernels.json``; end to end, Megatron-LM
and Korthikanti et al. (``tests/validation``).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simddp.compute.attention import flash_s
from simddp.compute.gemm import gemm_s
from simddp.config import GPU
from simddp.presets.clusters import a100_gpu, h100_gpu

DATA = Path(__file__).resolve().parent / "data"
FP16 = 2


def read_csv(name: str) -> list[dict[str, str]]:
    with open(DATA / name) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def errors(pred: Iterable[float], meas: Iterable[float]) -> np.ndarray:
    return np.array([p / m - 1 for p, m in zip(pred, meas, strict=True)])


def summary(e: np.ndarray) -> dict[str, float]:
    return {"n": len(e), "mape": float(np.mean(np.abs(e))), "max": float(np.max(np.abs(e))), "bias": float(np.mean(e))}


def grid(fn: Callable[..., float], axes: dict[str, Sequence[float]]) -> dict[str, float]:
    """The point of the grid with the smallest ``fn(**point)`` (deterministic, no optimiser dependency)."""
    best: tuple[float, dict[str, float]] | None = None
    for values in itertools.product(*axes.values()):
        point = dict(zip(axes, values, strict=True))
        score = fn(**point)
        if best is None or score < best[0]:
            best = (score, point)
    assert best is not None
    return best[1]


# ------------------------------------------------------------------------------------------- GEMMs
Gemm = tuple[int, int, int, int, float]  # batch, m, n, k, measured seconds


def gemm_errors(gpu: GPU, rows: Sequence[Gemm], precision: str = "bf16-mixed") -> np.ndarray:
    return errors((gemm_s(m, n, k, gpu, precision, FP16, b) for b, m, n, k, _ in rows), (t for *_, t in rows))


def with_(gpu: GPU, **update: float) -> GPU:
    return gpu.model_copy(update=update)


def a100_gemm_rows() -> list[Gemm]:
    return [(1, int(r["m"]), int(r["n"]), int(r["k"]),
             2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) / (float(r["tflop_per_s"]) * 1e12))
            for r in read_csv("azure_a100_gemm_fp16.csv")]


def xla_h100_rows() -> list[Gemm]:
    return [(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]),
             2.0 * int(r["b"]) * int(r["m"]) * int(r["n"]) * int(r["k"]) / float(r["flop_per_s"]))
            for r in read_csv("xla_matmul_h100_bf16.csv")]


def h100_measured() -> dict[str, Any]:
    return json.loads((DATA / "h100_kernels.json").read_text())


def fit_a100_gemm(base: GPU) -> dict[str, float]:
    rows = a100_gemm_rows()
    return grid(lambda matmul_ceiling_fraction, gemm_k_overhead, kernel_launch_s: float(np.mean(np.abs(
        gemm_errors(with_(base, matmul_ceiling_fraction=matmul_ceiling_fraction, gemm_k_overhead=gemm_k_overhead,
                          kernel_launch_s=kernel_launch_s), rows, "fp16-mixed")))),
        {"matmul_ceiling_fraction": np.arange(0.75, 0.95, 0.002), "gemm_k_overhead": range(0, 1025, 32),
         "kernel_launch_s": [2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 7e-6, 8e-6]})


def fit_h100_gemm_shape(base: GPU) -> dict[str, float]:
    """k0 and launch from XLA's table (its own ceiling fitted alongside, then set aside: boost clocks)."""
    rows = xla_h100_rows()
    return grid(lambda matmul_ceiling_fraction, gemm_k_overhead, kernel_launch_s: float(np.mean(np.abs(
        gemm_errors(with_(base, matmul_ceiling_fraction=matmul_ceiling_fraction, gemm_k_overhead=gemm_k_overhead,
                          kernel_launch_s=kernel_launch_s), rows)))),
        {"matmul_ceiling_fraction": np.arange(0.78, 0.92, 0.002), "gemm_k_overhead": range(0, 513, 32),
         "kernel_launch_s": [2e-6, 3e-6, 4e-6, 5e-6, 6e-6]})


def sustained_ceiling_fraction(base: GPU, measured: dict[str, Any]) -> float:
    """The ceiling that makes the model's 8192^3 GEMM take the sustained run's median time."""
    sus = measured["sustained"]
    n = sus["n"]
    t = 2.0 * n**3 / float(np.median([s["flop_per_s"] for s in sus["samples"]]))
    lo, hi = 0.3, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gemm_s(n, n, n, with_(base, matmul_ceiling_fraction=mid), "bf16-mixed", FP16) < t \
            else (mid, hi)
    return (lo + hi) / 2


# --------------------------------------------------------------------------------------- attention
Flash = tuple[int, int, int, bool, bool, float]  # batch x heads, seq, head dim, causal, backward, seconds


def flash_errors(gpu: GPU, rows: Sequence[Flash], precision: str = "bf16-mixed") -> np.ndarray:
    pred = []
    for bh, s, d, causal, bwd, _ in rows:
        flop = 4.0 * bh * s * s * d * (0.5 if causal else 1.0) * (2.5 if bwd else 1.0)
        pred.append(flash_s(flop, bh * math.ceil(s / 128), s / 2 if causal else s, gpu, precision, bwd))
    return errors(pred, (r[-1] for r in rows))


def a100_flash_rows() -> list[Flash]:
    out = []
    for r in read_csv("flash2_a100_causal.csv"):
        s, d = int(r["seq_len"]), int(r["head_dim"])
        bh = (16384 // s) * (2048 // d)
        bwd = r["pass"] == "bwd"
        flop = 4.0 * bh * s * s * d * 0.5 * (2.5 if bwd else 1.0)
        out.append((bh, s, d, True, bwd, flop / (float(r["tflop_per_s"]) * 1e12)))
    return out


def h100_flash_rows(measured: dict[str, Any]) -> list[Flash]:
    out = []
    for x in measured["attention_bf16"]:
        if not x["impl"].startswith("flash"):
            continue
        causal = x["impl"] == "flash-causal"
        for bwd in (False, True):
            out.append((x["b"] * x["heads"], x["s"], x["d"], causal, bwd, x["bwd_s"] if bwd else x["fwd_s"]))
    return out


def fit_flash(base: GPU, rows: Sequence[Flash], precision: str) -> dict[str, float]:
    return grid(lambda flash_fwd_fraction, flash_bwd_fraction, flash_key_overhead: float(np.mean(np.abs(
        flash_errors(with_(base, flash_fwd_fraction=flash_fwd_fraction, flash_bwd_fraction=flash_bwd_fraction,
                           flash_key_overhead=flash_key_overhead), rows, precision)))),
        {"flash_fwd_fraction": np.arange(0.4, 0.95, 0.01), "flash_bwd_fraction": np.arange(0.4, 0.95, 0.01),
         "flash_key_overhead": range(0, 2049, 64)})


# ---------------------------------------------------------------------------------------- report
def fit_all() -> dict[str, Any]:
    """Every fitted constant and its in-sample / held-out errors (the presets hold the rounded values)."""
    a100, h100 = GPU.model_validate(a100_gpu("A100", 81920, 2039)), GPU.model_validate(h100_gpu())
    measured = h100_measured()
    out: dict[str, Any] = {}
    a_gemm = fit_a100_gemm(a100)
    out["A100 gemm"] = {**a_gemm, "fit": summary(gemm_errors(with_(a100, **a_gemm), a100_gemm_rows(), "fp16-mixed"))}
    h_shape = fit_h100_gemm_shape(h100)
    h_fit = {k: h_shape[k] for k in ("gemm_k_overhead", "kernel_launch_s")}
    h_fit["matmul_ceiling_fraction"] = sustained_ceiling_fraction(with_(h100, **h_fit), measured)
    out["H100 gemm"] = {
        **h_fit, "xla_burst_ceiling_fraction": h_shape["matmul_ceiling_fraction"],
        "fit (XLA table, its own burst ceiling)": summary(gemm_errors(with_(h100, **h_shape), xla_h100_rows())),
        "XLA table at the sustained ceiling": summary(gemm_errors(with_(h100, **h_fit), xla_h100_rows())),
    }
    a_flash = fit_flash(a100, a100_flash_rows(), "bf16-mixed")
    out["A100 flash"] = {**a_flash, "fit": summary(flash_errors(with_(a100, **a_flash), a100_flash_rows()))}
    h_flash = fit_flash(h100, h100_flash_rows(measured), "bf16-mixed")
    out["H100 flash"] = {**h_flash, "fit": summary(flash_errors(with_(h100, **h_flash), h100_flash_rows(measured)))}
    return out


def held_out(h100: GPU) -> dict[str, dict[str, float]]:
    """Errors of the H100 preset on simddp's measured data that set no constant."""
    measured = h100_measured()
    sweep = [(x["b"], x["m"], x["n"], x["k"], x["median_s"]) for x in measured["gemm_bf16"]]
    big = [r for r in sweep if r[-1] > 50e-6]
    batched = [(x["b"], x["m"], x["n"], x["k"], x["median_s"]) for x in measured["batched_gemm_bf16"]]
    return {
        "H100 transformer GEMMs (478)": summary(gemm_errors(h100, sweep)),
        "H100 transformer GEMMs > 50 us": summary(gemm_errors(h100, big)),
        "H100 attention batched GEMMs (14)": summary(gemm_errors(h100, batched)),
    }


def main() -> dict[str, Any]:
    fits = fit_all()
    for name, fit in fits.items():
        print(f"{name}:")
        for k, v in fit.items():
            print(f"  {k}: {v}")
    h100 = GPU.model_validate(h100_gpu())
    for name, s in held_out(h100).items():
        print(f"held out, preset H100: {name}: {s}")
    return fits


if __name__ == "__main__":
    main()
