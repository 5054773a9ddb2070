"""Print the preset-vs-published nccl-tests table (markdown) used in docs/collectives.md.

    python benchmarks/nccl_validation.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "validation"))

from test_nccl_tests import PUBLISHED_BUSBW

from simddp.collectives import collective_cost
from simddp.config import Cluster
from simddp.topology import world_group
from simddp.units import GB

# Mid-size points that are reported but not asserted (see docs/collectives.md).
EXTRA = [
    ("dgx-a100-80gb", 1, 16 * 2**20, "auto", 109.22, "Azure/AI-benchmarking-guide ND_A100_v4_results.md"),
    ("dgx-h100-80gb", 16, 64 * 2**20, "ring", 150.0, "NVIDIA/nccl#1469 (128 H100, 'normal' runs)"),
]


def main() -> None:
    print("| cluster | GPUs | size | algorithm (model) | measured busbw GB/s | simddp GB/s | error | source |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for preset, nodes, size, algo, measured, source in PUBLISHED_BUSBW + EXTRA:
        cluster = Cluster.model_validate({"preset": preset, "num_nodes": nodes})
        c = collective_cost("all-reduce", size, world_group(cluster), algo)  # type: ignore[arg-type]
        model = c.busbw_bytes_per_s / GB
        err = model / measured - 1
        asserted = (preset, nodes, size, algo, measured, source) in PUBLISHED_BUSBW
        if asserted:
            errors.append(abs(err))
        size_txt = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"
        mark = "" if asserted else " (not asserted)"
        print(f"| {preset} | {cluster.num_gpus} | {size_txt} | {c.algorithm}/{c.protocol} | {measured:.1f} | "
              f"{model:.1f} | {err:+.1%}{mark} | {source} |")
    print(f"\nAsserted rows: {len(errors)}, mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}")


if __name__ == "__main__":
    main()
