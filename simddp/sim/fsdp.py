"""ZeRO-3 / FSDP full-shard: per-unit parameter all-gathers and gradient reduce-scatters.

PyTorch FSDP (Zhao et al., VLDB 2023, "PyTorch FSDP") with one FSDP unit per transformer block (and a
root unit for embeddings, final norm and head), ``reshard_after_forward=True`` and the default
prefetching, each micro-batch:

* forward: unit i's forward waits for its parameter all-gather; the all-gather of unit i+1 is issued
  when unit i's forward starts (forward prefetch, one unit ahead; all-gathers run one at a time on
  their own stream, as ``limit_all_gathers`` keeps them);
* backward (reverse unit order): unit i's backward waits for its re-gather; the gather of the next unit
  is issued when unit i's backward starts (``BACKWARD_PRE``); when unit i's backward ends its gradients
  are reduce-scattered on a separate stream.

The optimizer steps on the local shard after the last reduce-scatter. Gradient accumulation without
``no_sync`` reduce-scatters every micro-batch, which is what FSDP does by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from simddp.compute import LayerTiming
from simddp.results import Span


@dataclass(frozen=True)
class FsdpUnit:
    """A group of consecutive layers wrapped as one FSDP unit."""

    index: int
    name: str
    layer_indices: tuple[int, ...]
    gather_s: float  # all-gather of the unit's parameters
    reduce_s: float  # reduce-scatter of the unit's gradients
    grad_bytes: int


def fsdp_micro_step(
    env: simpy.Environment,
    timings: Sequence[LayerTiming],
    units: Sequence[FsdpUnit],
    gather_lock: simpy.Resource,
    reduce_lock: simpy.Resource,
    spans: list[Span],
    on_reduced: Callable[[FsdpUnit, float, float, float], None] | None,
    interference: float,
) -> simpy.events.ProcessGenerator:
    """One forward + backward with FSDP communication; returns when the last reduce-scatter ends."""
    state = {"comm": 0}

    def scale() -> float:
        return 1.0 + interference if state["comm"] else 1.0

    def collective(lock: simpy.Resource, cost_s: float, span: Span) -> simpy.events.ProcessGenerator:
        """Run one collective on its stream (one at a time per stream); returns (start, end)."""
        with lock.request() as req:
            yield req
            start = env.now
            state["comm"] += 1
            yield env.timeout(cost_s)
            state["comm"] -= 1
            spans.append(span.model_copy(update={"start_s": start, "end_s": env.now}))
        return start, env.now

    def gather(unit: FsdpUnit, phase: str, done: simpy.Event) -> simpy.events.ProcessGenerator:
        yield from collective(gather_lock, unit.gather_s,
                              Span(name=f"all-gather {unit.name} ({phase})", stream="comm", start_s=0, end_s=0))
        done.succeed()

    def reduce(unit: FsdpUnit, ready: float) -> simpy.events.ProcessGenerator:
        start, end = yield from collective(
            reduce_lock, unit.reduce_s,
            Span(name=f"reduce-scatter {unit.name}", stream="comm reduce-scatter", start_s=0, end_s=0),
        )
        if on_reduced is not None:
            on_reduced(unit, ready, start, end)

    pending: list[simpy.Process] = []
    for phase, order in (("fwd", list(units)), ("bwd", list(reversed(units)))):
        gathered = [env.event() for _ in order]
        env.process(gather(order[0], phase, gathered[0]))
        for k, unit in enumerate(order):
            yield gathered[k]
            if k + 1 < len(order):  # prefetch the next unit while this one computes
                env.process(gather(order[k + 1], phase, gathered[k + 1]))
            start = env.now
            if phase == "fwd":
                for i in unit.layer_indices:
                    yield env.timeout(timings[i].fwd_total_s)
            else:
                for i in reversed(unit.layer_indices):
                    t = timings[i]
                    yield env.timeout((t.recompute_s + t.dgrad_s + t.wgrad_s) * scale() + t.tp_bwd_s
                                      + t.recompute_tp_s)
            spans.append(Span(name=f"{phase} {unit.name}", stream="compute", start_s=start, end_s=env.now))
            if phase == "bwd":
                pending.append(env.process(reduce(unit, env.now)))
    yield simpy.AllOf(env, pending)
