"""The layer-by-layer step of :mod:`simddp.sim.step`, followed directly instead of in simpy.

Same model, same resources (:mod:`simddp.sim.resources`), for the steps whose collectives run beside the
layers: data parallel with tensor parallelism, overlapped parameter gathers or DDP's find_unused_parameters /
static_graph; ZeRO-3 / FSDP; and a pipeline's last backwards beside its overlapped gradient reduction (each
rank its own GPU; ranks meet only through arrivals). Two parts:

* :class:`Comms`, every collective of a GPU: one FIFO queue per NCCL stream (a collective at a time), a
  collective's latency, then its transfer on its link, the transfers in flight on a link progressing together
  at ``1 / n`` each (processor sharing). What it does depends only on when collectives are issued, so it is
  advanced event by event up to the time the compute stream has reached, and no further.
* the compute stream, one process run as straight-line code (:class:`Engine`): kernels advance through the
  collectives' events at ``1 / (1 + i)`` while any NCCL collective is in flight; a wait jumps to a
  collective's end. Most layers need no event: a layer takes its closed form
  (:func:`simddp.sim.layers.layer_alone`) when nothing else is queued or in flight, or the same with every
  kernel slowed when other collectives, on other links and streams, stay in flight throughout it
  (:meth:`Comms.in_flight_until`); runs of such layers go in one piece (:meth:`Engine.layers`).

``tests/test_fast.py`` checks every number of the result against the simpy engine to 1e-9 on generated
scenarios; :mod:`simddp.sim.fast` dispatches here.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from simddp.collectives import CollectiveCost
from simddp.sim.layers import TP_STREAM, LayerPlan, layer_alone_parts
from simddp.sim.pipeline import PipeOp, dependency
from simddp.sim.plan import (
    FSDP_STREAM,
    FsdpUnitPlan,
    RankPlan,
    StepPlan,
    fsdp_reduce_scatter_stream,
    last_backwards,
    root_prefetch,
)

#: Work below this many seconds counts as done, or below this fraction of the time (simddp.sim.resources).
_EPS_S = 1e-15
_EPS_REL = 1e-13
DP_STREAM = "dp"


@dataclass
class Outcome:
    """One rank's result, in the fields :func:`simddp.sim.step._result` reads."""

    plan: RankPlan
    acct: dict[str, float] = field(default_factory=dict)
    ready_at: dict[tuple[int, int], float] = field(default_factory=dict)
    reduced: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    compute_end_s: float = 0.0
    end_s: float = 0.0
    dp_comm_s: float = 0.0
    link_busy_s: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    link_work_s: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})

    def add(self, key: str, seconds: float) -> None:
        self.acct[key] = self.acct.get(key, 0.0) + seconds

    def transfer(self, tier: str, seconds: float) -> None:
        """A transfer alone on a link: it is busy exactly that long."""
        self.link_busy_s[tier] += seconds
        self.link_work_s[tier] += seconds


def _eps(t: float) -> float:
    return max(_EPS_S, t * _EPS_REL)


class _Coll:
    """One collective: its stream, then (start, end) once known."""

    __slots__ = ("cost", "end", "issued", "latency_end", "remaining", "slows", "start", "stream")

    def __init__(self, cost: CollectiveCost, stream: str, issued: float) -> None:
        self.cost = cost
        self.stream = stream
        self.issued = issued
        self.slows = 1 if cost.sm_interference else 0
        self.start = -1.0
        self.end = -1.0
        self.remaining = 0.0
        self.latency_end = -1.0  # while in its latency


class Comms:
    """The GPU's streams and links (see the module docstring), settled up to ``now``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queues: dict[str, deque[_Coll]] = {}
        self.latency: list[tuple[float, int, _Coll]] = []  # (end of its latency, issue order, collective)
        self.links: dict[str, list[_Coll]] = {"intra": [], "inter": []}
        self.busy_s = {"intra": 0.0, "inter": 0.0}
        self.work_s = {"intra": 0.0, "inter": 0.0}
        self.in_flight = 0  # NCCL collectives past their stream's queue and not done
        self.queued = 0  # collectives issued and not done
        self._order = 0
        self._next: float | None = None  # time of the next event, while the jobs in flight stay the same
        # Per stream, for in_flight_until: the time of the collectives queued behind the one running (each
        # alone), and how many of its collectives use each link ("": those that do not slow compute).
        self._waiting_s: dict[str, float] = {}
        self._links_of: dict[str, dict[str, int]] = {}

    def issue(self, cost: CollectiveCost, stream: str, t: float) -> _Coll:
        """Issue ``cost`` on ``stream`` at ``t`` (not before what is settled)."""
        self.settle(t)
        job = _Coll(cost, stream, t)
        queue = self.queues.get(stream)
        if queue is None:
            queue = self.queues[stream] = deque()
            self._waiting_s[stream], self._links_of[stream] = 0.0, {}
        queue.append(job)
        self.queued += 1
        links = self._links_of[stream]
        key = cost.tier if job.slows else ""
        links[key] = links.get(key, 0) + 1
        if len(queue) == 1:
            self._start(job, t)
        else:
            self._waiting_s[stream] += cost.time_s
        return job

    def alone(self, costs: Sequence[CollectiveCost]) -> None:
        """Collectives that ran alone on their links (a layer's closed form): the links' busy time and work."""
        for c in costs:
            if c.time_s > 0:
                transfer = c.transfer_s
                if transfer > 0:
                    self.busy_s[c.tier] += transfer
                    self.work_s[c.tier] += transfer

    def _start(self, job: _Coll, t: float) -> None:
        job.start = t
        cost = job.cost
        if cost.time_s <= 0:
            self._done(job, t)
            return
        self.in_flight += job.slows
        if cost.latency_s > 0:
            self._order += 1
            job.latency_end = t + cost.latency_s
            heapq.heappush(self.latency, (job.latency_end, self._order, job))
            self._next = None
        else:
            self._transfer(job, t)

    def _transfer(self, job: _Coll, t: float) -> None:
        job.latency_end = -1.0
        transfer = job.cost.transfer_s
        if transfer <= 0:
            self._done(job, t)
            return
        self.work_s[job.cost.tier] += transfer
        if transfer <= _eps(t):
            self._done(job, t)
            return
        job.remaining = transfer
        self.links[job.cost.tier].append(job)
        self._next = None

    def _done(self, job: _Coll, t: float) -> None:
        job.end = t
        if job.cost.time_s > 0:
            self.in_flight -= job.slows
        self.queued -= 1
        stream = job.stream
        queue = self.queues[stream]
        queue.popleft()
        links = self._links_of[stream]
        key = job.cost.tier if job.slows else ""
        links[key] -= 1
        if not links[key]:
            del links[key]
        if queue:  # the next one starts: its time leaves the queue's (recounted from zero once it is alone)
            self._waiting_s[stream] = self._waiting_s[stream] - queue[0].cost.time_s if len(queue) > 1 else 0.0
            self._start(queue[0], t)

    def next_s(self) -> float:
        """Time of the next event (a latency ending, a transfer ending); inf when nothing is in flight.

        A transfer's end, ``now + remaining x n``, does not move while the transfers on its link stay the same,
        so the answer is kept until a collective starts or ends."""
        nxt = self._next
        if nxt is not None:
            return nxt
        nxt = self.latency[0][0] if self.latency else math.inf
        now = self.now
        for jobs in self.links.values():
            if jobs:
                end = now + min(j.remaining for j in jobs) * len(jobs)
                if end < nxt:
                    nxt = end
        self._next = nxt
        return nxt

    def _progress(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for tier, jobs in self.links.items():
                if jobs:
                    share = dt / len(jobs)
                    for j in jobs:
                        j.remaining -= share
                    self.busy_s[tier] += dt
        self.now = t

    def step(self) -> None:
        """Run the next event (and every other one at the same time)."""
        t = self.next_s()
        self._progress(t)
        self._next = None
        while self.latency and self.latency[0][0] <= t:
            self._transfer(heapq.heappop(self.latency)[2], t)
        eps = t * _EPS_REL if t * _EPS_REL > _EPS_S else _EPS_S
        for jobs in self.links.values():
            if jobs and min(j.remaining for j in jobs) <= eps:
                finished = [j for j in jobs if j.remaining <= eps]
                jobs[:] = [j for j in jobs if j.remaining > eps]
                for j in finished:
                    self._done(j, t)
        self._next = None

    def in_flight_until(self, tiers: frozenset[str]) -> float:
        """A time before which some NCCL collective stays in flight, if nothing more is issued: the longest
        of each stream's queue run alone (sharing a link only delays), or of a link's work; -inf unless every
        collective in flight or queued slows compute and stays off ``tiers`` and the TP stream (then it cannot
        touch a layer's own collectives)."""
        until = -math.inf
        for name, queue in self.queues.items():
            if not queue:
                continue
            links = self._links_of[name]
            if name == TP_STREAM or "" in links or not tiers.isdisjoint(links):
                return -math.inf
            head = queue[0]
            if head.latency_end >= 0:
                end = head.latency_end + head.cost.transfer_s + self._waiting_s[name]
            else:
                end = self.now + head.remaining + self._waiting_s[name]
            if end > until:
                until = end
        for jobs in self.links.values():  # a shared link stays busy until all its work is done
            if len(jobs) > 1:
                end = self.now + sum(j.remaining for j in jobs)
                if end > until:
                    until = end
        return until

    def settle(self, t: float) -> None:
        """Run every event up to and at ``t``; the links' progress up to ``t``."""
        if not self.queued:
            if t > self.now:
                self.now = t
            return
        while self.queued and self.next_s() <= t:
            self.step()
        if t > self.now:
            self._progress(t)

    def wait(self, job: _Coll) -> float:
        """The end of ``job``, running the events before it."""
        while job.end < 0:
            self.step()
        return job.end


class _Closed(NamedTuple):
    """A layer pass's closed forms (:meth:`Engine._closed_forms`): (duration, busy) alone and slowed."""

    alone: tuple[float, float]
    slowed: tuple[float, float]
    costs: tuple[CollectiveCost, ...]
    tiers: frozenset[str]
    released: tuple[float, float] = (0.0, 0.0)  # when its weight gradients are ready, alone and slowed


class Engine:
    """One GPU's compute stream beside its :class:`Comms`, with the simpy engine's bookkeeping."""

    def __init__(self, plan: StepPlan) -> None:
        self.comms = Comms()
        self.i = plan.interference
        self.rate_in = 1.0 / (1.0 + plan.interference)
        self.overlap = plan.overlap
        self.busy_s = 0.0  # compute stream busy
        self.release_tiers: frozenset[str] = frozenset()  # links a release's reductions use (_Reductions)
        self.acct: dict[str, float] = {}
        self._alone: dict[tuple[int, str], _Closed] = {}
        self._passes: dict[object, tuple[tuple[list[list[float]], list[list[float]]], dict[str, list[float]],
                                         frozenset[str]]] = {}

    def add(self, key: str, seconds: float) -> None:
        self.acct[key] = self.acct.get(key, 0.0) + seconds

    def run(self, t: float, work: float) -> float:
        """Kernels worth ``work`` seconds started at ``t``: when they end."""
        if work <= _eps(t):
            return t
        comms = self.comms
        comms.settle(t)
        while True:
            rate = self.rate_in if comms.in_flight else 1.0
            nxt = comms.next_s() if comms.queued else math.inf
            end = t + work / rate
            if end <= nxt:
                self.busy_s += end - t
                return end
            work -= (nxt - t) * rate
            self.busy_s += nxt - t
            t = nxt
            comms.step()
            if work <= _eps(t):
                return t

    def block(self, costs: Sequence[CollectiveCost], t: float) -> float:
        """TP collectives issued together, the compute stream waiting for them."""
        last = self.issue(costs, t)
        return self.comms.wait(last) if last is not None else t

    def issue(self, costs: Sequence[CollectiveCost], t: float, stream: str = TP_STREAM) -> _Coll | None:
        """Collectives issued together on ``stream``: they run back to back (FIFO); the last of them."""
        last = None
        for c in costs:
            last = self.comms.issue(c, stream, t)
        return last

    def joined(self, job: _Coll | None, t: float) -> float:
        """``t``, or the end of ``job`` if later."""
        return max(t, self.comms.wait(job)) if job is not None else t

    # ---------------------------------------------------------------- one layer (simddp.sim.layers)
    def forward(self, p: LayerPlan, t: float, work: float) -> float:
        if self.overlap == "full":
            comm = self.issue(p.fwd_pre + p.fwd_post, t)
            return self.joined(comm, self.run(t, work))
        t = self.block(p.fwd_pre, t)
        t = self.run(t, work)
        return self.block(p.fwd_post, t)

    def backward(self, p: LayerPlan, t: float, release: Callable[[float], None] | None) -> float:
        tm = p.timing
        if tm.recompute_s > 0:
            t = self.forward(p, t, tm.recompute_s) if p.recompute_comm else self.run(t, tm.recompute_s)
        if self.overlap == "none":
            t = self.block(p.bwd_pre, t)
            t = self.run(t, tm.dgrad_s)
            t = self.block(p.dgrad_post + p.wgrad_pre, t)
            t = self.run(t, tm.wgrad_s)
            if release is not None:
                release(t)
            return t
        if self.overlap == "full":
            comm = self.issue(p.bwd_pre + p.wgrad_pre + p.dgrad_post, t)
            t = self.run(self.run(t, tm.dgrad_s), tm.wgrad_s)
            if release is not None:
                release(t)
            return self.joined(comm, t)
        t = self.block(p.bwd_pre, t)
        gather = self.issue(p.wgrad_pre, t)
        t = self.run(t, tm.dgrad_s)
        reduce = self.issue(p.dgrad_post, t)
        t = self.joined(gather, t)
        t = self.run(t, tm.wgrad_s)
        if release is not None:
            release(t)
        return self.joined(reduce, t)

    def layer(self, p: LayerPlan, kind: str, t: float, release: Callable[[float], None] | None = None) -> float:
        """One layer's forward (``F``) or backward (``B``) with the bookkeeping of ``step._booked_layer``."""
        tm = p.timing
        work = tm.fwd_s if kind == "F" else tm.bwd_s
        recompute = tm.recompute_s if kind == "B" else 0.0
        start, busy0 = t, self.busy_s
        comms = self.comms
        closed = None
        alone = self._alone.get((id(p), kind))
        if alone is None:
            alone = self._alone[(id(p), kind)] = self._closed_forms(p, kind)
        # Nothing is issued during the layer but its own TP collectives, or what its release issues at the end
        # of its last kernels on links its collectives do not use (what is left of the layer then, waiting
        # for its own collectives, cannot be touched by them).
        if release is None or not alone.tiers & self.release_tiers:
            if comms.queued:
                comms.settle(t)
            if not comms.queued:
                closed, which = alone.alone, 0  # nothing else in flight: the layer alone
            elif alone.slowed[0] <= comms.in_flight_until(alone.tiers) - t:
                closed, which = alone.slowed, 1  # others in flight throughout, on other links: kernels slowed
            if closed is not None:
                if release is not None:
                    release(t + alone.released[which])
                t += closed[0]
                self.busy_s += closed[1]
                comms.alone(alone.costs)
        if closed is None:
            t = self.forward(p, t, tm.fwd_s) if kind == "F" else self.backward(p, t, release)
        ran = self.busy_s - busy0
        self.add("compute", work - recompute)
        self.add("recompute", recompute)
        self.add("interference", max(0.0, ran - work))
        self.add("tp_comm", max(0.0, (t - start) - ran))
        return t

    def layers(self, plans: Sequence[LayerPlan], kind: str, t: float, key: object) -> float:
        """:meth:`layer` for each of ``plans`` in turn (a unit's forward, or its backward in reverse order),
        releasing no gradients: the runs of layers for which a closed form holds (nothing else in flight; or
        other collectives in flight throughout, on other links) in one piece each, from running sums that
        ``key`` names in the cache; the layer where the other collectives end, by :meth:`layer`."""
        sums = self._passes.get(key)
        if sums is None:
            sums = self._passes[key] = self._running_sums(plans, kind)
        cum, links, tiers = sums
        comms = self.comms
        n, j = len(plans), 0
        if not tiers:  # no collectives of their own: the layers are one sequence of kernels, slowed alike
            dur, _, compute, recompute, _, _ = cum[0]
            end = self.run(t, dur[n])
            self.add("compute", compute[n])
            self.add("recompute", recompute[n])
            self.add("interference", max(0.0, end - t - dur[n]))
            self.add("tp_comm", 0.0)
            return end
        while j < n:
            if comms.queued:
                comms.settle(t)
            if not comms.queued:
                k, which = n, 0
            else:
                which = 1
                ends = cum[1][0]
                k = bisect.bisect_right(ends, comms.in_flight_until(tiers) - t + ends[j], j, n + 1) - 1
            if k > j:
                dur, busy, *parts = cum[which]
                t += dur[k] - dur[j]
                self.busy_s += busy[k] - busy[j]
                for name, values in zip(("compute", "recompute", "interference", "tp_comm"), parts, strict=True):
                    self.add(name, values[k] - values[j])
                for tier, values in links.items():
                    delta = values[k] - values[j]
                    comms.busy_s[tier] += delta
                    comms.work_s[tier] += delta
                j = k
            if j < n:
                t = self.layer(plans[j], kind, t)
                j += 1
        return t

    def _running_sums(self, plans: Sequence[LayerPlan], kind: str) -> tuple[
            tuple[list[list[float]], list[list[float]]], dict[str, list[float]], frozenset[str]]:
        """For :meth:`layers`: running sums over ``plans`` of duration, busy time and the four booked parts,
        alone and slowed throughout; of the transfers on each link; the links their collectives use."""
        forms = []
        for p in plans:
            form = self._alone.get((id(p), kind))
            if form is None:
                form = self._alone[(id(p), kind)] = self._closed_forms(p, kind)
            forms.append(form)
        cum: list[list[list[float]]] = []
        for which in (0, 1):
            series = [[0.0] for _ in range(6)]
            for p, form in zip(plans, forms, strict=True):
                tm = p.timing
                work = tm.fwd_s if kind == "F" else tm.bwd_s
                recompute = tm.recompute_s if kind == "B" else 0.0
                d, b = form.slowed if which else form.alone
                for values, x in zip(series, (d, b, work - recompute, recompute, max(0.0, b - work),
                                              max(0.0, d - b)), strict=True):
                    values.append(values[-1] + x)
            cum.append(series)
        links = {tier: [0.0] for tier in ("intra", "inter")}
        for form in forms:
            moved = {tier: 0.0 for tier in links}
            for c in form.costs:
                if c.time_s > 0 and c.transfer_s > 0:
                    moved[c.tier] += c.transfer_s
            for tier, values in links.items():
                values.append(values[-1] + moved[tier])
        tiers = frozenset(tier for form in forms for tier in form.tiers)
        return (cum[0], cum[1]), links, tiers

    def _closed_forms(self, p: LayerPlan, kind: str) -> _Closed:
        """(duration, busy) of the layer on an idle GPU, and with its kernels slowed throughout (at
        ``1 / (1 + i)``: the layer alone with kernels ``1 + i`` times longer and no interference); its own
        collectives; their links."""
        tm = p.timing
        costs = p.fwd_pre + p.fwd_post
        if kind == "B":
            redo = costs if p.recompute_comm and tm.recompute_s > 0 else ()
            costs = redo + p.bwd_pre + p.dgrad_post + p.wgrad_pre
        k = 1.0 + self.i
        slowed = replace(p, timing=replace(tm, fwd_s=tm.fwd_s * k, dgrad_s=tm.dgrad_s * k, wgrad_s=tm.wgrad_s * k,
                                           recompute_s=tm.recompute_s * k))
        duration, busy, release = layer_alone_parts(p, self.overlap, kind, self.i)
        slow_duration, slow_busy, slow_release = layer_alone_parts(slowed, self.overlap, kind, 0.0)
        released = (release, slow_release) if kind == "B" else (0.0, 0.0)
        return _Closed((duration, busy), (slow_duration, slow_busy), costs,
                       frozenset(c.tier for c in costs if c.time_s > 0), released)

    def waited(self, jobs: Sequence[_Coll], t: float) -> float:
        """The compute stream waits for ``jobs`` (data-parallel collectives): booked as exposed DP comm."""
        end = t
        for job in jobs:
            end = max(end, self.comms.wait(job))
        self.add("dp_comm", end - t)
        return end


def _dp_total(jobs: Sequence[_Coll]) -> float:
    return sum(j.end - j.start for j in jobs)


def _finish(e: Engine, out: Outcome, compute_end: float, comm_end: float) -> float:
    """``step._finish``: embedding sync, gradient clipping, optimizer, parameter gather."""
    p = out.plan
    out.compute_end_s = compute_end
    t = max(compute_end, comm_end)
    e.add("dp_comm", t - compute_end)
    if p.embedding_sync is not None:
        job = e.comms.issue(p.embedding_sync, "embedding", t)
        end = e.comms.wait(job)
        out.dp_comm_s += job.end - job.start
        e.add("dp_comm", end - t)
        t = end
    if p.clip_norm_s or p.clip_reduces:  # clip_grad_norm_: the norm's pass, its scalar all-reduces, the scaling
        t0 = t
        t = e.run(t, p.clip_norm_s)
        for k, cost in enumerate(p.clip_reduces):
            t = e.comms.wait(e.comms.issue(cost, f"clip {k}", t))
        t = e.run(t, p.clip_scale_s)
        e.add("grad_clip", t - t0)
    start = t
    t = e.run(t, p.opt_s)
    e.add("optimizer", p.opt_s)
    e.add("interference", t - start - p.opt_s)
    if p.gather_after_step is not None:
        job = e.comms.issue(p.gather_after_step, DP_STREAM, t)
        end = e.comms.wait(job)
        out.dp_comm_s += job.end - job.start
        e.add("dp_comm", end - t)
        t = end
    e.comms.settle(t)
    out.end_s = t
    out.acct = e.acct
    out.link_busy_s = dict(e.comms.busy_s)
    out.link_work_s = dict(e.comms.work_s)
    return t


def _fused(e: Engine, p: RankPlan, kind: str, times: int, t: float, vs: int = 0) -> float:
    """``step._fused``: ``times`` passes through virtual stage ``vs`` that release nothing, as one piece of
    kernels, then the rest of their time on an idle GPU (their TP collectives, not put on the links)."""
    alone = (p.fwd_alone_s if kind == "F" else p.bwd_alone_s)[vs] * times
    busy = (p.fwd_busy_s if kind == "F" else p.bwd_busy_s)[vs] * times
    work = (p.fwd_work_s if kind == "F" else p.bwd_work_s)[vs] * times
    recompute = 0.0 if kind == "F" else p.bwd_recompute_s[vs] * times
    end = e.run(t, work)
    e.add("compute", work - recompute)
    e.add("recompute", recompute)
    e.add("interference", end - t - work)
    if alone > work:
        end += alone - work
        e.add("interference", busy - work)
        e.add("tp_comm", alone - busy)
    return end


class _Reductions:
    """A rank's gradient buckets on the DP stream (``step._dp_comm``): in (round, bucket) order, each issued once
    its gradients are all released and the bucket before it was issued; with find_unused_parameters, the
    used-parameter map's all-reduce after each round's last bucket, and the parameters that get no gradient
    marked ready at the round's first gradient hook (``step._Rank.release``)."""

    def __init__(self, e: Engine, out: Outcome, rounds: int) -> None:
        p = out.plan
        self.e, self.out, self.plan = e, out, p
        self.remaining = {(rnd, b.index): b.num_params for rnd in range(rounds) for b in p.buckets}
        self.order = [(rnd, b.index) for rnd in range(rounds) for b in p.buckets]
        self.jobs: list[_Coll] = []
        self.maps: list[_Coll] = []  # the used-parameter map's all-reduces
        self.marked: set[int] = set()
        costs = [b.reduce for b in p.buckets] + ([p.unused_map_reduce] if p.unused_map_reduce else [])
        e.release_tiers = frozenset(c.tier for c in costs if c.time_s > 0)

    def issue_ready(self, t: float) -> None:
        order, jobs, ready_at = self.order, self.jobs, self.out.ready_at
        used_map, last = self.plan.unused_map_reduce, len(self.plan.buckets) - 1
        k = len(jobs)
        while k < len(order) and order[k] in ready_at:
            jobs.append(self.e.comms.issue(self.plan.buckets[order[k][1]].reduce, DP_STREAM, t))
            if used_map is not None and order[k][1] == self.plan.buckets[last].index:
                self.maps.append(self.e.comms.issue(used_map, DP_STREAM, t))
            k += 1

    def releaser(self, rnd: int, layer: int) -> Callable[[float], None] | None:
        """What the end of ``layer``'s weight gradients does in round ``rnd`` (None: nothing)."""
        buckets = self.plan.bucket_of_layer[layer]
        unused = self.plan.unused_per_bucket
        if not buckets and not unused:
            return None

        def release(t: float) -> None:
            ready = False
            if unused and rnd not in self.marked:
                self.marked.add(rnd)
                for b, count in unused.items():
                    ready = self._decrement((rnd, b), count, t) or ready
            for b in buckets:
                ready = self._decrement((rnd, b), 1, t) or ready
            if ready and self.plan.overlap:
                self.issue_ready(t)
        return release

    def _decrement(self, key: tuple[int, int], count: int, t: float) -> bool:
        self.remaining[key] -= count
        if self.remaining[key] == 0:
            self.out.ready_at[key] = t
            return True
        return False

    def done(self, compute_end: float) -> float:
        """After the compute stream ended: issue what waits for it (reduction not overlapped); the last end."""
        if not self.plan.overlap:
            self.issue_ready(compute_end)
        end = max((self.e.comms.wait(job) for job in self.jobs + self.maps), default=0.0)
        for key, job in zip(self.order, self.jobs, strict=False):
            self.out.reduced[key] = (job.start, job.end)
        self.out.dp_comm_s += _dp_total(self.jobs) + _dp_total(self.maps)
        return end


def run_dp(plan: StepPlan) -> list[Outcome]:
    """``step._run_dp`` (pp = 1, DDP or ZeRO-1/2), with TP collectives, overlapped parameter gathers and DDP's
    find_unused_parameters / static_graph."""
    p = plan.ranks[0]
    out = Outcome(p)
    e = Engine(plan)
    m = plan.num_micro_batches
    silent = m - p.rounds
    reductions = _Reductions(e, out, p.rounds)
    gathers: dict[int, _Coll] = {}
    if any(b.gather for b in p.buckets):
        for bucket in reversed(p.buckets):  # the previous step's update, in forward order
            assert bucket.gather is not None
            gathers[bucket.index] = e.comms.issue(bucket.gather, DP_STREAM, 0.0)
    bucket_sets = [sorted(set(bs)) for bs in p.bucket_of_layer]
    positions = range(len(p.layers))
    plans_fwd = list(p.plans)
    key_fwd = ("F", *map(id, plans_fwd))

    def forward(t: float, gated: bool) -> float:
        if not gated:
            return e.layers(plans_fwd, "F", t, key_fwd)
        for i in positions:
            if bucket_sets[i]:
                t = e.waited([gathers[b] for b in bucket_sets[i]], t)
            t = e.layer(p.plans[i], "F", t)
        return t

    def backward(t: float, rnd: int) -> float:
        for i in reversed(positions):
            t = e.layer(p.plans[i], "B", t, reductions.releaser(rnd, i))
        return t

    t, j = 0.0, 0
    if gathers:
        t = forward(t, True)
        t = _fused(e, p, "B", 1, t) if silent else backward(t, 0)
        j = 1
    quiet = max(0, silent - j)
    if quiet:
        t = _fused(e, p, "F", quiet, t)
        t = _fused(e, p, "B", quiet, t)
        j += quiet
    for k in range(j, m):
        t = forward(t, False)
        if k >= silent and p.traversal_s > 0:  # DDP prepares the reducing backward: the graph search
            t += p.traversal_s
            e.add("ddp_host", p.traversal_s)
        t = backward(t, k - silent)
        if k >= silent and k < m - 1 and p.overlap:  # the round's reductions end before the next (step._run_dp)
            t = e.waited(reductions.jobs + reductions.maps, t)
    out.dp_comm_s = _dp_total(list(gathers.values()))
    comm_end = reductions.done(t)
    _finish(e, out, t, comm_end)
    return [out]


def pipeline_tail(plan: StepPlan, first: list[int], at: list[float],
                  arrived: dict[PipeOp, float]) -> list[Outcome]:
    """The tail of a pipeline step (:func:`simddp.sim.fast._run_pipeline`): every rank's schedule from
    position ``first[r]`` on, started idle at ``at[r]``, the earlier operations it waits for arrived at the
    times ``arrived`` (Megatron's synchronous send/recv: a send blocks its sender; a receiver all-gathers the
    TP slices of what arrived). Each rank's GPU is its own; ranks meet only through arrivals, so each runs as
    far as its arrivals are known, in turns."""
    par = plan.scenario.parallelism
    num_vs = par.pp * par.virtual_stages
    arrivals: dict[tuple[str, int, int], float] = {tuple(op): t for op, t in arrived.items()}  # type: ignore[misc]
    ranks = []
    last = last_backwards(plan)
    for r, rp in enumerate(plan.ranks):
        e, out = Engine(plan), Outcome(rp)
        by_stage = plan.workload.rank_stage_positions(rp.index, par.pp)
        ranks.append((e, out, _Reductions(e, out, 1), by_stage, last[r]))
    position, clock = list(first), list(at)
    left = [r for r in range(len(ranks)) if position[r] < len(plan.ops[r])]
    while left:
        moved = False
        for r in left:
            e, out, reductions, by_stage, last_b = ranks[r]
            ops, i, t = plan.ops[r], position[r], clock[r]
            while i < len(ops):
                op = ops[i]
                dep = dependency(op, num_vs)
                if dep is not None:
                    if dep not in arrivals:
                        break
                    t0, t = t, max(t, arrivals[dep])
                    e.add("pipeline_wait", t - t0)
                    if plan.p2p_gather is not None:  # reassemble the tp slices of what arrived
                        t0, t = t, e.block((plan.p2p_gather,), t)
                        e.add("tp_comm", t - t0)
                vs = op.virtual_stage
                if op.kind == "B" and last_b.get(vs) == i:
                    for k in reversed(by_stage.get(vs, [])):
                        t = e.layer(out.plan.plans[k], "B", t, reductions.releaser(0, k))
                else:
                    t = _fused(e, out.plan, op.kind, 1, t, vs)
                cost = plan.p2p.get(vs if op.kind == "F" else vs - 1)
                t0 = t
                if cost is not None:  # one p2p stream per rank: its sends go out one after another
                    t = e.comms.wait(e.comms.issue(cost, "p2p", t))
                arrivals[(op.kind, op.micro_batch, vs)] = t
                e.add("pipeline_p2p", t - t0)
                i += 1
                moved = True
            position[r], clock[r] = i, t
        left = [r for r in left if position[r] < len(plan.ops[r])]
        if left and not moved:
            raise RuntimeError("the pipeline tail waits for an operation no rank runs")  # a schedule bug
    outs = []
    for r, (e, out, reductions, _, _) in enumerate(ranks):
        e.add("pipeline_p2p", 0.0)  # the schedule's wait for its sends: none are in flight (they block)
        comm_end = reductions.done(clock[r])
        _finish(e, out, clock[r], comm_end)
        outs.append(out)
    return outs


def run_fsdp(plan: StepPlan) -> list[Outcome]:
    """``step._run_fsdp``: every micro-batch gathers and reduce-scatters unit by unit; then the sharded step."""
    p = plan.ranks[0]
    out = Outcome(p)
    e = Engine(plan)
    m = plan.num_micro_batches
    units, root = p.fsdp_units, p.fsdp_root
    gathers: list[_Coll] = []
    reduces: list[tuple[FsdpUnitPlan, _Coll, bool]] = []

    rs_stream = fsdp_reduce_scatter_stream(plan.rule)
    prefetch_at_root = root_prefetch(plan.rule, units)

    def gather(unit: FsdpUnitPlan, t: float) -> _Coll:
        job = e.comms.issue(unit.gather, FSDP_STREAM, t)
        gathers.append(job)
        return job

    passes: dict[tuple[str, tuple[int, ...]], tuple[list[LayerPlan], tuple[object, ...]]] = {}

    def run_pass(kind: str, positions: Sequence[int], t: float) -> float:
        """A unit's layers forward, or backward in reverse, in order: units of identical layers share a key."""
        seq = passes.get((kind, tuple(positions)))
        if seq is None:
            plans = [p.plans[i] for i in (positions if kind == "F" else reversed(positions))]
            seq = passes[(kind, tuple(positions))] = (plans, (kind, *map(id, plans)))
        return e.layers(seq[0], kind, t, seq[1])

    def forward(positions: Sequence[int], t: float) -> float:
        return run_pass("F", positions, t)

    def backward(positions: Sequence[int], t: float) -> float:
        return run_pass("B", positions, t)

    def reduce(unit: FsdpUnitPlan, last: bool, t: float) -> float:
        assert unit.reduce is not None
        job = e.comms.issue(unit.reduce, rs_stream, t)
        reduces.append((unit, job, last))
        return e.waited([job], t) if unit.reduce_blocks else t

    root_pos = list(root.layers) if root else []
    head = [i for i in root_pos if units and i < units[0].layers[0]] if units else root_pos
    tail = [i for i in root_pos if i not in head]
    t = 0.0
    reduced = 0  # reduce-scatters of the micro-batches before this one (waited for)
    for j in range(m):
        last = j == m - 1
        root_ready = gather(root, t) if root else None
        fwd: dict[int, _Coll] = {}
        bwd: dict[int, _Coll] = {}

        def issue_fwd(k: int, t: float, fwd: dict[int, _Coll] = fwd) -> None:
            if k < len(units) and k not in fwd:
                fwd[k] = gather(units[k], t)

        def issue_bwd(k: int, t: float, bwd: dict[int, _Coll] = bwd) -> None:
            if k >= 0 and k not in bwd and units[k].gather_bwd:
                bwd[k] = gather(units[k], t)

        issue_fwd(0, t)
        if root_ready is not None:
            t = e.waited([root_ready], t)
        t = forward(head, t)
        for k, unit in enumerate(units):
            issue_fwd(k, t)
            t = e.waited([fwd[k]], t)
            for ahead in range(k + 1, k + 1 + unit.prefetch_fwd):
                issue_fwd(ahead, t)
            t = forward(unit.layers, t)
        t = forward(tail, t)
        for ahead in range(len(units) - 1, len(units) - 1 - prefetch_at_root, -1):
            issue_bwd(ahead, t)
        t = backward(tail, t)
        issue_bwd(len(units) - 1, t)
        for k in range(len(units) - 1, -1, -1):
            issue_bwd(k, t)
            if k in bwd:
                t = e.waited([bwd[k]], t)
            for ahead in range(k - 1, k - 1 - units[k].prefetch_bwd, -1):
                issue_bwd(ahead, t)
            t = backward(units[k].layers, t)
            if units[k].reduce is not None:
                t = reduce(units[k], last, t)
        t = backward(head, t)
        if root is not None and root.reduce is not None:
            t = reduce(root, last, t)
        if not last:  # the end of backward waits for its reduce-scatters (step._run_fsdp)
            t = e.waited([job for _, job, _ in reduces[reduced:]], t)
            reduced = len(reduces)
    compute_end = t
    comm_end = max((e.comms.wait(job) for _, job, _ in reduces), default=0.0)
    out.dp_comm_s = _dp_total(gathers) + _dp_total([job for _, job, _ in reduces])
    for unit, job, last in reduces:
        if last:
            out.ready_at[(0, unit.index)] = job.issued
            out.reduced[(0, unit.index)] = (job.start, job.end)
    _finish(e, out, compute_end, comm_end)
    return [out]


__all__ = ["Comms", "Engine", "Outcome", "pipeline_tail", "run_dp", "run_fsdp"]
