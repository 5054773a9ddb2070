"""The fast engine: the same step as the simpy simulation, computed without simpy where its dynamics are
simple enough to follow directly. ``tests/test_fast.py`` checks it equals the simpy engine to 1e-9 on
generated scenarios; :func:`simddp.sim.step.simulate_step` uses it when :func:`supported` says so, and the
simpy engine otherwise (and always with ``exact=True`` or when a trace is asked for).

Three cases are covered:

* **Data parallel without tensor parallelism** (pp = 1, DDP or ZeRO-1/2, no overlapped parameter gather):
  the compute stream runs kernels back to back; the gradient reductions run one at a time on the DP stream,
  each alone on its link (nothing else uses it), starting when its bucket is ready and the one before it
  is done. Compute runs at 1 / (1 + i) while a reduction is in flight. A single sweep over the compute
  jobs, each cut where a bucket completes, follows both streams exactly: a reduction can only be in flight
  during a job if its bucket was ready before the job started, so the reductions that can slow a job are
  already scheduled when it runs.
* **Pipelines with synchronous send/recv** (Megatron's default): every operation takes its time on an idle
  GPU (its own TP collectives included), a send blocks its sender, a receiver all-gathers the slices of
  what arrived; the schedule is the max-plus recurrence of :class:`simddp.sim.periodic.ScheduleRun` (its
  periodic steady state extended exactly), then each rank reduces its buckets one after another, syncs a
  tied embedding, steps and gathers. Where the gradient reduction overlaps backward (torch DDP, ZeRO-1/2
  with dp > 1), nothing is in flight beside a rank's operations before its first release of gradients, so
  the recurrence is exact up to there; :mod:`simddp.sim.fluid` runs the rest (a few cool-down backwards per
  rank, its reductions beside them) from the recurrence's state.
* **Everything else at pp = 1** (data parallel with TP, Megatron's overlapped parameter gather or DDP's
  find_unused_parameters / static_graph, ZeRO-3 and FSDP): the simpy processes' layer-by-layer step,
  followed directly by :mod:`simddp.sim.fluid` (its collectives advanced event by event only as far as the
  compute stream has come, runs of layers in closed form where nothing else can touch them).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any, NamedTuple, cast

from simddp.results import StepResult
from simddp.sim import fluid
from simddp.sim.fluid import Outcome
from simddp.sim.layers import layer_alone_parts
from simddp.sim.periodic import Linear, ScheduleRun, steady
from simddp.sim.pipeline import PipeOp, Schedule, decode, op_code
from simddp.sim.plan import RankPlan, StepPlan, last_backwards, memo_put

#: Work below this many seconds counts as done (as the simpy engine's fluid server does).
_EPS_S = 1e-15


def supported(plan: StepPlan) -> bool:
    """Whether the fast engine follows this plan's dynamics exactly."""
    scenario = plan.scenario
    par, ddp = scenario.parallelism, scenario.ddp
    if ddp.backend != "nccl":
        return False  # gloo's host-staged collectives: the simpy engine alone times them
    if _knobs(plan):
        return plan.mode == "dp"  # DDP's knobs (simddp.knobs): torch DDP at pp = 1 (simddp.sim.fluid)
    if plan.mode in ("dp", "fsdp"):  # layer by layer beside the collectives (simddp.sim.fluid) when not simple
        return True
    if plan.mode == "pipeline":  # overlapped reduction: the schedule's tail in simddp.sim.fluid
        return not par.pp_p2p_overlap
    return False


def run(plan: StepPlan, max_operations: int | None = None) -> StepResult:
    """The step of ``plan`` (which :func:`supported` accepts), as the simpy engine would give it.

    A pipeline whose steady state does not repeat runs every operation: with ``max_operations`` it raises
    :class:`simddp.sim.periodic.TooManyOperations` instead of running more than that one by one."""
    from simddp.sim.step import _result

    if plan.mode == "pipeline":
        outcomes = _run_pipeline(plan, max_operations)
    elif plan.mode == "fsdp":
        outcomes = fluid.run_fsdp(plan)
    elif _simple_dp(plan):
        outcomes = _run_dp(plan)
    else:
        outcomes = fluid.run_dp(plan)
    return _result(plan, outcomes, None)


def _simple_dp(plan: StepPlan) -> bool:
    """Data parallel whose layers have no collectives of their own and whose forward waits for no parameter
    gather: compute is one sequence of kernels, run by :func:`_run_dp` without events."""
    no_tp = not any(r.plans.has_tp_collectives for r in plan.ranks)
    return no_tp and not _knobs(plan) and not any(b.gather for r in plan.ranks for b in r.buckets)


def _knobs(plan: StepPlan) -> bool:
    """Whether DDP's find_unused_parameters / static_graph show in the plan (graph search, unused parameters)."""
    return any(r.traversal_s or r.unused_per_bucket or r.unused_map_reduce for r in plan.ranks)


# ------------------------------------------------------------------------------------- data parallel
def _advance(t: float, work: float, intervals: deque[tuple[float, float]], rate_in: float) -> float:
    """When ``work`` seconds of kernels started at ``t`` end, slowed to ``rate_in`` inside ``intervals``."""
    remaining = work
    while remaining > _EPS_S:
        while intervals and intervals[0][1] <= t:
            intervals.popleft()
        if intervals and intervals[0][0] <= t:
            end = intervals[0][1]
            can = (end - t) * rate_in
            if can >= remaining:
                return t + remaining / rate_in
            remaining -= can
            t = end
        else:
            nxt = intervals[0][0] if intervals else None
            if nxt is None or nxt - t >= remaining:
                return t + remaining
            remaining -= nxt - t
            t = nxt
    return t


def _backward(p: RankPlan) -> tuple[list[tuple[float, float, tuple[int, ...]]], list[tuple[float, str, float]]]:
    """Backward as the compute stream sees it, and each bucket's reduction (time, link tier, transfer).

    Backward runs its layers' kernels back to back, in reverse layer order; only a layer whose gradients
    complete buckets (the last its buckets wait for) starts anything. So it comes as *runs* of layers, each
    ending with a layer that releases buckets (and a last run that may release none): each run's (kernel work,
    its recompute part, the buckets released at its end). A run's kernels end when their summed work ends
    (:func:`_advance` is additive in the work it is given), so a run is one job. The releases come once per
    gradients, the runs once per those and the layer plans (a sweep's points share both). Bucket indices are
    positions in ``p.buckets``."""
    releases = p.grads.memo.get("releases")
    if releases is None:
        left = {b.index: b.num_params for b in p.buckets}
        releases = []
        for buckets in reversed(p.bucket_of_layer):
            if not buckets:  # a layer without parameters (most of a block's) releases nothing
                releases.append(())
                continue
            done = []
            for b in buckets:
                n = left[b] - 1
                left[b] = n
                if not n:
                    done.append(b)
            releases.append(tuple(done))
        p.grads.memo["releases"] = releases
    runs_of = p.plans.memo.get(id(releases))  # kept beside the releases: an id is only theirs while they live
    if runs_of is None or runs_of[0] is not releases:
        runs: list[tuple[float, float, tuple[int, ...]]] = []
        work = redo = 0.0
        for (w, r), released in zip(p.plans.backward_work, releases, strict=True):
            work += w
            redo += r
            if released:
                runs.append((work, redo, released))
                work = redo = 0.0
        if work or redo:  # layers after the last release (a rank without layers has no runs)
            runs.append((work, redo, ()))
        runs_of = p.plans.memo[id(releases)] = (releases, runs)
    costs_of = p.grads.memo.get(("reduction costs", id(p.buckets)))  # bucket plans are shared (build_plan)
    if costs_of is None or costs_of[0] is not p.buckets:
        costs_of = (p.buckets, [(b.reduce.time_s, b.reduce.tier, b.reduce.transfer_s) for b in p.buckets])
        memo_put(p.grads.memo, ("reduction costs", id(p.buckets)), costs_of)
    return runs_of[1], costs_of[1]


def _run_dp(plan: StepPlan) -> list[Outcome]:
    p = plan.ranks[0]
    out = Outcome(p)
    m, rounds, i = plan.num_micro_batches, p.rounds, plan.interference
    rate_in = 1.0 / (1.0 + i)
    silent = m - rounds
    # Silent micro-batches: nothing in flight, their forward and backward at full speed.
    t = 0.0
    if silent:
        fwd, bwd = p.fwd_work_s[0] * silent, p.bwd_work_s[0] * silent
        t = fwd + bwd
        out.add("compute", fwd + bwd - p.bwd_recompute_s[0] * silent)
        out.add("recompute", p.bwd_recompute_s[0] * silent)
    overlap = plan.rule.overlap
    fwd = p.fwd_work_s[0]
    backward, costs = _backward(p)
    # The DP stream: reductions in (round, bucket) order, each alone on its link, once ready. Ready times and
    # (start, end) spans in flat lists (position round * buckets + bucket), handed to the outcome's dicts at the
    # end; ``started`` reductions so far, the stream's ``busy_until``, and the intervals they are in flight.
    nb = len(costs)
    ready: list[float | None] = [None] * (rounds * nb)
    spans: list[tuple[float, float]] = []
    intervals: deque[tuple[float, float]] = deque()
    busy, link_work = out.link_busy_s, out.link_work_s
    started, busy_until, total = 0, 0.0, len(ready)

    def start_ready() -> None:
        """Start every reduction whose bucket and predecessors are ready (a closure over the stream's locals:
        a 7B model's backward calls it 130 times, a method would load its state from attributes each time)."""
        nonlocal started, busy_until
        k, end, dp_comm = started, busy_until, out.dp_comm_s
        while k < total:
            at = ready[k]
            if at is None:
                break
            time_s, tier, transfer_s = costs[k % nb]
            start = at if at >= end else end
            if time_s > 0:
                end = start + time_s
                intervals.append((start, end))
                dp_comm += end - start
                busy[tier] += transfer_s
                link_work[tier] += transfer_s
            else:
                end = start
            spans.append((start, end))
            k += 1
        started, busy_until, out.dp_comm_s = k, end, dp_comm

    acct = out.acct
    for rnd in range(rounds):
        first = rnd * nb  # the round's reductions in the stream's lists
        # Forward: one job (no collective of this step can be in flight before the first release).
        end = _advance(t, fwd, intervals, rate_in)
        out.add("compute", fwd)
        out.add("interference", end - t - fwd)
        t = end
        # The parts are summed in the same order as out.add would, in locals (one run of layers at a time).
        compute, recompute, interference = acct["compute"], acct.get("recompute", 0.0), acct["interference"]
        for work, redo, released in backward:
            if intervals:
                end = _advance(t, work, intervals, rate_in)
            else:  # nothing in flight: _advance's answer, without the call
                end = t + work if work > _EPS_S else t
            compute += work - redo
            recompute += redo
            interference += end - t - work
            t = end
            if released:
                for b in released:
                    ready[first + b] = t
                if overlap:
                    start_ready()
        if backward:
            acct["compute"], acct["recompute"], acct["interference"] = compute, recompute, interference
        if overlap and rnd < rounds - 1 and busy_until > t:  # the round's reductions end first (step._run_dp)
            out.add("dp_comm", busy_until - t)
            t = busy_until
    out.compute_end_s = t
    if not overlap:
        busy_until = max(busy_until, t)
        start_ready()
    # Every reduction's ready time and (start, end) into the outcome, keyed (round, bucket).
    keys = [(rnd, b) for rnd in range(rounds) for b in range(nb)]
    out.ready_at.update(zip(keys, cast(list[float], ready), strict=True))  # all ready by the end
    out.reduced.update(zip(keys, spans, strict=True))
    comm_end = max(busy_until, t)
    _finish(out, comm_end)
    return [out]


def _finish(out: Outcome, comm_end: float) -> None:
    """After compute and reductions: embedding sync, gradient clipping, optimizer, ZeRO gather (each alone, one
    after another)."""
    p = out.plan
    t = comm_end
    out.add("dp_comm", comm_end - out.compute_end_s)
    if p.embedding_sync is not None and p.embedding_sync.time_s > 0:
        t += p.embedding_sync.time_s
        out.dp_comm_s += p.embedding_sync.time_s
        out.add("dp_comm", p.embedding_sync.time_s)
        out.transfer(p.embedding_sync.tier, p.embedding_sync.transfer_s)
    if p.clip_norm_s or p.clip_reduces:  # clip_grad_norm_: the norm's pass, its scalar all-reduces, the scaling
        t0 = t
        t += p.clip_norm_s
        for cost in p.clip_reduces:
            if cost.time_s > 0:
                t += cost.time_s
                out.transfer(cost.tier, cost.transfer_s)
        t += p.clip_scale_s
        out.add("grad_clip", t - t0)
    t += p.opt_s
    out.add("optimizer", p.opt_s)
    out.add("interference", 0.0)
    gather = p.gather_after_step
    if gather is not None and gather.time_s > 0:
        t += gather.time_s
        out.dp_comm_s += gather.time_s
        out.add("dp_comm", gather.time_s)
        out.transfer(gather.tier, gather.transfer_s)
    out.end_s = t


# ---------------------------------------------------------------------------------------- pipelines
class _Released(NamedTuple):
    """What a kind of rank's last backwards release (:func:`_rank_releases`): their TP transfers per link tier,
    in the order they run; each bucket as (virtual stage less the rank's index of the backward that completes
    it, its ready time after that backward starts, its reduction's time, its index), in bucket order; and the
    (time, tier, transfer) of each reduction that takes time."""

    transfers: list[tuple[str, float]]
    buckets: list[tuple[int, float, float, int]]
    paid: list[tuple[float, str, float]]
    #: Where no reduction takes time (one data-parallel rank): each releasing stage's (less the rank's index)
    #: latest ready offset, the only thing :func:`_reduce_buckets` then reads (rounding is monotone, so the
    #: latest start plus offset is the start plus the latest offset); else empty.
    latest: list[tuple[int, float]]


def _rank_releases(p: RankPlan, positions: dict[int, list[int]], order: list[int], overlap: str,
                   interference: float, seen: dict[int, tuple[float, float, list[tuple[str, float]]]]) -> _Released:
    """What rank ``p``'s last backward of each virtual stage releases, its virtual stages taken in ``order``
    (that of their last backwards in its schedule): that backward's layers (``positions[vs]`` in its layers)
    run alone, in reverse order, and a bucket is ready once the last of its gradients is.

    ``seen`` keeps each distinct layer's (release offset, duration, TP transfers) across calls: layers of
    identical blocks share one timing object (as :func:`simddp.sim.layers.pass_alone` relies on). Twin ranks
    (:meth:`simddp.workload.Workload.rank_twins`) share their layer plans and buckets, so one answer serves
    them all: its stages are virtual stages less the rank's index."""
    plans, bucket_of_layer = p.plans, p.bucket_of_layer
    left = {b.index: b.num_params for b in p.buckets}
    where: dict[int, tuple[int, float]] = {}  # bucket -> (its releasing stage less p.index, its offset)
    all_transfers: list[tuple[str, float]] = []
    for vs in order:
        t = 0.0
        transfers: dict[str, float] = {}  # this backward's, per tier
        for k in reversed(positions.get(vs, ())):
            plan = plans[k]
            got = seen.get(id(plan.timing))
            if got is None:
                # This pass runs layer by layer in the simpy engine, its TP collectives on the link.
                costs = plan.bwd_pre + plan.dgrad_post + plan.wgrad_pre
                if plan.recompute_comm:
                    costs += plan.fwd_pre + plan.fwd_post
                duration, _, release = layer_alone_parts(plan, overlap, "B", interference)
                got = seen[id(plan.timing)] = (release, duration,
                                               [(c.tier, c.transfer_s) for c in costs if c.time_s > 0])
            release, duration, layer_transfers = got
            own = bucket_of_layer[k]
            if own:  # a layer without parameters (most of a block's) completes no bucket: no ready time
                ready = t + release
                for b in own:
                    n = left[b] - 1
                    left[b] = n
                    if not n:
                        where[b] = (vs - p.index, ready)
            t += duration
            for tier, transfer in layer_transfers:
                transfers[tier] = transfers.get(tier, 0.0) + transfer
        all_transfers += transfers.items()
    paid = [(b.reduce.time_s, b.reduce.tier, b.reduce.transfer_s) for b in p.buckets if b.reduce.time_s > 0]
    latest: dict[int, float] = {}
    for shift, offset in ([] if paid else where.values()):
        if offset > latest.get(shift, -math.inf):
            latest[shift] = offset
    return _Released(all_transfers, [(*where[b.index], b.reduce.time_s, b.index) for b in p.buckets], paid,
                     list(latest.items()))


def _run_pipeline(plan: StepPlan, max_operations: int | None = None) -> list[Outcome]:
    """The pipeline step: the schedule's max-plus recurrence, then each rank's reduction, sync, step, gather.

    With overlapped gradient reduction (torch DDP, ZeRO-1/2 under pipelines), a rank's reductions start during
    its last backward of a virtual stage (its *release*) and share its GPU with what it still runs. Nothing is
    in flight before a rank's first release, so the recurrence times every operation before it exactly, and
    the fluid engine runs the rest (the *tail*: the cool-down backwards from there, a few per rank) from
    the recurrence's state (:func:`simddp.sim.fluid.pipeline_tail`)."""
    from simddp.sim.step import bound_steps, record_pipeline_ends, reported_state

    par = plan.scenario.parallelism
    num_vs = par.pp * par.virtual_stages
    two = 2 * num_vs
    outs = [Outcome(r) for r in plan.ranks]
    gather = plan.p2p_gather.time_s if plan.p2p_gather is not None and plan.p2p_gather.time_s > 0 else 0.0
    gather_transfer = plan.p2p_gather.transfer_s if gather and plan.p2p_gather is not None else 0.0
    gather_tier = plan.p2p_gather.tier if plan.p2p_gather is not None else "intra"
    last_b = last_backwards(plan)
    m = plan.num_micro_batches
    overlapped = plan.rule.overlap and any(r.buckets for r in plan.ranks) and plan.scenario.dp > 1
    cut = [min(lb.values(), default=len(ops)) if overlapped else len(ops)  # where each rank's tail starts
           for lb, ops in zip(last_b, plan.ops, strict=True)]
    # Operations of each slot (2 virtual stage + 1 for a backward) the recurrence times: all m, less the tail's.
    every = [m] * two
    timed = [every] * len(outs)  # one row shared by the ranks without a tail (read only), a 1T pipeline's 64
    for r, ops in enumerate(plan.ops):
        if cut[r] < len(ops):
            timed[r] = list(every)
        for i in range(cut[r], len(ops)):
            op = ops[i]
            timed[r][2 * op.virtual_stage + (op.kind == "B")] -= 1
    # Per rank and slot: the time an operation holds its rank once it may start (its kernels and TP collectives
    # alone, then its blocking send). Everything but the waits is the same for each of the operations, so it
    # is booked once, times their number, below; the run books only the waits.
    per = [0.0] * two  # one row for every rank: a slot is one rank's, and each reads its own (periodic.Linear)
    # Twin ranks (the first of their kind's pass values, shifted by virtual stages) that time as many operations
    # of each slot and send over the same pairs book the same sums: the first of them books them, the others
    # copy its (fresh) outcome's dicts and its slots' holds (a 1T pipeline's 64 ranks book 3 or 4 kinds).
    twins: list[tuple[int, int]] | None = plan.cache.get("rank twins")  # build_plan's copies
    booked: dict[tuple[Any, ...], tuple[Outcome, list[tuple[int, float]]]] = {}
    p2p = plan.p2p
    for r, rp in enumerate(plan.ranks):
        out = outs[r]
        sig = None
        if twins is not None:
            sig = (twins[r][0], id(timed[r]), *[(vs - r, id(p2p.get(vs)), id(p2p.get(vs - 1)), vs > 0,
                                                 vs < num_vs - 1) for vs in rp.fwd_alone_s])
            got = booked.get(sig)
            if got is not None:
                first, holds = got
                out.acct, out.link_busy_s, out.link_work_s = (dict(first.acct), dict(first.link_busy_s),
                                                              dict(first.link_work_s))
                for shift, hold_s in holds:
                    per[shift + 2 * r] = hold_s
                continue
        acct, busy_s, work_s = out.acct, out.link_busy_s, out.link_work_s  # Outcome.add and .transfer, inline
        get = acct.get
        for vs in rp.fwd_alone_s:
            for kind, alone, busy, work, recompute in (
                    ("F", rp.fwd_alone_s[vs], rp.fwd_busy_s[vs], rp.fwd_work_s[vs], 0.0),
                    ("B", rp.bwd_alone_s[vs], rp.bwd_busy_s[vs], rp.bwd_work_s[vs], rp.bwd_recompute_s[vs])):
                slot = 2 * vs + (kind == "B")
                n = timed[r][slot]
                acct["compute"] = get("compute", 0.0) + n * (work - recompute)
                acct["recompute"] = get("recompute", 0.0) + n * recompute
                acct["interference"] = get("interference", 0.0) + n * (busy - work)
                acct["tp_comm"] = get("tp_comm", 0.0) + n * (alone - busy)
                received = vs > 0 if kind == "F" else vs < num_vs - 1
                if received and gather:
                    acct["tp_comm"] += n * gather
                    busy_s[gather_tier] += n * gather_transfer
                    work_s[gather_tier] += n * gather_transfer
                send = plan.p2p.get(vs if kind == "F" else vs - 1)
                sent = send.time_s if send is not None and send.time_s > 0 else 0.0
                if send is not None and sent:
                    acct["pipeline_p2p"] = get("pipeline_p2p", 0.0) + n * sent
                    busy_s[send.tier] += n * send.transfer_s
                    work_s[send.tier] += n * send.transfer_s
                per[slot] = alone + sent
        if sig is not None:
            booked[sig] = (out, [(2 * (vs - r) + b, per[2 * vs + b]) for vs in rp.fwd_alone_s for b in (0, 1)])
    hold = [per] * len(outs)
    zeros = [0.0] * two
    # Without overlap, each rank's last backward of a virtual stage releases its gradients (its start is kept:
    # watched, run.started); with it, the fluid tail runs them.
    step = Linear(pre=[zeros] * len(outs), mid=[[gather] * two] * len(outs), hold=hold, tail=[zeros] * len(outs),
                  extra=[{} for _ in outs], watch=None if overlapped else [last.values() for last in last_b])
    # The two bounds' schedules (simddp.sim.step._bounds) ride along: same operations, same traversal.
    serial, kernels = bound_steps(plan)
    run = ScheduleRun(plan.ops, num_vs, [step, serial, kernels], max_operations=max_operations)
    shape = steady(plan.ops, last_b)
    needed = _tail_needs(plan, cut) if overlapped else {}
    if shape is not None and needed:  # run the tail's inputs one by one, so that their times are kept
        limit = list(shape.limit)
        for r, position in needed.values():
            limit[r] = min(limit[r], position)
        shape = replace(shape, limit=limit)
    at_cut: dict[str, Any] = {}

    def keep() -> None:
        at_cut.update(clock=list(run.clock), waits=list(run.waits),
                      arrived={decode(c, num_vs): run.arrival[c][0] for c in needed})

    run.run(shape, cut if overlapped else None, keep)
    record_pipeline_ends(plan, run.clocks[1], run.clocks[2])
    plan.cache["jumped_units"] = run.jumped_units
    if overlapped:
        for out, w, st in zip(outs, at_cut["waits"], fluid.pipeline_tail(plan, cut, at_cut["clock"], at_cut["arrived"]),
                              strict=True):
            out.add("pipeline_wait", w)
            for key, seconds in st.acct.items():
                out.add(key, seconds)
            for tier, busy in st.link_busy_s.items():
                out.link_busy_s[tier] += busy
            for tier, work in st.link_work_s.items():
                out.link_work_s[tier] += work
            out.dp_comm_s += st.dp_comm_s
            out.ready_at.update(st.ready_at)
            out.reduced.update(st.reduced)
            out.compute_end_s, out.end_s = st.compute_end_s, st.end_s
        return outs
    for out, w in zip(outs, run.waits, strict=True):
        out.add("pipeline_wait", w)
    clock, started = run.clock, run.started
    seen: dict[int, tuple[float, float, list[tuple[str, float]]]] = {}
    # Each kind of rank's releases, worked out once: twin ranks share layer plans, buckets and the order of
    # their virtual stages' last backwards (keys: virtual stages less the rank's index).
    kinds: dict[tuple[int, int, int, tuple[int, ...]], _Released] = {}
    released: list[tuple[_Released, dict[int, float]]] = []  # per rank: its kind, its releases' starts
    for r, out in enumerate(outs):
        rp, last = out.plan, last_b[r]
        shifted: tuple[int, ...]  # the virtual stages, in the order of their last backwards, less the rank's index
        if len(last) == 1:  # one virtual stage (1F1B): nothing to order
            ((vs, i),) = last.items()
            order, shifted, mine = [vs], (vs - r,), {vs - r: started[(r, i)]}
        else:
            order = sorted(last, key=last.__getitem__)
            shifted, mine = tuple(map(r.__rsub__, order)), {vs - r: started[(r, last[vs])] for vs in order}
        kind_key = (id(rp.plans), id(rp.buckets), id(rp.bucket_of_layer), shifted)
        rel = kinds.get(kind_key)
        if rel is None:
            rel = kinds[kind_key] = _rank_releases(rp, plan.workload.rank_stage_positions(r, par.pp), order,
                                                   plan.overlap, plan.interference, seen)
        released.append((rel, mine))
        out.compute_end_s = clock[r]
        link_busy, link_work = out.link_busy_s, out.link_work_s
        for tier, transfer in rel.transfers:  # the releases' TP transfers (Outcome.transfer, inline)
            link_busy[tier] += transfer
            link_work[tier] += transfer
        # Buckets one after another on the DP stream: after the schedule, or (overlap on, with nothing to
        # reduce: a zero-cost reduction) each as soon as it is ready.
        for time_s, tier, transfer in rel.paid:
            out.dp_comm_s += time_s
            link_busy[tier] += transfer
            link_work[tier] += transfer
        if rel.paid:
            t = _reduce_buckets(rel.buckets, mine, 0.0 if rp.overlap else clock[r], rp.overlap)
        else:  # _reduce_buckets with no reduction taking time: the latest ready time, with overlap
            t = max([0.0, *[mine[shift] + offset for shift, offset in rel.latest]]) if rp.overlap else clock[r]
        _finish(out, max(t, clock[r]))
    # Only the reported rank's bucket times are read (simddp.sim.step._result): its ready and reduction times,
    # the same sums again.
    r = outs.index(reported_state(outs))
    rel, mine = released[r]
    out = outs[r]
    _reduce_buckets(rel.buckets, mine, 0.0 if out.plan.overlap else clock[r], out.plan.overlap, out)
    return outs


def _reduce_buckets(buckets: list[tuple[int, float, float, int]], starts: dict[int, float], t: float,
                    overlap: bool, out: Outcome | None = None) -> float:
    """When a rank's buckets are reduced, one after another from ``t`` on the DP stream (with ``overlap``, each
    once it is ready: its releasing backward's start in ``starts`` plus its offset): the last one's end. With
    ``out``, each bucket's ready time and (start, end) go into it."""
    ready_at, reduced = (out.ready_at, out.reduced) if out is not None else ({}, None)
    for shift, offset, time_s, index in buckets:
        ready = starts[shift] + offset
        if overlap and ready > t:
            t = ready
        start = t
        if time_s > 0:
            t += time_s
        if reduced is not None:
            ready_at[(0, index)] = ready
            reduced[(0, index)] = (start, t)
    return t


def _tail_needs(plan: StepPlan, cut: list[int]) -> dict[int, tuple[int, int]]:
    """The operations before the cut whose arrival an operation after it waits for: code -> (rank, position).

    The tail of 1F1B and interleaved 1F1B is cool-down backwards; each waits for the next virtual stage's
    backward of its micro-batch, which is in the tail too (1F1B) or just before it (interleaved)."""
    par = plan.scenario.parallelism
    num_vs = par.pp * par.virtual_stages
    needs: dict[int, tuple[int, int]] = {}
    for r, ops in enumerate(plan.ops):
        for i in range(cut[r], len(ops)):
            op = ops[i]
            if op.kind != "B":
                raise RuntimeError("a forward after a rank's first release")  # a schedule bug, not user input
            if op.virtual_stage == num_vs - 1:
                continue
            owner = (op.virtual_stage + 1) % par.pp
            theirs = plan.ops[owner]
            assert isinstance(theirs, Schedule)
            position = theirs.backward_position(op.micro_batch, op.virtual_stage + 1)
            if position < cut[owner]:
                needs[op_code(PipeOp("B", op.micro_batch, op.virtual_stage + 1), num_vs)] = (owner, position)
    return needs


__all__ = ["Outcome", "run", "supported"]
