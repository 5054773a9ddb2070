"""The whole training run: days, GPU-hours, cost, failures, checkpoints and goodput (``simddp run``).

Time to train. ``tokens`` at the step's throughput: the simulated step (its Monte Carlo mean when the
scenario's ``variability`` is on, since a run's throughput follows the mean step), or a measured throughput
fed in as model FLOP/s per GPU, ``run.achieved_tflops_per_gpu``. Then the training time is
``tokens x FLOP per token / (n x X)``: Narayanan et al. (SC'21) eq. 4, ``8 T P / (n X)``, with the FLOP per
token of the workload model (their eq. 3, ``96 l h^2 (1 + s/6h + V/16lh)`` per token with full recompute;
``8 P`` is its leading term).

Failures. A job-interrupting failure hits each GPU (or node) at rate ``1 / mtbf_hours``, independently, so
the job's mean time between failures is ``M = mtbf / n``. The default MTBF is Llama 3's: 419 unexpected
interruptions in 54 days on 16,384 H100s (Grattafiori et al. 2024, sec. 3.3.4), 50,700 GPU-hours each.

Checkpoints. The bytes are the training state of the memory model (:func:`simddp.memory.model_states_bytes`:
working parameters, fp32 master weights and optimizer states; gradients are not saved). ``rank0`` (what
torch's DDP tutorial teaches): the state is gathered to rank 0 when it is sharded (tp, pp or ZeRO), over rank
0's network link, and one process writes it at ``min(node, storage)`` bandwidth. ``sharded``
(``torch.distributed.checkpoint``, Megatron's distributed checkpoint): every node writes its part at once, at
``min(storage, nodes x node)`` bandwidth. A restart costs ``restart_overhead_s`` and reading the checkpoint
back (a rank-0 file is read in full by every node).

Goodput. With checkpoints every ``tau`` seconds of training, each taking ``delta``, restarts ``R`` and
exponential failures of mean ``M``, the expected wall time of ``T_s`` seconds of training is Daly's complete
model (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22,
2006, eq. 13): ``T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau``. The interval that minimises it is
Daly's higher-order estimate, ``sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta`` (``M`` when
``delta >= 2M``); Young's (CACM 1974) ``sqrt(2 delta M)`` is its first term. The one-time start-up (DDP's
parameter broadcast from rank 0, ``_sync_module_states``, 250 MiB chunks) adds to the wall time. Goodput =
training time / wall time; expected failures = wall time / ``M``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp.collectives import CollectiveCost, Op, chunked_cost, collective_cost
from simddp.config import RunConfig, Scenario
from simddp.errors import ScenarioError
from simddp.memory import model_states_bytes, zero_model_states_bytes
from simddp.sanity import check_range
from simddp.topology import CommGroup, dp_group, group
from simddp.units import DAY, HOUR, MiB, dtype_bytes

#: DDP's start-up broadcast of parameters and buffers from rank 0 (``_sync_module_states``), per chunk.
PARAM_SYNC_CHUNK_BYTES = 250 * MiB
#: Longest wall clock a run is answered for (about 2,700 years): beyond it failures leave next to no progress,
#: and Daly's exponentials are past what double precision resolves.
MAX_RUN_DAYS = 1e6
#: What the JSON form of a run always carries (``simddp run --json``).
RUN_JSON_KEYS = ("days", "gpu_hours", "cost", "expected_failures", "checkpoint_interval_s", "checkpoint_time_s",
                 "goodput")


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GoodputPoint(_Result):
    """Goodput at one checkpoint interval."""

    checkpoint_interval_s: float
    goodput: float
    days: float


class RunResult(_Result):
    """One training run: its time, cost, failures, checkpoints and goodput."""

    scenario: str
    num_gpus: int
    num_nodes: int
    tokens: float = Field(description="Tokens trained on.")
    throughput_source: str = Field(description="Where tokens/s come from: simulated step, Monte Carlo, or fed.")
    tokens_per_s: float
    step_time_s: float = Field(description="Time of one optimizer step (mean), s.")
    num_steps: float = Field(description="Optimizer steps to see every token.")
    flop_per_token: float = Field(description="Model FLOP per token, recomputation included.")
    achieved_flop_per_s_per_gpu: float = Field(description="tokens/s x FLOP per token / GPUs.")
    training_s: float = Field(description="Failure-free training time (no checkpoints, no start-up), s.")
    training_days: float
    startup_s: float = Field(description="One-time start-up: DDP's parameter broadcast from rank 0, s.")
    checkpoint_bytes: int = Field(description="Training state saved: parameters, master weights, optimizer states.")
    checkpoint_saving: str
    checkpoint_time_s: float = Field(description="One checkpoint with the chosen saving, s.")
    checkpoint_time_rank0_s: float
    checkpoint_time_sharded_s: float
    checkpoint_interval_s: float = Field(description="Training time between checkpoints, s.")
    young_interval_s: float = Field(description="Young's first-order optimum sqrt(2 delta M), s.")
    restart_s: float = Field(description="Per failure: restart overhead plus reading the checkpoint back, s.")
    mtbf_s: float = Field(description="The job's mean time between failures, s.")
    expected_failures: float
    wall_s: float
    days: float
    gpu_hours: float
    cost: float = Field(description="USD at run.gpu_hour_cost_usd.")
    gpu_hour_cost_usd: float
    goodput: float = Field(description="Training time / wall time.")
    curve: list[GoodputPoint] = Field(default_factory=list, description="Goodput against the checkpoint interval.")
    notes: list[str] = Field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_dataframe(self) -> Any:
        """Goodput against the checkpoint interval (pandas, imported lazily)."""
        import pandas as pd

        return pd.DataFrame([p.model_dump() for p in self.curve])


# ------------------------------------------------------------------------------------- the pieces
def flop_per_token(scenario: Scenario) -> float:
    """Model FLOP per token, recomputed forwards included (Narayanan et al.'s eq. 3 accounting)."""
    from simddp.compute import recomputed
    from simddp.workload import build_workload

    workload = build_workload(scenario)
    tr, tp = scenario.training, scenario.parallelism.tp
    redo = sum(la.model_flop for la in workload.layers if recomputed(la, tr.recompute))
    shards = tp if scenario.model.transformer is not None else 1
    per_sample = workload.model_flop_per_sample + shards * redo / tr.micro_batch_size
    return per_sample / tr.seq_len


def checkpoint_bytes(scenario: Scenario) -> int:
    """The training state a checkpoint holds: parameters, master weights and optimizer states (no gradients)."""
    from simddp.workload import total_params

    tr, model = scenario.training, scenario.model
    if model.transformer is not None:
        states = zero_model_states_bytes(total_params(model.transformer), 1, 0, tr.precision, tr.optimizer)
    else:
        states = model_states_bytes(model.parameters or [], tr.precision, tr.optimizer)
    return states.params_bytes + states.optimizer_bytes


def state_is_sharded(scenario: Scenario) -> bool:
    """Whether no single rank holds the whole training state (tp, pp or ZeRO shard it)."""
    par = scenario.parallelism
    return par.tp > 1 or par.pp > 1 or par.zero_stage >= 1


def checkpoint_times(scenario: Scenario, num_bytes: int) -> tuple[float, float]:
    """(rank 0 writing everything, every node writing its part), seconds."""
    run, cluster = scenario.run, scenario.cluster
    one_writer = min(run.node_write_bytes_per_s, run.storage_write_bytes_per_s)
    gather = 0.0
    if state_is_sharded(scenario) and scenario.cluster.num_gpus > 1:
        # Rank 0 receives what the others hold over its own link (another node's GPU when the job spans nodes).
        pair = group(cluster, 2, stride=cluster.gpus_per_node if cluster.num_nodes > 1 else 1)
        remote = num_bytes - num_bytes // cluster.num_gpus
        gather = collective_cost("send-recv", remote, pair).time_s
    rank0 = gather + num_bytes / one_writer
    sharded = num_bytes / min(run.storage_write_bytes_per_s, cluster.num_nodes * run.node_write_bytes_per_s)
    return rank0, sharded


def load_time(scenario: Scenario, num_bytes: int) -> float:
    """Reading a checkpoint back after a restart: a rank-0 file is read whole by every node."""
    run, nodes = scenario.run, scenario.cluster.num_nodes
    readers = nodes if run.checkpoint_saving == "rank0" else 1
    return readers * num_bytes / min(run.storage_read_bytes_per_s, nodes * run.node_write_bytes_per_s)


def startup_time(scenario: Scenario) -> float:
    """DDP's one-time broadcast of the parameters from rank 0 to the data-parallel group (250 MiB chunks)."""
    from simddp.workload import build_workload

    if scenario.dp < 2:
        return 0.0
    workload = build_workload(scenario)
    stage0 = {i for la in workload.rank_layers(0, scenario.parallelism.pp) for i in la.param_indices}
    size = sum(workload.parameters[i].numel * dtype_bytes(workload.parameters[i].dtype) for i in stage0)
    if not size:
        return 0.0
    cost = None
    if scenario.ddp.backend == "gloo":  # gloo's own broadcast (until 2026-11-29 timed as NCCL's: 5.2 ms for 106 ms)
        from simddp.gloo import gloo_cost

        def cost(op: Op, size_bytes: int, dp: CommGroup) -> CollectiveCost:
            return gloo_cost(op, size_bytes, dp, scenario.cluster.gloo)
    return chunked_cost("broadcast", size, PARAM_SYNC_CHUNK_BYTES, dp_group(scenario), cost).time_s


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum interval between checkpoints of ``delta_s`` seconds."""
    if delta_s <= 0:
        return math.inf
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    x = delta_s / (2 * mtbf_s)
    return math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum: sqrt(2 delta M)."""
    return math.sqrt(2 * delta_s * mtbf_s)


def expected_wall_s(training_s: float, interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's complete model: M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau (expm1 for small ratios)."""
    if interval_s <= 0:
        raise ValueError(f"checkpoint interval({interval_s}) must be > 0")
    if math.isinf(interval_s):  # never checkpointing: every failure restarts from the beginning
        interval_s = training_s
    exponent = (interval_s + delta_s) / mtbf_s
    if exponent > 700 or restart_s / mtbf_s > 700:
        return math.inf
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(exponent) * training_s / interval_s


# ---------------------------------------------------------------------------------------- the run
def simulate_run(scenario: Scenario, run: RunConfig | None = None, curve_points: int = 41) -> RunResult:
    """Days, GPU-hours, cost, failures, checkpoints and goodput of training ``scenario`` on ``run.tokens``."""
    if run is not None:
        scenario = scenario.model_copy(update={"run": run})
    run = scenario.run
    if run.tokens is None:
        raise ScenarioError("run.tokens: how many tokens to train on (simddp run --tokens 300e9)")
    cluster, tr = scenario.cluster, scenario.training
    n = cluster.num_gpus
    fpt = flop_per_token(scenario)
    notes: list[str] = []
    full_tokens = scenario.global_batch_size * tr.seq_len
    step_tokens: float = full_tokens  # what one step trains (padding aside)
    if run.achieved_tflops_per_gpu is not None:
        achieved = run.achieved_tflops_per_gpu * 1e12
        peak = cluster.gpu.peak_flop_per_s(tr.precision)
        if achieved > peak:
            raise ScenarioError(
                f"run.achieved_tflops_per_gpu: {run.achieved_tflops_per_gpu:g} TFLOP/s is above the "
                f"{cluster.gpu.name}'s peak, {peak / 1e12:g} TFLOP/s in {tr.precision}")
        tokens_per_s = n * achieved / fpt
        source = f"fed: {run.achieved_tflops_per_gpu:g} TFLOP/s per GPU (run.achieved_tflops_per_gpu)"
        step_s = full_tokens / tokens_per_s
    elif scenario.variability.active:
        from simddp.limits import check_tails_size, max_tail_steps
        from simddp.variability import simulate_tails

        # The mean step of 200 Monte Carlo steps, or of as many as the draws' limit allows (`simddp run` has no
        # --steps: a 64k-sample batch was refused with "use fewer steps"); at a batch that large the mean of fewer
        # steps is already over many replicas.
        num_steps = min(200, max_tail_steps(scenario))
        check_tails_size(scenario, num_steps, "too large for the Monte Carlo: leave the variability section out "
                                              "to use the simulated step")
        tails = simulate_tails(scenario, num_steps)
        tokens_per_s, step_s = tails.tokens_per_s, tails.mean_s
        step_tokens = tails.tokens_per_step  # real tokens: padding trains none (tokens_per_s counts the same)
        source = (f"Monte Carlo mean step ({tails.num_steps} step{'s' if tails.num_steps != 1 else ''}, variability on"
                  + (", fewer than 200: the draws' limit at this batch)" if tails.num_steps < 200 else ")"))
    else:
        from simddp.sim import simulate_step

        step = simulate_step(scenario, trace=False)
        tokens_per_s, step_s = step.tokens_per_s, step.step_time_s
        source = "simulated step"
    if run.achieved_tflops_per_gpu is not None:  # the fed throughput alone sets the step
        check_range(step_s, cause=f"run.achieved_tflops_per_gpu (--tflops-per-gpu) {run.achieved_tflops_per_gpu:g} "
                                  "TFLOP/s is too small")
    check_range(step_s)  # the bound `simulate` keeps to (simddp.sanity)
    if not tokens_per_s > 0:
        raise ScenarioError("the step trains no tokens: check training.seq_len and the batch sizes")
    if run.tokens < full_tokens:
        raise ScenarioError(f"run.tokens: {run.tokens:g} is less than one step's {full_tokens:,} tokens "
                            "(training.global_batch_size x training.seq_len)")
    training_s = run.tokens / tokens_per_s
    num_bytes = checkpoint_bytes(scenario)
    rank0_s, sharded_s = checkpoint_times(scenario, num_bytes)
    delta = rank0_s if run.checkpoint_saving == "rank0" else sharded_s
    per = run.mtbf_hours * HOUR
    units = n if run.mtbf_scope == "gpu" else cluster.num_nodes
    mtbf_s = per / units
    restart_s = run.restart_overhead_s + load_time(scenario, num_bytes)
    interval = run.checkpoint_interval_s or daly_interval(delta, mtbf_s)
    chosen = "run.checkpoint_interval_s" if run.checkpoint_interval_s else "Daly's optimum"
    raised = interval < step_s
    if raised:  # a checkpoint is taken between steps (Megatron's --save-interval counts iterations)
        notes.append(f"checkpoint interval: {chosen}, {interval:.3g} s, is shorter than one step: raised to the step, "
                     f"{step_s:.3g} s (a checkpoint is taken between steps)")
        interval = step_s
    if not interval < training_s:
        if run.checkpoint_interval_s and math.isfinite(interval) and interval > training_s:
            notes.append(f"checkpoint interval: {interval:.3g} s is longer than the training, {training_s:.3g} s: "
                         "one checkpoint at the end")
        interval = training_s
    if delta > interval:
        notes.append(f"a checkpoint takes {delta:.3g} s, longer than the {interval:.3g} s of training between two: "
                     "most of the run is spent saving (raise the storage bandwidth or save sharded)")
    startup = startup_time(scenario)
    wall = startup + expected_wall_s(training_s, interval, delta, restart_s, mtbf_s)
    if not wall <= MAX_RUN_DAYS * DAY:
        if training_s > MAX_RUN_DAYS * DAY:  # failures aside: the tokens at this throughput
            raise ScenarioError(f"run.tokens: {run.tokens:g} tokens take {training_s / DAY:.3g} days of training "
                                f"at {tokens_per_s:.3g} tokens/s, beyond the {MAX_RUN_DAYS:.0e} days answered for")
        progress = ("expected progress is nil" if not math.isfinite(wall)
                    else f"it would take {wall / DAY:.3g} days, beyond the {MAX_RUN_DAYS:.0e} answered for")
        raise ScenarioError(
            f"the run never finishes: with a failure every {mtbf_s / HOUR:.3g} h (run.mtbf_hours / {units:,} "
            f"{run.mtbf_scope}s), checkpoints of {delta:.3g} s every {interval:.3g} s and restarts of "
            f"{restart_s:.3g} s, {progress}; raise run.mtbf_hours or the storage bandwidth, or checkpoint less "
            "often (run.checkpoint_interval_s)"
        )
    if state_is_sharded(scenario) and run.checkpoint_saving == "rank0":
        notes.append("rank0 saving of a sharded state (tp, pp or ZeRO) gathers it to rank 0 first; rank 0 also "
                     "needs host memory for all of it")
    if run.checkpoint_interval_s is None and not raised:  # a raised one has its own note
        notes.append("checkpoint interval: Daly's optimum for this checkpoint time and MTBF")
    elif run.checkpoint_interval_s is not None and not raised and interval < training_s:
        notes.append(f"checkpoint interval: fixed by run.checkpoint_interval_s ({interval:.3g} s); Daly's optimum "
                     f"would be {daly_interval(delta, mtbf_s):.3g} s")
    curve = goodput_curve(training_s, delta, restart_s, mtbf_s, startup, interval, curve_points, step_s)
    gpu_hours = wall * n / HOUR
    return RunResult(
        scenario=scenario.name, num_gpus=n, num_nodes=cluster.num_nodes, tokens=run.tokens,
        throughput_source=source, tokens_per_s=tokens_per_s, step_time_s=step_s,
        num_steps=run.tokens / step_tokens, flop_per_token=fpt,
        achieved_flop_per_s_per_gpu=tokens_per_s * fpt / n, training_s=training_s, training_days=training_s / DAY,
        startup_s=startup, checkpoint_bytes=num_bytes, checkpoint_saving=run.checkpoint_saving,
        checkpoint_time_s=delta, checkpoint_time_rank0_s=rank0_s, checkpoint_time_sharded_s=sharded_s,
        checkpoint_interval_s=interval, young_interval_s=young_interval(delta, mtbf_s), restart_s=restart_s,
        mtbf_s=mtbf_s, expected_failures=wall / mtbf_s, wall_s=wall, days=wall / DAY, gpu_hours=gpu_hours,
        cost=gpu_hours * run.gpu_hour_cost_usd, gpu_hour_cost_usd=run.gpu_hour_cost_usd,
        goodput=training_s / wall, curve=curve, notes=notes,
    )


def goodput_curve(training_s: float, delta_s: float, restart_s: float, mtbf_s: float, startup_s: float,
                  around_s: float, points: int = 41, step_s: float = 0.0) -> list[GoodputPoint]:
    """Goodput at intervals from around/30 to 30 x around (log-spaced), no shorter than one step (a checkpoint is
    taken between steps) and capped at the training time."""
    if points < 2 or not around_s > 0:
        return []
    lo, hi = math.log(max(around_s / 30, step_s)), math.log(min(around_s * 30, training_s))
    if hi <= lo:
        hi = lo + math.log(2)
    out = []
    for k in range(points):
        tau = math.exp(lo + (hi - lo) * k / (points - 1))
        wall = startup_s + expected_wall_s(training_s, tau, delta_s, restart_s, mtbf_s)
        if math.isfinite(wall):
            out.append(GoodputPoint(checkpoint_interval_s=tau, goodput=training_s / wall, days=wall / DAY))
    return out


__all__ = [
    "MAX_RUN_DAYS",
    "RUN_JSON_KEYS",
    "GoodputPoint",
    "RunResult",
    "checkpoint_bytes",
    "checkpoint_times",
    "daly_interval",
    "expected_wall_s",
    "flop_per_token",
    "goodput_curve",
    "load_time",
    "simulate_run",
    "startup_time",
    "young_interval",
]
