"""DDP's search for unused parameters (``find_unused_parameters``) on CPU torch: per-node cost fitted on one
model, checked on a held-out one, both measured here in alternation (host speed and load set the constant).

Fit: ``calibration/models/small_transformer.py:factory`` (340 autograd nodes). Held out:
``calibration/models/deep_mlp.py:factory`` (2,001 nodes). Each figure is the median of paired, alternated
(DDP forward with the search) - (without) differences on a one-rank gloo group. Results in docs/ddp_knobs.md.

    python benchmarks/bench_graph_search.py [--pairs 300]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from simddp.config import Cluster
from simddp_calibration.common import load_factory

ROOT = Path(__file__).resolve().parents[1]


def model(file: str, factory: str = "factory") -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``(model, inputs)`` from ``calibration/models/FILE:factory``, loaded as the collectors load a model."""
    return load_factory(f"{ROOT / 'calibration' / 'models' / file}:{factory}")()  # type: ignore[no-any-return]


def graph_search_s(models: list[tuple[torch.nn.Module, tuple[torch.Tensor, ...]]], pairs: int) -> list[float]:
    """Per model: median (forward with find_unused_parameters) - (without), the models taking turns."""
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    wrapped = []
    for model, inputs in models:
        plain, searching = ddp_cls(copy.deepcopy(model)), ddp_cls(copy.deepcopy(model), find_unused_parameters=True)
        for m in (plain, searching):
            for _ in range(3):
                m(*inputs).sum().backward()
        wrapped.append((plain, searching, inputs))
    diffs: list[list[float]] = [[] for _ in models]
    for i in range(pairs):
        for k, (plain, searching, inputs) in enumerate(wrapped):
            t = {}
            for name, m in (("p", plain), ("s", searching)) if i % 2 else (("s", searching), ("p", plain)):
                t0 = time.perf_counter()
                out = m(*inputs)
                t[name] = time.perf_counter() - t0
                out.sum().backward()
            diffs[k].append(t["s"] - t["p"])
    return [statistics.median(d) for d in diffs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    args = parser.parse_args()
    from simddp_calibration.common import count_autograd_nodes

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1)
        try:
            fit, held = model("small_transformer.py"), model("deep_mlp.py")
            nodes = [count_autograd_nodes(*fit), count_autograd_nodes(*held)]
            fit_s, held_s = graph_search_s([fit, held], args.pairs)
        finally:
            dist.destroy_process_group()
    per_node = fit_s / nodes[0]
    default = Cluster.model_fields["autograd_node_traversal_s"].default
    print(f"fit   small_transformer:factory  {nodes[0]:>5} nodes  {fit_s * 1e6:8.1f} us  "
          f"{per_node * 1e9:.0f} ns/node")
    print(f"held  deep_mlp:factory           {nodes[1]:>5} nodes  {held_s * 1e6:8.1f} us measured, "
          f"{nodes[1] * per_node * 1e6:.1f} us predicted ({nodes[1] * per_node / held_s - 1:+.0%}); "
          f"with the shipped default {nodes[1] * default * 1e6:.1f} us ({nodes[1] * default / held_s - 1:+.0%})")


if __name__ == "__main__":
    main()
