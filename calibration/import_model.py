"""A simddp scenario from a torch model, no timing: ``python -m simddp_calibration.import_model FILE.py:factory
--out model.yaml``.

Runs one forward and backward of the factory's ``(model, example_inputs)`` on the CPU to record every
trainable parameter (name, numel, dtype, in ``named_parameters()`` order, deduplicated as DDP sees them)
and the order their gradients become ready. The file is a complete scenario: that ``model:`` block, a
cluster preset (``--cluster``) and ``training`` keys (micro-batch from the inputs, ``seq_len: 1``,
precision from the parameter dtypes), so ``simddp buckets model.yaml`` and ``simddp memory model.yaml``
work as is, and the ``model:`` block can be pasted into any other scenario. simddp itself never imports
torch; this is the bridge. For step times, calibrate (see docs/calibration.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from simddp import safeio
from simddp.errors import ScenarioError
from simddp.scenario_io import scenario_from_dict
from simddp_calibration.common import CollectorError, build_model, dtype_name, model_file, set_threads
from simddp_calibration.compute import grad_ready_order


def model_block(spec: str) -> tuple[dict[str, Any], int, list[str]]:
    """(scenario ``model`` keys, micro-batch size, parameter dtypes) of the factory's model."""
    model, inputs = build_model(spec, torch.device("cpu"))
    model.train()
    table, order = grad_ready_order(model, inputs)
    params = [{"name": n, "numel": p.numel(), "dtype": dtype_name(p.dtype)} for n, _, p in table]
    batch = next((int(x.shape[0]) for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), 1)
    return {"parameters": params, "grad_ready_order": order}, batch, sorted({p["dtype"] for p in params})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simddp_calibration.import_model", description=__doc__.splitlines()[0])
    p.add_argument("model", help="FILE.py:factory returning (model, example_inputs)")
    p.add_argument("--out", required=True, type=Path, help="scenario to write (.yaml or .json)")
    p.add_argument("--cluster", default="dgx-h100-80gb", help="cluster preset of the scenario")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the one forward/backward")
    args = p.parse_args(argv)
    try:
        safeio.check_output(args.out, model_file(args.model), "--out")
        set_threads(args.threads)
        block, batch, dtypes = model_block(args.model)
    except (CollectorError, ScenarioError) as err:
        print(f"simddp_calibration.import_model: error: {safeio.one_line(err)}", file=sys.stderr)
        return 2
    precision = "fp32" if dtypes == ["float32"] else ("fp16-mixed" if "float16" in dtypes else "bf16-mixed")
    scenario = {
        "name": f"imported {args.model}",
        "cluster": {"preset": args.cluster, "num_nodes": 1},
        "model": block,
        "training": {"precision": precision, "micro_batch_size": batch, "seq_len": 1},
    }
    scenario_from_dict(scenario)  # fail here, not in the user's next command
    header = (f"# simddp scenario from {args.model} (python -m simddp_calibration.import_model): parameters in "
              "named_parameters() order and their gradient-ready order; no timing.\n")
    text = json.dumps(scenario, indent=1) if args.out.suffix == ".json" else (
        header + safeio.dump_yaml(scenario, sort_keys=False, width=120))
    safeio.write_text(args.out, text, model_file(args.model), "--out")
    print(f"wrote {safeio.shown_path(args.out)}: {len(block['parameters'])} parameters, "
          f"{sum(q['numel'] for q in block['parameters']):,} elements", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
