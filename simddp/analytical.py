"""Closed-form step times used to bound and cross-check the simulator.

With one communication stream that all-reduces buckets in index order (torch's Reducer launches bucket
i only after buckets 0..i-1), bucket i starts at max(ready_i, end_{i-1}) and ends cost_i later. That
recurrence is the exact overlapped step; the no-overlap step runs every all-reduce after backward; the
perfect-overlap lower bound allows any bucket order: max(compute end + the last bucket's cost,
first ready time + all communication).
"""

from __future__ import annotations

from collections.abc import Sequence


def in_order_schedule(ready_s: Sequence[float], cost_s: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce on one FIFO stream."""
    out, free = [], 0.0
    for ready, cost in zip(ready_s, cost_s, strict=True):
        start = max(ready, free)
        free = start + cost
        out.append((start, free))
    return out


def no_overlap_step_s(compute_s: float, cost_s: Sequence[float], tail_s: float) -> float:
    """Backward finishes, then every all-reduce, then the optimizer and host overhead (``tail_s``)."""
    return compute_s + sum(cost_s) + tail_s


def in_order_overlap_step_s(
    compute_s: float, ready_s: Sequence[float], cost_s: Sequence[float], tail_s: float
) -> float:
    """The exact overlapped step: the later of the compute's end and the stream's last all-reduce end
    (:func:`in_order_schedule`; its ends never decrease, so the last is the latest), then the tail."""
    free = 0.0
    for ready, cost in zip(ready_s, cost_s, strict=True):  # in_order_schedule's recurrence, ends only
        free = (ready if ready > free else free) + cost
    return max(compute_s, free) + tail_s


def perfect_overlap_step_s(
    compute_s: float, ready_s: Sequence[float], cost_s: Sequence[float], tail_s: float
) -> float:
    """A lower bound on any schedule of these buckets on one stream."""
    if not cost_s:
        return compute_s + tail_s
    last_ready = max(ready_s)
    last_cost = max(c for r, c in zip(ready_s, cost_s, strict=True) if r == last_ready)
    return max(compute_s, last_ready + last_cost, min(ready_s) + sum(cost_s)) + tail_s
