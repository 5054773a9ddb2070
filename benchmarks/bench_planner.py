"""``simddp plan`` speed and quality (issue 10): GPT-3 175B on 1,024 A100s at batch 1,536, and the default.

Prints the layouts evaluated, how many fit, how many were simulated, the wall time, the best layout, and the
published Megatron layout (``examples/gpt3-175b-3d-1024xA100.yaml``: tp 8, pp 8, interleaved) as simddp times
it; the best must be no slower. Results go in docs/performance.md.

    python benchmarks/bench_planner.py [--jobs 2]

``--jobs`` (default 2, the machine's two cores) checks the candidates' memory in worker processes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import simddp
from simddp.cli import default_scenario_path
from simddp.planner import plan_layouts

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"  # found from any working directory

CASES = [
    ("GPT-3 175B, 1,024 A100, batch 1,536", str(EXAMPLES / "gpt3-175b-3d-1024xA100.yaml"), 1024),
    ("default Llama-2-7B on 16 H100, batch 512", str(default_scenario_path()), 16),
]


def main(jobs: int = 2) -> list[dict[str, object]]:
    out = []
    for label, path, gpus in CASES:
        scenario = simddp.load_scenario(path)
        t0 = time.perf_counter()
        result = plan_layouts(scenario, gpus, top=5, jobs=jobs)
        wall = time.perf_counter() - t0
        best = result.layouts[0]
        row = {"case": label, "evaluated": result.evaluated, "dominated": result.dominated,
               "fitting": result.fitting, "simulated": result.simulated, "wall_s": wall,
               "best": best.label(), "best_step_s": best.step_time_s, "best_mfu": best.mfu}
        if scenario.cluster.num_gpus == gpus:
            given = simddp.simulate(scenario, trace=False)
            row["scenario_step_s"] = given.step_time_s
            assert best.step_time_s <= given.step_time_s, "the planner's best is slower than the given layout"
        out.append(row)
        print(f"{label}: {result.evaluated:,} layouts evaluated ({result.dominated:,} by dominance), "
              f"{result.fitting:,} fit, {result.simulated} simulated, {wall:.1f} s with {jobs} job(s)")
        print(f"  best: {best.label()}: {best.step_time_s:.3f} s, MFU {best.mfu:.1%}")
        if "scenario_step_s" in row:
            print(f"  the scenario's own layout: {row['scenario_step_s']:.3f} s")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simddp plan speed and quality")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for the memory check (default 2)")
    main(parser.parse_args().jobs)
