"""torch's Adam step measured on an H100, held out: the optimizer model is torch.optim's own passes.

``benchmarks/data/h100_calibration/compute_gpu.json`` (this project's GPU session, 2026-11-22, torch 2.11,
docs/calibration.md): ``optimizer.step()`` of ``torch.optim.Adam`` (its default foreach path, fp32) over the
152 M parameters of ``calibration/models/small_transformer.py:gpu``, median of 20 steps: 4.14 ms. simddp times
it from the bytes ``_multi_tensor_adam`` moves per parameter (76 B: seven multi-tensor kernels,
simddp.compute.layer.FOREACH_OPTIMIZER_BYTES_PER_PARAM) at the H100 preset's streaming bandwidth; no constant
comes from this run. It predicts 3.84 ms (-7.4%); the fused-kernel model it had before (28 B) gave 1.41 ms,
2.9x short.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simddp
from simddp.compute import FOREACH_OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM, optimizer_step_s
from simddp.config import Training
from simddp.workload import Param, Workload

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100_calibration" / "compute_gpu.json"


def _step_s(impl: str) -> tuple[float, float]:
    data = json.loads(RUN.read_text())
    params = tuple(Param(p["name"], p["numel"], p["dtype"]) for p in data["parameters"])
    workload = Workload(parameters=params, grad_ready_order=tuple(range(len(params))), layers=(),
                        tokens_per_micro_batch=1, samples_per_micro_batch=1, model_flop_per_sample=0.0)
    gpu = simddp.as_scenario({"cluster": {"preset": "dgx-h100-80gb", "num_nodes": 1},
                              "model": {"preset": "gpt2"}}).cluster.gpu
    training = Training(precision="fp32", optimizer=data["optimizer"])
    return optimizer_step_s(workload, gpu, training, impl=impl), data["optimizer_step"]["median_s"]


def test_torch_adam_on_h100_is_its_foreach_passes() -> None:
    predicted, measured = _step_s("foreach")
    assert measured == pytest.approx(4.14e-3, rel=0.01)
    assert predicted / measured - 1 == pytest.approx(-0.074, abs=0.074)  # -7.4%: fails if the error doubles


def test_foreach_moves_the_bytes_of_its_kernels() -> None:
    # Adam: lerp_(m, g) 3 + mul_(v) 2 + addcmul_(v, g, g) 4 + sqrt(v) 2 + div_ 2 + add_ 2 + addcdiv_(p, m, d) 4
    # fp32 operands read or written, 4 B each; AdamW adds mul_(p) 2; SGD add_(p, g) 3, momentum 2 + 3 more.
    assert FOREACH_OPTIMIZER_BYTES_PER_PARAM["adam"] == 4 * (3 + 2 + 4 + 2 + 2 + 2 + 4)
    assert FOREACH_OPTIMIZER_BYTES_PER_PARAM["adamw"] == FOREACH_OPTIMIZER_BYTES_PER_PARAM["adam"] + 4 * 2
    assert FOREACH_OPTIMIZER_BYTES_PER_PARAM["sgd-momentum"] == 4 * (3 + 2 + 3)
    foreach, _ = _step_s("foreach")
    fused, _ = _step_s("fused")
    assert foreach / fused == pytest.approx(76 / OPTIMIZER_BYTES_PER_PARAM["adam"], rel=1e-12)
