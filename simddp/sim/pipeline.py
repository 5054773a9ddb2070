"""Pipeline-parallel schedules and their simpy execution.

Schedules give, for each pipeline rank, the order of its forward (F) and backward (B) operations on
(micro-batch, virtual stage) pairs:

* GPipe (Huang et al., NeurIPS 2019): all forwards, then all backwards.
* 1F1B (PipeDream-Flush; Narayanan et al., SC'21 section 2.2.1): ``p - rank - 1`` warm-up forwards,
  then one forward / one backward, then the remaining backwards. Bubble fraction (p - 1) / m.
* Interleaved 1F1B (Narayanan et al., SC'21 section 2.2.2), exactly as Megatron-LM's
  ``forward_backward_pipelining_with_interleaving`` orders it: each rank holds ``v`` model chunks
  (virtual stages ``rank + k p``); warm-up ``2 (p - rank - 1) + (v - 1) p`` forwards; micro-batches go in
  groups of ``p``. Bubble fraction (p - 1) / (v m).

Execution: each rank runs its operations in order; F of virtual stage ``vs`` waits for F of ``vs - 1``
(plus the activation send/recv time), B of ``vs`` for B of ``vs + 1`` (plus the gradient send/recv).
Events scale with micro-batches x virtual stages, never with bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from simddp.results import Span


@dataclass(frozen=True)
class PipeOp:
    """One forward or backward of one micro-batch through one virtual stage."""

    kind: str  # "F" or "B"
    micro_batch: int
    virtual_stage: int


def gpipe(num_stages: int, num_micro: int, rank: int) -> list[PipeOp]:
    return [PipeOp("F", i, rank) for i in range(num_micro)] + [
        PipeOp("B", i, rank) for i in range(num_micro)
    ]


def one_f_one_b(num_stages: int, num_micro: int, rank: int) -> list[PipeOp]:
    warmup = min(num_stages - rank - 1, num_micro)
    ops = [PipeOp("F", i, rank) for i in range(warmup)]
    for i in range(num_micro - warmup):
        ops.append(PipeOp("F", warmup + i, rank))
        ops.append(PipeOp("B", i, rank))
    ops += [PipeOp("B", i, rank) for i in range(num_micro - warmup, num_micro)]
    return ops


def interleaved_1f1b(num_stages: int, num_micro: int, rank: int, num_chunks: int) -> list[PipeOp]:
    """Megatron-LM's interleaved schedule (needs num_micro to be a multiple of num_stages)."""
    p, v = num_stages, num_chunks
    if num_micro % p:
        raise ValueError(f"interleaved-1f1b needs micro-batches({num_micro}) to be a multiple of pp({p})")
    total = num_micro * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - c - 1

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def op(kind: str, k: int) -> PipeOp:
        return PipeOp(kind, micro(k), chunk(k, kind == "F") * p + rank)

    if num_micro == p:  # Megatron: all forwards then all backwards when m == p
        warmup = total
    else:
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(op("F", warmup + k))
        ops.append(op("B", k))
    ops += [op("B", k) for k in range(total - warmup, total)]
    return ops


def schedule(name: str, num_stages: int, num_micro: int, rank: int, num_chunks: int = 1) -> list[PipeOp]:
    """The operation order of ``rank`` under schedule ``name``."""
    if name == "gpipe":
        return gpipe(num_stages, num_micro, rank)
    if name == "1f1b":
        return one_f_one_b(num_stages, num_micro, rank)
    if name == "interleaved-1f1b":
        return interleaved_1f1b(num_stages, num_micro, rank, num_chunks)
    raise ValueError(f"unknown pipeline schedule {name!r}")


@dataclass
class PipelineClock:
    """Completion events and times of every operation, shared by the rank processes."""

    env: simpy.Environment
    done: dict[tuple[str, int, int], simpy.Event]
    done_at: dict[tuple[str, int, int], float]

    @classmethod
    def create(cls, env: simpy.Environment) -> PipelineClock:
        return cls(env, {}, {})

    def event(self, key: tuple[str, int, int]) -> simpy.Event:
        if key not in self.done:
            self.done[key] = self.env.event()
        return self.done[key]

    def finish(self, key: tuple[str, int, int]) -> None:
        self.done_at[key] = self.env.now
        self.event(key).succeed()


def pipeline_rank(
    env: simpy.Environment,
    rank: int,
    ops: list[PipeOp],
    num_virtual_stages: int,
    clock: PipelineClock,
    run_op: Callable[[PipeOp, bool], simpy.events.ProcessGenerator],
    p2p_s: Callable[[PipeOp], float],
    spans: list[Span],
) -> simpy.events.ProcessGenerator:
    """Run ``ops`` in order on one pipeline rank, waiting for each operation's upstream dependency.

    ``run_op(op, last)`` yields the operation's own timeouts; ``last`` is true for the final backward of
    each virtual stage on this rank (when its gradients become ready for data-parallel reduction).
    """
    last_b = {}
    for i, op in enumerate(ops):
        if op.kind == "B":
            last_b[op.virtual_stage] = i
    for i, op in enumerate(ops):
        if op.kind == "F" and op.virtual_stage > 0:
            dep = ("F", op.micro_batch, op.virtual_stage - 1)
        elif op.kind == "B" and op.virtual_stage < num_virtual_stages - 1:
            dep = ("B", op.micro_batch, op.virtual_stage + 1)
        else:
            dep = None
        if dep is not None:
            yield clock.event(dep)
            arrive = clock.done_at[dep] + p2p_s(op)
            if arrive > env.now:
                yield env.timeout(arrive - env.now)
        start = env.now
        yield from run_op(op, last_b.get(op.virtual_stage) == i)
        clock.finish((op.kind, op.micro_batch, op.virtual_stage))
        spans.append(
            Span(
                name=f"{op.kind}{op.micro_batch}" + (f" vs{op.virtual_stage}" if num_virtual_stages > 1 else ""),
                stream=f"compute {rank}",
                start_s=start,
                end_s=env.now,
                args={"micro_batch": op.micro_batch, "virtual_stage": op.virtual_stage},
            )
        )
