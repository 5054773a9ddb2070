"""Checks a result must pass before it is printed: finite numbers, and parts that add up to the step.

A step time beyond :data:`MAX_STEP_TIME_S` (or an infinite one) comes from rates or sizes out of any
physical range in the scenario (a peak of 1e-300 FLOP/s, say): that is the user's to fix, reported as
a :class:`~simddp.errors.ScenarioError`. Anything else that fails here is a bug in simddp, reported as an
:class:`~simddp.errors.InternalError`, never printed as a result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simddp.errors import InternalError, ScenarioError
from simddp.safeio import first_non_finite

#: Longest step the model answers for (about 32 years): beyond it the inputs are out of range, and
#: double precision no longer resolves the parts of a step against its total.
MAX_STEP_TIME_S = 1e9
#: Most bytes one GPU's memory is answered for: 2^64, all a 64-bit address space holds (16 EiB). Beyond it the
#: model's sizes are out of range (a vocabulary of 10^300 printed a 240-digit GiB figure, a probe).
MAX_MEMORY_BYTES = 2**64
#: What a message of more than :data:`simddp.limits.MAX_MESSAGE_BYTES` says of its cause (it blamed the links).
SIZE_CAUSE = ("the model's sizes are out of range (model.transformer, model.parameters, training.micro_batch_size, "
              "training.seq_len)")
#: Relative slack of "parts add up to the step" (the simulator's clock sums thousands of durations).
REL_TOL = 1e-6
ABS_TOL_S = 1e-9


def check_range(step_time_s: float, what: str | Callable[[], str] = "the step",
                cause: str = "a rate or size in the scenario is out of range (peak FLOP/s, bandwidths, seq_len, "
                             "batch sizes)") -> None:
    """Refuse a step time (or any part of one) that is not finite or beyond :data:`MAX_STEP_TIME_S` (a user
    error; ``cause`` says which inputs can make it so). ``what`` may be a function giving the name, called only
    for a time refused: a caller on a hot path (every collective's cost) then formats nothing otherwise."""
    if not step_time_s <= MAX_STEP_TIME_S:
        if callable(what):
            what = what()
        raise ScenarioError(
            f"{what} would take {step_time_s:.3g} s, beyond the {MAX_STEP_TIME_S:.0e} s the model answers for: {cause}"
        )


def check_memory(total_bytes: int, what: str = "the most loaded GPU") -> None:
    """Refuse a memory total beyond :data:`MAX_MEMORY_BYTES` (a user error, as a step beyond the time range)."""
    if total_bytes > MAX_MEMORY_BYTES:
        raise ScenarioError(f"{what} would hold {float(total_bytes):.3g} B, beyond the 2^64 B (16 EiB) a 64-bit "
                            f"address space holds: {SIZE_CAUSE}")


def check_finite(data: Any, what: str) -> None:
    """Every number in ``data`` (nested dicts and lists) is finite."""
    bad = first_non_finite(data)
    if bad is not None:
        raise InternalError(f"{what}: {bad[0]} is {bad[1]}, not a finite number")


def check_step_result(result: Any) -> None:
    """A :class:`~simddp.results.StepResult` is finite, non-negative, and its parts add up to the step."""
    step = result.step_time_s
    check_range(step)
    check_finite(result.model_dump(exclude={"trace"}), "step result")
    tol = REL_TOL * step + ABS_TOL_S
    named = {
        "compute_time_s": result.compute_time_s,
        "optimizer_time_s": result.optimizer_time_s,
        "host_overhead_s": result.host_overhead_s,
        "exposed_comm_time_s": result.exposed_comm_time_s,
        "pipeline_bubble_time_s": result.pipeline_bubble_time_s,
        "comm_time_s": result.comm_time_s,
        "tp_comm_time_s": result.tp_comm_time_s,
    }
    for name, value in named.items():
        if value < -ABS_TOL_S:
            raise InternalError(f"step result: {name} = {value} s is negative")
    if result.exposed_comm_time_s > step + tol:
        raise InternalError(f"step result: exposed communication {result.exposed_comm_time_s} s exceeds the step "
                            f"{step} s")
    if result.exposed_comm_time_s > result.comm_time_s + tol:
        raise InternalError(f"step result: exposed communication {result.exposed_comm_time_s} s exceeds all "
                            f"communication {result.comm_time_s} s")
    for part in result.breakdown:
        if part.time_s < -ABS_TOL_S:
            raise InternalError(f"step result: breakdown part {part.key} = {part.time_s} s is negative")
    parts = sum(part.time_s for part in result.breakdown)
    if abs(parts - step) > tol:
        listed = " + ".join(f"{p.key} {p.time_s}" for p in result.breakdown)
        raise InternalError(f"step result: breakdown {listed} = {parts} s, not the step {step} s")
    bounds = result.bounds
    if not bounds.perfect_overlap_s - tol <= step <= bounds.no_overlap_s + tol:
        raise InternalError(f"step result: step {step} s outside its bounds {bounds.perfect_overlap_s}.."
                            f"{bounds.no_overlap_s} s")
    for bucket in result.buckets:
        if not (0 <= bucket.start_s <= bucket.end_s and bucket.ready_s <= bucket.start_s + tol):
            raise InternalError(f"step result: bucket {bucket.index} runs {bucket.start_s}..{bucket.end_s} s, "
                                f"ready at {bucket.ready_s} s")


__all__ = ["MAX_MEMORY_BYTES", "MAX_STEP_TIME_S", "SIZE_CAUSE", "check_finite", "check_memory", "check_range",
           "check_step_result"]
