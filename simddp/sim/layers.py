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
        """The first layer it was made for: identical layers share one plan, so a layer's own name is its
        :class:`simddp.workload.Layer`'s (``RankPlan.layers``)."""
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
    """TP collectives issued together: one after another on the TP stream, ahead of any issued later."""
    if not costs:
        return
    times = yield from gpu.collectives(tuple(costs), TP_STREAM)
    for cost, (start, end) in zip(costs, times, strict=True):
        rec.add(f"{cost.op} {label}", "comm tp", start, end, size_bytes=cost.size_bytes,
                algorithm=f"{cost.algorithm}/{cost.protocol}")


def _kernels(gpu: Gpu, work_s: float, rec: Recorder, name: str) -> simpy.events.ProcessGenerator:
    start = gpu.env.now
    yield gpu.run(work_s)
    rec.add(name, "compute", start, gpu.env.now)


def forward(gpu: Gpu, plan: LayerPlan, overlap: str, rec: Recorder, label: str = "forward",
            work_s: float | None = None, name: str | None = None) -> simpy.events.ProcessGenerator:
    """The layer's forward (or its recomputation: ``label='recompute'``, ``work_s`` its kernel time).

    ``name`` labels its spans (default: the plan's; identical layers share one plan, each with its name)."""
    env = gpu.env
    work = plan.timing.fwd_s if work_s is None else work_s
    name = plan.name if name is None else name
    if overlap == "full":
        comm = env.process(_comms(gpu, plan.fwd_pre + plan.fwd_post, rec, name))
        yield from _kernels(gpu, work, rec, f"{label} {name}")
        yield comm
        return
    yield from _comms(gpu, plan.fwd_pre, rec, name)
    yield from _kernels(gpu, work, rec, f"{label} {name}")
    yield from _comms(gpu, plan.fwd_post, rec, name)


def backward(gpu: Gpu, plan: LayerPlan, overlap: str, rec: Recorder,
             on_wgrad_done: Callable[[], None] | None = None, name: str | None = None) -> simpy.events.ProcessGenerator:
    """The layer's backward: recompute, input-grad, weight-grad, with its TP collectives."""
    env = gpu.env
    t = plan.timing
    name = plan.name if name is None else name
    if t.recompute_s > 0:
        if plan.recompute_comm:
            yield from forward(gpu, plan, overlap, rec, "recompute", t.recompute_s, name)
        else:
            yield from _kernels(gpu, t.recompute_s, rec, f"recompute {name}")
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


def overlapped_s(work_s: float, comm_s: float, interference: float) -> float:
    """When kernels worth ``work_s`` end if collectives are in flight for the first ``comm_s`` seconds (both
    start together): at rate 1 / (1 + i) while the collectives run, full speed after."""
    slow = work_s * (1.0 + interference)
    if slow <= comm_s:
        return slow
    return comm_s + (work_s - comm_s / (1.0 + interference))


def layer_alone(plan: LayerPlan, overlap: str, kind: str, interference: float) -> tuple[float, float]:
    """(duration, compute-stream busy time) of one layer's forward (``kind='F'``) or backward on an idle GPU.

    The closed form of :func:`forward` / :func:`backward` when nothing else is in flight: the layer's own
    collectives run one after another on the TP stream, alone on the link (their ``time_s``), and kernels
    slow while any of them is in flight (:func:`overlapped_s`).
    """
    duration, busy, _ = layer_alone_parts(plan, overlap, kind, interference)
    return duration, busy


def layer_alone_parts(plan: LayerPlan, overlap: str, kind: str, interference: float) -> tuple[float, float, float]:
    """(duration, busy, end of the weight-gradient kernels) of :func:`layer_alone`: its two values and when, from
    the start of a backward on an idle GPU, its weight gradients are ready (a forward's duration again), worked
    out at once, for callers that read more than one."""
    t, i = plan.timing, interference

    def total(costs: tuple[CollectiveCost, ...]) -> float:
        return sum(c.time_s for c in costs if c.time_s > 0)

    def fwd(work: float) -> tuple[float, float]:
        if overlap == "full":
            comm = total(plan.fwd_pre + plan.fwd_post)
            busy = overlapped_s(work, comm, i)
            return max(busy, comm), busy
        return total(plan.fwd_pre) + work + total(plan.fwd_post), work

    if kind == "F":
        d, b = fwd(t.fwd_s)
        return d, b, d
    duration = busy = 0.0
    if t.recompute_s > 0:
        duration, busy = fwd(t.recompute_s) if plan.recompute_comm else (t.recompute_s, t.recompute_s)
    if overlap == "none":
        comm = total(plan.bwd_pre) + total(plan.dgrad_post + plan.wgrad_pre)
        end = duration + comm + t.dgrad_s + t.wgrad_s
        return end, busy + t.dgrad_s + t.wgrad_s, end
    if overlap == "full":
        comm = total(plan.bwd_pre + plan.wgrad_pre + plan.dgrad_post)
        ran = overlapped_s(t.dgrad_s + t.wgrad_s, comm, i)
        return duration + max(ran, comm), busy + ran, duration + ran
    pre, gather, reduce = total(plan.bwd_pre), total(plan.wgrad_pre), total(plan.dgrad_post)
    dgrad_end = pre + overlapped_s(t.dgrad_s, gather, i)
    wgrad_start = max(dgrad_end, pre + gather)  # the reduce waits for the gather on the one TP stream
    wgrad_ran = overlapped_s(t.wgrad_s, reduce, i)
    end = wgrad_start + max(wgrad_ran, reduce)
    return duration + end, busy + (dgrad_end - pre) + wgrad_ran, duration + wgrad_start + wgrad_ran


def layer_tp_s(plan: LayerPlan, kind: str) -> float:
    """A layer's TP collectives of a forward (``kind='F'``) or backward (``'B'``, with the forward's again
    where recompute re-runs them), each alone on its link and added (the no-overlap bound's serialised
    communication)."""
    fwd = sum(c.time_s for c in plan.fwd_pre + plan.fwd_post)
    if kind == "F":
        return fwd
    bwd = sum(c.time_s for c in plan.bwd_pre + plan.dgrad_post + plan.wgrad_pre)
    return bwd + (fwd if plan.recompute_comm else 0.0)


def pass_alone_s(plans: Sequence[LayerPlan], overlap: str, kind: str, interference: float) -> float:
    """Duration of a forward (``kind='F'``) or backward (``'B'``) through ``plans`` on an otherwise idle GPU.

    Pipeline operations that release no gradients run as one piece of this length in the step simulation.
    A layer finishes its own collectives before the next starts, so the pass is the sum of its layers'
    :func:`layer_alone` (``tests/test_layers.py`` checks it against the simpy processes).
    """
    return pass_alone(plans, overlap, kind, interference)[0]


def pass_alone(plans: Sequence[LayerPlan], overlap: str, kind: str, interference: float) -> tuple[float, float]:
    """(duration, compute-stream busy time) of :func:`pass_alone_s`'s pass."""
    duration = busy = 0.0
    seen: dict[int, tuple[float, float]] = {}  # layers of identical blocks share one timing object
    for plan in plans:
        key = id(plan.timing)
        if key not in seen:
            seen[key] = layer_alone(plan, overlap, kind, interference)
        d, b = seen[key]
        duration += d
        busy += b
    return duration, busy


def pass_alone_simulated(plans: Sequence[LayerPlan], overlap: str, kind: str,
                         interference: float) -> tuple[float, float]:
    """:func:`pass_alone` by running the simpy layer processes (the reference the closed form must equal)."""
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
