"""Pipeline schedules run as max-plus recurrences, with the steady state extended exactly.

A pipeline schedule with deterministic operation times is a max-plus linear system: an operation starts when
its rank is free and its dependency (the previous virtual stage's forward, the next one's backward) has
arrived. After a transient its 1F1B steady state becomes periodic: one *unit* later (1 pair of forward and
backward per rank for 1F1B, ``p v`` pairs for interleaved 1F1B, shifting micro-batches by 1 or ``p``) every
time is the same plus a constant (Cohen et al., "A linear-system-theoretic view of discrete-event processes
...", 1985; Baccelli et al., *Synchronization and Linearity*, 1992, ch. 3).

:class:`ScheduleRun` runs the recurrence rank by rank (a rank runs until it needs an arrival that is not
there yet, and the rank that produces it wakes it), and at each *cut* compares the state with the cuts one
to :data:`MAX_CYCLE` units before. A cut is a set of positions, one per rank, closed under
dependencies (nothing before it needs anything after it). Everything after a cut depends on what is before it
only through each rank's clock and the last forward and backward it ran (its *frontier*); :func:`steady`'s
offsets make that so for 1F1B and interleaved 1F1B. When the frontier and clocks at cut ``J + c P`` are those
at cut ``J`` plus one constant ``Δ``, the remaining steady units repeat them exactly (max-plus operations
commute with adding a constant), so the run jumps ``N`` cycles ahead: clocks and frontier plus ``N Δ``, the
waits plus ``N`` times their increment over the cycle. The transient, the compared cuts and the drain are
run operation by operation. Evaluation cost then depends on the number of stages, not of micro-batches;
``tests/test_periodic.py`` checks the extension against the plain recurrence on random schedules and the
fast engine against the simpy simulation of every micro-batch.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import sub
from typing import cast

from simddp.sim.pipeline import PipeOp, Schedule, last_backward, op_codes

#: Cycle lengths (in units) tried when comparing cuts; max-plus systems can be periodic with cyclicity > 1.
MAX_CYCLE = 3
#: Cuts per unit that :meth:`ScheduleRun._extend` compares (an interleaved unit is ``p v`` pairs).
CUTS_PER_UNIT = 2
#: Relative tolerance of "the same state plus a constant" (float rounding of sums of times, not modelling).
_REL_TOL = 1e-12

#: What :meth:`ScheduleRun.advance` holds for a rank with no work (never read).
_NO_CODES: list[int] = []
_NO_FIXED: tuple[list[int], int, int] = ([], 0, 0)
_NO_STATE: tuple[int, int, float, float, float, float, int] = (-1, 0, 0.0, 0.0, 0.0, 0.0, 0)


#: Op codes up to which :class:`ScheduleRun` keeps its arrivals in a list (8 bytes each), not a dict.
_LIST_CODES = 1 << 16

#: An operation's arrival (end) in each of the three recurrences.
Arrival = tuple[float, float, float]


def _code_space(ops: Sequence[Sequence[PipeOp]], num_vs: int) -> int:
    """One more than the largest :func:`simddp.sim.pipeline.op_code` of ``ops`` (a schedule's: ``2 V m``)."""
    size = 0
    for o in ops:
        if isinstance(o, Schedule):
            size = max(size, 2 * num_vs * (o.total // o.v))
        elif o:
            size = max(size, 1 + max(op_codes(o, 0, len(o), num_virtual_stages=num_vs)))
    return size


class TooManyOperations(Exception):
    """More operations would run one by one than the caller allows (no repeating steady state was found)."""


@dataclass(frozen=True)
class Steady:
    """Where each rank's steady 1F1B pairs are, and how the schedule repeats."""

    start: list[int]  # position of the first steady pair (the warm-up forwards before it)
    pairs: list[int]  # number of steady (forward, backward) pairs
    offset: list[int]  # a cut at unit index J puts rank r after J unit + offset[r] + phase pairs (closed)
    limit: list[int]  # a jump may not pass this position (the first last-backward: it releases gradients)
    unit: int  # pairs per period of the schedule
    shift: int  # micro-batches one unit moves
    # Units rank r's jump may go past the common one when the state repeats every unit (1F1B: r; see _moves).
    stagger: list[int]

    @functools.cached_property
    def phase(self) -> int:
        """Pairs every cut is moved by (``0 <= phase < unit``), so that the last cut lands where the rank with
        the least room (:meth:`room`, past its offset) ends its steady pairs, not up to a unit before.

        A cut moved by the same number of pairs on every rank is still closed under dependencies (the
        conditions between neighbouring ranks' pair counts are differences), and cuts a unit apart still
        compare. Without it an interleaved schedule would run up to a unit less one pair per rank one by one
        after the jump (GPT-3 tp8 pp8 v3: 18 of its 24 pairs); with it the cut at 0 units is inside the steady
        pairs too, so the repeat is found a unit earlier where the steady state has set in by then."""
        low = min(map(sub, self.rooms, self.offset))
        return low % self.unit if low > 0 else 0

    @functools.cached_property
    def max_units(self) -> int:
        """The last cut (in units) inside every rank's steady pairs and before its limit."""
        return (min(map(sub, self.rooms, self.offset)) - self.phase) // self.unit

    @functools.cached_property
    def rooms(self) -> list[int]:
        """How many steady pairs each rank may run before a jump's target: all, or up to its limit."""
        return [min(n, (lim - s) // 2) for n, lim, s in zip(self.pairs, self.limit, self.start, strict=True)]


def steady(ops: Sequence[Sequence[PipeOp]], last: Sequence[dict[int, int]] | None = None) -> Steady | None:
    """The steady structure of the ranks' schedules ``ops``, or None where they have none to extend (GPipe,
    interleaving with as many micro-batches as stages, operation lists that are not a :class:`Schedule`).

    1F1B: rank r runs ``w_r = p - r - 1`` warm-up forwards, then pairs (F w_r + j, B j); a forward's input
    is the previous rank's forward of the same index, a backward's gradient the next rank's backward of the
    same index, so cutting every rank after ``J`` pairs is closed (``w_{r-1} >= w_r``). Interleaved 1F1B:
    ``w_r = 2 (p - r - 1) + (v - 1) p`` forwards, then pairs of the k-th forward and backward, where forward
    index k + p v is index k's (chunk, micro-batch + p); rank 0's input comes from rank p - 1's forward
    k - p and rank p - 1's gradient from rank 0's backward k - p, so the cut of rank r goes after ``J + r``
    pairs. Either way the first operation after a cut needs at most the last forward and backward of a
    neighbour (see the module docstring). The warm-up counts are the schedules' own. ``last``: each rank's
    :func:`simddp.sim.pipeline.last_backward`, where the caller has them.
    """
    schedules = [o for o in ops if isinstance(o, Schedule)]
    if not schedules or len(schedules) != len(ops):
        return None
    first = schedules[0]
    p, v = len(schedules), first.v
    if first.name == "1f1b":
        unit, shift, offset = 1, 1, [0] * p  # aligned cuts are closed already
        stagger = list(range(p))
    elif first.name == "interleaved-1f1b" and first.total > p * v:  # more micro-batches than stages
        unit, shift, offset = p * v, p, list(range(p))
        stagger = [0] * p
    else:
        return None
    warm = [o.warmup for o in schedules]
    pairs = [o.total - o.warmup for o in schedules]
    if last is None:  # each rank's last_backward (the caller's, where it has them)
        last = [last_backward(o, v) for o in schedules]
    limit = [min(lb.values(), default=len(o)) for lb, o in zip(last, schedules, strict=True)]
    return Steady(start=warm, pairs=pairs, offset=offset, limit=limit, unit=unit, shift=shift,
                  stagger=stagger)


@dataclass
class Linear:
    """A recurrence whose operations take per-(rank, slot) constants: what the runner evaluates inline, with no
    call per operation (the fast engine's step and the bounds' schedules are of this form).

    An operation of rank r in slot s (:func:`simddp.sim.pipeline.op_code`) that has a dependency starts at
    ``max(clock, arrival + pre[r][s])``, else at its rank's clock; then ``mid[r][s]`` is added (operations
    with a dependency only), the first recurrence's time is kept in :attr:`ScheduleRun.started` where its
    ``watch[r]`` holds the position, and ``hold[r][s]``, ``tail[r][s]`` and ``extra[r][position]`` are added,
    in that order. Where neither ``watch`` nor ``extra`` applies (all but a few operations) the runner adds
    ``mid + hold + tail`` summed once per slot:
    one addition per operation instead of three, at the cost of float rounding (about 1e-16 relative per
    operation, where the engines book the three apart; the tests compare at 1e-9). A slot's lists run over
    ``2 V`` slots, V virtual stages. A slot is one rank's and a rank reads only its own, so ranks may share
    one list (each rank's values at its slots).
    """

    pre: list[list[float]]
    mid: list[list[float]]
    hold: list[list[float]]
    tail: list[list[float]]
    extra: list[dict[int, float]]
    watch: list[Collection[int]] | None = None


class ScheduleRun:
    """Greedy max-plus runs of per-rank operation lists, optionally extended over their periodic steady state.

    Each of ``steps`` (one to three :class:`Linear` recurrences, evaluated inline) is one recurrence over the
    same operations (the fast engine's step and the two bounds of :func:`simddp.sim.step._pipeline_ends`):
    which operations can run depends only on the dependency graph, never on the times, so one traversal
    evaluates them all. The runner keeps the first recurrence's waits per rank (``waits``: how long each rank's
    operations waited for their dependency), which a jump advances by their increment over the cycle. After
    :meth:`run`, ``clocks[k][r]`` is rank r's last arrival in recurrence k.
    """

    def __init__(self, ops: Sequence[Sequence[PipeOp]], num_virtual_stages: int, steps: Sequence[Linear],
                 max_operations: int | None = None) -> None:
        if not 1 <= len(steps) <= 3:
            raise TypeError("one to three Linear recurrences")
        self.ops = ops
        self.max_operations = max_operations  # run() raises TooManyOperations rather than run more one by one
        self.ran = 0
        self.num_vs = num_virtual_stages
        self.count = len(steps)
        self.recurrences = list(steps) + [steps[-1]] * (3 - len(steps))  # the inline loop runs three
        self.waits = [0.0] * len(ops)
        self.pos = [0] * len(ops)
        self.clocks = [[0.0] * len(ops) for _ in range(3)]
        # Op code -> its arrival in each recurrence (None: not yet; while :meth:`advance` runs, an int: the rank
        # that waits for it, which the operation's end wakes). A list indexed by code where the codes are few
        # (2 V m: GPT-3 tp8 pp8 v3 3,072, a 1T pipeline 65,536): the inner loop's read and write are then a list's
        # (2.6% of GPT-3's evaluation against a dict's get and set). Where more, a dict that answers None for a
        # code not there, so that the store stays within the operations run, whatever the micro-batches.
        size = _code_space(ops, num_virtual_stages)
        # Typed as read outside the inner loop, which alone meets a code not there yet (or its waiting rank):
        # a cut is closed under dependencies, so no rank waits once advance() returns.
        self.arrival = cast(list[Arrival] | defaultdict[int, Arrival],
                            [None] * size if size <= _LIST_CODES else defaultdict(type(None)))
        # Per slot, where its operation's dependency is: a forward's the code 2 below, a backward's 2 above;
        # the first forward and the last backward have none (0).
        two = 2 * num_virtual_stages
        self._delta = [(-2 if s % 2 == 0 else 2) for s in range(two)]
        self._delta[0] = self._delta[two - 1] = 0
        # Once per run, not at each resume: the per-slot constants, their parts (for the special operations) and
        # each rank's special positions. Every rank reads the same rows, each at its own slots only.
        self._consts, self._parts, self._specials = self._slot_consts()
        #: (rank, position) -> the start (after ``mid``) in the first recurrence of each operation its ``watch``
        #: holds (and of each with an ``extra``).
        self.started: dict[tuple[int, int], float] = {}
        # Whether any operation waits longer than its dependency's arrival (the bounds' late sends): where none
        # does (most steps: pp_p2p_overlap is off), the loop adds no pre constant.
        self._pre = any(map(any, self._consts[:3]))
        self.jumped_units = 0  # for tests and benchmarks: how much of the steady state was extended
        self.shifted = 0  # for tests and benchmarks: warm-up and drain operations timed as a twin rank's, shifted
        self.detected_at: tuple[int, int] | None = None  # (units run, cycle) when the repeat was found
        self._pairs: dict[tuple[int, int], list[int]] = {}  # (rank, position) -> the two codes before it
        #: Per rank, codes made ahead of what ran (advance's ``ahead``): (the position of the first, the codes).
        self._window: list[tuple[int, list[int]]] = [(0, _NO_CODES)] * len(ops)
        self._windowed = False  # whether any is kept (until a jump moves every rank past them)
        # Each rank's op_codes(ops, start, stop), bound once: a Schedule's own method, without the dispatch.
        self._code_fns: list[Callable[[int, int], list[int]]] = [
            o.codes if isinstance(o, Schedule)
            else functools.partial(op_codes, o, num_virtual_stages=num_virtual_stages) for o in ops]

    @property
    def clock(self) -> list[float]:
        """Each rank's last arrival in the first recurrence."""
        return self.clocks[0]

    def run(self, shape: Steady | None, cut: Sequence[int] | None = None,
            at_cut: Callable[[], None] | None = None) -> None:
        """Run every operation (extending the steady state of ``shape``). With ``cut`` (a position per rank,
        closed under dependencies and not before the jump's limit), ``at_cut`` is called once every rank
        reached it, before the rest runs."""
        if shape is not None:
            self._extend(shape)
            if shape.unit == 1 and self.num_vs == len(self.ops):
                self._shift_drains(shape.start)
        left = sum(len(o) - p for o, p in zip(self.ops, self.pos, strict=True))
        if self.max_operations is not None and self.ran + left > self.max_operations:
            raise TooManyOperations(f"{self.ran + left:,} operations, over {self.max_operations:,}")
        if cut is not None:
            self.advance(cut)
            if at_cut is not None:
                at_cut()
        self.advance([len(o) for o in self.ops])
        del self.clocks[self.count:]

    def _codes(self, r: int, start: int, stop: int) -> list[int]:
        return self._code_fns[r](start, stop)

    def _last_pair(self, r: int, cut: int) -> list[int]:
        """The codes of rank ``r``'s two operations before position ``cut``: the end of what :meth:`advance`
        last read when it stopped there (the repeat detection and the jump look at each cut it runs to)."""
        pair = self._pairs.get((r, cut))
        return pair if pair is not None else self._codes(r, cut - 2, cut)

    def advance(self, limits: Sequence[int], ahead: Sequence[int] | None = None) -> None:
        """Run every rank up to position ``limits[r]`` (a cut closed under dependencies, or the end).

        A rank runs until it needs an arrival that is not there yet; it then waits on that operation, and
        the rank that completes it wakes it up, so every operation is read about once. With ``ahead`` (a
        position per rank, at or past its limit), each rank's codes are made up to there and kept, so that
        the next advances up to it read theirs as a slice: one call per rank for the cuts
        :meth:`_extend` runs to within a unit (making codes costs most per call: an interleaved rank's 24 take
        7.9 us on the 2-core host, its 114 from the start 11.9 us).
        """
        pos, fns, pairs = self.pos, self._code_fns, self._pairs
        active: list[int] = []  # ranks with work
        codes: list[list[int]] = [_NO_CODES] * len(pos)  # codes[r][k]: the operation at pos[r] + k
        windowed = ahead is not None or self._windowed
        for r, lim in enumerate(limits):
            base = pos[r]
            if base < lim:
                rc = codes[r] = self._window_codes(r, base, lim, ahead) if windowed else fns[r](base, lim)
                if len(rc) >= 2:  # the two codes before the limit (a 1F1B cut reads exactly those: no copy)
                    pairs[(r, lim)] = rc if len(rc) == 2 else rc[-2:]
                active.append(r)
        self._advance_linear(limits, active, codes)
        if any(p < lim for p, lim in zip(pos, limits, strict=True)):
            raise RuntimeError("pipeline schedule deadlocks")  # a schedule bug, not user input

    def _window_codes(self, r: int, base: int, lim: int, ahead: Sequence[int] | None) -> list[int]:
        """Rank ``r``'s codes from ``base`` to ``lim``: a slice of those kept where they cover them, else made
        (up to ``ahead[r]`` where that is further, and kept)."""
        lo, kept = self._window[r]
        if lo <= base and lim - lo <= len(kept):
            return kept[base - lo:lim - lo]
        if ahead is not None and ahead[r] > lim:
            kept = self._code_fns[r](base, ahead[r])
            self._window[r] = (base, kept)
            self._windowed = True
            return kept[:lim - base]
        return self._code_fns[r](base, lim)

    def _advance_linear(self, limits: Sequence[int], active: list[int], codes: list[list[int]]) -> None:
        arrival, delta = self.arrival, self._delta
        pre0, pre1, pre2, post0, post1, post2 = self._consts
        two = 2 * self.num_vs
        pre = self._pre
        ready = deque(active)
        specials, started = self._specials, self.started
        mid0, hold0, tail0, mid1, hold1, tail1, mid2, hold2, tail2 = self._parts
        extra0, extra1, extra2 = (s.extra for s in self.recurrences)
        c0, c1, c2 = self.clocks
        waits, pos = self.waits, self.pos
        # Per rank, what each of its resumes reads: what stays (its codes from its base on, where to stop in
        # them, its base), and its state, which each resume writes back: its next special position (an ``extra``
        # or a ``watch``) as an index in its codes (-1: none before the limit) and where that is in its
        # specials, three clocks, its waits and its index in its codes. The per-slot constants are every rank's
        # rows.
        fixed: list[tuple[list[int], int, int]] = [_NO_FIXED] * len(pos)
        state: list[tuple[int, int, float, float, float, float, int]] = [_NO_STATE] * len(pos)
        for r in active:
            base, lim, sp = pos[r], limits[r], specials[r]
            # A rank's specials ascend: where the first at or after its base is at or past its limit (most
            # resumes), none is in range.
            at = bisect_left(sp, base) if sp else 0
            fixed[r] = (codes[r], lim - base, base)
            state[r] = (sp[at] - base if at < len(sp) and sp[at] < lim else -1, at, c0[r], c1[r], c2[r], waits[r], 0)
        # Every rank once in order, then the woken ranks, last woken first. In a drain, the rank that has just
        # run all its backwards wakes the one below it, which then finds every backward it waits for and runs
        # its own at once; first in, first out, the ranks would take turns one operation each.
        first_pass = len(active)
        while ready:
            if first_pass:
                first_pass -= 1
                r = ready.popleft()
            else:
                r = ready.pop()
            rc, stop, base = fixed[r]
            nxt, at, t0, t1, t2, w, first = state[r]
            j = first
            for j in range(first, stop):  # j: where the rank stops
                code = rc[j]
                slot = code % two
                d = delta[slot]
                if d:
                    got = arrival[code + d]
                    if got is None:  # not there yet: the rank's number marks it waits (an int, not an arrival)
                        arrival[code + d] = r  # type: ignore[call-overload]
                        break
                    a0, a1, a2 = got
                    if pre:
                        a0 += pre0[slot]
                        a1 += pre1[slot]
                        a2 += pre2[slot]
                    if a0 > t0:
                        w += a0 - t0
                        t0 = a0
                    if a1 > t1:
                        t1 = a1
                    if a2 > t2:
                        t2 = a2
                if j == nxt:  # an operation where a watch or an extra applies: the recurrences' terms one by one
                    if d:
                        t0 += mid0[slot]
                        t1 += mid1[slot]
                        t2 += mid2[slot]
                    i = base + j
                    started[(r, i)] = t0
                    t0 = t0 + hold0[slot] + tail0[slot] + extra0[r].get(i, 0.0)
                    t1 = t1 + hold1[slot] + tail1[slot] + extra1[r].get(i, 0.0)
                    t2 = t2 + hold2[slot] + tail2[slot] + extra2[r].get(i, 0.0)
                    sp = specials[r]
                    at += 1
                    nxt = sp[at] - base if at < len(sp) and sp[at] < base + stop else -1
                else:
                    t0 += post0[slot]
                    t1 += post1[slot]
                    t2 += post2[slot]
                waiter = arrival[code]  # None, or the number of the rank that waits for this operation
                arrival[code] = (t0, t1, t2)
                if waiter is not None:
                    ready.append(waiter)  # type: ignore[arg-type]  # a rank's number (the store is typed as read)
            else:
                j = stop
            state[r] = (nxt, at, t0, t1, t2, w, j)
        for r in active:
            _, _, c0[r], c1[r], c2[r], waits[r], j = state[r]
            pos[r] += j
            self.ran += j

    def _slot_consts(self) -> tuple[tuple[list[float], ...], tuple[list[float], ...], list[list[int]]]:
        """The per-slot constants of the three recurrences (their ``pre``, then what each adds after an
        operation's start), their parts (``mid``, ``hold``, ``tail`` of each recurrence, which a special operation
        adds one by one) and each rank's special positions, ascending (where an ``extra`` or a ``watch``
        applies): read once per run, not each time a rank resumes. An operation that is not special adds one
        constant per recurrence after its start: ``mid + hold + tail`` where it has a dependency, else ``hold +
        tail``.

        A slot (a virtual stage's forward or backward) is one rank's: each row holds, at every slot, the
        constant of the rank that runs it, so all ranks share the rows (a 1T pipeline's 64 ranks would
        otherwise make 384 rows of 128 slots each).
        """
        two, delta = 2 * self.num_vs, self._delta
        recurrences = self.recurrences
        watch = recurrences[0].watch
        if all(len(set(map(id, rows))) == 1 for s in recurrences for rows in (s.pre, s.mid, s.hold, s.tail)):
            # Every rank holds the same four rows of each recurrence (the fast engine's and the bounds' steps do):
            # they are the shared rows, slot by slot.
            before = [list(s.pre[0]) for s in recurrences]
            after = [[(m if d else 0.0) + h + t for m, d, h, t in zip(s.mid[0], delta, s.hold[0], s.tail[0],
                                                                       strict=True)] for s in recurrences]
            parts = tuple(row for s in recurrences for row in (s.mid[0], s.hold[0], s.tail[0]))
            s1, s2 = recurrences[1], recurrences[2]
            specials = [sorted({*s0_extra, *s1.extra[r], *s2.extra[r], *(watch[r] if watch is not None else ())})
                        for r, s0_extra in enumerate(recurrences[0].extra)]
            return (*before, *after), parts, specials
        rows = [[0.0] * two for _ in range(15)]
        specials = []
        for r, ops in enumerate(self.ops):
            # The rank's own slots: virtual stages r, r + p, ... of a Schedule; those of its operations otherwise.
            stages = (range(ops.rank, two >> 1, ops.p) if isinstance(ops, Schedule)
                      else {op.virtual_stage for op in ops})
            slots = [k for vs in stages for k in (2 * vs, 2 * vs + 1)]
            special: set[int] = set()
            for n, s in enumerate(self.recurrences):
                special.update(s.extra[r])
                pre, mid, hold, tail = s.pre[r], s.mid[r], s.hold[r], s.tail[r]
                pres, posts, mids, holds, tails = rows[n], rows[3 + n], *rows[6 + 3 * n:9 + 3 * n]
                for k in slots:
                    pres[k] = pre[k]
                    posts[k] = (mid[k] if delta[k] else 0.0) + hold[k] + tail[k]
                    mids[k], holds[k], tails[k] = mid[k], hold[k], tail[k]
            if watch is not None:
                special.update(watch[r])
            specials.append(sorted(special))
        return tuple(rows[:6]), tuple(rows[6:]), specials

    def _cut(self, shape: Steady, pairs: int) -> list[int]:
        """Each rank's position after ``pairs`` steady pairs past its offset."""
        return [s + 2 * (pairs + o) for s, o in zip(shape.start, shape.offset, strict=True)]

    def _frontier(self, cut: list[int]) -> list[int]:
        """The codes of each rank's last forward and backward before ``cut`` (in its last steady pair)."""
        return [code for r, c in enumerate(cut) for code in self._last_pair(r, c)]

    def _state(self, cut: list[int]) -> list[list[float]]:
        """Per recurrence: the frontier's arrivals. They hold the clocks too: a rank's clock after the cut is
        the arrival of its last operation before it (every steady cut has two on every rank)."""
        return list(map(list, zip(*map(self.arrival.__getitem__, self._frontier(cut)), strict=True)))

    def _extend(self, shape: Steady) -> None:
        """Run cut by cut until the state repeats up to a constant, then jump over the repeating units.

        The cuts compared are :data:`CUTS_PER_UNIT` a unit apart (their pairs past each rank's offset: those
        of :meth:`_cut_pairs`), each with the cuts one to :data:`MAX_CYCLE` units before it. A repeat between
        the cuts at ``P - c U`` and ``P`` pairs holds for every cut after the first, so the jump goes from the
        cut ``X`` in between that lands, whole cycles later, on the last cut (:attr:`Steady.max_units`): the
        state at ``X`` was kept as it ran (its frontier in the arrivals, its waits), so every rank ends the jump
        where its steady pairs end, however far past ``X`` the repeat was found. Cuts half a unit apart find an
        interleaved repeat up to half a unit sooner than cuts a unit apart (GPT-3 tp8 pp8 v3: between 6 and 30
        pairs rather than 18 and 42, 192 fewer operations one by one)."""
        if shape.unit == 1 and self.num_vs == len(self.ops) and not any(self.pos):
            self._shift_warmups(shape.start)
        unit, end = shape.unit, shape.phase + shape.max_units * shape.unit  # end: the last cut's pairs
        history: dict[int, tuple[list[list[float]], list[float]]] = {}  # pairs -> (state, waits) at that cut
        for pairs in _cut_pairs(shape):
            cut = self._cut(shape, pairs)
            if self.max_operations is not None and sum(cut) > self.max_operations:
                return  # no repeat within the allowed operations: run() refuses the rest
            # An interleaved rank's codes up to the cut a unit on (a 1F1B cut's two are made without a call).
            self.advance(cut, self._cut(shape, min(pairs + unit, end)) if unit > 1 else None)
            state, acc = history[pairs] = self._state(cut), list(self.waits)
            for c in range(1, MAX_CYCLE + 1):
                got = history.get(pairs - c * unit)
                if got is None:
                    break  # nor any cut before it
                before, acc_a = got
                # How far rank 0's clock moved: its last operation's arrival (the second of its frontier)
                deltas = [now[1] - then[1] for now, then in zip(state, before, strict=True)]
                if all(_shifted(then, now, d) for then, now, d in zip(before, state, deltas, strict=True)):
                    self.detected_at = (pairs, c)
                    increment = [b - a for a, b in zip(acc_a, acc, strict=True)]
                    if unit == 1 and c == 1:  # 1F1B: each rank from this cut, staggered (_moves)
                        base, moves = pairs, _moves(shape, pairs, 1)
                    else:  # every rank alike, from the cut whose whole cycles end on the last one
                        base = pairs - (pairs - end) % (c * unit)
                        moves = [(end - base) // (c * unit)] * len(self.ops)
                    if any(moves):
                        self._jump(shape, base, c, moves, deltas, increment, history[base])
                    return
            for old in [k for k in history if k < pairs - MAX_CYCLE * unit]:
                del history[old]

    def _shift_warmups(self, warm: list[int]) -> None:
        """Time the 1F1B warm-ups of twin ranks as shifts of one rank's, not forward by forward.

        Rank r's warm-up forward m ends at ``G_r(m) = max(G_r(m - 1), G_{r-1}(m) + pre) + post`` (its clock
        starts at 0: ``G_r(-1) = 0``). Take a rank q > 0 whose times are those of rank q - 1 plus one constant
        ``δ >= 0``, checked on the run's own times, each recurrence apart, with ``G_{q-1}(0) + pre >= 0``. Then a
        rank q + 1 that takes rank q's constants in its forward slot (and has no special operation among its
        warm-up forwards) ends each forward at ``G_q(m) + δ``: by induction on m both terms of its max are rank
        q's plus ``δ``, the first forward's included (it starts on its arrival, not at 0). So, by induction on
        the rank, a run of such twins ends each at ``G_q(m) + (r - q) δ``; a twin's first forward waits
        ``(r - q) δ`` longer than rank q's, the others as long. Where rank q - 1 differs (the first stage holds
        the embedding), the differences may need a rank or two to settle: up to three bases are tried.

        Only each twin's last warm-up forward is stored (the next twin's first steady forward reads it), and
        every one of the run's last twin (the rank after it runs its warm-up). 1T tp8 pp64: 1,891 of the
        2,016 warm-up forwards are shifts.
        """
        p, consts, arrival = len(self.ops), self._consts, self.arrival
        k0, k1, k2, k3, k4, k5 = consts
        # A rank's forward-slot constants, or None where a special operation is among its warm-up forwards (its
        # specials ascend: the first says).
        key = [((k0[i], k1[i], k2[i], k3[i], k4[i], k5[i]) if not sp or sp[0] >= w else None)
               for w, sp, i in zip(warm, self._specials, range(0, 2 * p, 2), strict=True)]
        q = 1
        for _ in range(3):  # bases tried
            while q + 1 < p and not (warm[q + 1] and key[q + 1] is not None and key[q + 1] == key[q]):
                q += 1
            if q + 1 >= p:
                return
            end = q + 1
            while end + 1 < p and warm[end + 1] and key[end + 1] == key[q]:
                end += 1
            self.advance([w if r <= q else self.pos[r] for r, w in enumerate(warm)])
            n = warm[q + 1]
            g = [arrival[(m * p + q) << 1] for m in range(n)]
            before = [arrival[(m * p + q - 1) << 1] for m in range(n)]
            deltas = [a - b for a, b in zip(g[0], before[0], strict=True)]
            if all(d >= 0 and before[0][k] + consts[k][2 * q] >= 0
                   and _shifted([b[k] for b in before], [a[k] for a in g], d) for k, d in enumerate(deltas)):
                break
            q += 1
        else:
            return
        pre, wait, waited = consts[0][2 * q], 0.0, [0.0]  # rank q's waits before each of its forwards
        for m, b in enumerate(before):
            a0, t0 = b[0] + pre, g[m - 1][0] if m else 0.0
            if a0 > t0:
                wait += a0 - t0
            waited.append(wait)
        d0, d1, d2 = deltas
        c0, c1, c2 = self.clocks
        for r in range(q + 1, end + 1):  # the three recurrences written out
            k, n = r - q, warm[r]
            e0, e1, e2 = k * d0, k * d1, k * d2
            x0, x1, x2 = g[n - 1]
            c0[r], c1[r], c2[r] = x0 + e0, x1 + e1, x2 + e2
            self.waits[r] = waited[n] + e0
            self.pos[r] = n
            self.shifted += n
            for m in range(n) if r == end else (n - 1,):
                x0, x1, x2 = g[m]
                arrival[(m * p + r) << 1] = (x0 + e0, x1 + e1, x2 + e2)

    def _shift_drains(self, warm: list[int]) -> None:
        """Time the 1F1B drains of twin ranks from one rank's, not backward by backward (after the jump).

        After its last forward, at its clock ``c_r``, rank r runs backwards ``j = a_r, ..., M - 1`` (``a_r = M -
        w_r - 1``: its last steady backward, then its cool-down), ending at ``H_r(a_r) = max(c_r, H_{r+1}(a_r) +
        pre) + post`` and ``H_r(j) = max(H_r(j - 1), H_{r+1}(j) + pre) + post``. Every rank after its last
        forward is a cut closed under dependencies, and after it a rank's backwards need only the next rank's.
        Take a rank q whose backwards from ``a_{q+1}`` to ``M - 2`` end rank q + 1's plus a constant ``δ``
        (checked on the run's own times, each recurrence apart; up to three bases are tried from the top). A
        rank r < q that takes rank q's constants in its backward slot, and whose first two backwards (timed
        here) end as the claim says, ``H_r(a_r + 1) = H_{r+1}(a_r + 1) + δ``, ends each later one at ``H_{r+1}(j)
        + δ``: by induction on j, both terms of its max are rank r + 1's plus ``δ`` (rank r + 1's own claim, by
        induction on the rank downwards from q), and it waits as long as rank r + 1. Each rank's last backward
        (it releases the gradients) runs in :meth:`advance`, as do the ranks below the twins. 1T tp8 pp64:
        1,950 backwards are shifts (60 ranks' last steady one and cool-down but the last).
        """
        p, consts, arrival = len(self.ops), self._consts, self.arrival
        total = len(self.ops[0]) >> 1  # micro-batches
        if any(w >= total for w in warm):  # a rank with no steady pair
            return
        cut, last = [2 * total - w - 1 for w in warm], 2 * total - 1  # after each rank's last forward
        if any(x > c for x, c in zip(self.pos, cut, strict=True)) or (
                self.max_operations is not None
                and self.ran + sum(c - x for c, x in zip(cut, self.pos, strict=True)) > self.max_operations):
            return
        self.advance(cut)
        start, waits = [list(c) for c in self.clocks], list(self.waits)  # at the cut
        first = [total - w - 1 for w in warm]  # a_r
        k0, k1, k2, k3, k4, k5 = consts
        # A rank's backward-slot constants, or None where a special operation lies between its cut and its last
        # backward (its specials ascend: the first at or after the cut says).
        key: list[tuple[float, ...] | None] = []
        for r, (k, sp) in enumerate(zip(cut, self._specials, strict=True)):
            i, at = 2 * r + 1, bisect_left(sp, k)
            key.append((k0[i], k1[i], k2[i], k3[i], k4[i], k5[i]) if at == len(sp) or sp[at] >= last else None)

        def ended(r: int, j: int) -> tuple[float, ...]:
            return arrival[((j * p + r) << 1) | 1]

        q = p - 2
        for _ in range(3):  # bases tried
            while q > 0 and not (key[q - 1] is not None and key[q - 1] == key[q] and warm[q + 1]):
                q -= 1
            if q <= 0:
                return
            self.advance([c if r < q else last for r, c in enumerate(cut)])
            mine = [ended(q, j) for j in range(first[q + 1], total - 1)]
            theirs = [ended(q + 1, j) for j in range(first[q + 1], total - 1)]
            deltas = [a - c for a, c in zip(mine[0], theirs[0], strict=True)]
            if all(_shifted([c[k] for c in theirs], [a[k] for a in mine], d) for k, d in enumerate(deltas)):
                break
            q -= 1
        else:
            return
        base = key[q]  # rank q's backward slot's constants (not None: q was chosen so)
        assert base is not None
        pre0, pre1, pre2, post0, post1, post2 = base
        x = ended(q + 1, first[q])[0] + pre0
        first_wait = x - start[0][q] if x > start[0][q] else 0.0  # rank q's first backward's
        tail_wait = self.waits[q] - waits[q]  # rank q's backwards' before its last
        e0, e1, e2 = ended(q, total - 2)
        d0, d1, d2 = deltas
        (s0, s1, s2), (c0, c1, c2) = start, self.clocks
        low = q
        # Each twin below q, the three recurrences written out: its first two backwards after the cut (from its
        # clock at the cut and rank r + 1's backwards), checked to end rank r + 1's plus the deltas (_shifted).
        for r in range(q - 1, -1, -1):
            if key[r] != base:
                break
            j = first[r]
            u0, u1, u2 = ended(r + 1, j)  # rank r + 1's last steady backward
            n0, n1, n2 = ended(r + 1, j + 1)  # and its first after the cut
            one = (max(s0[r], u0 + pre0) + post0, max(s1[r], u1 + pre1) + post1, max(s2[r], u2 + pre2) + post2)
            t0, t1, t2 = two = (max(one[0], n0 + pre0) + post0, max(one[1], n1 + pre1) + post1,
                                max(one[2], n2 + pre2) + post2)
            if (abs(t0 - n0 - d0) > _REL_TOL * abs(t0) or abs(t1 - n1 - d1) > _REL_TOL * abs(t1)
                    or abs(t2 - n2 - d2) > _REL_TOL * abs(t2)):
                break
            w1, w2 = max(u0 + pre0 - s0[r], 0.0), max(n0 + pre0 - one[0], 0.0)
            arrival[((j * p + r) << 1) | 1] = one
            arrival[(((j + 1) * p + r) << 1) | 1] = two
            tail_wait, first_wait = w1 + w2 + tail_wait - first_wait, w1
            n = q - r
            c0[r], c1[r], c2[r] = e0 + n * d0, e1 + n * d1, e2 + n * d2
            self.waits[r] = waits[r] + tail_wait
            self.pos[r] = last
            self.shifted += last - cut[r]
            low = r
        if low < q:  # the rank below runs its backwards one by one: the lowest twin's are all there
            for j in range(first[low] + 2, total - 1):
                s = min(q, low + j - first[low])  # the rank that timed its backward j first (or q)
                n = s - low
                x0, x1, x2 = arrival[((j * p + s) << 1) | 1]
                arrival[((j * p + low) << 1) | 1] = (x0 + n * d0, x1 + n * d1, x2 + n * d2)

    def _jump(self, shape: Steady, pairs: int, cycle: int, moves: list[int], deltas: list[float],
              increment: list[float], at: tuple[list[list[float]], list[float]]) -> None:
        """From the cut at ``pairs`` (whose state and waits are ``at``), move rank r over ``moves[r]`` repeats of
        ``cycle`` units, each adding ``deltas`` (one per recurrence) to its clocks and frontier and
        ``increment[r]`` to its waits. A rank's clock at a cut is the arrival of its last operation before it,
        the second of its frontier."""
        cut = self._cut(shape, pairs)
        arrival, (c0, c1, c2), waits = self.arrival, self.clocks, self.waits  # three recurrences until run() ends
        d0, d1, d2 = deltas
        state, waited = at
        s0, s1, s2 = state  # the frontier's arrivals: three per operation, as the inline loop runs
        for r, n in enumerate(moves):
            moved = (shape.shift * cycle * n * self.num_vs) << 1  # the same operation, micro-batches later
            e0, e1, e2 = d0 * n, d1 * n, d2 * n
            for k in self._last_pair(r, cut[r]):
                a0, a1, a2 = arrival[k]
                arrival[k + moved] = (a0 + e0, a1 + e1, a2 + e2)
            i = 2 * r + 1
            c0[r], c1[r], c2[r] = s0[i] + e0, s1[i] + e1, s2[i] + e2
            waits[r] = waited[r] + increment[r] * n
            self.pos[r] = cut[r] + 2 * shape.unit * cycle * n
        self.jumped_units = cycle * min(moves)
        self._windowed = False  # every rank is past the codes kept (a jump moves it a cycle or more)


def _cut_pairs(shape: Steady) -> Iterator[int]:
    """The pairs (past each rank's offset) of the cuts :meth:`ScheduleRun._extend` compares, ascending: at least
    one steady pair on every rank (a frontier) and up to the last cut, :data:`CUTS_PER_UNIT` per unit (the
    phase's among them, :attr:`Steady.phase`: those land on the last cut whole units later)."""
    unit, phase = shape.unit, shape.phase
    end = phase + shape.max_units * unit
    if unit == 1:
        yield from range(1, end + 1)
        return
    residues = sorted({(phase + i * unit // CUTS_PER_UNIT) % unit for i in range(CUTS_PER_UNIT)})
    for start in range(0, end + 1, unit):
        for r in residues:
            if 1 <= start + r <= end:
                yield start + r


def _moves(shape: Steady, units: int, cycle: int) -> list[int]:
    """How many repeats of ``cycle`` units each rank's jump moves it from the cut ``units``.

    All ranks move alike to the last cut inside every rank's steady pairs (:attr:`Steady.max_units`). Where
    the state repeats every unit (``cycle`` 1 and a 1-pair unit: 1F1B), rank r may instead go ``stagger[r]``
    units further than a common target: rank r after ``J + r`` pairs is a cut closed under dependencies (a
    forward of rank r needs rank r - 1's, which has run one pair less but holds one more warm-up forward; a
    backward needs rank r + 1's, which has run one pair more), and every operation before it is a steady pair
    or a warm-up forward whose inputs are too. Each such pair repeats the one a unit before plus the constant,
    by induction from the repeating cuts, so each rank's clock, frontier and waits extend by its own count of
    units. That leaves each rank the same few pairs before its drain, instead of ``r`` more on rank r (1T
    tp8 pp64 runs 4,544 operations one by one instead of 8,448).
    """
    common = [(shape.max_units - units) // cycle] * len(shape.offset)
    if cycle != 1 or shape.unit != 1 or not any(shape.stagger):
        return common
    target = min(map(sub, map(sub, shape.rooms, shape.offset), shape.stagger))
    moves = [target + g - units for g in shape.stagger]
    return moves if min(moves) >= 0 else common


def _shifted(before: list[float], now: list[float], delta: float) -> bool:
    """Whether ``now`` is ``before`` plus ``delta`` everywhere, up to float rounding."""
    if len(before) != len(now):
        raise ValueError("states of different sizes")  # a runner bug, not user input
    tol = _REL_TOL * max(map(abs, now))
    # all(abs(b - a - delta) <= tol), each step in C: (b - a) - delta, its size, compared (False for a NaN).
    return all(map(tol.__ge__, map(abs, map(sub, map(sub, now, before), repeat(delta)))))


__all__ = ["MAX_CYCLE", "Linear", "ScheduleRun", "Steady", "TooManyOperations", "steady"]
