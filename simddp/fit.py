"""Fit a :class:`~simddp.profile.CalibrationProfile` from collector measurements (numpy least squares).

Collectives (alpha-beta per op and link tier). The model is the one :func:`simddp.collectives.fitted_s`
evaluates: time = steps(n) x alpha + data(n) x size / busbw, with ring step counts (all-reduce 2(n-1),
the others n-1) and nccl-tests data factors (all-reduce 2(n-1)/n, reduce-scatter and all-gather
(n-1)/n, broadcast 1). Fitting in those units is what lets a fit made on n ranks predict another world
size. The least squares are weighted by 1/time, so that a 1 KiB and a 256 MiB message count alike
(relative residuals); alpha >= 0 and 1/busbw >= 0 are enforced by dropping a term that comes out
negative. Libraries change protocol or algorithm with the message size (NCCL LL -> LL128 -> Simple,
gloo's ring vs. halving-doubling), so the sizes are split into up to three contiguous segments, each
with its own fit; the split is the one with the lowest BIC (Schwarz 1978) over relative residuals, each
segment holding at least ``MIN_POINTS`` sizes. Each segment reports R², the relative RMS residual and
the standard errors of alpha and 1/busbw (from the weighted residual variance and (XᵀWX)⁻¹).

Compute: per-layer medians of the measured forward and backward times (see ``simddp_calibration.compute``),
the measured optimizer step, and a host overhead of the rest of the step plus the Reducer's own work.

Interference: ``i = f / (1 - f)`` from the median share ``f`` of a collective's time that compute loses
beside it (:class:`~simddp.profile.InterferenceCase`), clipped to ``f <= MAX_LOST_FRACTION``.

Consistency. :func:`fit_profile` refuses, naming the file and the measurement, what would give a profile
with made-up numbers: a collector run that stopped early, no all-reduce fit on the tier the world group
crosses (fewer than 2 message sizes), no measured device rates, comm and compute files from different
numbers of ranks per node, one collective measured at several numbers of ranks, a non-positive time.
``allow_partial`` writes the profile anyway with every placeholder listed in its notes as
``PLACEHOLDER: ...``; ``allow_mixed`` accepts mixed world sizes (fitting the most measured rank count).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from simddp.collectives import BUSBW_FACTOR
from simddp.config import CollectiveFit, ScenarioError, format_validation_error
from simddp.limits import MAX_COMM_SIZES
from simddp.profile import (
    PROFILE_VERSION,
    CalibrationProfile,
    CommCase,
    CommMeasurements,
    ComputeMeasurements,
    FitReport,
    InterferenceFit,
    JitterFit,
    layer_specs,
    parameter_specs,
)
from simddp.units import TFLOP

MIN_POINTS = 3
MAX_SEGMENTS = 3
MAX_LOST_FRACTION = 0.95
#: At or above this lost share the profile turns DDP overlap off (see :func:`fit_interference`).
NO_OVERLAP_LOST_FRACTION = 0.5
#: 1/busbw when a segment shows no bandwidth term at all (flat, latency-bound): 1e18 bytes/s.
NO_BANDWIDTH_TERM = 1e-18


def ring_steps(op: str, num_ranks: int) -> int:
    """Latency steps of the ring (or chain) algorithm, as :func:`simddp.collectives.fitted_s` counts them."""
    return 2 * (num_ranks - 1) if op == "all-reduce" else num_ranks - 1


@dataclass(frozen=True)
class Segment:
    """One alpha-beta segment of a piecewise fit."""

    lo: int  # index of the first point
    hi: int  # index one past the last point
    latency_per_step_s: float
    inv_bandwidth_s_per_byte: float
    latency_stderr_s: float
    inv_bandwidth_stderr: float
    rel_rms: float
    r2: float
    rel_sse: float


def _nnls_coef(x_steps: np.ndarray, x_bytes: np.ndarray, t: np.ndarray, lo: int,
               hi: int) -> tuple[np.ndarray, list[int], np.ndarray, float]:
    """(coef, active terms, weighted design, relative SSE) of t = steps a + bytes g on lo..hi-1, a, g >= 0."""
    a_col, g_col, y = x_steps[lo:hi], x_bytes[lo:hi], t[lo:hi]
    w = 1.0 / y
    design = np.column_stack([a_col * w, g_col * w])
    target = np.ones_like(y)  # y * w
    active = [0, 1]
    coef = np.zeros(2)
    for _ in range(2):
        sol, *_ = np.linalg.lstsq(design[:, active], target, rcond=None)
        coef = np.zeros(2)
        coef[active] = sol
        negative = [k for k in active if coef[k] < 0]
        if not negative:
            break
        active = [k for k in active if k not in negative]
        if not active:
            break
    fitted = a_col * coef[0] + g_col * coef[1]
    rel = (fitted - y) / y
    return coef, active, design, float(np.sum(rel**2))


def _fit_segment(x_steps: np.ndarray, x_bytes: np.ndarray, t: np.ndarray, lo: int, hi: int) -> Segment:
    """Weighted (1/t) least squares of t = steps a + bytes g on points lo..hi-1, with a, g >= 0."""
    a_col, g_col, y = x_steps[lo:hi], x_bytes[lo:hi], t[lo:hi]
    coef, active, design, rel_sse = _nnls_coef(x_steps, x_bytes, t, lo, hi)
    fitted = a_col * coef[0] + g_col * coef[1]
    n = hi - lo
    dof = max(1, n - len(active))
    sigma2 = rel_sse / dof
    stderr = np.zeros(2)
    if active:
        xa = design[:, active]
        try:
            cov = sigma2 * np.linalg.inv(xa.T @ xa)
            stderr[active] = np.sqrt(np.clip(np.diag(cov), 0, None))
        except np.linalg.LinAlgError:
            pass
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((fitted - y) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return Segment(lo, hi, float(coef[0]), float(coef[1]), float(stderr[0]), float(stderr[1]),
                   float(math.sqrt(rel_sse / n)), r2, rel_sse)


def fit_piecewise(op: str, num_ranks: int, sizes: Sequence[int], times_s: Sequence[float],
                  max_segments: int = MAX_SEGMENTS) -> list[Segment]:
    """Segments of the best piecewise alpha-beta fit (sizes ascending, one median time per size)."""
    order = np.argsort(np.asarray(sizes))
    s = np.asarray(sizes, dtype=float)[order]
    t = np.asarray(times_s, dtype=float)[order]
    if np.any(t <= 0):
        raise ValueError(f"{op}: every time must be > 0 to fit (got {t.min()})")
    x_steps = np.full_like(s, ring_steps(op, num_ranks))
    x_bytes = s * BUSBW_FACTOR[op](num_ranks)
    n = len(s)
    if n < 2:
        raise ValueError(f"{op}: at least 2 message sizes are needed to fit latency and bandwidth (got {n})")
    # A segment recurs in many splits: fit each (lo, hi) once (the same arithmetic, so the same choice).
    sse_of: dict[tuple[int, int], float] = {}

    def segment_sse(lo: int, hi: int) -> float:
        if (lo, hi) not in sse_of:
            sse_of[lo, hi] = _nnls_coef(x_steps, x_bytes, t, lo, hi)[3]
        return sse_of[lo, hi]

    best: tuple[float, list[int]] | None = None
    for k in range(1, max_segments + 1):
        if k > 1 and n < k * MIN_POINTS:
            break
        for cuts in itertools.combinations(range(MIN_POINTS, n - MIN_POINTS + 1), k - 1):
            bounds = [0, *cuts, n]
            if any(b - a < (MIN_POINTS if k > 1 else 2) for a, b in itertools.pairwise(bounds)):
                continue
            if k > 2 and best is not None:
                # The first and last segments alone bound the sum from below (float addition is monotone):
                # skip fitting the middle ones when that bound already loses (by a margin beyond rounding).
                outer = max(segment_sse(0, bounds[1]) + segment_sse(bounds[-2], n), 1e-12 * n)
                if n * math.log(outer / n) + (3 * k - 1) * math.log(n) > best[0] + 1e-9 * (1 + abs(best[0])):
                    continue
            sse = max(sum(segment_sse(a, b) for a, b in itertools.pairwise(bounds)), 1e-12 * n)
            bic = n * math.log(sse / n) + (3 * k - 1) * math.log(n)
            if best is None or bic < best[0]:
                best = (bic, bounds)
    assert best is not None
    return [_fit_segment(x_steps, x_bytes, t, a, b) for a, b in itertools.pairwise(best[1])]


def fit_collectives(cases: Sequence[CommCase], source: str = "comm.json",
                    gpus_per_node: int | None = None) -> list[FitReport]:
    """Piecewise fits per (op, group) of the measured medians; one FitReport per segment.

    An (op, group) with fewer than 2 message sizes has no fit; a non-positive median time, or a fit that
    fails, is a :class:`ScenarioError` naming ``source`` and the measurement. Each fit records the NIC share
    it was measured with: its communicator's ranks per node over the run's ranks per node
    (``gpus_per_node``, :attr:`RunInfo.ranks_per_node`; default: the communicator's own, a share of 1). The
    inter-node group (one rank per host, every local rank at once) has 1/ranks_per_node.
    """
    reports: list[FitReport] = []
    keys = list(dict.fromkeys((c.op, c.group) for c in cases))
    for op, group in keys:
        pts = sorted((c for c in cases if c.op == op and c.group == group), key=lambda c: c.size_bytes)
        if len(pts) < 2:
            continue
        if len(pts) > MAX_COMM_SIZES:
            raise ScenarioError(f"{source}: {op} on {group}: {len(pts):,} message sizes is over the limit of "
                                f"{MAX_COMM_SIZES:,} (simddp.limits.MAX_COMM_SIZES); fit fewer sizes")
        for c in pts:
            if not c.stats.median_s > 0:
                raise ScenarioError(f"{source}: {op} on {group} at {c.size_bytes} B: median time {c.stats.median_s} s; "
                                    "a collective must take > 0 s to fit")
        n, tier = pts[0].num_ranks, pts[0].tier
        per_node = max(1, n // pts[0].num_nodes)
        run_per_node = max(per_node, gpus_per_node or per_node)
        sizes = [c.size_bytes for c in pts]
        times = [c.stats.median_s for c in pts]
        what = f"{source}: {op} on {group} ({len(pts)} sizes, {sizes[0]}..{sizes[-1]} B)"
        try:
            with np.errstate(all="ignore"):  # an overflow shows as a non-finite fit, refused below
                segments = fit_piecewise(op, n, sizes, times)
        except (ValueError, np.linalg.LinAlgError) as err:
            raise ScenarioError(f"{what}: the fit failed: {err}") from None
        if not all(math.isfinite(v) for g in segments for v in (g.latency_per_step_s, g.inv_bandwidth_s_per_byte,
                                                                 g.latency_stderr_s, g.inv_bandwidth_stderr, g.r2)):
            raise ScenarioError(f"{what}: the fit is not finite (times or sizes out of range)")
        for k, seg in enumerate(segments):
            lo_bytes = 0 if k == 0 else int(math.sqrt(sizes[seg.lo - 1] * sizes[seg.lo])) + 1
            hi_bytes = sizes[-1] if k == len(segments) - 1 else int(math.sqrt(sizes[seg.hi - 1] * sizes[seg.hi]))
            inv_bw = seg.inv_bandwidth_s_per_byte if seg.inv_bandwidth_s_per_byte > 0 else NO_BANDWIDTH_TERM
            fit = CollectiveFit(op=op, tier=tier, min_bytes=lo_bytes, max_bytes=hi_bytes,
                                latency_per_step_s=seg.latency_per_step_s, bus_bandwidth_bytes_per_s=1.0 / inv_bw,
                                rel_residual=seg.rel_rms, measured_ranks=n, ranks_per_node=per_node,
                                gpus_per_node=run_per_node)
            points = [
                (sizes[i], times[i],
                 ring_steps(op, n) * seg.latency_per_step_s + sizes[i] * BUSBW_FACTOR[op](n) * inv_bw)
                for i in range(seg.lo, seg.hi)
            ]
            reports.append(FitReport(fit=fit, group=group, num_points=seg.hi - seg.lo, r2=seg.r2,
                                     latency_stderr_s=seg.latency_stderr_s,
                                     inv_bandwidth_stderr_s_per_byte=seg.inv_bandwidth_stderr, points=points))
    return reports


def interference_settings(lost_fraction: float) -> tuple[float, bool]:
    """(cluster.comm_compute_interference, ddp.overlap) for a lost share (see :func:`fit_interference`)."""
    clipped = min(max(lost_fraction, 0.0), MAX_LOST_FRACTION)
    return clipped / (1 - clipped), lost_fraction < NO_OVERLAP_LOST_FRACTION


def fit_interference(comm: CommMeasurements) -> InterferenceFit:
    """The simulator's interference factor from the median lost share ``f`` over the benchmark's sizes.

    The simulator slows a backward layer that starts while a collective is in flight by ``1 + i``. Over a
    collective much longer than a layer, compute then loses ``i / (1 + i)`` of the collective's time, so
    ``i = f / (1 - f)``. But the rule keeps a layer slow after the collective ends: when collectives are
    shorter than layers (small buckets) each one costs up to ``i`` layer-times, so from ``i = 1``
    (``f = 0.5``) on the rule predicts more lost time than running the collectives after backward, which
    is the physical bound while ``f <= 1``. So for ``f >= NO_OVERLAP_LOST_FRACTION`` (on a CPU whose cores
    gloo's threads share with compute, ``f`` is close to 1) the profile turns ``ddp.overlap`` off: the
    step is then compute + every collective + the tail, the simulator's exact form of "compute and
    communication take turns".
    """
    if not comm.interference:
        return InterferenceFit(value=0.0, lost_fraction=0.0, lost_fraction_p10=0.0, lost_fraction_p90=0.0,
                               note="not measured (no interference cases in comm.json): assumed 0")
    f = np.array([c.lost_fraction for c in comm.interference])
    med, p10, p90 = (float(v) for v in np.percentile(f, [50, 10, 90]))
    value, overlap = interference_settings(med)
    clipped = min(max(med, 0.0), MAX_LOST_FRACTION)
    note = (f"compute loses {med:.0%} of a collective's time beside it (median over {len(f)} all-reduce sizes, "
            f"p10..p90 {p10:.0%}..{p90:.0%})")
    if not overlap:
        note += (f"; >= {NO_OVERLAP_LOST_FRACTION:.0%}: compute and communication take turns, so the profile "
                 "sets ddp.overlap false")
    elif clipped != med:
        note += f"; clipped to {clipped:.2f}"
    return InterferenceFit(value=value, lost_fraction=med, lost_fraction_p10=p10,
                           lost_fraction_p90=p90, overlap=overlap, note=note)


def _link_placeholders(fits: Sequence[FitReport], num_nodes: int) -> tuple[dict[str, object], dict[str, object]]:
    """Link dicts filled with the large-message all-reduce fit, for ops the fits do not cover."""

    def pick(tier: str) -> CollectiveFit | None:
        cands = [r.fit for r in fits if r.fit.tier == tier and r.fit.op == "all-reduce"]
        return max(cands, key=lambda f: f.max_bytes) if cands else None

    intra = pick("intra") or pick("inter")
    inter = pick("inter") or intra
    intra_d: dict[str, object] = {"kind": "pcie", "latency_s": intra.latency_per_step_s if intra else 10e-6,
                                  "bandwidth_bytes_per_s": intra.bus_bandwidth_bytes_per_s if intra else 1e9,
                                  "efficiency": 1.0}
    inter_d: dict[str, object] = {"kind": "ethernet", "nics_per_node": 1,
                                  "nic_bandwidth_bytes_per_s": inter.bus_bandwidth_bytes_per_s if inter else 1e9,
                                  "latency_s": inter.latency_per_step_s if inter else 10e-6, "efficiency": 1.0}
    return intra_d, inter_d


def _optimizer_name(name: str) -> str:
    return {"sgd": "sgd", "adam": "adam", "adamw": "adamw"}[name]


def _consistent_cases(comm: CommMeasurements, source: str, allow_mixed: bool) -> tuple[list[CommCase], list[str]]:
    """The comm cases to fit: one number of ranks per (op, group), or the most measured one if allowed."""
    counts: dict[tuple[str, str], Counter[int]] = {}
    for c in comm.cases:
        counts.setdefault((c.op, c.group), Counter())[c.num_ranks] += 1
    mixed = {key: ranks for key, ranks in counts.items() if len(ranks) > 1}
    if not mixed:
        return list(comm.cases), []
    (op, group), ranks = next(iter(mixed.items()))
    described = ", ".join(f"{n} ranks ({k} sizes)" for n, k in sorted(ranks.items()))
    if not allow_mixed:
        raise ScenarioError(f"{source}: {op} on {group} was measured at {described}: files from different world "
                            "sizes were mixed; fit each world size separately (or --allow-mixed fits the most "
                            "measured one)")
    keep = {key: ranks.most_common(1)[0][0] for key, ranks in counts.items()}
    cases = [c for c in comm.cases if c.num_ranks == keep[(c.op, c.group)]]
    return cases, [f"mixed numbers of ranks in {source} ({op} on {group}: {described}); fitted the most "
                   "measured count of each collective"]


def _check_compute(compute: ComputeMeasurements, source: str) -> None:
    for k, la in enumerate(compute.layers):
        for what, st in (("forward", la.fwd), ("backward", la.bwd)):
            if st.median_s < 0:
                raise ScenarioError(f"{source}: layers.{k} ({la.name}): {what} median {st.median_s} s is negative")
    if compute.optimizer_step.median_s < 0:
        raise ScenarioError(f"{source}: optimizer_step median {compute.optimizer_step.median_s} s is negative")


#: Fewest step times a jitter fit needs.
MIN_JITTER_SAMPLES = 8


def fit_jitter(compute: ComputeMeasurements) -> JitterFit | None:
    """The lognormal jitter of a rank's step from each rank's own step times (``rank_step_times_s``).

    Each time is divided by its rank's median (so a rank that is steadily slower is not jitter), the logs are
    pooled, and their spread is taken robustly: sigma = IQR / 1.349 (a normal's IQR), which ignores the few
    far-out steps a shared machine adds. The lognormal of mean 1 with that sigma has CV sqrt(e^(sigma^2) - 1).
    None when the file has no per-rank times (an older collector) or too few.
    """
    logs = []
    for times in compute.rank_step_times_s:
        x = np.asarray([t for t in times if t > 0], dtype=float)
        if len(x):
            logs.append(np.log(x / np.median(x)))
    pooled = np.concatenate(logs) if logs else np.array([])
    if len(pooled) < MIN_JITTER_SAMPLES:
        return None
    q1, q3 = np.percentile(pooled, [25, 75])
    sigma = float((q3 - q1) / 1.349)
    cv = float(np.sqrt(np.expm1(sigma * sigma)))
    return JitterFit(cv=cv, sigma_log=sigma, num_samples=len(pooled),
                     note=f"{len(pooled)} step times of {len(logs)} rank(s), each over its rank's median; "
                     "sigma of the logs from their IQR / 1.349")


def fit_profile(comm: CommMeasurements, compute: ComputeMeasurements, sources: dict[str, str] | None = None,
                allow_partial: bool = False, allow_mixed: bool = False) -> CalibrationProfile:
    """The calibration profile of a comm.json and a compute.json (see the module's "Consistency")."""
    comm_src, compute_src = (sources or {}).get("comm", "comm.json"), (sources or {}).get("compute", "compute.json")
    if not comm.cases:
        raise ScenarioError(f"{comm_src}: holds no collective timings; re-run `simddp calibrate collect comm`")
    if not compute.layers:
        raise ScenarioError(f"{compute_src}: holds no layer timings; re-run `simddp calibrate collect compute`")
    placeholders: list[str] = []
    for src, m in ((comm_src, comm), (compute_src, compute)):
        if not m.complete:
            if not allow_partial:
                raise ScenarioError(f"{src}: the collector stopped early ({m.error or 'no reason recorded'}); "
                                    "re-run it, or fit anyway with --allow-partial")
            placeholders.append(f"PLACEHOLDER: {src} is partial ({m.error or 'stopped early'})")
    cr, pr = comm.run, compute.run
    if pr.world_size > 1 and pr.ranks_per_node != cr.ranks_per_node and not allow_mixed:
        raise ScenarioError(
            f"{comm_src} was measured on {cr.world_size} ranks ({cr.ranks_per_node} per node) and {compute_src} on "
            f"{pr.world_size} ({pr.ranks_per_node} per node): measure both with the same ranks per node (or "
            "--allow-mixed)")
    cases, mixed_notes = _consistent_cases(comm, comm_src, allow_mixed)
    _check_compute(compute, compute_src)
    fits = fit_collectives(cases, comm_src, gpus_per_node=comm.run.ranks_per_node)
    # The simulator reads one set of segments per (op, tier): world for its tier, intra-node for intra.
    used = [r for r in fits if r.simulated]
    world_tier = "inter" if cr.num_nodes > 1 else "intra"
    for tier in dict.fromkeys([world_tier, "intra"] if cr.ranks_per_node > 1 else [world_tier]):
        if not any(r.fit.op == "all-reduce" and r.fit.tier == tier for r in used):
            sizes = sorted({c.size_bytes for c in cases if c.op == "all-reduce" and c.tier == tier})
            why = (f"all-reduce was measured at {len(sizes)} message size(s) on the {tier}-node tier; at least 2 "
                   "are needed to fit latency and bandwidth")
            if not allow_partial:
                raise ScenarioError(f"{comm_src}: {why} (the simulator would use made-up links); re-run the comm "
                                    "collector with more --sizes, or --allow-partial")
            placeholders.append(f"PLACEHOLDER: {why}: {tier}-node links use 1 GB/s and 10 us unless the scenario "
                                "sets them")
    if compute.peak is None:
        if not allow_partial:
            raise ScenarioError(f"{compute_src}: no measured device rates (peak); re-run the compute collector to "
                                "the end, or --allow-partial")
        placeholders.append("PLACEHOLDER: no measured device rates: 1 TFLOP/s matmul, 16 GiB of memory, "
                            "100 GB/s copies")
    interference = fit_interference(comm)
    run = comm.run
    peak = compute.peak
    matmul = peak.matmul_flop_per_s if peak else 1 * TFLOP
    gpu = {
        "name": (compute.run.device_names[0] if compute.run.device_names else "measured device"),
        "peak_fp32_flop_per_s": matmul,
        "peak_tf32_flop_per_s": matmul,
        "peak_bf16_flop_per_s": matmul,
        "peak_fp16_flop_per_s": matmul,
        "hbm_bytes": peak.memory_bytes if peak else 16 * 1024**3,
        "hbm_bandwidth_bytes_per_s": peak.copy_bytes_per_s if peak else 1e11,
        # The measured rates stand in for the peaks; layers carry measured times, so the kernel model only
        # times what was not measured (the optimizer: memory-bound at the measured copy rate).
        "num_sms": 1,
        "memory_efficiency": 1.0,
        "matmul_ceiling_fraction": 1.0,
        "gemm_k_overhead": 0.0,
        "kernel_launch_s": 0.0,
        "flash_fwd_fraction": 1.0,
        "flash_bwd_fraction": 1.0,
        "flash_key_overhead": 0.0,
    }
    intra, inter = _link_placeholders(used, run.num_nodes)
    ddp_overhead = compute.ddp_overhead.median_s if compute.ddp_overhead is not None else 0.0
    unmeasured_overhead = [] if compute.ddp_overhead is not None else [  # it read "measured" at 0.000 ms
        "not measured: the DDP Reducer overhead (measured on CPU only, and not with --no-ddp-overhead or by a "
        "compute run that stopped before it): host_overhead_s holds none of it, and DDP's unused-parameter search "
        "takes the simulator's default"]
    host_overhead = max(0.0, compute.host.median_s) + max(0.0, ddp_overhead)
    search = compute.graph_search
    cluster_extra: dict[str, object] = {}
    if search is not None and compute.num_autograd_nodes and search.median_s > 0:
        cluster_extra["autograd_node_traversal_s"] = search.median_s / compute.num_autograd_nodes
    cluster = {
        **cluster_extra,
        "num_nodes": run.num_nodes,
        "gpus_per_node": run.ranks_per_node,
        "gpu": gpu,
        "intra_node": intra,
        "inter_node": inter,
        "host_overhead_s": host_overhead,
        "comm_compute_interference": interference.value,
        "collective_fits": [r.fit.model_dump() for r in used],
    }
    dtypes = {p.dtype for p in compute.parameters}
    precision = "fp32" if dtypes <= {"float32"} else "bf16-mixed"
    model = {
        "parameters": [p.model_dump() for p in parameter_specs(compute.parameters)],
        "grad_ready_order": list(compute.grad_ready_order),
        "layers": [la.model_dump(exclude_none=True) for la in layer_specs(compute.layers)],
    }
    if compute.num_autograd_nodes is not None:
        model["num_autograd_nodes"] = compute.num_autograd_nodes
    training = {
        "precision": precision,
        "optimizer": _optimizer_name(compute.optimizer),
        "micro_batch_size": compute.micro_batch_size,
        "seq_len": 1,
        "optimizer_time_s": compute.optimizer_step.median_s,
    }
    notes = [
        "measured: collective times (median of repeats, slowest rank), per-layer forward/backward times, "
        "optimizer step, host time, " + ("DDP Reducer overhead without communication, "
                                          if compute.ddp_overhead is not None else "") + "interference benchmark",
        "assumed: collectives extrapolate to other world sizes with ring step counts and nccl-tests data "
        "factors at the fitted per-step latency and bus bandwidth",
        "cluster.intra_node/inter_node are placeholders carrying the all-reduce fit; collective_fits replace "
        "the link model for every op they cover",
        f"host_overhead_s = rest of the step {compute.host.median_s * 1e3:.3f} ms + DDP Reducer overhead "
        f"{ddp_overhead * 1e3:.3f} ms",
        f"interference: {interference.note}",
    ]
    if search is not None and cluster_extra:
        notes.append(f"autograd_node_traversal_s = DDP's unused-parameter search {search.median_s * 1e6:.1f} us "
                     f"/ {compute.num_autograd_nodes} graph nodes")
    if not interference.overlap:
        notes.append("overlap off: compute loses most of each collective's time beside it, so the profile sets "
                     "ddp.overlap false (compute and communication take turns)")
    if not comm.complete or not compute.complete:
        notes.append("fitted from partial measurements (a collector stopped early)")
    if precision != "fp32":
        notes.append(f"parameter dtypes {sorted(dtypes)}: precision set to bf16-mixed")
    notes += unmeasured_overhead + mixed_notes + placeholders
    try:
        return _profile(comm, compute, sources, fits, interference, cluster, model, training, notes)
    except ValidationError as err:
        raise ScenarioError(f"{compute_src}: the fitted profile is invalid: {format_validation_error(err)}") from None


def _profile(comm: CommMeasurements, compute: ComputeMeasurements, sources: dict[str, str] | None,
             fits: list[FitReport], interference: InterferenceFit, cluster: dict[str, object],
             model: dict[str, object], training: dict[str, object], notes: list[str]) -> CalibrationProfile:
    return CalibrationProfile(
        kind="simddp-profile",
        version=PROFILE_VERSION,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        sources=sources or {},
        comm_run=comm.run,
        compute_run=compute.run,
        model_name=compute.model,
        fits=fits,
        interference=interference,
        compute_rel_sigma=compute.step.rel_sigma,
        cluster=cluster,
        model=model,
        training=training,
        ddp={} if interference.overlap else {"overlap": False},
        jitter=fit_jitter(compute),
        notes=notes,
    )


__all__ = [
    "MAX_LOST_FRACTION",
    "MIN_POINTS",
    "NO_OVERLAP_LOST_FRACTION",
    "Segment",
    "fit_collectives",
    "fit_interference",
    "fit_jitter",
    "fit_piecewise",
    "fit_profile",
    "interference_settings",
    "ring_steps",
]
