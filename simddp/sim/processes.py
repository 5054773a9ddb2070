"""simpy processes of one data-parallel GPU: the compute stream and one NCCL communication stream.

Ranks of a data-parallel group behave identically, so one is simulated. Events scale with layers and
buckets: the micro-steps before the last (gradient accumulation, no communication) are one timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from simddp.compute import LayerTiming
from simddp.results import Span


@dataclass
class StreamState:
    """Shared between the streams: whether a collective is in flight (for compute interference)."""

    comm_busy: bool = False
    interference: float = 0.0  # fractional compute slowdown while comm_busy

    def scale(self) -> float:
        return 1.0 + self.interference if self.comm_busy else 1.0


@dataclass(frozen=True)
class BucketPlan:
    """A bucket to all-reduce: which layers' backward must finish first, and its cost."""

    index: int
    size_bytes: int
    num_grads: int
    cost_s: float
    label: str


def compute_stream(
    env: simpy.Environment,
    timings: Sequence[LayerTiming],
    num_micro_batches: int,
    grads_of_layer: Sequence[Sequence[int]],
    grad_ready: Callable[[int], None],
    spans: list[Span],
    state: StreamState,
    rounds: int = 1,
    num_buckets: int = 0,
) -> simpy.events.ProcessGenerator:
    """Forward then backward, layer by layer; reports each bucket gradient as it becomes ready.

    Only the last ``rounds`` micro-batches release gradients (1 for DDP's ``no_sync`` accumulation, all of
    them for ZeRO-2, which reduces every micro-batch); round ``k`` reports bucket ``b`` as
    ``k * num_buckets + b``. The micro-batches before are one timeout. A backward layer that starts while
    a collective is in flight runs ``1 + interference`` times slower (NCCL kernels take SMs and memory
    bandwidth; gloo threads take CPU cores).
    """
    one_micro_s = sum(t.fwd_total_s + t.bwd_s for t in timings)
    silent = num_micro_batches - rounds
    if silent > 0:
        start = env.now
        yield env.timeout(silent * one_micro_s)
        spans.append(Span(name=f"micro-batches 1-{silent}", stream="compute", start_s=start, end_s=env.now))
    for k in range(rounds):
        for t in timings:
            start = env.now
            yield env.timeout(t.fwd_total_s)
            spans.append(Span(name=f"fwd {t.name}", stream="compute", start_s=start, end_s=env.now))
        for i in range(len(timings) - 1, -1, -1):
            t = timings[i]
            start = env.now
            scale = state.scale()
            yield env.timeout((t.recompute_s + t.recompute_tp_s + t.dgrad_s) * scale + t.tp_bwd_s)
            yield env.timeout(t.wgrad_s * scale)
            spans.append(Span(name=f"bwd {t.name}", stream="compute", start_s=start, end_s=env.now))
            for bucket_index in grads_of_layer[i]:
                grad_ready(k * num_buckets + bucket_index)


def comm_stream(
    env: simpy.Environment,
    buckets: Sequence[BucketPlan],
    ready: Sequence[simpy.Event],
    backward_done: simpy.Event | None,
    record: Callable[[BucketPlan, float, float], None],
    spans: list[Span],
    state: StreamState,
    stream: str = "comm",
) -> simpy.events.ProcessGenerator:
    """All-reduce buckets one at a time in index order (torch's Reducer launches them in order).

    With ``backward_done`` given (overlap off) nothing starts before backward has finished.
    """
    if backward_done is not None:
        yield backward_done
    for bucket in buckets:
        yield ready[bucket.index]
        start = env.now
        state.comm_busy = True
        yield env.timeout(bucket.cost_s)
        state.comm_busy = False
        record(bucket, start, env.now)
        spans.append(
            Span(name=f"all-reduce bucket {bucket.index}", stream=stream, start_s=start, end_s=env.now,
                 args={"size_bytes": bucket.size_bytes, "algorithm": bucket.label})
        )
