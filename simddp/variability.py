"""Step-time tails: jitter, stragglers and sequence lengths, Monte Carlo over steps (``simddp tails``).

One deterministic step (:func:`simddp.sim.simulate_step`) says how long each part takes when every rank
computes alike. Real ranks do not: kernels, clocks and the host jitter from step to step, a slow GPU stays
slow, and a data loader that pads each micro-batch to its longest document hands every rank a different
amount of work. Every collective waits for its slowest member, so the step is the critical path through the
synchronisation points, and with many ranks the slowest of them sets the pace: the expected maximum of n
draws grows with n even though each rank's mean does not move.

The model (numpy over ranks and steps; no simpy process per rank):

* rank r's compute in step s is the simulated compute path times ``F[s, r] = J[s, r] x K[r]``: ``J`` a
  lognormal of mean 1 and coefficient of variation ``variability.jitter_cv`` drawn per rank and step,
  ``K`` = ``straggler_slowdown`` on ``num_stragglers`` ranks chosen once (seeded), 1 elsewhere;
* each micro-batch of data-parallel replica d costs ``Q[s, d, k]`` times the simulated one, from the lengths
  of the documents it holds (:func:`sequence_costs`): padded to its longest document, the dense layers cost
  L / seq_len and the attention core (L / seq_len)^2; packed into full rows with a document mask, the dense
  layers cost a full row and attention the sum of squared document lengths. The tensor-parallel and
  pipeline ranks of a replica see the same micro-batches;
* synchronisation points, innermost first: **tensor-parallel collectives** (every layer: the group moves at
  its slowest member's pace, so a stage costs ``max_t F``); **pipeline boundaries** (stage by stage and
  micro-batch by micro-batch, the flow-shop recurrence of a GPipe schedule, ``end[k, p] = max(end[k-1, p],
  end[k, p-1]) + u[k, p]`` forward then backward, scaling the simulated pipeline; exact for GPipe, and for
  1F1B it has the same makespan when stages are balanced); **data-parallel gradient reduction** (the last
  bucket's reduction starts when the slowest replica is done: ``max_d``); the **optimizer**, a
  synchronisation point only when something collective follows it (ZeRO's parameter all-gather); without
  one, a rank's optimizer step is part of its work before the next step's reduction;
* what follows the compute path (exposed reduction, optimizer, host, clipping) keeps its simulated time.

With no variation every draw is 1 and each step equals the simulated step (to a rounding of the pipeline's
recurrence, 1e-15 relative). The "balanced" step of
a draw replaces every rank's work by the mean over ranks (nobody waits); the step minus the balanced step
is the throughput lost to the tail, and it splits exactly into the waits at each synchronisation point
(each point's ``max`` minus the ``mean`` of what it synchronises, averaged over the groups outside it).

Randomness only through three ``numpy.random.default_rng`` streams spawned from ``variability.seed`` (the
jitter, the stragglers, the documents): the same seed gives the same draws, and each setting draws from its own
stream, so that changing one leaves the others' draws alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simddp.config import MAX_INPUT_INT, Scenario, ScenarioError, VariabilityConfig
from simddp.limits import check_tails_size, max_tail_steps  # max_tail_steps: the app reads it here
from simddp.results import StepResult
from simddp.scenario_io import scenario_from_dict

#: Parts of the simulated step that happen after the compute path, at their simulated length.
TAIL_PARTS = ("dp_comm", "optimizer", "host", "grad_clip", "ddp_host")
#: Rows of the document pool that packing draws its rows from.
PACK_POOL_ROWS = 4096
#: Most documents drawn for the packing pool (memory bound).
MAX_POOL_DOCS = 4_000_000

SYNC_POINTS = {
    "tp": "tensor-parallel collectives",
    "pp": "pipeline boundaries",
    "dp": "data-parallel gradient reduction",
    "optimizer": "optimizer step",
}


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SyncPointWait(_Result):
    """Time lost waiting at one kind of synchronisation point, per step on average."""

    key: str = Field(description="tp, pp, dp or optimizer.")
    label: str = Field(description="Human name.")
    wait_s: float = Field(description="Mean wait per step, s; the pipeline boundaries' can be below zero (slow units "
                          "off the critical path: the pipeline absorbs some of the variation).")
    share: float = Field(description="Share of the waiting: of the positive waits' sum (below zero with the wait).")


class VariabilityResult(_Result):
    """Monte Carlo step times of one scenario under its ``variability`` settings."""

    scenario: str
    num_ranks: int
    dp: int
    tp: int
    pp: int
    num_steps: int
    seed: int
    variability: VariabilityConfig
    deterministic_step_s: float = Field(description="The simulated step (no variation).")
    step_times_s: list[float] = Field(description="Each Monte Carlo step, s.")
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    balanced_step_s: float = Field(description="Mean step had every rank done the mean work (nobody waits), s.")
    tail_loss_fraction: float = Field(description="Throughput lost to waiting: 1 - balanced / mean.")
    padding_fraction: float = Field(description="Share of the tokens computed that are padding.")
    tokens_per_step: float = Field(description="Real (non-padding) tokens per step, mean.")
    tokens_per_s: float = Field(description="Real tokens over the Monte Carlo time.")
    sync_points: list[SyncPointWait] = Field(description="Waiting per synchronisation point, largest first.")
    stragglers: list[int] = Field(default_factory=list, description="Global ranks drawn as stragglers.")

    @property
    def worst_sync_point(self) -> str | None:
        waits = [s for s in self.sync_points if s.wait_s > 0]
        return waits[0].label if waits else None

    @property
    def below_zero_note(self) -> str | None:
        """Why a wait (the pipeline's) or the loss reads below zero, where one does; None otherwise."""
        if self.tail_loss_fraction >= 0 and all(w.wait_s >= 0 for w in self.sync_points):
            return None
        return ("below zero: these steps' pipelines ended sooner than their balanced form (every unit at the mean); "
                "slow units off the critical path do that, and with ranks alike it is Monte Carlo scatter around a "
                "small wait (its expectation is not below zero); shares are of the positive waits")

    def to_json_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["worst_sync_point"] = self.worst_sync_point
        return data

    def to_dataframe(self) -> Any:
        """One row per Monte Carlo step (pandas, imported lazily)."""
        import pandas as pd

        return pd.DataFrame({"step": np.arange(len(self.step_times_s)), "step_time_s": self.step_times_s})


# ------------------------------------------------------------------------------------ distributions
def lognormal_params(cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean 1 and coefficient of variation ``cv``."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2, math.sqrt(sigma2)


def expected_max_lognormal(n: int, cv: float, points: int = 20001) -> float:
    """E[max of n iid lognormals of mean 1 and CV ``cv``]: the integral of x n Phi(z)^(n-1) phi(z) over z.

    The reference the Monte Carlo is tested against (order statistics of the maximum).
    """
    if n < 1:
        raise ValueError(f"n({n}) must be >= 1")
    if cv == 0:
        return 1.0
    mu, sigma = lognormal_params(cv)
    z = np.linspace(-12.0, 12.0, points)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    pdf = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    integrand = np.exp(mu + sigma * z) * n * cdf ** (n - 1) * pdf
    return float(np.trapezoid(integrand, z))


def document_lengths(rng: np.random.Generator, var: VariabilityConfig, seq_len: int, size: Any) -> np.ndarray:
    """Document lengths in tokens, 1..seq_len (longer documents are cut to the context)."""
    if var.seq_len_distribution == "fixed":
        return np.full(size, seq_len, dtype=np.int64)
    if var.seq_len_distribution == "uniform":
        return rng.integers(1, seq_len + 1, size=size)
    mean = var.mean_seq_len or max(1, seq_len // 4)
    mu, sigma = lognormal_params(var.seq_len_cv)
    lengths = np.rint(mean * rng.lognormal(mu, sigma, size=size))
    return np.clip(lengths, 1, seq_len).astype(np.int64)


def packed_rows(rng: np.random.Generator, var: VariabilityConfig, seq_len: int,
                rows: int = PACK_POOL_ROWS) -> np.ndarray:
    """Sum of squared document lengths of ``rows`` rows of ``seq_len`` tokens packed from a document stream
    (a document that crosses a row boundary is split, as packing does)."""
    if var.seq_len_distribution == "fixed":
        return np.full(rows, float(seq_len) ** 2)
    if var.seq_len_distribution == "lognormal":
        mean: float = var.mean_seq_len or max(1, seq_len // 4)
    else:
        mean = (seq_len + 1) / 2
    # Short documents in long rows: fewer rows, so that the stream stays within MAX_POOL_DOCS documents.
    rows = max(16, min(rows, int(MAX_POOL_DOCS * mean / (1.5 * seq_len))))
    num_docs = min(MAX_POOL_DOCS, int(1.5 * rows * seq_len / mean) + 64)
    total = rows * seq_len
    ends = np.cumsum(document_lengths(rng, var, seq_len, num_docs))
    for _ in range(64):  # a short draw (rare): extend the stream
        if ends[-1] >= total:
            break
        more = np.cumsum(document_lengths(rng, var, seq_len, num_docs)) + ends[-1]
        ends = np.concatenate([ends, more])
    total = min(total, int(ends[-1]) // seq_len * seq_len)
    rows = total // seq_len
    cuts = _merge_sorted(ends[ends < total], np.arange(1, rows) * seq_len)
    bounds = np.concatenate([[0], cuts, [total]])
    seg = np.diff(bounds).astype(float)
    row = (bounds[:-1] // seq_len).astype(np.int64)
    return np.bincount(row, weights=seg * seg, minlength=rows)


def _merge_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.union1d(a, b)`` of two strictly increasing integer arrays, by insertion in O(len(a) + len(b)):
    ``union1d`` sorts (numpy 2.4's ``unique`` took 2.3 s on the two million document ends of a packing pool of
    one-token documents, this 5 ms)."""
    at = np.searchsorted(a, b)
    fresh = b[(at >= len(a)) | (a[np.minimum(at, len(a) - 1)] != b)] if len(a) else b
    return np.insert(a, np.searchsorted(a, fresh), fresh)


def sequence_costs(rng: np.random.Generator, var: VariabilityConfig, seq_len: int, micro_batch: int,
                   attention_fraction: float, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cost of each micro-batch relative to one of full-length samples, its real tokens and the tokens it
    computes (padding included).

    ``shape`` is (steps, replicas, micro-batches). Padding: ``(1 - a) L/S + a (L/S)^2`` with L the micro-batch's
    longest document and ``a`` the attention core's share of the compute; packing: ``(1 - a) + a sum(L_i^2)/S^2``
    averaged over the micro-batch's rows.
    """
    a = attention_fraction
    s = float(seq_len)
    full = np.full(shape, float(micro_batch * seq_len))
    if var.seq_len_distribution == "fixed":
        return np.ones(shape), full, full
    if var.sequence_handling == "padding":
        lengths = document_lengths(rng, var, seq_len, (*shape, micro_batch))
        longest = lengths.max(axis=-1)
        frac = longest / s
        return (1 - a) * frac + a * frac * frac, lengths.sum(axis=-1).astype(float), micro_batch * longest.astype(float)
    pool = packed_rows(rng, var, seq_len)
    picks = rng.integers(0, len(pool), size=(*shape, micro_batch))
    cost = (1 - a) + a * pool[picks].mean(axis=-1) / (s * s)
    return cost, full, full


# -------------------------------------------------------------------------------------- the model
def _attention_fraction(scenario: Scenario) -> float:
    """Share of one micro-batch's kernel time in attention cores (cost quadratic in the sequence)."""
    from simddp.sim import build_plan

    plan = build_plan(scenario)
    core = total = 0.0
    for rank in plan.ranks:
        for layer, lp in zip(rank.layers, rank.plans, strict=True):
            total += lp.timing.compute_s
            if layer.recompute == "core":
                core += lp.timing.compute_s
    return core / total if total > 0 else 0.0


def _stage_times(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward time of one micro-batch on each pipeline stage (alone on the GPU)."""
    from simddp.sim import build_plan

    plan = build_plan(scenario)
    fwd = np.array([sum(r.fwd_alone_s.values()) for r in plan.ranks])
    bwd = np.array([sum(r.bwd_alone_s.values()) for r in plan.ranks])
    return fwd, bwd


def gpipe_makespan(fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """Makespan of m micro-batches through p stages, forward then backward (flow-shop recurrence).

    ``fwd`` and ``bwd`` have shape (..., p, m): the time of micro-batch k on stage p. Vectorised over the
    leading axes (steps, replicas).
    """
    p, m = fwd.shape[-2], fwd.shape[-1]
    lead = fwd.shape[:-2]
    end = np.zeros((*lead, p))
    for k in range(m):
        prev = np.zeros(lead)
        for q in range(p):
            prev = np.maximum(end[..., q], prev) + fwd[..., q, k]
            end[..., q] = prev
    start_b = end[..., -1]
    endb = np.broadcast_to(start_b[..., None], (*lead, p)).copy()
    for k in range(m):
        prev = np.zeros(lead) if k else start_b.copy()
        for q in range(p - 1, -1, -1):
            prev = np.maximum(endb[..., q], prev) + bwd[..., q, k]
            endb[..., q] = prev
    return endb.max(axis=-1)


#: A mean wait below this share of the mean step is float rounding (waits are differences of sums of the same
#: times), not a wait: it counts as none.
_WAIT_RESIDUE = 1e-12


def simulate_tails(scenario: Scenario, num_steps: int = 200, seed: int | None = None,
                   step: StepResult | None = None) -> VariabilityResult:
    """Monte Carlo of ``num_steps`` steps of ``scenario`` under its ``variability`` settings."""
    from simddp.sanity import check_range
    from simddp.sim import simulate_step

    check_tails_size(scenario, num_steps)
    var = scenario.variability
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= MAX_INPUT_INT:
            raise ScenarioError(f"seed({seed!r}) must be an integer 0..2^53, as variability.seed")
        var = var.model_copy(update={"seed": int(seed)})
    det = step or simulate_step(scenario, trace=False)
    check_range(det.step_time_s)  # the bound `simulate` keeps to (simddp.sanity)
    par, tr = scenario.parallelism, scenario.training
    dp, tp, pp, m = scenario.dp, par.tp, par.pp, scenario.num_micro_batches
    # Three streams of one seed: the jitter, the stragglers and the documents draw apart, so that changing one
    # setting leaves the others' draws as they were (common random numbers). Until 2026-11-29 they shared one
    # stream and each count of stragglers drew its own set: 4 stragglers read a 5.9% faster step than 3, and a
    # jitter CV of 0.001 against 0 moved the stragglers.
    jitter_rng, straggler_rng, rng = (np.random.default_rng(s) for s in np.random.SeedSequence(var.seed).spawn(3))

    tail = sum(det.part(k) for k in TAIL_PARTS)
    path_s = det.step_time_s - tail  # the compute path: compute, TP waits, pipeline waits
    opt_s = det.part("optimizer")
    opt_syncs = par.zero_stage >= 1  # ZeRO all-gathers the updated parameters: the optimizer is a sync point

    # Rank factors: lognormal jitter per (step, replica, stage, tp rank) times the stragglers' slowdown.
    mu, sigma = lognormal_params(var.jitter_cv)
    shape = (num_steps, dp, pp, tp)
    jitter = jitter_rng.lognormal(mu, sigma, size=shape) if var.jitter_cv > 0 else np.ones(shape)
    slow = np.ones(dp * pp * tp)
    stragglers: list[int] = []
    if var.num_stragglers and var.straggler_slowdown > 1:
        # The first k of one permutation: k stragglers are among any larger number's, so more never run faster.
        chosen = straggler_rng.permutation(dp * pp * tp)[:var.num_stragglers]
        slow[chosen] = var.straggler_slowdown
        stragglers = sorted(_global_rank(int(i), dp, pp, tp) for i in chosen)
    factor = jitter * slow.reshape(dp, pp, tp)

    attention = _attention_fraction(scenario) if var.seq_len_distribution != "fixed" else 0.0
    q, tokens, computed = sequence_costs(rng, var, tr.seq_len, tr.micro_batch_size, attention, (num_steps, dp, m))

    waits = {key: np.zeros(num_steps) for key in SYNC_POINTS}
    if pp == 1:
        per_micro = path_s / m
        work = factor[:, :, 0, :] * (per_micro * q.sum(axis=-1))[..., None]  # (steps, dp, tp)
        opt = factor[:, :, 0, :] * opt_s
        if not opt_syncs:
            work = work + opt  # the optimizer runs before this rank's next reduction
        group = work.max(axis=-1)  # tensor-parallel groups move at their slowest member's pace
        waits["tp"] = (group - work.mean(axis=-1)).mean(axis=-1)
        waits["dp"] = group.max(axis=-1) - group.mean(axis=-1)
        path = group.max(axis=-1)
        balanced_path = work.mean(axis=(1, 2))
        if opt_syncs:
            waits["optimizer"] = opt.max(axis=(1, 2)) - opt.mean(axis=(1, 2))
            after = tail - opt_s + opt.max(axis=(1, 2))
            balanced_after = tail - opt_s + opt.mean(axis=(1, 2))
        else:
            after = np.full(num_steps, tail - opt_s)
            balanced_after = after
    else:
        fwd, bwd = _stage_times(scenario)
        stage = factor.max(axis=-1)  # (steps, dp, pp): TP sync inside each stage
        unit = stage[..., :, None] * q[:, :, None, :]  # (steps, dp, pp, m)
        ones = np.ones((pp, m))
        base = gpipe_makespan(fwd[:, None] * ones, bwd[:, None] * ones)
        pipe = path_s * gpipe_makespan(fwd[:, None] * unit, bwd[:, None] * unit) / base  # (steps, dp)
        mean_unit = unit.mean(axis=(-2, -1))
        tp_mean = (factor.mean(axis=-1)[..., None] * q[:, :, None, :]).mean(axis=(-2, -1))
        waits["tp"] = path_s * (mean_unit - tp_mean).mean(axis=-1)
        waits["pp"] = (pipe - path_s * mean_unit).mean(axis=-1)
        waits["dp"] = pipe.max(axis=-1) - pipe.mean(axis=-1)
        path = pipe.max(axis=-1)
        balanced_path = path_s * tp_mean.mean(axis=-1)
        opt = factor * opt_s
        if opt_syncs:
            waits["optimizer"] = opt.max(axis=(1, 2, 3)) - opt.mean(axis=(1, 2, 3))
            after = tail - opt_s + opt.max(axis=(1, 2, 3))
            balanced_after = tail - opt_s + opt.mean(axis=(1, 2, 3))
        else:  # each stage steps on its own after the reduction: the slowest stage ends the step
            after = tail - opt_s + opt.max(axis=(1, 2, 3))
            balanced_after = tail - opt_s + opt.mean(axis=(1, 2, 3))
            waits["optimizer"] = after - balanced_after

    steps = path + after
    balanced = balanced_path + balanced_after
    real_tokens = tokens.sum(axis=(1, 2))
    padding = 1.0 - float(real_tokens.sum()) / float(computed.sum())
    mean = float(steps.mean())
    loss = float(mean - balanced.mean())
    # Mean waits, a float residue of the step (differences of equal sums) counted as none; shares of their total.
    # The pipeline's can be below zero. The makespan is convex in the units (a max of sums), so with ranks alike
    # its expected wait is at least zero (Jensen), but the mean of a few hundred steps scatters around a small one
    # (GPT-2 on pp 8, CV 10%, 2,000 steps: -0.67 to +0.38 ms by seed); and a straggler off the critical path makes
    # the pipeline end sooner than the balanced one, which gives every unit the mean. It is kept, so that the waits
    # add up to the loss (until 2026-11-29 it was counted as none: the waits then exceeded the loss by 4.3e-5 s at
    # seed 0 of a pp-4 test scenario). Shares are of the positive waits' sum: those add up to 1, a negative one
    # reads as what the pipeline absorbs against them.
    residue = _WAIT_RESIDUE * mean
    mean_waits = {k: float(w.mean()) for k, w in waits.items()
                  if (k != "tp" or tp > 1) and (k != "pp" or pp > 1) and (k != "dp" or dp > 1)}
    mean_waits = {k: w if abs(w) > residue else 0.0 for k, w in mean_waits.items()}
    total_wait = sum(w for w in mean_waits.values() if w > 0)
    sync = [SyncPointWait(key=k, label=SYNC_POINTS[k], wait_s=w, share=w / total_wait if total_wait > 0 else 0.0)
            for k, w in mean_waits.items()]
    sync.sort(key=lambda w: -w.wait_s)
    p50, p90, p99 = (float(v) for v in np.percentile(steps, [50, 90, 99]))
    return VariabilityResult(
        scenario=scenario.name, num_ranks=dp * tp * pp, dp=dp, tp=tp, pp=pp, num_steps=num_steps, seed=var.seed,
        variability=var, deterministic_step_s=det.step_time_s, step_times_s=[float(v) for v in steps],
        mean_s=mean, p50_s=p50, p90_s=p90, p99_s=p99, max_s=float(steps.max()),
        balanced_step_s=float(balanced.mean()), tail_loss_fraction=loss / mean if mean > 0 else 0.0,
        padding_fraction=padding, tokens_per_step=float(real_tokens.mean()),
        tokens_per_s=float(real_tokens.sum() / steps.sum()), sync_points=sync, stragglers=stragglers,
    )


def _global_rank(index: int, dp: int, pp: int, tp: int) -> int:
    """Megatron's layout: global rank = tp_rank + tp x (dp_rank + dp x pp_rank), from a flat (dp, pp, tp) index."""
    d, rest = divmod(index, pp * tp)
    p, t = divmod(rest, tp)
    return t + tp * (d + dp * p)


class RanksPoint(_Result):
    """One world size of :func:`tails_vs_ranks`."""

    num_gpus: int
    num_nodes: int
    deterministic_step_s: float
    mean_s: float
    p50_s: float
    p99_s: float
    tail_loss_fraction: float


def tails_vs_ranks(scenario: Scenario, num_nodes: list[int], num_steps: int = 200) -> list[RanksPoint]:
    """Weak scaling: the same samples per data-parallel replica on more nodes, and the tails at each size. A size
    the layout does not fit (pp x tp more than its GPUs, more stragglers than GPUs), or whose draws are beyond the
    limit (:func:`simddp.limits.check_tails_size`), is left out; if every size is, the first one's error is raised."""
    from simddp.sweeps import scenario_to_dict, with_values

    data = scenario_to_dict(scenario)
    data["name"] = None
    points = []
    first_error: ScenarioError | None = None
    for nodes in num_nodes:
        try:
            variant = scenario_from_dict(with_values(data, {"cluster.num_nodes": nodes}))
            check_tails_size(variant, num_steps)
        except ScenarioError as err:
            first_error = first_error or err
            continue
        result = simulate_tails(variant, num_steps)
        points.append(RanksPoint(num_gpus=variant.cluster.num_gpus, num_nodes=nodes,
                                 deterministic_step_s=result.deterministic_step_s, mean_s=result.mean_s,
                                 p50_s=result.p50_s, p99_s=result.p99_s,
                                 tail_loss_fraction=result.tail_loss_fraction))
    if not points and first_error is not None:
        raise first_error
    return points


__all__ = [
    "SYNC_POINTS",
    "RanksPoint",
    "SyncPointWait",
    "VariabilityResult",
    "document_lengths",
    "expected_max_lognormal",
    "gpipe_makespan",
    "lognormal_params",
    "max_tail_steps",
    "packed_rows",
    "sequence_costs",
    "simulate_tails",
    "tails_vs_ranks",
]
