"""Pipeline-parallel schedules and their simpy execution.

Schedules give, for each pipeline rank, the order of its forward (F) and backward (B) operations on
(micro-batch, virtual stage) pairs:

* GPipe (Huang et al., NeurIPS 2019): all forwards, then all backwards.
* 1F1B (PipeDream-Flush; Narayanan et al., SC'21 section 2.2.1): ``p - rank - 1`` warm-up forwards,
  then one forward / one backward, then the remaining backwards. Bubble fraction (p - 1) / m.
* Interleaved 1F1B (Narayanan et al., SC'21 section 2.2.2), exactly as Megatron-LM's
  ``forward_backward_pipelining_with_interleaving`` orders it: each rank holds ``v`` model chunks
  (virtual stages ``rank + k p``); warm-up ``2 (p - rank - 1) + (v - 1) p`` forwards; micro-batches go in
  groups of ``p``. Bubble fraction (p - 1) / (v m). Where m = p, Megatron runs every forward first; torch's
  ``ScheduleInterleaved1F1B`` (torch.distributed.pipelining, ``ddp.implementation`` other than megatron) keeps
  the warm-up above: the one difference between the two orders. (torch's ``Schedule1F1B`` warms up p - rank
  forwards and then alternates backward and forward: the same order as 1F1B above.)

Execution (:mod:`simddp.sim.step`): each rank runs its operations in order; F of virtual stage ``vs`` waits
for F of ``vs - 1`` (plus the activation send/recv), B of ``vs`` for B of ``vs + 1`` (plus the gradient
send/recv). Events scale with micro-batches x virtual stages, never with bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, overload

from simddp.engine_caches import cached


class PipeOp(NamedTuple):
    """One forward or backward of one micro-batch through one virtual stage (a tuple: a 1T schedule has 65,536)."""

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


def interleaved_1f1b(num_stages: int, num_micro: int, rank: int, num_chunks: int,
                     all_warmup: bool = True) -> list[PipeOp]:
    """Megatron-LM's interleaved schedule (needs num_micro to be a multiple of num_stages); with ``all_warmup``
    false, torch.distributed.pipelining's ``ScheduleInterleaved1F1B`` (the same order, except that it has no
    all-forwards-first case where num_micro equals num_stages)."""
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

    if num_micro == p and all_warmup:  # Megatron: all forwards then all backwards when m == p
        warmup = total
    else:
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(op("F", warmup + k))
        ops.append(op("B", k))
    ops += [op("B", k) for k in range(total - warmup, total)]
    return ops


class Schedule(Sequence[PipeOp]):
    """One rank's operations under a schedule, each computed when read (equal to the list functions above).

    A 1T model on pp 64 with 512 micro-batches has 65,536 operations; the fast engine reads the warm-up, a few
    steady units and the drain (:mod:`simddp.sim.periodic`), so building them all would cost more than the run.
    Positions: ``warmup`` forwards, then ``total - warmup`` (forward, backward) pairs, then the remaining
    backwards; forward and backward ``k`` are the schedule's k-th of each kind.
    """

    def __init__(self, name: str, num_stages: int, num_micro: int, rank: int, num_chunks: int = 1,
                 all_warmup: bool = True) -> None:
        p, m, v = num_stages, num_micro, num_chunks
        self.name, self.rank, self.p, self.v = name, rank, p, v
        if name == "gpipe":
            self.total, self.warmup, self.interleaved = m, m, False
        elif name == "1f1b":
            self.total, self.warmup, self.interleaved = m, min(p - rank - 1, m), False
        elif name == "interleaved-1f1b":
            if m % p:
                raise ValueError(f"interleaved-1f1b needs micro-batches({m}) to be a multiple of pp({p})")
            total = m * v
            warmup = total if m == p and all_warmup else min((p - rank - 1) * 2 + (v - 1) * p, total)
            self.total, self.warmup, self.interleaved = total, warmup, True
        else:
            raise ValueError(f"unknown pipeline schedule {name!r}")
        self.length = 2 * self.total
        self._step, self._base = 2 * p * v, 2 * rank  # a 1F1B code: k-th forward k step + base, backward + 1

    def __len__(self) -> int:
        return self.length

    def op_at(self, i: int) -> PipeOp:
        """The operation at position ``0 <= i < len(self)`` (no slice or negative index: the engines' path)."""
        return decode(self.code_at(i), self.p * self.v)

    def code_at(self, i: int) -> int:
        """The operation at position ``i`` as one integer, :func:`op_code` (what the runner keys times by)."""
        w, total, b = self.warmup, self.total, 0
        if i < w:
            k = i
        elif i < 2 * total - w:
            j = i - w
            if j & 1:
                b, k = 1, j >> 1
            else:
                k = w + (j >> 1)
        else:
            b, k = 1, i - total
        p, v = self.p, self.v
        if not self.interleaved:
            return ((k * p * v + self.rank) << 1) | b
        c = (k % (p * v)) // p
        vs = (v - c - 1 if b else c) * p + self.rank
        return ((((k // (p * v)) * p + k % p) * p * v + vs) << 1) | b

    def backward_position(self, micro_batch: int, virtual_stage: int) -> int:
        """The position of the backward of ``micro_batch`` through ``virtual_stage`` (one of this rank's)."""
        p, v = self.p, self.v
        if self.interleaved:  # groups of p micro-batches, chunks in reverse order within a group
            k = (micro_batch // p) * p * v + (v - 1 - virtual_stage // p) * p + micro_batch % p
        else:
            k = micro_batch
        w, total = self.warmup, self.total
        return w + 2 * k + 1 if k < total - w else total + k

    def codes(self, start: int, stop: int) -> list[int]:
        """:meth:`code_at` of positions ``start`` to ``stop``, built phase by phase (the warm-up forwards, the
        alternating pairs, the drain's backwards), each phase's forwards and backwards in one list each."""
        w, total = self.warmup, self.total
        pairs_end = 2 * total - w
        if stop - start == 1:  # one operation (a 1F1B drain's cut: one per rank)
            return [self.code_at(start)]
        if stop - start == 2 and w <= start and stop <= pairs_end and not self.interleaved:
            # One pair of 1F1B (what the runner reads at each cut of each rank, 64 ranks for a 1T pipeline):
            # forward w + j/2 at even j = i - w, backward j // 2 at odd j, as code_at has them, without calls.
            j = start - w
            half, step, base = j >> 1, self._step, self._base
            if j & 1:
                return [half * step + base + 1, (w + half + 1) * step + base]
            return [(w + half) * step + base, half * step + base + 1]
        out = self._kth(0, range(start, stop if stop < w else w)) if start < w else []  # warm-up forward k = i
        lo, hi = max(start, w), min(stop, pairs_end)
        if lo < hi:  # forward w + j/2 at even j = i - w, backward j // 2 at odd j
            j0, n = lo - w, hi - lo
            first = j0 & 1  # where the first forward is among the pairs
            if n <= 2:  # a frontier's last pair, or one operation: no lists to interleave
                out += [self.code_at(i) for i in range(lo, hi)]
            else:
                pairs = [0] * n
                forwards = (n - first + 1) >> 1
                k_f, k_b = w + ((j0 + first) >> 1), (j0 + 1 - first) >> 1
                pairs[first::2] = self._kth(0, range(k_f, k_f + forwards))
                pairs[1 - first::2] = self._kth(1, range(k_b, k_b + n - forwards))
                out += pairs
        if stop > pairs_end:
            out += self._kth(1, range(max(start, pairs_end) - total, stop - total))  # drain backward k = i - total
        return out

    def _kth(self, b: int, ks: range) -> list[int]:
        """Codes of the ``k``-th forwards (``b`` 0) or backwards (``b`` 1) for ``k`` in ``ks``: interleaved, the
        ``k``-th runs micro-batch ``(k // pv) p + k % p`` through chunk ``c = (k % pv) // p`` (backwards take the
        chunks in reverse order); else micro-batch ``k``."""
        p, v = self.p, self.v
        pv, base = p * v, 2 * self.rank + b
        if not self.interleaved:  # an arithmetic progression (``ks`` steps by 1)
            return list(range(2 * pv * ks.start + base, 2 * pv * ks.stop + base, 2 * pv))
        # Periodic in k with period pv: k + pv runs the same chunk on micro-batch + p, whose code is 2 p pv more.
        # So the k-th code is the (k mod pv)-th of rank 0's first pv (_group_codes) plus 2 p pv per period and
        # base: one addition per code (building each from k, or a range per p codes, cost 3-5x as much).
        table, group = _group_codes(p, v)[b], 2 * p * pv
        out: list[int] = []
        k, stop = ks.start, ks.stop
        while k < stop:
            q, at = divmod(k, pv)
            end = min(stop, k - at + pv)
            off = q * group + base
            out += [t + off for t in table[at:at + end - k]]
            k = end
        return out

    def last_backwards(self) -> dict[int, int]:
        """:func:`last_backward` of this schedule, in closed form: each of its virtual stages' last backward is
        that of the last micro-batch (every schedule here runs a chunk's micro-batches in order)."""
        m = self.total // self.v
        return {c * self.p + self.rank: self.backward_position(m - 1, c * self.p + self.rank)
                for c in range(self.v)}  # in the order the search from the end finds them

    @overload
    def __getitem__(self, i: int) -> PipeOp: ...

    @overload
    def __getitem__(self, i: slice) -> list[PipeOp]: ...

    def __getitem__(self, i: int | slice) -> PipeOp | list[PipeOp]:
        if isinstance(i, slice):
            return [self.op_at(j) for j in range(*i.indices(self.length))]
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(i)
        return self.op_at(i)


def schedule(name: str, num_stages: int, num_micro: int, rank: int, num_chunks: int = 1,
             all_warmup: bool = True) -> Schedule:
    """The operation order of ``rank`` under schedule ``name`` (``all_warmup``: see :func:`interleaved_1f1b`)."""
    return Schedule(name, num_stages, num_micro, rank, num_chunks, all_warmup)


def op_code(op: PipeOp, num_virtual_stages: int) -> int:
    """``op`` as one integer: ``2 (micro_batch V + virtual_stage) + (1 if backward)``, V virtual stages. Its
    dependency is the code 2 below (a forward's) or above (a backward's), and ``code % 2V`` its *slot*
    ``2 virtual_stage + (1 if backward)``, which fixes its duration on its rank."""
    return ((op.micro_batch * num_virtual_stages + op.virtual_stage) << 1) | (op.kind == "B")


@cached(maxsize=256)
def _group_codes(p: int, v: int) -> tuple[list[int], list[int]]:
    """The codes of rank 0's first ``p v`` forwards and backwards under interleaved 1F1B (:meth:`Schedule._kth`
    with base 0): the k-th runs micro-batch ``k mod p`` through chunk ``k // p`` (backwards: in reverse order).
    Read only: every rank's schedule shares them."""
    pv = p * v
    return ([((k % p) * pv + (k // p) * p) << 1 for k in range(pv)],
            [((k % p) * pv + (v - 1 - k // p) * p) << 1 for k in range(pv)])


def op_codes(ops: Sequence[PipeOp], start: int, stop: int, num_virtual_stages: int) -> list[int]:
    """:func:`op_code` of ``ops[start:stop]``: a :class:`Schedule` builds them without its operations."""
    if isinstance(ops, Schedule):
        return ops.codes(start, stop)
    return [op_code(ops[i], num_virtual_stages) for i in range(start, stop)]


def decode(code: int, num_virtual_stages: int) -> PipeOp:
    """The operation of :func:`op_code` ``code``."""
    q = code >> 1
    return PipeOp("B" if code & 1 else "F", q // num_virtual_stages, q % num_virtual_stages)


def dependency(op: PipeOp, num_virtual_stages: int) -> tuple[str, int, int] | None:
    """The operation ``op`` waits for: F of the previous virtual stage, B of the next one (same micro-batch)."""
    if op.kind == "F" and op.virtual_stage > 0:
        return ("F", op.micro_batch, op.virtual_stage - 1)
    if op.kind == "B" and op.virtual_stage < num_virtual_stages - 1:
        return ("B", op.micro_batch, op.virtual_stage + 1)
    return None


def makespan(ops: Sequence[Sequence[PipeOp]], num_virtual_stages: int, duration: Callable[[int, PipeOp], float],
             transfer: Callable[[PipeOp], float]) -> list[float]:
    """End time of each rank's schedule when operations take ``duration(rank, op)`` and a dependency arrives
    ``transfer(op)`` after it ends (the max-plus recurrence of the schedule; no other resource)."""
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * len(ops)
    clock = [0.0] * len(ops)
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for r, rank_ops in enumerate(ops):
            while pos[r] < len(rank_ops):
                op = rank_ops[pos[r]]
                dep = dependency(op, num_virtual_stages)
                if dep is not None and dep not in done:
                    break
                start = clock[r] if dep is None else max(clock[r], done[dep] + transfer(op))
                clock[r] = start + duration(r, op)
                done[(op.kind, op.micro_batch, op.virtual_stage)] = clock[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("pipeline schedule deadlocks")  # a schedule bug, not user input
    return clock


def last_backward(ops: Sequence[PipeOp], num_chunks: int | None = None) -> dict[int, int]:
    """Position of the last backward of each virtual stage in a rank's operations (gradients ready).

    Searched from the end; with ``num_chunks`` (the virtual stages a rank holds) it stops once all are found.
    A :class:`Schedule` answers in closed form (:meth:`Schedule.last_backwards`).
    """
    if isinstance(ops, Schedule) and num_chunks == ops.v and ops.total:
        return ops.last_backwards()
    last: dict[int, int] = {}
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.kind == "B" and op.virtual_stage not in last:
            last[op.virtual_stage] = i
            if len(last) == num_chunks:
                break
    return last
