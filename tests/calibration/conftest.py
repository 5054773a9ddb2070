"""Synthetic, self-consistent calibration files (no torch): exact alpha-beta collectives, fixed layer times."""

from __future__ import annotations

from pathlib import Path

import pytest

from simddp.collectives import BUSBW_FACTOR
from simddp.fit import fit_profile, ring_steps
from simddp.profile import (
    MEASUREMENT_VERSION,
    CommCase,
    CommMeasurements,
    ComputeMeasurements,
    InterferenceCase,
    MeasuredLayer,
    MeasuredParameter,
    PeakRates,
    RunInfo,
    TimingStats,
    timing_stats,
    write_json,
)

ALPHA_S = 30e-6
BUSBW = 1.5e9
SIZES = [2**k for k in range(10, 27)]  # 1 KiB .. 64 MiB
NUM_LAYERS = 6
PARAM_NUMEL = 500_000  # 2 MB of fp32 gradient per layer


def run_info(world: int) -> RunInfo:
    return RunInfo(world_size=world, num_nodes=1, ranks_per_node=world, backend="gloo" if world > 1 else "none",
                   device="cpu", hosts=["h"] * world, device_names=["cpu"] * world, torch_version="2.13.0",
                   num_threads=1, started_at="2026-01-01T00:00:00+00:00")


def stats(t: float, rel: float = 0.02) -> TimingStats:
    return timing_stats([t * (1 + rel * k) for k in (-2, -1, 0, 0, 1, 2)])


def comm_measurements(lost_fraction: float = 0.2) -> CommMeasurements:
    ops = ("all-reduce", "reduce-scatter", "all-gather", "broadcast")
    cases = [
        CommCase(op=op, group="world", tier="intra", num_ranks=2, num_nodes=1, size_bytes=s,  # type: ignore[arg-type]
                 stats=stats(ring_steps(op, 2) * ALPHA_S + s * BUSBW_FACTOR[op](2) / BUSBW))
        for op in ops for s in SIZES
    ]
    inter = [InterferenceCase(size_bytes=2**22, compute_alone_s=0.03, comm_alone_s=0.01,
                              both_s=0.03 + lost_fraction * 0.01, comm_in_both_s=0.011, repeats=3,
                              lost_fractions=[lost_fraction * f for f in (0.9, 1.0, 1.1)])]
    return CommMeasurements(kind="simddp-comm", version=MEASUREMENT_VERSION, complete=True, run=run_info(2),
                            cases=cases, interference=inter)


def compute_measurements() -> ComputeMeasurements:
    params = []
    for i in range(NUM_LAYERS):
        params.append(MeasuredParameter(name=f"l{i}.weight", numel=PARAM_NUMEL, dtype="float32", module=f"l{i}"))
        params.append(MeasuredParameter(name=f"l{i}.bias", numel=1000, dtype="float32", module=f"l{i}"))
    order = [j for i in reversed(range(NUM_LAYERS)) for j in (2 * i + 1, 2 * i)]
    layers = [MeasuredLayer(name="(other ops)", param_indices=[], fwd=stats(1e-3), bwd=stats(0.5e-3))]
    layers += [MeasuredLayer(name=f"l{i}", param_indices=[2 * i, 2 * i + 1], fwd=stats(3e-3), bwd=stats(6e-3))
               for i in range(NUM_LAYERS)]
    return ComputeMeasurements(
        kind="simddp-compute", version=MEASUREMENT_VERSION, complete=True, run=run_info(2), model="toy.py:build",
        optimizer="sgd", micro_batch_size=8, input_shapes=[[8, 64]], parameters=params, grad_ready_order=order,
        layers=layers, forward=stats(19e-3), backward=stats(36.5e-3), optimizer_step=stats(1.5e-3),
        host=stats(0.4e-3), step=stats(57.4e-3), ddp_overhead=stats(1e-3),
        peak=PeakRates(matmul_flop_per_s=5e10, copy_bytes_per_s=2e10, memory_bytes=8 * 2**30),
    )


@pytest.fixture
def calibration_files(tmp_path: Path) -> dict[str, Path]:
    """comm.json, compute.json and the fitted profile.json in a temporary folder."""
    comm, compute = comm_measurements(), compute_measurements()
    paths = {name: tmp_path / f"{name}.json" for name in ("comm", "compute", "profile")}
    write_json(comm, paths["comm"])
    write_json(compute, paths["compute"])
    write_json(fit_profile(comm, compute), paths["profile"])
    return paths
