"""simddp: a discrete-event simulator and cost model for distributed deep-learning training.

It answers: if I train this model on this cluster with this parallel layout, how long does a step take,
how much of it is communication, and does it fit in memory?

Glossary
--------
rank
    One process driving one GPU. Ranks that behave identically are simulated once.
dp / tp / pp degree
    Data-parallel replicas, tensor-parallel shards of each layer, pipeline stages;
    dp x tp x pp = number of GPUs. Ranks are placed tp-fastest, then dp, then pp (Megatron-LM).
bucket
    A group of gradients that torch DDP all-reduces in one collective (``bucket_cap_mb``, MiB).
    Buckets are formed in gradient-ready order after DDP's first iteration, exactly as torch does.
ZeRO stage, implementation
    What is sharded over the dp ranks (1: optimizer states; 2: and gradients; 3: and parameters), and who runs
    it (``ddp.implementation``: torch, DeepSpeed or Megatron-LM), which decides the collectives, when they run
    and which buffers exist (:mod:`simddp.zero`).
link tier
    NVLink/NVSwitch or PCIe inside a node, NICs between nodes; each has a latency (alpha) and a
    bandwidth (1/beta) in the alpha-beta model.
input-grad vs weight-grad
    Backward of a layer computes the gradient of its input (dgrad, needed by the layer before) and of
    its weights (wgrad); a parameter's gradient is ready for DDP when its wgrad finishes.
exposed communication
    The data-parallel communication the GPU waits for, not hidden behind compute (gradient reductions,
    parameter gathers, the embedding sync). The step's other waits are parts of their own: tensor-parallel
    collectives, the pipeline bubble and stage imbalance, kernels slowed by NCCL (``StepResult.breakdown``
    lists every part; they add up to the step).
busbw / algbw
    nccl-tests' bus and algorithm bandwidths: algbw = size / time; busbw = algbw x 2(n-1)/n for
    all-reduce, comparable across world sizes.
jitter / straggler / tail
    Step-to-step variation of a rank's compute (lognormal, a coefficient of variation), a rank that is
    persistently slower, and the slow steps they cause because every collective waits for its slowest
    member (:mod:`simddp.variability`, ``simddp tails``).
MTBF / goodput
    Mean time between job-interrupting failures (per GPU or node; the job's is that over the count), and
    the share of a run's wall clock spent training rather than checkpointing, restarting or redoing lost
    work (:mod:`simddp.run`, ``simddp run``).

Units inside are bytes, seconds, FLOP, bytes/s and FLOP/s (see :mod:`simddp.units`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simddp.bucketing import Bucket, ddp_buckets
from simddp.collectives import CollectiveCost, collective_cost
from simddp.config import Scenario, ScenarioError
from simddp.memory import MemoryBreakdown, max_micro_batch_that_fits, memory_breakdown, smallest_layout_that_fits
from simddp.results import Bounds, BucketTiming, StepResult, Trace
from simddp.scenario_io import as_scenario, load_scenario, scenario_from_dict

__version__ = "0.1.0"


def simulate(scenario: Scenario | dict[str, Any] | str | Path, trace: bool = True, exact: bool = False) -> StepResult:
    """Simulate one training step; see :class:`StepResult` for what comes back.

    Without a trace the fast engine answers where it is exact; ``exact=True`` forces the simpy simulation.
    """
    from simddp.sanity import check_range
    from simddp.sim import simulate_step

    result = simulate_step(as_scenario(scenario), trace=trace, exact=exact)
    check_range(result.step_time_s)  # the longest step answered for, as the CLI, tails and training_run keep to
    return result


def tails(scenario: Scenario | dict[str, Any] | str | Path, steps: int = 200, seed: int | None = None) -> Any:
    """Monte Carlo step times under the scenario's ``variability`` (a :class:`simddp.variability.VariabilityResult`)."""
    from simddp.errors import whole_number
    from simddp.variability import simulate_tails

    steps = whole_number("steps", steps)
    seed = None if seed is None else whole_number("seed", seed, 0)
    return simulate_tails(as_scenario(scenario), steps, seed)


def training_run(scenario: Scenario | dict[str, Any] | str | Path, tokens: float | None = None) -> Any:
    """The whole training run of the scenario (a :class:`simddp.run.RunResult`); ``tokens`` overrides run.tokens."""
    from pydantic import ValidationError

    from simddp.config import RunConfig, format_validation_error
    from simddp.run import simulate_run

    sc = as_scenario(scenario)
    if tokens is not None:
        try:
            run_config = RunConfig.model_validate({**sc.run.model_dump(), "tokens": tokens})
        except ValidationError as err:
            raise ScenarioError("run." + format_validation_error(err)) from None
        sc = sc.model_copy(update={"run": run_config})
    return simulate_run(sc)


__all__ = [
    "Bounds",
    "Bucket",
    "BucketTiming",
    "CollectiveCost",
    "MemoryBreakdown",
    "Scenario",
    "ScenarioError",
    "StepResult",
    "Trace",
    "as_scenario",
    "collective_cost",
    "ddp_buckets",
    "load_scenario",
    "max_micro_batch_that_fits",
    "memory_breakdown",
    "scenario_from_dict",
    "simulate",
    "smallest_layout_that_fits",
    "tails",
    "training_run",
]
