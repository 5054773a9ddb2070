"""Parity of simddp's ``autograd`` gradient accumulation with what real torch runs (CPU torch).

:func:`simddp.compute.grad_accumulation_s` charges torch (DDP under ``no_sync``, ZeroRedundancyOptimizer,
DeepSpeed ZeRO-0/1) one in-place add per parameter in micro-batches 2..m and none in the first. Here a real
model runs several backwards after ``zero_grad(set_to_none=True)`` under torch's profiler: the first
backward launches no ``aten::add_`` (AccumulateGrad keeps the gradient it is handed), every later one
launches exactly one per parameter, into the same storage (in place: read both, write one).
"""

from __future__ import annotations

from collections import Counter

import pytest

from simddp import as_scenario
from simddp.compute import grad_accumulation_s, memory_s
from simddp.workload import Param

torch = pytest.importorskip("torch")
profiler = pytest.importorskip("torch.profiler")


def _backward_ops(model, x) -> Counter:
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    return Counter(e.name for e in prof.events())


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_autograd_adds_each_gradient_in_place_after_the_first_micro_batch(micro_batches: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 8))
    params = list(model.parameters())
    x = torch.randn(16, 64)
    model.zero_grad(set_to_none=True)
    adds = [_backward_ops(model, x)["aten::add_"]]
    storage = [p.grad.data_ptr() for p in params]
    for _ in range(micro_batches - 1):
        adds.append(_backward_ops(model, x)["aten::add_"])
        assert [p.grad.data_ptr() for p in params] == storage  # accumulated in place
    assert adds == [0] + [len(params)] * (micro_batches - 1)

    # simddp charges the same adds: (m - 1) per parameter over the step, each reading two and writing one
    gpu = as_scenario({"cluster": {"preset": "dgx-a100-80gb"}, "model": {"preset": "gpt2"}}).cluster.gpu
    specs = [Param(f"p{i}", p.numel(), "float32") for i, p in enumerate(params)]
    per_micro_batch = grad_accumulation_s(specs, "autograd", micro_batches, False, gpu)
    by_hand = sum(memory_s(3 * s.numel * 4, gpu) for s in specs)
    assert micro_batches * per_micro_batch == pytest.approx((micro_batches - 1) * by_hand, rel=1e-12)
