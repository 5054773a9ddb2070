"""One layer's forward and backward on a GPU: kernels on the compute stream, tensor-parallel collectives on
the TP communicator's stream, with the overlap Megatron-LM gives them (``parallelism.tp_comm_overlap``).

* ``none``: every TP collective blocks the compute stream where it sits (Shoeybi et al. 2019).
* ``backward`` (Megatron-LM's default since its asynchronous tensor-parallel all-reduce, 2021): in
  backward, the input-gradient all-reduce (reduce-scatter with sequence parallelism) runs while the
  weight-gradient GEMM computes, and with sequence parallelism the all-gather of the layer input that the
  weight gradient needs runs while the input-gradient GEMM computes (Korthikanti et al. 2022, sec. 4.2.2:
  "we overlap the tensor-parallel all-reduce with the weight-gradient GEMM"). Forward collectives block.
* ``full`` (Megatron-Core ``--tp-comm-overlap``, Transformer Engine userbuffers): every TP collective is
  split into chunks pipelined with the GEMM beside it; the layer takes as long as the longer of its
  kernels and its collectives.

A layer's backward is done when both its kernels and the collective producing the gradient of its input
are; the gradients of its parameters are ready for data-parallel reduction when its weight-gradient
kernels end. Recompute re-runs the forward (kernels and forward collectives) at the start of backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from simddp.collectives import CollectiveCost
from simddp.compute import LayerTiming
from simddp.results import Span
from simddp.sim.resources import Gpu

TP_STREAM = "tp"


@dataclass(frozen=True)
class LayerPlan:
    """What the simulator runs for one layer: its kernel times and its TP collectives, by position."""

    timing: LayerTiming
    fwd_pre: tuple[CollectiveCost, ...] = ()
    fwd_post: tuple[CollectiveCost, ...] = ()
    bwd_pre: tuple[CollectiveCost, ...] = ()
    dgrad_post: tuple[CollectiveCost, ...] = ()
    wgrad_pre: tuple[CollectiveCost, ...] = ()
    recompute_comm: bool = False  # recompute repeats the forward collectives

    @property
    def name(self) -> str:
        return self.timing.name

    @property
    def tp_comm_s(self) -> float:
        """All TP collective time of one forward + backward (recompute included), alone on the links."""
        colls = self.fwd_pre + self.fwd_post
        redo = colls if self.recompute_comm else ()
        return sum(c.time_s for c in colls + redo + self.bwd_pre + self.dgrad_post + self.wgrad_pre)


class Recorder:
    """Collects spans when a trace is wanted (and a prefix for the stream names of one pipeline rank)."""

    def __init__(self, spans: list[Span] | None, suffix: str = "") -> None:
        self.spans = spans
        self.suffix = suffix

    def add(self, name: str, stream: str, start: float, end: float, keep_empty: bool = False,
            **args: object) -> None:
        if self.spans is not None and (end > start or keep_empty):
            self.spans.append(Span(name=name, stream=stream + self.suffix, start_s=start, end_s=end,
                                   args=dict(args)))


def _comms(gpu: Gpu, costs: Sequence[CollectiveCost], rec: Recorder, label: str) -> simpy.events.ProcessGenerator:
    """TP collectives one after another on the TP stream."""
    for cost in costs:
        start, end = yield from gpu.collective(cost, TP_STREAM)
        rec.add(f"{cost.op} {label}", "comm tp", start, end, size_bytes=cost.size_bytes,
                algorithm=f"{cost.algorithm}/{cost.protocol}")


def _kernels(gpu: Gpu, work_s: float, rec: Recorder, name: str) -> simpy.events.ProcessGenerator:
    start = gpu.env.now
    yield gpu.run(work_s)
    rec.add(name, "compute", start, gpu.env.now)


def forward(gpu: Gpu, plan: LayerPlan, overlap: str, rec: Recorder,
            label: str = "forward") -> simpy.events.ProcessGenerator:
    """The layer's forward (or its recomputation, ``label='recompute'``)."""
    env = gpu.env
    work = plan.timing.fwd_s
    if overlap == "full":
        comm = env.process(_comms(gpu, plan.fwd_pre + plan.fwd_post, rec, plan.name))
        yield from _kernels(gpu, work, rec, f"{label} {plan.name}")
        yield comm
        return
    yield from _comms(gpu, plan.fwd_pre, rec, plan.name)
    yield from _kernels(gpu, work, rec, f"{label} {plan.name}")
    yield from _comms(gpu, plan.fwd_post, rec, plan.name)


def backward(gpu: Gpu, plan: LayerPlan, overlap: str, rec: Recorder,
             on_wgrad_done: Callable[[], None] | None = None) -> simpy.events.ProcessGenerator:
    """The layer's backward: recompute, input-grad, weight-grad, with its TP collectives."""
    env = gpu.env
    t = plan.timing
    if t.recompute_s > 0:
        if plan.recompute_comm:
            yield from forward(gpu, plan, overlap, rec, "recompute")
        else:
            yield from _kernels(gpu, t.recompute_s, rec, f"recompute {plan.name}")
    name = plan.name
    if overlap == "none":
        yield from _comms(gpu, plan.bwd_pre, rec, name)
        yield from _kernels(gpu, t.dgrad_s, rec, f"dgrad {name}")
        yield from _comms(gpu, plan.dgrad_post + plan.wgrad_pre, rec, name)
        yield from _kernels(gpu, t.wgrad_s, rec, f"wgrad {name}")
        if on_wgrad_done:
            on_wgrad_done()
        return
    if overlap == "full":
        comm = env.process(_comms(gpu, plan.bwd_pre + plan.wgrad_pre + plan.dgrad_post, rec, name))
        yield from _kernels(gpu, t.dgrad_s, rec, f"dgrad {name}")
        yield from _kernels(gpu, t.wgrad_s, rec, f"wgrad {name}")
        if on_wgrad_done:
            on_wgrad_done()
        yield comm
        return
    # "backward": the gathered input for wgrad comes while dgrad computes; the input gradient is reduced
    # while wgrad computes.
    yield from _comms(gpu, plan.bwd_pre, rec, name)
    gather = env.process(_comms(gpu, plan.wgrad_pre, rec, name))
    yield from _kernels(gpu, t.dgrad_s, rec, f"dgrad {name}")
    reduce = env.process(_comms(gpu, plan.dgrad_post, rec, name))
    yield gather
    yield from _kernels(gpu, t.wgrad_s, rec, f"wgrad {name}")
    if on_wgrad_done:
        on_wgrad_done()
    yield reduce


def pass_alone_s(plans: Sequence[LayerPlan], overlap: str, kind: str, interference: float) -> float:
    """Duration of a forward (``kind='F'``) or backward (``'B'``) through ``plans`` on an otherwise idle GPU.

    Pipeline operations that release no gradients run as one piece of this length in the step simulation;
    this runs the same layer processes, so both agree exactly when nothing else is in flight.
    """
    return pass_alone(plans, overlap, kind, interference)[0]


def pass_alone(plans: Sequence[LayerPlan], overlap: str, kind: str, interference: float) -> tuple[float, float]:
    """(duration, compute-stream busy time) of :func:`pass_alone_s`'s pass."""
    env = simpy.Environment()
    gpu = Gpu(env, interference)
    rec = Recorder(None)

    end = [0.0, 0.0]

    def run() -> simpy.events.ProcessGenerator:
        if kind == "F":
            for plan in plans:
                yield from forward(gpu, plan, overlap, rec)
        else:
            for plan in reversed(plans):
                yield from backward(gpu, plan, overlap, rec)
        gpu.compute.rerate()
        end[:] = [env.now, gpu.compute.busy_s]  # not env.now after run(): stale rate timers fire later

    env.process(run())
    env.run()
    return end[0], end[1]
