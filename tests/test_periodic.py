"""The periodic extension of pipeline schedules (issue 10) equals running every operation.

:class:`simddp.sim.periodic.ScheduleRun` jumps over the repeating steady state of 1F1B and interleaved 1F1B;
here it must give the same end times as :func:`simddp.sim.pipeline.makespan` (the plain recurrence over every
operation) for arbitrary per-(rank, kind, virtual stage) durations and send times, and the fast engine must
equal the simpy simulation on pipelines long enough to jump.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fast import _equal

from simddp import simulate
from simddp.scenario_io import scenario_from_dict
from simddp.sim import build_plan, periodic
from simddp.sim.periodic import Linear, ScheduleRun, _cut_pairs, steady
from simddp.sim.pipeline import PipeOp, makespan, schedule

durations = st.floats(min_value=0.05, max_value=3.0, allow_nan=False)


@st.composite
def schedules(draw: st.DrawFn) -> tuple[str, int, int, int, dict, float]:
    name = draw(st.sampled_from(["1f1b", "interleaved-1f1b"]))
    p = draw(st.integers(2, 6))
    v = draw(st.integers(2, 3)) if name == "interleaved-1f1b" else 1
    m = p * draw(st.integers(2, 12))
    # Stages differ (embedding on the first, the head on the last): a duration per (rank, kind, stage).
    times = {(r, kind, vs): draw(durations) for r in range(p) for kind in "FB" for vs in range(r, p * v, p)}
    return name, p, m, v, times, draw(st.sampled_from([0.0, 0.01, 0.3]))


def _linear(p: int, v: int, times: dict, send: float) -> Linear:
    """The recurrence as the runner takes it (:class:`Linear`): the send as the dependency's delay (``pre``),
    durations by slot (2 virtual stage + 1 for a backward)."""
    two = 2 * p * v
    hold = [[0.0] * two for _ in range(p)]
    for (r, kind, vs), t in times.items():
        hold[r][2 * vs + (kind == "B")] = t
    zeros = [[0.0] * two for _ in range(p)]
    return Linear(pre=[[send] * two for _ in range(p)], mid=zeros, hold=hold, tail=zeros, extra=[{} for _ in range(p)])


def _runs(name: str, p: int, m: int, v: int, times: dict, send: float) -> tuple[list[float], ScheduleRun]:
    """The plain recurrence over every operation (:func:`makespan`), and the runner's extended run."""
    ops = [schedule(name, p, m, r, v) for r in range(p)]

    def duration(r: int, op: PipeOp) -> float:
        return times[(r, op.kind, op.virtual_stage)]

    reference = makespan(ops, p * v, duration, lambda op: send)
    run = ScheduleRun(ops, p * v, [_linear(p, v, times, send)])
    run.run(steady(ops))
    return reference, run


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_extension_equals_every_operation(case: tuple) -> None:
    reference, run = _runs(*case)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(run.clock, reference, strict=True))


@settings(max_examples=150, deadline=None)
@given(schedules(), st.sampled_from([1, 3, 4]))
def test_cuts_compared_at_any_spacing_give_the_same_times(case: tuple, cuts: int) -> None:
    """Cuts 1, 3 or 4 per unit instead of 2 (periodic.CUTS_PER_UNIT): the repeat is found at another cut and the
    jump goes from another, and the times are the plain run's all the same."""
    name, p, m, v, times, send = case
    plain = ScheduleRun([schedule(name, p, m, r, v) for r in range(p)], p * v, [_linear(p, v, times, send)])
    plain.run(None)  # every operation one by one
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(periodic, "CUTS_PER_UNIT", cuts)
        _, run = _runs(*case)
    for ours, theirs in ((run.clock, plain.clock), (run.waits, plain.waits)):
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(ours, theirs, strict=True))


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_arrivals_kept_in_a_list_or_a_dict_give_the_same_run(case: tuple) -> None:
    """The runner keeps arrivals in a list indexed by op code where the codes are few, else in a dict; both give
    the same times to the bit, as does a run of plain operation lists (their codes counted from the operations)."""
    name, p, m, v, times, send = case
    ops = [schedule(name, p, m, r, v) for r in range(p)]
    _, listed = _runs(*case)
    assert isinstance(listed.arrival, list) and len(listed.arrival) == 2 * p * v * m
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(periodic, "_LIST_CODES", 0)
        _, keyed = _runs(*case)
    assert isinstance(keyed.arrival, dict)
    assert keyed.clocks == listed.clocks and keyed.waits == listed.waits
    plain = ScheduleRun([list(o) for o in ops], p * v, [_linear(p, v, times, send)])
    plain.run(None)
    assert isinstance(plain.arrival, list) and len(plain.arrival) == 2 * p * v * m
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(plain.clock, listed.clock, strict=True))


def test_long_schedules_jump_over_most_of_the_steady_state() -> None:
    # 1F1B, 8 stages, 256 micro-batches, unequal stages: the state repeats within a few units.
    times = {(r, k, r): (1.0 + 0.3 * (r == 0) + 0.5 * (r == 7)) * (1 if k == "F" else 2) for r in range(8)
             for k in "FB"}
    reference, run = _runs("1f1b", 8, 256, 1, times, 0.01)
    assert math.isclose(max(run.clock), max(reference), rel_tol=1e-12)
    assert run.jumped_units >= 240
    times = {(r, k, vs): 1.0 + 0.1 * vs for r in range(4) for k in "FB" for vs in range(r, 12, 4)}
    reference, run = _runs("interleaved-1f1b", 4, 64, 3, times, 0.02)
    assert math.isclose(max(run.clock), max(reference), rel_tol=1e-12)
    assert run.jumped_units >= 12  # units of p v = 12 pairs: 144 of rank 0's 178 steady pairs


def test_schedules_without_a_steady_state_run_whole() -> None:
    ops = [schedule("gpipe", 4, 16, r) for r in range(4)]
    assert steady(ops) is None
    ops = [schedule("interleaved-1f1b", 4, 4, r, 2) for r in range(4)]  # m == p: all warm-up
    assert steady(ops) is None


@st.composite
def long_pipelines(draw: st.DrawFn) -> dict:
    tp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([2, 4]))
    schedule_name = draw(st.sampled_from(["1f1b", "interleaved-1f1b"]))
    v = draw(st.sampled_from([2, 3])) if schedule_name == "interleaved-1f1b" else 1
    micro = pp * draw(st.sampled_from([6, 10, 16]))
    nodes = draw(st.sampled_from([1, 2]))
    dp = nodes * 8 // (tp * pp)
    return {
        "cluster": {"preset": draw(st.sampled_from(["dgx-a100-80gb", "dgx-h100-80gb"])), "num_nodes": nodes,
                    "comm_compute_interference": draw(st.sampled_from([0.0, 0.189]))},
        "model": {"transformer": {"num_layers": 12, "hidden_size": 512, "num_heads": 8, "ffn_hidden_size": 2048,
                                  "vocab_size": 32000, "tied_embeddings": draw(st.booleans())}},
        "parallelism": {"tp": tp, "pp": pp, "pipeline_schedule": schedule_name, "virtual_stages": v,
                        "sequence_parallel": tp > 1 and draw(st.booleans())},
        "training": {"micro_batch_size": 1, "global_batch_size": micro * dp, "seq_len": 512,
                     "recompute": draw(st.sampled_from(["none", "selective", "full"]))},
        # torch DDP overlaps its reduction with the last backwards: the fast engine's tail in simpy, from the
        # recurrence's state (after the jump); Megatron reduces after the schedule.
        "ddp": draw(st.sampled_from([{"implementation": "megatron", "overlap": False}, {"implementation": "torch"}])),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_pipelines())
def test_fast_engine_equals_simpy_on_long_pipelines(data: dict) -> None:
    from simddp.sim import fast

    plan = build_plan(scenario_from_dict(data))
    assert fast.supported(plan)
    quick = fast.run(plan)
    exact = simulate(data, trace=False, exact=True)
    _equal(quick.model_dump(exclude={"trace"}), exact.model_dump(exclude={"trace"}))
    # 1F1B from 10 micro-batches per stage repeats and is extended. (Interleaved may not within the step: a
    # rank with less work per unit can spend the whole step using up the lead its longer warm-up gave it, its
    # clock advancing at another rate than its neighbours'; then no cut repeats up to one constant, and the
    # run goes operation by operation, as it must.)
    pp = plan.scenario.parallelism.pp
    if data["parallelism"]["pipeline_schedule"] == "1f1b" and plan.num_micro_batches >= 10 * pp:
        assert plan.cache["jumped_units"] > 0


def test_the_fast_engine_answers_pipelines_past_the_simulation_cap() -> None:
    # 10^10 micro-batches: the simpy engine (a trace) is refused; the fast engine extends the steady state and
    # its step per micro-batch is the long-run one of a million micro-batches.
    from simddp import ScenarioError

    def scenario(batch: int) -> dict:
        return {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
                "model": {"transformer": {"num_layers": 8, "hidden_size": 512, "num_heads": 8,
                                          "ffn_hidden_size": 2048, "vocab_size": 32000}},
                "parallelism": {"pp": 2}, "training": {"micro_batch_size": 1, "global_batch_size": batch,
                                                       "seq_len": 512}, "ddp": {"overlap": False}}
    huge = simulate(scenario(8 * 10**10), trace=False)
    assert huge.num_micro_batches == 10**10
    million = simulate(scenario(8 * 10**6), trace=False)
    assert huge.step_time_s / 10**10 == pytest.approx(million.step_time_s / 10**6, rel=1e-5)
    with pytest.raises(ScenarioError, match="over the limit of 131,072"):
        simulate(scenario(8 * 10**10))


def test_a_runner_refuses_to_run_more_operations_one_by_one_than_allowed() -> None:
    # What bounds the fast engine when a schedule does not repeat soon enough (an interleaved rank can use up
    # its warm-up lead over the whole step): it raises instead of running more one by one than it may (one
    # fewer than this schedule needs), and runs when allowed as many.
    from simddp.sim.periodic import TooManyOperations

    ops = [schedule("interleaved-1f1b", 4, 64, r, 2) for r in range(4)]
    times = {(r, k, vs): (0.5 if r == 0 else 1.0) for r in range(4) for k in "FB" for vs in range(r, 8, 4)}
    step = _linear(4, 2, times, 0.0)

    allowed = ScheduleRun(ops, 8, [step], max_operations=sum(len(o) for o in ops))
    allowed.run(steady(ops))
    assert allowed.jumped_units > 0  # it repeats: 192 of its 1,024 operations run one by one
    with pytest.raises(TooManyOperations):
        ScheduleRun(ops, 8, [step], max_operations=allowed.ran - 1).run(steady(ops))
    ScheduleRun(ops, 8, [step], max_operations=allowed.ran).run(steady(ops))


def test_interleaved_cuts_are_phased_to_end_where_the_steady_pairs_do() -> None:
    # GPT-3's layout (p 8, v 3, 64 micro-batches; a unit is 24 pairs): the last cut is at 162 pairs (Steady.phase:
    # the least room past its offset, 162 pairs, mod 24 is 18). Cuts half a unit apart (6, 18, 30, ...) find the
    # repeat between 6 and 30 pairs, and the jump goes from the cut at 18 (run on the way), six units, to 162,
    # where rank 0's steady pairs end. One by one: the warm-up forwards and cool-down backwards (184 each), the
    # pairs before the cut at 30 (8 x 30 + the offsets' 28) and rank r's r pairs left after the jump:
    # 368 + 2 (8 x 30 + 28) + 2 x 28 = 960 of 3,072 operations (1,152 comparing only the cuts at 18 and 42, as
    # before 2026-11-29; 1,536 with unphased cuts at 24 and 48 pairs, 18 + r pairs left after).
    p, v, m = 8, 3, 64
    times = {(r, k, vs): (1.0 + 0.3 * (r == 0) + 0.5 * (r == p - 1)) * (1 if k == "F" else 2)
             for r in range(p) for k in "FB" for vs in range(r, p * v, p)}
    reference, run = _runs("interleaved-1f1b", p, m, v, times, 0.01)
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(run.clock, reference, strict=True))
    shape = steady([schedule("interleaved-1f1b", p, m, r, v) for r in range(p)])
    assert shape is not None and (shape.unit, shape.phase, shape.max_units) == (24, 18, 6)
    assert list(_cut_pairs(shape)) == list(range(6, 163, 12))
    assert run.detected_at == (30, 1)  # the cuts at 6 and 30 pairs compared
    assert run.jumped_units == 6 and run.ran == 960
    with pytest.MonkeyPatch.context() as mp:  # a unit apart, the repeat is found between 18 and 42
        mp.setattr(periodic, "CUTS_PER_UNIT", 1)
        _, whole = _runs("interleaved-1f1b", p, m, v, times, 0.01)
    assert whole.detected_at == (42, 1) and whole.jumped_units == 5 and whole.ran == 1152
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(whole.clock, run.clock, strict=True))


def test_1f1b_ranks_jump_to_their_drains() -> None:
    # Rank r of 1F1B jumps r units further than rank 0 (simddp.sim.periodic._moves): what runs one by one is the
    # warm-up forwards, the units compared, about one pair per rank and the drain's backwards, not the r extra
    # steady pairs rank r would have left after a common cut (p (p - 1) more operations).
    p, m = 16, 256
    times = {(r, k, r): (1.0 + 0.3 * (r == 0) + 0.5 * (r == p - 1) + 0.01 * r) * (1 if k == "F" else 2)
             for r in range(p) for k in "FB"}
    reference, run = _runs("1f1b", p, m, 1, times, 0.01)
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(run.clock, reference, strict=True))
    warm_up = drain = p * (p - 1) // 2
    assert run.detected_at is not None
    units = run.detected_at[0]
    assert run.ran <= warm_up + drain + 2 * p * (units + 1)


@st.composite
def twin_pipelines(draw: st.DrawFn) -> tuple[int, int, dict, float]:
    """1F1B pipelines whose middle ranks are alike: one to three ranks differ at each end (the first holds the
    embedding, the last the head; a layer count that does not divide evenly leaves another)."""
    p = draw(st.integers(3, 12))
    m = draw(st.integers(1, 3 * p))
    head, tail = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ends = {(r, kind): draw(durations) for r in {*range(head), *range(p - tail, p)} for kind in "FB"}
    middle = {kind: draw(durations) for kind in "FB"}
    times = {(r, kind, r): ends.get((r, kind), middle[kind]) for r in range(p) for kind in "FB"}
    return p, m, times, draw(st.sampled_from([0.0, 0.01, 0.3]))


@settings(max_examples=200, deadline=None)
@given(twin_pipelines())
def test_twin_warm_ups_and_drains_are_shifts_of_one_rank(case: tuple) -> None:
    # The 1F1B warm-ups and drains of alike middle ranks are timed as shifts of one rank's
    # (ScheduleRun._shift_warmups, _shift_drains): the clocks equal the plain recurrence, and clocks and waits
    # the runner's own operation-by-operation run.
    p, m, times, send = case
    reference, run = _runs("1f1b", p, m, 1, times, send)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(run.clock, reference, strict=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScheduleRun, "_shift_warmups", lambda self, warm: None)
        patch.setattr(ScheduleRun, "_shift_drains", lambda self, warm: None)
        _, whole = _runs("1f1b", p, m, 1, times, send)
    assert whole.shifted == 0
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(run.clock, whole.clock, strict=True))
    assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(run.waits, whole.waits, strict=True))


def test_twin_warm_ups_and_drains_skip_most_operations() -> None:
    # 16 stages, the last heavier: ranks 1-14 are twins. Warm-ups: with a heavier first stage, rank 1 waits for
    # each forward, its times are rank 0's plus a constant, and ranks 2-14's warm-ups are shifts of rank 1's;
    # with a lighter one, rank 1 runs its forwards back to back after its first wait, and the shifts start at
    # rank 3. Drains: rank 13's backwards (from its last steady one) are rank 14's plus a constant, and ranks
    # 12 down to 1 take theirs from it, all but the last (w_r = p - r - 1 each, the first two timed to check).
    p = 16
    for first, base in ((1.3, 1), (0.7, 2)):
        times = {(r, k, r): (1.0 + (first - 1.0) * (r == 0) + 0.5 * (r == p - 1)) * (1 if k == "F" else 2)
                 for r in range(p) for k in "FB"}
        reference, run = _runs("1f1b", p, 64, 1, times, 0.01)
        assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(run.clock, reference, strict=True))
        warm_ups = sum(p - r - 1 for r in range(base + 1, p - 1))
        drains = sum(p - r - 1 for r in range(1, p - 3))
        assert run.shifted == warm_ups + drains
