"""A layer alone on a GPU: the closed form the engine uses equals the simpy layer processes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simddp.collectives import CollectiveCost
from simddp.compute import LayerTiming
from simddp.sim.layers import LayerPlan, overlapped_s, pass_alone, pass_alone_simulated
from simddp.sim.resources import _EPS_S


def _cost(time_s: float, latency_frac: float) -> CollectiveCost:
    return CollectiveCost("all-reduce", 1 << 20, 8, "ring", "Simple", time_s, time_s * latency_frac, "intra")


costs = st.lists(st.builds(_cost, st.floats(0.0, 2e-3), st.floats(0.0, 1.0)), max_size=3).map(tuple)


@st.composite
def layer_plans(draw: st.DrawFn) -> LayerPlan:
    t = LayerTiming("l", draw(st.floats(0, 3e-3)), draw(st.floats(0, 3e-3)), draw(st.floats(0, 3e-3)),
                    recompute_s=draw(st.sampled_from([0.0, 1e-3])))
    return LayerPlan(t, fwd_pre=draw(costs), fwd_post=draw(costs), bwd_pre=draw(costs), dgrad_post=draw(costs),
                     wgrad_pre=draw(costs), recompute_comm=draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(plans=st.lists(layer_plans(), min_size=1, max_size=4), overlap=st.sampled_from(["none", "backward", "full"]),
       kind=st.sampled_from(["F", "B"]), interference=st.sampled_from([0.0, 0.189, 0.7]))
def test_closed_form_equals_simpy(plans, overlap, kind, interference) -> None:
    fast = pass_alone(plans, overlap, kind, interference)
    ref = pass_alone_simulated(plans, overlap, kind, interference)
    # simpy's streams count work of at most _EPS_S (1e-15 s) left as done (resources.py); slowed by
    # interference (up to 1.7x) that is up to 1.7e-15 s a kernel, over at most 4 layers.
    tiny = 4 * 1.7 * _EPS_S
    assert fast[0] == pytest.approx(ref[0], rel=1e-9, abs=tiny)
    assert fast[1] == pytest.approx(ref[1], rel=1e-9, abs=tiny)


def test_overlap_by_hand() -> None:
    # 2 ms of kernels beside 1 ms of collectives at i = 0.5: 1 ms at 2/3 speed does 2/3 ms of work, the
    # remaining 4/3 ms at full speed: done at 7/3 ms.
    assert overlapped_s(2e-3, 1e-3, 0.5) == pytest.approx(7e-3 / 3)
    assert overlapped_s(1e-3, 2e-3, 0.5) == pytest.approx(1.5e-3)  # slowed throughout
