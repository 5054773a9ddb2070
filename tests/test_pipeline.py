"""Pipeline schedules (GPipe, 1F1B, Megatron interleaved) and tensor-parallel communication timing."""

from __future__ import annotations

import pytest
from scenarios import base_scenario

from simddp import ScenarioError, simulate
from simddp.compute import memory_s
from simddp.config import deep_merge
from simddp.scenario_io import scenario_from_dict
from simddp.sim.pipeline import interleaved_1f1b, makespan, one_f_one_b, schedule


def _makespan(name: str, p: int, m: int, v: int, tf: float, tb: float, p2p: float = 0.0) -> float:
    ops = [schedule(name, p, m, r, v) for r in range(p)]
    return max(makespan(ops, p * v, lambda r, op: (tf if op.kind == "F" else tb) / v, lambda op: p2p))


@pytest.mark.parametrize(("name", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)])
@pytest.mark.parametrize(("p", "m"), [(2, 6), (4, 4), (4, 8), (8, 16)])
def test_bubble_fraction_matches_narayanan(name: str, v: int, p: int, m: int) -> None:
    # Narayanan et al. SC'21: bubble = (p - 1) / m, and (p - 1) / (v m) with interleaving.
    if name.startswith("interleaved") and m % p:
        pytest.skip("interleaving needs m % p == 0")
    ideal = m * (1.0 + 2.0)
    assert _makespan(name, p, m, v, 1.0, 2.0) == pytest.approx(ideal * (1 + (p - 1) / (v * m)))


def test_p2p_delays_the_pipeline() -> None:
    # 1F1B with send/recv time c: the fill and drain cross (p-1) boundaries each way (lower bound), and in
    # the steady state stage 0's p in-flight micro-batches must cover a round trip with 2(p-1) hops,
    # adding at most 2(p-1)c/p per micro-batch (upper bound).
    p, m, c = 4, 8, 0.1
    base = _makespan("1f1b", p, m, 1, 1.0, 2.0)
    slowed = _makespan("1f1b", p, m, 1, 1.0, 2.0, p2p=c)
    assert base + 2 * (p - 1) * c <= slowed <= base + 2 * (p - 1) * c + m * 2 * (p - 1) * c / p + 1e-9


def test_1f1b_order_and_in_flight_limit() -> None:
    ops = one_f_one_b(4, 8, 0)
    assert [(o.kind, o.micro_batch) for o in ops[:5]] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    in_flight = peak = 0
    for o in ops:
        in_flight += 1 if o.kind == "F" else -1
        peak = max(peak, in_flight)
    assert peak == 4  # the first stage holds p micro-batches (Korthikanti et al. 2022)


def test_interleaved_matches_megatron_warmup() -> None:
    # Megatron: warm-up = 2 (p - rank - 1) + (v - 1) p forwards; chunk of the k-th forward = (k % pv) // p.
    ops = interleaved_1f1b(4, 8, 1, 2)
    warmup = 2 * (4 - 1 - 1) + (2 - 1) * 4
    assert all(o.kind == "F" for o in ops[:warmup]) and ops[warmup + 1].kind == "B"
    assert [o.virtual_stage for o in ops[:8]] == [1, 1, 1, 1, 5, 5, 5, 5]
    with pytest.raises(ValueError, match="multiple of pp"):
        interleaved_1f1b(4, 6, 0, 2)


def _uniform(pp: int, m: int, schedule_name: str = "1f1b", v: int = 1) -> dict:
    layers = 8
    return {
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "model": {
            "parameters": [{"name": f"w{i}", "numel": 1024} for i in range(layers)],
            "layers": [{"name": f"l{i}", "param_indices": [i], "fwd_time_s": 1e-3, "bwd_time_s": 2e-3}
                       for i in range(layers)],
        },
        "parallelism": {"pp": pp, "dp": 8 // pp, "pipeline_schedule": schedule_name, "virtual_stages": v},
        "training": {"precision": "fp32", "optimizer": "sgd", "seq_len": 1, "micro_batch_size": 1,
                     "global_batch_size": m * (8 // pp)},
    }


def test_simulated_pipeline_step_has_the_bubble() -> None:
    p, m = 4, 8
    data = _uniform(p, m)
    r = simulate(data)
    # two layers of 1 + 2 ms on each stage; torch's autograd adds each 1024-element fp32 gradient to the
    # accumulated one in micro-batches 2..m (read two, write one), averaged over the m
    gpu = scenario_from_dict(data).cluster.gpu
    per_micro_stage = 2 * (3e-3 + (m - 1) / m * memory_s(3 * 1024 * 4, gpu))
    assert r.compute_time_s == pytest.approx(m * per_micro_stage)
    assert r.pipeline_bubble_time_s == pytest.approx((p - 1) * per_micro_stage, rel=1e-6)
    assert r.step_time_s >= (m + p - 1) * per_micro_stage
    assert r.reported_rank.startswith("pipeline stage")


def test_interleaving_shrinks_the_bubble() -> None:
    plain = simulate(_uniform(4, 8))
    inter = simulate(_uniform(4, 8, "interleaved-1f1b", 2))
    assert inter.pipeline_bubble_time_s == pytest.approx(plain.pipeline_bubble_time_s / 2, rel=1e-6)
    assert inter.step_time_s < plain.step_time_s


def test_interleaved_needs_micro_batches_multiple_of_pp() -> None:
    bad = _uniform(4, 6, "interleaved-1f1b", 2)
    with pytest.raises(ScenarioError, match=r"interleaved-1f1b needs the micro-batches per step \(6"):
        simulate(bad)


def test_tensor_parallel_collectives_are_timed() -> None:
    none = simulate(deep_merge(base_scenario(), {"parallelism": {"tp": 2, "tp_comm_overlap": "none"}}))
    tp2 = simulate(deep_merge(base_scenario(), {"parallelism": {"tp": 2}}))
    # Blocking, every TP collective waits: all of it shows; Megatron's backward overlap hides some.
    assert none.tp_comm_time_s == pytest.approx(none.tp_comm_total_s, rel=1e-9)
    assert 0 < tp2.tp_comm_time_s < tp2.tp_comm_total_s == pytest.approx(none.tp_comm_total_s)
    assert tp2.step_time_s < none.step_time_s
    # Sequence parallelism: reduce-scatter + all-gather for each all-reduce, plus the backward all-gather of
    # the layer input for the weight gradient (Korthikanti et al. 2022).
    sp = simulate(deep_merge(base_scenario(), {"parallelism": {"tp": 2, "sequence_parallel": True}}))
    assert sp.tp_comm_total_s > tp2.tp_comm_total_s
    full = simulate(deep_merge(base_scenario(), {"parallelism": {"tp": 2}, "training": {"recompute": "full"}}))
    assert tp2.tp_comm_total_s < full.tp_comm_total_s < 2 * tp2.tp_comm_total_s


def test_recompute_costs_time() -> None:
    none = simulate(base_scenario())
    sel = simulate(deep_merge(base_scenario(), {"training": {"recompute": "selective"}}))
    full = simulate(deep_merge(base_scenario(), {"training": {"recompute": "full"}}))
    assert none.compute_time_s < sel.compute_time_s < full.compute_time_s
    assert full.mfu < none.mfu  # recompute FLOP are not model FLOP


@pytest.mark.parametrize(("name", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)])
@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 2), (2, 6), (3, 9), (4, 4), (4, 8), (8, 16), (8, 64)])
def test_schedules_computed_on_access_equal_the_lists(name: str, v: int, p: int, m: int) -> None:
    """The engines read a :class:`Schedule` by position, in codes and through last_backward's closed form:
    each must be what the list functions give."""
    from simddp.sim.pipeline import gpipe, last_backward, op_code

    if name.startswith("interleaved") and m % p:
        pytest.skip("interleaving needs m % p == 0")
    for r in range(p):
        lazy = schedule(name, p, m, r, v)
        ops = (gpipe(p, m, r) if name == "gpipe" else one_f_one_b(p, m, r) if name == "1f1b"
               else interleaved_1f1b(p, m, r, v))
        assert list(lazy) == ops
        codes = [op_code(op, p * v) for op in ops]
        n = len(ops)
        for a, b in ((0, n), (0, n // 3), (n // 3, n), (n // 2, n // 2 + 5), (n - 1, n)):
            assert lazy.codes(a, min(b, n)) == codes[a:min(b, n)]
        for a in range(n):  # every start: a pair's forward or its backward first, across each phase's ends
            for width in (1, 2, 7):  # one operation, a frontier's pair (1F1B has a path of its own), a run
                assert lazy.codes(a, min(a + width, n)) == codes[a:a + width]
        assert list(last_backward(lazy, v).items()) == list(last_backward(ops, v).items())  # order too
        assert list(last_backward(lazy, v).items()) == list(last_backward(ops).items())
