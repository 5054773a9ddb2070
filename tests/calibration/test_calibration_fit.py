"""The least-squares fits of simddp.fit recover known constants, and the simulator reads them back."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simddp.collectives import BUSBW_FACTOR, fitted_s
from simddp.config import Cluster, CollectiveFit
from simddp.fit import (
    MAX_LOST_FRACTION,
    NO_OVERLAP_LOST_FRACTION,
    fit_collectives,
    fit_interference,
    fit_piecewise,
    interference_settings,
    ring_steps,
)
from simddp.profile import (
    MEASUREMENT_VERSION,
    CommCase,
    CommMeasurements,
    InterferenceCase,
    RunInfo,
    timing_stats,
)
from simddp.topology import group

SIZES = [2**k for k in range(10, 29)]  # 1 KiB .. 256 MiB
OPS = ("all-reduce", "reduce-scatter", "all-gather", "broadcast")


def ring_time(op: str, n: int, size: int, alpha: float, busbw: float) -> float:
    return ring_steps(op, n) * alpha + size * BUSBW_FACTOR[op](n) / busbw


def run_info(world: int = 2) -> RunInfo:
    return RunInfo(world_size=world, num_nodes=1, ranks_per_node=world, backend="gloo", device="cpu",
                   torch_version="2.13.0", num_threads=1, started_at="2026-01-01T00:00:00+00:00")


def cluster_with(fits: list[CollectiveFit], gpus_per_node: int) -> Cluster:
    return Cluster.model_validate({
        "preset": "dgx-a100-80gb", "num_nodes": 1, "gpus_per_node": gpus_per_node,
        "collective_fits": [f.model_dump() for f in fits],
    })


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_exact_alpha_beta_is_recovered(op: str, n: int) -> None:
    alpha, busbw = 15e-6, 3.2e9
    times = [ring_time(op, n, s, alpha, busbw) for s in SIZES]
    segments = fit_piecewise(op, n, SIZES, times)
    assert len(segments) == 1, "a single straight line needs no breakpoint"
    seg = segments[0]
    assert seg.latency_per_step_s == pytest.approx(alpha, rel=1e-6)
    assert 1 / seg.inv_bandwidth_s_per_byte == pytest.approx(busbw, rel=1e-6)
    assert seg.r2 == pytest.approx(1.0)
    assert seg.rel_rms < 1e-9


def test_noisy_fit_is_close_and_reports_its_residual() -> None:
    rng = np.random.default_rng(7)
    alpha, busbw, noise = 40e-6, 1.5e9, 0.03
    times = [ring_time("all-reduce", 2, s, alpha, busbw) * (1 + noise * rng.standard_normal()) for s in SIZES]
    seg = fit_piecewise("all-reduce", 2, SIZES, times, max_segments=1)[0]
    assert seg.latency_per_step_s == pytest.approx(alpha, rel=0.1)
    assert 1 / seg.inv_bandwidth_s_per_byte == pytest.approx(busbw, rel=0.05)
    assert seg.rel_rms == pytest.approx(noise, rel=0.5)
    assert seg.latency_stderr_s > 0 and seg.inv_bandwidth_stderr > 0


def test_protocol_change_is_found_as_a_breakpoint() -> None:
    # Below 64 KiB: low latency, low bandwidth (an LL-like protocol); above: the opposite.
    n, cut = 8, 64 * 1024
    small = (2e-6, 0.5e9)
    large = (12e-6, 20e9)
    times = [ring_time("all-reduce", n, s, *(small if s < cut else large)) for s in SIZES]
    segments = fit_piecewise("all-reduce", n, SIZES, times)
    assert len(segments) == 2
    lo, hi = segments
    assert SIZES[lo.hi - 1] < cut <= SIZES[hi.lo]
    assert lo.latency_per_step_s == pytest.approx(small[0], rel=1e-6)
    assert 1 / hi.inv_bandwidth_s_per_byte == pytest.approx(large[1], rel=1e-6)


def test_negative_latency_is_clipped_to_zero() -> None:
    # Pure bandwidth with a tiny negative offset: the fit must not return a negative alpha.
    times = [s / 1e9 - 1e-7 for s in SIZES[6:]]
    seg = fit_piecewise("broadcast", 2, SIZES[6:], times, max_segments=1)[0]
    assert seg.latency_per_step_s == 0.0
    assert 1 / seg.inv_bandwidth_s_per_byte == pytest.approx(1e9, rel=0.01)


def test_fit_needs_two_sizes_and_positive_times() -> None:
    with pytest.raises(ValueError, match="at least 2 message sizes"):
        fit_piecewise("all-reduce", 2, [1024], [1e-5])
    with pytest.raises(ValueError, match="must be > 0"):
        fit_piecewise("all-reduce", 2, [1024, 2048], [1e-5, 0.0])


@pytest.mark.parametrize("op", OPS)
def test_simulator_reads_the_fit_back_and_extrapolates_with_ring_steps(op: str) -> None:
    alpha, busbw, measured_n = 25e-6, 2.0e9, 2
    cases = [CommCase(op=op, group="world", tier="intra", num_ranks=measured_n, num_nodes=1, size_bytes=s,
                      stats=timing_stats([ring_time(op, measured_n, s, alpha, busbw)])) for s in SIZES]
    reports = fit_collectives(cases)
    fits = [r.fit for r in reports]
    for n in (2, 8, 128):
        g = group(cluster_with(fits, n), n)
        for s in (4096, 3 * 2**20, 2**28):
            t = fitted_s(op, s, g)
            assert t == pytest.approx(ring_time(op, n, s, alpha, busbw), rel=1e-6)


def test_segments_tile_the_sizes_without_gaps() -> None:
    n, cut = 2, 2**20
    times = [ring_time("all-reduce", n, s, *((5e-6, 1e9) if s < cut else (50e-6, 5e9))) for s in SIZES]
    cases = [CommCase(op="all-reduce", group="world", tier="intra", num_ranks=n, num_nodes=1, size_bytes=s,
                      stats=timing_stats([t])) for s, t in zip(SIZES, times, strict=True)]
    reports = fit_collectives(cases)
    assert len(reports) == 2
    assert reports[0].fit.min_bytes == 0
    assert reports[1].fit.min_bytes == reports[0].fit.max_bytes + 1
    assert reports[1].fit.max_bytes == SIZES[-1]
    for r in reports:
        for size, measured, fitted in r.points:
            assert fitted == pytest.approx(measured, rel=1e-6), size


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(1e-7, 1e-3), busbw=st.floats(1e8, 1e12), n=st.integers(2, 16))
def test_fit_recovers_any_exact_line(alpha: float, busbw: float, n: int) -> None:
    times = [ring_time("all-reduce", n, s, alpha, busbw) for s in SIZES]
    seg = fit_piecewise("all-reduce", n, SIZES, times, max_segments=1)[0]
    for s in (SIZES[0], SIZES[-1]):
        fitted = ring_steps("all-reduce", n) * seg.latency_per_step_s + s * BUSBW_FACTOR["all-reduce"](n) * (
            seg.inv_bandwidth_s_per_byte)
        assert fitted == pytest.approx(ring_time("all-reduce", n, s, alpha, busbw), rel=1e-6)


# ----------------------------------------------------------------------------------- interference
def interference(fractions: list[float]) -> CommMeasurements:
    cases = [InterferenceCase(size_bytes=2**20 * (k + 1), compute_alone_s=0.03, comm_alone_s=0.01,
                              both_s=0.03 + f * 0.01, comm_in_both_s=0.012, repeats=3, lost_fractions=[f, f, f])
             for k, f in enumerate(fractions)]
    return CommMeasurements(kind="simddp-comm", version=MEASUREMENT_VERSION, complete=True, run=run_info(),
                            cases=[], interference=cases)


def test_interference_factor_from_lost_share() -> None:
    fit = fit_interference(interference([0.2, 0.25, 0.3]))
    assert fit.lost_fraction == pytest.approx(0.25)
    assert fit.value == pytest.approx(0.25 / 0.75)
    assert fit.overlap


def test_interference_near_one_turns_overlap_off() -> None:
    fit = fit_interference(interference([0.9, 1.1, 1.3]))
    assert not fit.overlap
    assert fit.value == pytest.approx(MAX_LOST_FRACTION / (1 - MAX_LOST_FRACTION))
    assert "take turns" in fit.note


def test_interference_settings_are_monotonic_and_bounded() -> None:
    values = [interference_settings(f)[0] for f in np.linspace(-0.2, 1.5, 50)]
    assert all(b >= a for a, b in itertools.pairwise(values))
    assert max(values) == pytest.approx(MAX_LOST_FRACTION / (1 - MAX_LOST_FRACTION))
    assert interference_settings(NO_OVERLAP_LOST_FRACTION - 1e-9)[1] is True
    assert interference_settings(NO_OVERLAP_LOST_FRACTION)[1] is False


def test_missing_interference_is_zero() -> None:
    fit = fit_interference(interference([]))
    assert fit.value == 0.0 and fit.overlap and "not measured" in fit.note


def test_timing_stats_median_ignores_outliers() -> None:
    stats = timing_stats([1.0, 1.01, 0.99, 1.02, 0.98, 50.0])
    assert stats.median_s == pytest.approx(1.005)
    assert stats.num_outliers == 1
    assert stats.max_s == 50.0
    assert math.isfinite(stats.spread)


def test_inter_node_fits_record_their_nic_share() -> None:
    # 2 hosts x 4 ranks: the world group crosses nodes on all 4 local ranks' NICs (share 4/4), the
    # inter-node group (one rank per host, all 4 local groups at once) on 1/4 of them. A data-parallel group
    # with one rank per node then reads the world fit at 1/4 of its bus bandwidth.
    alpha, busbw = 20e-6, 8e9
    cases = []
    for name, n in (("world", 8), ("inter-node", 2)):
        cases += [CommCase(op="all-reduce", group=name, tier="inter", num_ranks=n, num_nodes=2, size_bytes=s,
                           stats=timing_stats([ring_time("all-reduce", n, s, alpha, busbw)])) for s in SIZES]
    fits = {r.group: r.fit for r in fit_collectives(cases, gpus_per_node=4)}
    assert (fits["world"].ranks_per_node, fits["world"].gpus_per_node) == (4, 4)
    assert (fits["inter-node"].ranks_per_node, fits["inter-node"].gpus_per_node) == (1, 4)
    c = Cluster.model_validate({"preset": "dgx-a100-80gb", "num_nodes": 2, "gpus_per_node": 4,
                                "collective_fits": [fits["world"].model_dump()]})
    one_per_node = group(c, 2, stride=4)
    size = 2**28
    expected = ring_time("all-reduce", 2, size, alpha, busbw / 4)
    assert fitted_s("all-reduce", size, one_per_node) == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------------------ jitter
def test_jitter_fit_recovers_a_lognormal_cv_per_rank() -> None:
    from conftest import compute_measurements

    from simddp.fit import fit_jitter
    from simddp.variability import lognormal_params

    rng = np.random.default_rng(0)
    mu, sigma = lognormal_params(0.12)
    # Two ranks, one steadily 30% slower (not jitter), a few far-out steps a shared machine adds.
    ranks = [list(0.05 * rng.lognormal(mu, sigma, 1500)), list(0.065 * rng.lognormal(mu, sigma, 1500))]
    ranks[0][:10] = [1.0] * 10
    compute = compute_measurements().model_copy(update={"rank_step_times_s": ranks})
    fit = fit_jitter(compute)
    assert fit is not None and fit.num_samples == 3000
    assert fit.cv == pytest.approx(0.12, rel=0.08)
    assert fit_jitter(compute_measurements()) is None  # no per-rank times: nothing to fit


def test_profile_carries_jitter_and_graph_search_into_the_scenario() -> None:
    from conftest import comm_measurements, compute_measurements

    from simddp.fit import fit_profile
    from simddp.scenario_io import scenario_from_dict
    from simddp.variability import simulate_tails

    rng = np.random.default_rng(1)
    compute = compute_measurements().model_copy(update={
        "rank_step_times_s": [list(0.0574 * rng.lognormal(0, 0.05, 200)) for _ in range(2)],
        "num_autograd_nodes": 400, "graph_search": timing_stats([200e-6, 210e-6, 190e-6])})
    profile = fit_profile(comm_measurements(), compute)
    keys = profile.scenario_defaults()
    assert keys["variability"]["jitter_cv"] == pytest.approx(profile.jitter.cv)  # type: ignore[union-attr]
    assert keys["cluster"]["autograd_node_traversal_s"] == pytest.approx(200e-6 / 400)
    assert keys["model"]["num_autograd_nodes"] == 400
    scenario = scenario_from_dict({**keys, "parallelism": {"dp": 2}})
    assert simulate_tails(scenario, 50).mean_s > simulate_tails(
        scenario.model_copy(update={"variability": scenario.variability.model_copy(update={"jitter_cv": 0.0})}),
        50).mean_s


def test_merge_pools_each_ranks_steps() -> None:
    from conftest import compute_measurements

    from simddp.profile import merge_measurements

    a = compute_measurements().model_copy(update={"rank_step_times_s": [[1.0, 2.0], [3.0]]})
    b = compute_measurements().model_copy(update={"rank_step_times_s": [[4.0], [5.0, 6.0]]})
    assert merge_measurements([a, b]).rank_step_times_s == [[1.0, 2.0, 4.0], [3.0, 5.0, 6.0]]
