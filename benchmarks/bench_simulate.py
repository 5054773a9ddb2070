"""Simulator speed: wall time of simddp.simulate for representative scenarios (median of repeats).

    python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import statistics
import time

import simddp

CASES = {
    "default: llama2-7b DDP, 128 x H100": {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 16},
                                            "model": {"preset": "llama2-7b"},
                                            "training": {"global_batch_size": 512, "seq_len": 4096}},
    "llama2-70b ZeRO-1 tp8 pp4, 1024 x H100": {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 128},
                                               "model": {"preset": "llama2-70b"},
                                               "parallelism": {"tp": 8, "pp": 4, "zero_stage": 1},
                                               "training": {"global_batch_size": 1024, "seq_len": 4096}},
    "gpt3-175b tp8 pp8, 4096 x A100": {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 512},
                                       "model": {"preset": "gpt3-175b"},
                                       "parallelism": {"tp": 8, "pp": 8},
                                       "training": {"global_batch_size": 1536, "seq_len": 2048}},
    "resnet50 DDP, 64 x A100, 5 MiB buckets": {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
                                               "model": {"preset": "resnet50"},
                                               "training": {"micro_batch_size": 256, "seq_len": 1},
                                               "ddp": {"bucket_cap_mb": 5}},
}


def main(repeats: int = 7) -> None:
    print("| scenario | buckets | simulate (trace off) | simulate (trace on) |")
    print("|---|---|---|---|")
    for name, data in CASES.items():
        scenario = simddp.as_scenario(data)
        timings = {}
        for trace in (False, True):
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = simddp.simulate(scenario, trace=trace)
                samples.append(time.perf_counter() - t0)
            timings[trace] = statistics.median(samples)
        print(f"| {name} | {len(r.buckets)} | {timings[False] * 1e3:.1f} ms | {timings[True] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
