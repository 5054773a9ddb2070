"""Monte Carlo speed of `simddp tails`: 1,024 ranks x 200 steps must take <= 2 s on the 2-core machine.

Times the Monte Carlo alone (``simulate_tails`` given the simulated step) and end to end (the step simulated
first), median of repeats, for a data-parallel, a 3D-parallel and a sequence-length case.

    python benchmarks/bench_variability.py
"""

from __future__ import annotations

import statistics
import time

from simddp.scenario_io import scenario_from_dict
from simddp.sim import simulate_step
from simddp.variability import simulate_tails

TARGET_S = 2.0
CASES = {
    "llama2-7b ZeRO-1, 1024 x H100 (dp 1024), jitter + 4 stragglers": {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 128}, "model": {"preset": "llama2-7b"},
        "parallelism": {"zero_stage": 1}, "training": {"global_batch_size": 2048, "seq_len": 4096,
                                                       "recompute": "selective"},
        "variability": {"jitter_cv": 0.05, "num_stragglers": 4, "straggler_slowdown": 1.3}},
    "llama2-70b tp8 pp4, 1024 x H100 (dp 32, 8 micro-batches), jitter": {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 128}, "model": {"preset": "llama2-70b"},
        "parallelism": {"tp": 8, "pp": 4, "zero_stage": 1}, "training": {"global_batch_size": 256, "seq_len": 4096},
        "variability": {"jitter_cv": 0.05}},
    "llama2-7b DDP, 1024 x H100, lognormal documents, padding": {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 128}, "model": {"preset": "llama2-7b"},
        "parallelism": {"zero_stage": 1},
        "training": {"micro_batch_size": 4, "global_batch_size": 4096, "seq_len": 4096},
        "variability": {"seq_len_distribution": "lognormal", "mean_seq_len": 1024, "jitter_cv": 0.03}},
    "llama2-7b DDP, 1024 x H100, lognormal documents, packing": {
        "cluster": {"preset": "dgx-h100-80gb", "num_nodes": 128}, "model": {"preset": "llama2-7b"},
        "parallelism": {"zero_stage": 1},
        "training": {"micro_batch_size": 4, "global_batch_size": 4096, "seq_len": 4096},
        "variability": {"seq_len_distribution": "lognormal", "mean_seq_len": 1024, "sequence_handling": "packing",
                        "jitter_cv": 0.03}},
}


def main(repeats: int = 5, steps: int = 200) -> None:
    print(f"| scenario | ranks x steps | Monte Carlo | end to end (with the step) | target {TARGET_S:g} s |")
    print("|---|---|---|---|---|")
    for name, data in CASES.items():
        scenario = scenario_from_dict(data)
        step = simulate_step(scenario, trace=False)
        mc, full = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            simulate_tails(scenario, steps, step=step)
            mc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            simulate_tails(scenario, steps)
            full.append(time.perf_counter() - t0)
        m, f = statistics.median(mc), statistics.median(full)
        ok = "met" if f <= TARGET_S else "MISSED"
        print(f"| {name} | {scenario.cluster.num_gpus:,} x {steps} | {m * 1e3:.0f} ms | {f * 1e3:.0f} ms | {ok} |")


if __name__ == "__main__":
    main()
