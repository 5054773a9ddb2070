"""Worst cases within simddp's caps (docs/safety.md): the largest inputs and scenarios it still answers.

    python benchmarks/bench_inputs.py

Each row is one wall-clock measurement on this machine: parsing a file just under the 20 MiB cap (YAML
and JSON), a model at the parameter-list cap (linear since the memory model stopped rebuilding a set per
parameter), the layout search at the GPU cap, and pipeline / ZeRO-3 steps at the pass cap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import simddp
from simddp import safeio
from simddp.cli import default_scenario_path
from simddp.limits import MAX_GPUS, MAX_LAYER_PASSES, MAX_PARAMETERS
from simddp.memory import smallest_layout_that_fits


def _timed(label: str, work: Callable[[], Any]) -> None:
    start = time.perf_counter()
    work()
    print(f"{label:<68} {time.perf_counter() - start:8.2f} s", flush=True)


def _params(n: int) -> list[dict[str, Any]]:
    return [{"name": f"layers.{i}.weight", "numel": 1000 + i % 7} for i in range(n)]


def main() -> None:
    row = "  - {{name: layers.{i}.weight, numel: {n}, dtype: float32}}\n"
    n = safeio.MAX_INPUT_BYTES // len(row.format(i=10**5, n=1000)) - 1000  # dense data up to the cap
    yaml_text = "cluster: {preset: dgx-h100-80gb, num_nodes: 1}\nmodel:\n  parameters:\n" + "".join(
        row.format(i=i, n=1000 + i % 7) for i in range(n))
    _timed(f"YAML, {len(yaml_text) / 2**20:.1f} MiB ({n:,} parameters)",
           lambda: safeio.parse_mapping(yaml_text, "big.yaml"))
    data = safeio.parse_mapping(yaml_text, "big.yaml")
    params = data["model"]["parameters"]
    json_text = json.dumps(data)
    keep = int(len(params) * safeio.MAX_INPUT_BYTES / len(json_text)) - 1000
    json_text = json.dumps({**data, "model": {"parameters": params[:keep]}})
    _timed(f"JSON, {len(json_text) / 2**20:.1f} MiB", lambda: safeio.parse_mapping(json_text, "big.json", "json"))
    scenario = {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1},
                "model": {"parameters": _params(MAX_PARAMETERS)}, "training": {"seq_len": 1}}
    _timed(f"simulate a {MAX_PARAMETERS:,}-parameter model", lambda: simddp.simulate(scenario, trace=False))
    default = simddp.load_scenario(default_scenario_path())
    _timed(f"layout search on {MAX_GPUS:,} GPUs (llama2-7b)", lambda: smallest_layout_that_fits(default, MAX_GPUS))
    base = {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 32}, "model": {"preset": "llama2-7b"}}
    pipe = {**base, "parallelism": {"pp": 32}, "training": {"micro_batch_size": 1,
                                                            "global_batch_size": 8 * MAX_LAYER_PASSES // 32}}
    _timed(f"pipeline at the pass cap ({MAX_LAYER_PASSES:,}: pp 32 x 4,096 micro-batches)",
           lambda: simddp.simulate(pipe, trace=False))
    zero3 = {"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 2}, "model": {"preset": "llama2-7b"},
             "parallelism": {"zero_stage": 3}, "training": {"micro_batch_size": 1,
                                                            "global_batch_size": 16 * MAX_LAYER_PASSES // 32}}
    _timed(f"ZeRO-3 at the pass cap ({MAX_LAYER_PASSES:,}: 32 layers x 4,096 micro-batches)",
           lambda: simddp.simulate(zero3, trace=False))


if __name__ == "__main__":
    main()
