"""Small, self-consistent calibration files for the Calibration page's tests (no torch needed).

Collective times follow an exact alpha-beta ring on 2 ranks; layer times are fixed; DDP steps are the
simulator's own prediction of them plus 5%, so the validation has a known error.
"""

from __future__ import annotations

from pathlib import Path

from simddp.profile import (
    MEASUREMENT_VERSION,
    CommCase,
    CommMeasurements,
    ComputeMeasurements,
    DDPCase,
    DDPMeasurements,
    MeasuredLayer,
    MeasuredParameter,
    PeakRates,
    RunInfo,
    timing_stats,
    write_json,
)

ALPHA_S = 20e-6  # per ring step
BUSBW = 2e9  # bytes/s
SIZES = [2**k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def _run(world: int = 2) -> RunInfo:
    return RunInfo(world_size=world, num_nodes=1, ranks_per_node=world, backend="gloo", device="cpu",
                   hosts=["host"] * world, device_names=["cpu"] * world, torch_version="2.13.0", num_threads=1,
                   started_at="2026-01-01T00:00:00+00:00")


def _stats(t: float) -> object:
    return timing_stats([t * f for f in (0.98, 0.99, 1.0, 1.0, 1.01, 1.02)])


def comm() -> CommMeasurements:
    n = 2
    cases = [
        CommCase(op="all-reduce", group="world", tier="intra", num_ranks=n, num_nodes=1, size_bytes=s,
                 stats=_stats(2 * (n - 1) * ALPHA_S + 2 * (n - 1) / n * s / BUSBW))  # type: ignore[arg-type]
        for s in SIZES
    ]
    return CommMeasurements(kind="simddp-comm", version=MEASUREMENT_VERSION, complete=True, run=_run(), cases=cases)


def compute() -> ComputeMeasurements:
    params = [MeasuredParameter(name=f"l{i}.weight", numel=1_000_000, dtype="float32", module=f"l{i}")
              for i in range(4)]
    layers = [MeasuredLayer(name=f"l{i}", param_indices=[i], fwd=_stats(2e-3), bwd=_stats(4e-3))  # type: ignore[arg-type]
              for i in range(4)]
    return ComputeMeasurements(
        kind="simddp-compute", version=MEASUREMENT_VERSION, complete=True, run=_run(1), model="toy.py:build",
        optimizer="sgd", micro_batch_size=8, parameters=params, grad_ready_order=[3, 2, 1, 0], layers=layers,
        forward=_stats(8e-3), backward=_stats(16e-3), optimizer_step=_stats(1e-3), host=_stats(0.5e-3),
        step=_stats(26e-3), peak=PeakRates(matmul_flop_per_s=1e11, copy_bytes_per_s=1e10, memory_bytes=8 * 2**30),
    )  # type: ignore[arg-type]


def ddp(profile_path: Path, error: float = 0.05) -> DDPMeasurements:
    from simddp.report import predict

    cases = []
    for cap in (1.0, 5.0, 25.0):
        pred = predict(profile_path, {"parallelism": {"dp": 2}, "ddp": {"bucket_cap_mb": cap}})
        cases.append(DDPCase(bucket_cap_mb=cap, num_buckets=pred.num_buckets,
                             stats=_stats(pred.step_time_s * (1 + error))))  # type: ignore[arg-type]
    return DDPMeasurements(kind="simddp-ddp", version=MEASUREMENT_VERSION, complete=True, run=_run(),
                           model="toy.py:build", optimizer="sgd", micro_batch_size=8, cases=cases)


def write_all(folder: Path) -> dict[str, Path]:
    """comm.json, compute.json, profile.json (fitted by simddp.fit) and ddp.json in ``folder``."""
    from simddp.fit import fit_profile

    paths = {name: folder / f"{name}.json" for name in ("comm", "compute", "profile", "ddp")}
    c, k = comm(), compute()
    write_json(c, paths["comm"])
    write_json(k, paths["compute"])
    write_json(fit_profile(c, k), paths["profile"])
    write_json(ddp(paths["profile"]), paths["ddp"])
    return paths
