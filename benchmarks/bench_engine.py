"""Engine speed on the cases of issue 10: one evaluation in-process, and a 1,000-configuration sweep.

Each timing is the median of repeats of ``simddp.simulate(scenario, trace=False)`` on an already validated
``Scenario``; every cache of the engine is cleared before each repeat, so speed comes from the engine and not
from answering the same request twice. ``--exact`` times the full simpy simulation instead.

    python benchmarks/bench_engine.py [--exact] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import simddp
from simddp.cli import default_scenario_path
from simddp.config import set_value
from simddp.sweeps import as_scenario_dict

ROOT = Path(__file__).resolve().parent.parent  # scenario files by the repository's paths, from any directory
DEFAULT = str(default_scenario_path())

CASES: dict[str, Any] = {
    "default: Llama-2-7B ZeRO-1, 128 H100": DEFAULT,
    "GPT-3 175B tp8 pp8 v3, 64 A100, 64 micro-batches": {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8}, "model": {"preset": "gpt3-175b"},
        "parallelism": {"tp": 8, "pp": 8, "pipeline_schedule": "interleaved-1f1b", "virtual_stages": 3},
        "training": {"micro_batch_size": 1, "global_batch_size": 64, "seq_len": 2048, "recompute": "selective"}},
    "1T tp8 pp64, 512 A100, 512 micro-batches": {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 64},
        "model": {"transformer": {"num_layers": 128, "hidden_size": 25600, "num_heads": 160,
                                  "ffn_hidden_size": 102400, "vocab_size": 51200}},
        "parallelism": {"tp": 8, "pp": 64},
        "training": {"micro_batch_size": 1, "global_batch_size": 512, "seq_len": 2048, "recompute": "selective"}},
    "default on 16,384 H100": {"_base": DEFAULT, "cluster.num_nodes": 2048, "training.global_batch_size": 65536},
}

#: Steps with collectives beside the layers (no target in issue 10; the fast engine follows them layer by layer,
#: simddp/sim/fluid.py): FSDP, TP in data parallel, a 3D pipeline whose reduction overlaps its last backwards.
EXTRA: dict[str, Any] = {
    "Llama-2-70B FSDP (ZeRO-3), 64 H100": str(ROOT / "examples/llama2-70b-zero3-64xH100.yaml"),
    "Llama-2-70B tp8 ZeRO-1 (dp 16), 128 H100": {"_base": DEFAULT, "model.preset": "llama2-70b",
                                                  "parallelism.tp": 8, "training.global_batch_size": 256},
    "GPT-3 175B 3D example, 1,024 A100 (tp8 pp8 v2, ZeRO-1)": str(ROOT / "examples/gpt3-175b-3d-1024xA100.yaml"),
}


def scenario_of(case: Any) -> simddp.Scenario:
    if isinstance(case, dict) and "_base" in case:
        data = as_scenario_dict(simddp.as_scenario(case["_base"]))
        for path, value in case.items():
            if path != "_base":
                data = set_value(data, path, value)
        return simddp.as_scenario(data)
    return simddp.as_scenario(case)


def clear_caches() -> None:
    from simddp import engine_caches

    engine_caches.clear()


def time_one(scenario: simddp.Scenario, exact: bool, repeats: int) -> tuple[float, float, Any]:
    """(median, fastest, result) of ``repeats`` evaluations after half a second of untimed warm-up
    (first-use costs of the process: imports, presets, and this VM's slow start), every engine cache cleared
    before each."""
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:
        clear_caches()
        simddp.simulate(scenario, trace=False, exact=exact)
    samples, result = [], None
    for _ in range(repeats):
        clear_caches()
        t0 = time.perf_counter()
        result = simddp.simulate(scenario, trace=False, exact=exact)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), min(samples), result


def host_reference_ms(repeats: int = 7) -> float:
    """Median milliseconds of a fixed pure-Python loop (10^6 additions in a function's locals): the host's own
    speed at the time, printed beside the engine's timings. The same code's wall times differ up to 2x between this
    project's 2-core machines and between minutes on one (the default evaluation read 1.9-2.0 ms on the
    twenty-third pass's host and 2.8-6.2 ms on the twenty-fourth's, where this loop read 39-66 ms within the hour),
    so a timing is read against this figure; instruction counts (``bench_instructions.py``) are the host-free
    measure."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def sweep_configs(n: int = 1000) -> list[dict[str, Any]]:
    """n DDP variants of the default: bucket caps x nodes x micro-batch sizes x ZeRO stage 0/1."""
    base = as_scenario_dict(simddp.as_scenario(DEFAULT))
    out = []
    caps = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000]
    nodes = [2, 4, 8, 16, 32]
    for cap in caps:
        for n_nodes in nodes:
            for mbs in (1, 2, 4, 8):
                for zero in (0, 1):
                    for precision_seq in ((2048,), (4096,), (8192,)):
                        data = set_value(base, "ddp.bucket_cap_mb", cap)
                        data = set_value(data, "cluster.num_nodes", n_nodes)
                        data = set_value(data, "training.micro_batch_size", mbs)
                        data = set_value(data, "training.global_batch_size", 8 * n_nodes * mbs * 4)
                        data = set_value(data, "parallelism.zero_stage", zero)
                        data = set_value(data, "training.seq_len", precision_seq[0])
                        out.append(data)
    return out[:n]


def time_sweep(exact: bool) -> tuple[float, int]:
    configs = sweep_configs()
    scenarios = [simddp.as_scenario(c) for c in configs]
    clear_caches()
    t0 = time.perf_counter()
    for s in scenarios:
        simddp.simulate(s, trace=False, exact=exact)
    return time.perf_counter() - t0, len(scenarios)


#: The ``simddp sweep`` grid of the same kind (10 x 5 x 5 x 2 x 2 = 1,000 points; the global batch follows the
#: cluster, weak scaling, as in :func:`sweep_configs`).
SWEEP_GRID: dict[str, list[Any]] = {
    "ddp.bucket_cap_mb": [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000],
    "cluster.num_nodes": [2, 4, 8, 16, 32],
    "training.micro_batch_size": [1, 2, 4, 8, 16],
    "parallelism.zero_stage": [0, 1],
    "training.seq_len": [2048, 4096],
}


def time_cli_sweep(jobs: int) -> tuple[float, int]:
    """``simddp sweep``'s own path (:func:`simddp.sweeps.vary_sweep`: each point validated from its dict, then
    simulated; ``jobs`` worker processes), engine caches cleared first; worker start-up included."""
    from simddp.sweeps import vary_sweep

    clear_caches()
    t0 = time.perf_counter()
    sweep = vary_sweep(simddp.as_scenario(DEFAULT), SWEEP_GRID, jobs=jobs)
    return time.perf_counter() - t0, len(sweep.points)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exact", action="store_true", help="time the full simpy simulation")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"engine: {'exact (simpy)' if args.exact else 'fast'}; host reference (10^6-iteration Python loop): "
          f"{host_reference_ms():.0f} ms\n")
    print("| case | evaluation (median) | fastest | step time |\n|---|---|---|---|")
    for name, case in {**CASES, **EXTRA}.items():
        scenario = scenario_of(case)
        t, fastest, r = time_one(scenario, args.exact, args.repeats if not args.exact else 1)
        print(f"| {name} | {t * 1e3:.2f} ms | {fastest * 1e3:.2f} ms | {r.step_time_s:.4f} s |", flush=True)
    total, n = time_sweep(args.exact)
    print(f"| {n}-configuration DDP sweep | {total:.2f} s | - | {total / n * 1e3:.2f} ms each |")
    if not args.exact:
        for jobs in (1, 2):
            total, n = time_cli_sweep(jobs)
            print(f"| {n}-point `simddp sweep --jobs {jobs}` (validation included) | {total:.2f} s | - "
                  f"| {total / n * 1e3:.2f} ms each |", flush=True)


if __name__ == "__main__":
    main()
