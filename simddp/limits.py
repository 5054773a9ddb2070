"""Caps that keep the cost of any scenario bounded (see docs/safety.md).

Every cost in simddp is linear (or n log n) in the layers, parameters and buckets of one GPU, and the
simulator's events scale with layers + buckets; ranks that behave alike are simulated once, and a
data-parallel step with many micro-batches is simulated once and extended exactly. Two schedules must
simulate every micro-batch: a pipeline (each stage and model chunk runs each micro-batch) and ZeRO-3 /
FSDP (each micro-batch gathers every unit again). Their cost is capped by :data:`MAX_LAYER_PASSES`.
On the 2-core development machine the largest scenarios allowed take about 10 to 20 seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from simddp.config import MAX_GPUS, Scenario
from simddp.errors import ScenarioError

#: Most transformer blocks.
MAX_LAYERS = 16_384
#: Most entries of an explicit parameter list (one layer each unless `layers` groups them): 65,536, above the
#: tensors of any published model (a 671B MoE of 61 layers with 256 experts holds about 47,000 expert matrices).
#: One evaluation costs about 50 us per entry (2026-11-25: a 100,000-entry list simulated in 5 s), and
#: `knobs`, `memory --max-micro-batch` and `memory --fit-layout` evaluate 8 to 30 variants: at 2^18 those ran
#: for minutes (a hostile-input probe), at 2^16 for under a minute.
MAX_PARAMETERS = 2**16
#: Most (micro-batch, pipeline stage x model chunk) or (micro-batch, layer) passes a pipeline or a
#: ZeRO-3 step simulates.
MAX_LAYER_PASSES = 2**17
#: Largest message ``simddp collective --bytes`` takes: 1 EiB, far beyond any real collective.
MAX_MESSAGE_BYTES = 2**60
#: Most layouts `simddp plan --top` lists (each beyond the first few costs simulations of its own).
MAX_PLAN_TOP = 100
#: Most (layers x layout groups) `simddp plan` searches: each (tp, pp, virtual stages, SP) group builds its workload
#: and checks its candidates' memory at a cost that grows with the layers, about 0.35 ms per layer and group on the
#: 2-core machine (a 2,000-layer model on 8 GPUs, 115 groups: 84 s). 500,000 is a few minutes at most; GPT-3 on
#: 1,024 GPUs is 27,648, the 1T model on 3,072 84,224. A hostile-input probe's 16,384 layers on 1,024 GPUs ran
#: past 10 minutes with no end in sight.
MAX_PLAN_LAYER_GROUPS = 500_000
#: Most Monte Carlo steps of `simddp tails`.
MAX_TAIL_STEPS = 100_000
#: Most elements of one array of `simddp tails` (steps x ranks, steps x replicas x samples, or in a pipeline steps x
#: replicas x stages x micro-batches: :func:`tails_draws`): 64 MiB of float64 each. Until 2026-11-29 the pipeline's
#: arrays were not counted: 2,048 steps of pp 32 and 4,096 samples took 6.5 GB.
MAX_TAIL_DRAWS = 2**23


def worker_processes(jobs: int, tasks: int) -> int:
    """Worker processes to start for ``--jobs`` ``jobs`` and ``tasks`` to share: never more than the tasks, or
    than the CPUs this process may run on (the work is CPU-bound: more processes only add start-up time and
    memory; ``--jobs 100000`` once started thousands)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(jobs, tasks, cpus))


#: Seconds an interrupted pool's workers get to finish their current task before they are terminated.
_WORKER_GRACE_S = 2.0


def _worker_start(initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    """A worker process ignores Ctrl-C: the parent, which gets it too, stops the pool (:func:`worker_pool`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(jobs: int, initializer: Callable[..., None] | None = None,
                initargs: tuple[Any, ...] = ()) -> Iterator[Any]:
    """A ``ProcessPoolExecutor`` of ``jobs`` workers that stops when the parent is interrupted or fails: queued
    work cancelled, each worker's current task given :data:`_WORKER_GRACE_S`, then the worker terminated. (With
    each worker taking Ctrl-C itself, `plan --jobs 2` and `sweep --jobs 2` hung for good in 2 of 5 interrupts, a
    worker waiting on a lock and the parent on it.)"""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_start, initargs=(initializer, initargs))
    try:
        yield pool
    except BaseException:
        # Queued work cancelled; each worker ends its current task and exits (it ignores Ctrl-C), within a couple of
        # seconds, or is terminated. Terminating at once left the executor's manager thread failing work that the
        # interrupted map had cancelled (InvalidStateError, CPython 3.11), or woken at exit through a closed pipe.
        processes = list((getattr(pool, "_processes", None) or {}).values())  # the executor's own, if any
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + _WORKER_GRACE_S
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        manager = getattr(pool, "_executor_manager_thread", None)
        if manager is not None:
            manager.join(timeout=5)
        raise
    pool.shutdown(wait=True)


def num_model_layers(scenario: Scenario) -> int:
    """Transformer blocks, or modules of a parameter-list model."""
    model = scenario.model
    if model.transformer is not None:
        return model.transformer.num_layers
    return len(model.layers or model.parameters or [])


def too_many_gpus(num_nodes: int, gpus_per_node: int,
                  names: tuple[str, str] = ("cluster: num_nodes", "gpus_per_node")) -> str | None:
    """What is wrong with a cluster of more than :data:`MAX_GPUS` GPUs, or None; ``names``: what the two counts
    are called where they were given (scenario keys, or flags). The scenario's own validation asks first (before
    its layout checks, which would blame the batch or tp for it), this module again."""
    gpus = num_nodes * gpus_per_node
    if gpus <= MAX_GPUS:
        return None
    return (f"{names[0]}({num_nodes}) x {names[1]}({gpus_per_node}) = {gpus:,} GPUs is over the limit "
            f"of {MAX_GPUS:,} (simddp.limits.MAX_GPUS)")


def check_scenario_size(scenario: Scenario) -> None:
    """Refuse a scenario whose size alone makes every cost unbounded (raises :class:`ScenarioError`)."""
    cluster = scenario.cluster
    problem = too_many_gpus(cluster.num_nodes, cluster.gpus_per_node)
    if problem:
        raise ScenarioError(problem)
    tf = scenario.model.transformer
    if tf is not None and tf.num_layers > MAX_LAYERS:
        raise ScenarioError(f"model.transformer.num_layers({tf.num_layers:,}) is over the limit of {MAX_LAYERS:,} "
                            "(simddp.limits.MAX_LAYERS)")
    params = scenario.model.parameters
    if params is not None and len(params) > MAX_PARAMETERS:
        raise ScenarioError(f"model.parameters: {len(params):,} entries is over the limit of {MAX_PARAMETERS:,} "
                            "(simddp.limits.MAX_PARAMETERS)")


class SimulationTooLarge(ScenarioError):
    """A step whose event-by-event simulation (simpy: ``--exact``, a trace) would run more passes than the limit;
    the fast engine may still answer it."""


def check_simulation_size(scenario: Scenario) -> None:
    """Refuse a step whose pipeline, ZeRO-3 or every-micro-batch reduction would simulate too many passes."""
    from simddp.zero import zero_rule

    check_scenario_size(scenario)
    par, micro = scenario.parallelism, scenario.num_micro_batches
    how = (f"{micro:,} micro-batches per step = global_batch_size({scenario.global_batch_size}) / "
           f"(micro_batch_size({scenario.training.micro_batch_size}) x dp({scenario.dp}))")
    if par.pp > 1:
        passes = micro * par.pp * par.virtual_stages
        if passes > MAX_LAYER_PASSES:
            raise SimulationTooLarge(
                f"the pipeline would simulate {passes:,} passes ({how}, x pp({par.pp}) x "
                f"virtual_stages({par.virtual_stages})), over the limit of {MAX_LAYER_PASSES:,} "
                "(simddp.limits.MAX_LAYER_PASSES); use fewer micro-batches per step"
            )
    elif zero_rule(scenario).sharded_params or zero_rule(scenario).every_micro_batch:
        # ZeRO-3 gathers, and DeepSpeed's ZeRO-2 reduces, in every micro-batch: each runs layer by layer
        layers = num_model_layers(scenario)
        passes = micro * layers
        if passes > MAX_LAYER_PASSES:
            raise SimulationTooLarge(
                f"{zero_rule(scenario).name} would simulate {passes:,} layer passes ({how}, x {layers:,} layers), "
                f"over the limit of {MAX_LAYER_PASSES:,} (simddp.limits.MAX_LAYER_PASSES); use fewer micro-batches "
                "per step"
            )


def tails_draws(scenario: Scenario) -> tuple[int, str]:
    """The largest array of one Monte Carlo step of `simddp tails` (elements) and what it holds: ranks (the
    jitter), micro-batches of every replica (their costs), samples (document lengths, drawn unless they are
    fixed) or, in a pipeline, replicas x stages x micro-batches (each stage's work per micro-batch)."""
    par = scenario.parallelism
    micro = scenario.dp * scenario.num_micro_batches
    sizes = {"ranks": scenario.cluster.num_gpus, "micro-batches per step": micro}
    if scenario.variability.seq_len_distribution != "fixed":
        sizes["samples per step"] = micro * scenario.training.micro_batch_size
    if par.pp > 1:
        sizes["replicas x stages x micro-batches"] = micro * par.pp
    what = max(sizes, key=sizes.__getitem__)
    return sizes[what], what


def max_tail_steps(scenario: Scenario) -> int:
    """Most Monte Carlo steps whose arrays stay within :data:`MAX_TAIL_DRAWS`; 1 where even one step is beyond it
    (:func:`check_tails_size` then refuses it)."""
    return max(1, min(MAX_TAIL_STEPS, MAX_TAIL_DRAWS // tails_draws(scenario)[0]))


def check_tails_size(scenario: Scenario, num_steps: int, fewer: str = "use fewer steps") -> None:
    """Refuse a Monte Carlo whose arrays would not fit in memory (``fewer``: what the caller can change)."""
    if not 1 <= num_steps <= MAX_TAIL_STEPS:
        raise ScenarioError(f"steps({num_steps:,}) must be 1..{MAX_TAIL_STEPS:,} (simddp.limits.MAX_TAIL_STEPS)")
    size, what = tails_draws(scenario)
    draws = num_steps * size
    if draws > MAX_TAIL_DRAWS:
        raise ScenarioError(
            f"steps({num_steps:,}) x {size:,} {what} = {draws:,} draws is over the limit of {MAX_TAIL_DRAWS:,} "
            f"(simddp.limits.MAX_TAIL_DRAWS); {fewer}"
        )


#: Most distinct message sizes `simddp calibrate fit` fits per collective and communicator: its breakpoint search
#: fits every contiguous run of sizes (quadratic); an nccl-tests sweep has 20 to 40, a dense one of 4 sizes
#: per doubling over 1 B .. 8 GiB about 130. At the limit a fit takes about 1 s per collective.
MAX_COMM_SIZES = 256
#: Shortest measured median time a calibration file may hold, s: 1 ns is below any timer's resolution (CUDA
#: events: 0.5 us); a shorter median is a unit error or a corrupt file, and its 1/t weight overflows.
MIN_TIMING_S = 1e-9
#: Longest measured time (and largest difference of times) a calibration file may hold, s: 1e6 s (11.6 days)
#: is far beyond any one step or collective.
MAX_TIMING_S = 1e6
#: Most ranks per node `simddp calibrate collect --nproc-per-node` starts: more than any node's GPUs or CPU
#: cores (each rank is a process).
MAX_NPROC_PER_NODE = 1024

__all__ = [
    "MAX_COMM_SIZES",
    "MAX_GPUS",
    "MAX_LAYERS",
    "MAX_LAYER_PASSES",
    "MAX_MESSAGE_BYTES",
    "MAX_NPROC_PER_NODE",
    "MAX_PARAMETERS",
    "MAX_PLAN_LAYER_GROUPS",
    "MAX_PLAN_TOP",
    "MAX_TAIL_DRAWS",
    "MAX_TAIL_STEPS",
    "MAX_TIMING_S",
    "MIN_TIMING_S",
    "SimulationTooLarge",
    "check_scenario_size",
    "check_simulation_size",
    "check_tails_size",
    "max_tail_steps",
    "num_model_layers",
    "tails_draws",
    "too_many_gpus",
    "worker_pool",
    "worker_processes",
]
