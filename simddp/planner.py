"""``simddp plan``: the fastest parallel layouts that fit, for a model, a global batch and a GPU count.

The search enumerates tensor parallelism (divisors of the heads that stay inside a node), pipeline
parallelism (divisors of the layers, and of the GPUs up to the layers: uneven stages), virtual stages
(interleaving, when the micro-batches allow it and every chunk holds a layer), data parallelism (the rest of
the GPUs), ZeRO stage (2 and 3 with pipelining only under torch's FSDP: DeepSpeed's pipeline engine refuses
them, Megatron has neither), micro-batch size (dividing the per-replica batch), activation recompute, sequence
parallelism and DDP's bucket cap. The memory model prunes first (cheap); the survivors are simulated
(the fast engine where it is exact, simpy otherwise) and ranked by step time or tokens per second.
Everything else (model, batch, precision, optimizer, overlap options, cluster) is the scenario's own.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simddp.collectives import collective_cost
from simddp.config import Cluster, Scenario, ScenarioError, Training, default_overlap
from simddp.errors import whole_number
from simddp.limits import MAX_GPUS, MAX_PLAN_LAYER_GROUPS, MAX_PLAN_TOP, num_model_layers, worker_pool, worker_processes
from simddp.memory import memory_breakdown
from simddp.results import StepResult
from simddp.sanity import MAX_STEP_TIME_S, check_range
from simddp.scenario_io import as_scenario
from simddp.sim.layers import LayerPlan, pass_alone
from simddp.sim.plan import boundary_sends, rank_layer_plans
from simddp.sim.step import PUBLISHED_FSDP_ERROR, published_fsdp_gap, simulate_step
from simddp.topology import tp_group
from simddp.workload import Workload, build_workload
from simddp.zero import zero_rule

Objective = Literal["step_time", "tokens_per_s"]
OBJECTIVES: tuple[str, ...] = ("step_time", "tokens_per_s")

#: Activation recompute the search tries (torchtitan's op-level ``selective-op`` is not searched: it lies between
#: Megatron's ``selective`` and ``full`` in both the memory it keeps and the time it recomputes).
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
#: Bucket caps the search tries, MiB: torch's default 25 and a large one (fewer, larger all-reduces).
BUCKET_CAPS_MB: tuple[float, ...] = (25.0, 100.0)
#: Largest interleaving (virtual stages) tried: up to one layer per chunk of GPT-3 at pp 8 (Megatron accepts any
#: count that divides the layers per stage). It was 4 until 2026-11-25, which missed GPT-3's tp8 pp4 layouts with
#: 6, 8 and 12 chunks (17.57-17.62 s) that beat v 4 (17.80 s); the search went from 5.8 to 8.4 s.
MAX_VIRTUAL_STAGES = 12


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlannedLayout(_Frozen):
    """One layout the planner evaluated."""

    tp: int = Field(description="Tensor-parallel degree.")
    pp: int = Field(description="Pipeline-parallel stages.")
    dp: int = Field(description="Data-parallel degree.")
    virtual_stages: int = Field(description="Model chunks per pipeline stage (interleaved 1F1B when > 1).")
    zero_stage: int = Field(description="ZeRO stage.")
    micro_batch_size: int = Field(description="Samples per GPU per micro-batch.")
    recompute: str = Field(description="Activation recompute: none, selective or full.")
    sequence_parallel: bool = Field(description="Megatron sequence parallelism.")
    bucket_cap_mb: float | None = Field(description="DDP bucket cap, MiB (null: the implementation's default, "
                                                   "for the scenario's own layout).")
    step_time_s: float | None = Field(description="Simulated step time, s (null: not simulated, it does not fit).")
    tokens_per_s: float | None = Field(description="Tokens per second of the whole job.")
    mfu: float | None = Field(description="Model FLOP utilisation.")
    memory_bytes: int = Field(description="Peak memory of the most loaded GPU, bytes.")
    fits: bool = Field(description="Whether that fits the GPU.")

    def label(self) -> str:
        v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        sp = " SP" if self.sequence_parallel else ""
        return (f"tp={self.tp} pp={self.pp}{v} dp={self.dp} ZeRO-{self.zero_stage} mbs={self.micro_batch_size} "
                f"recompute={self.recompute}{sp} cap={_cap_text(self.bucket_cap_mb)}")


def _cap_text(cap_mb: float | None) -> str:
    return "default" if cap_mb is None else f"{cap_mb:g}MiB"


class PlanResult(_Frozen):
    """The planner's answer: layouts fastest first (those that fit), then the ones that do not."""

    num_gpus: int = Field(description="GPUs planned for.")
    objective: Objective = Field(description="What the layouts are ranked by.")
    evaluated: int = Field(description="Valid layouts evaluated (memory model), fitting or not.")
    dominated: int = Field(description="Evaluated layouts known not to fit without their own memory estimate: a "
                                       "smaller micro-batch or heavier recompute of the same layout did not.")
    fitting: int = Field(description="Evaluated layouts that fit the GPU's memory.")
    simulated: int = Field(description="Fitting layouts simulated (the rest could not beat the top: their lower "
                                       "bound was slower).")
    untimed: int = Field(default=0, description="Fitting layouts that could not be simulated (over the simulation "
                                                "size or step-time limits), left out of the ranking.")
    untimed_reason: str | None = Field(default=None, description="Why the first of them could not be.")
    layouts: list[PlannedLayout] = Field(description="Fitting layouts, best first.")
    simulated_layouts: list[PlannedLayout] = Field(description="Every layout simulated, best first.")
    front: list[PlannedLayout] | None = Field(
        default=None, description="Pareto front of step time against memory per GPU of the simulated layouts, "
        "least memory first (when asked for; exact over every fitting layout with exact_front).")
    exact_front: bool = Field(default=False, description="Whether every layout that could be on the front was "
                                                         "simulated.")

    def to_json_dict(self) -> dict[str, Any]:
        """``{"evaluated": int, "layouts": [...]}``, fastest first (issue 10's format), with the search's other
        counts beside them."""
        return {"evaluated": self.evaluated, "dominated": self.dominated, "fitting": self.fitting,
                "simulated": self.simulated, "untimed": self.untimed, "objective": self.objective,
                "num_gpus": self.num_gpus, "layouts": [layout.model_dump() for layout in self.layouts]}

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame([layout.model_dump() for layout in self.layouts], columns=list(PlannedLayout.model_fields))


#: Largest micro-batch size (samples) the search considers. The divisors of the batch a replica takes are the
#: candidates, found by trial division up to this bound. Counting up to the batch, a batch of 10**9 took over
#: 120 s to plan; up to its square root, one of 10**18 (a probe's input) still took 540 s. No GPU holds
#: micro-batches this large of any real model.
MAX_PLAN_MICRO_BATCH = 2**16


def _divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (all without one) in increasing order: O(min(sqrt n, limit))."""
    if limit is not None and limit * limit < n:
        return [d for d in range(1, limit + 1) if n % d == 0]
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    out = small + large[::-1]
    return out if limit is None else [d for d in out if d <= limit]


def candidate_layouts(scenario: Scenario, num_gpus: int) -> Iterator[dict[str, Any]]:
    """Every layout the search considers, as scenario section updates (before validation)."""
    tf = scenario.model.transformer
    per_node = scenario.cluster.gpus_per_node
    layers = tf.num_layers if tf is not None else len(scenario.model.layers or scenario.model.parameters or [])
    heads = tf.num_heads if tf is not None else 1
    gbs = scenario.global_batch_size
    tps = [t for t in _divisors(per_node) if heads % t == 0] if tf is not None else [1]
    recomputes = RECOMPUTE_MODES if tf is not None else ("none",)
    # DeepSpeed (every stage, ZeRO-3's reduce buckets too) and Megatron size their buckets from the cap
    torch_fsdp = scenario.ddp.implementation == "torch"
    one_bucket = scenario.ddp.implementation == "megatron" and not (
        scenario.ddp.overlap if scenario.ddp.overlap is not None else default_overlap("megatron", 0))
    # pp: the divisors of the layers (even stages, as Megatron requires), and those of the GPUs up to the layers,
    # whose stages are uneven (simulate's split, torchtitan's: workload.block_stage_starts): on 24 GPUs a 32-layer
    # model has no layout with even stages whose dp divides 512.
    pps = sorted(set(_divisors(layers)) | {d for d in _divisors(num_gpus) if d <= layers}) if tf is not None \
        else _divisors(layers)
    for tp in tps:
        for pp in pps:
            if tp * pp > num_gpus or num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if gbs % dp:
                continue
            per_replica = gbs // dp
            # Interleaving: every chunk holds a block at least (uneven chunks are split as simulate splits them,
            # torchtitan's split, workload.block_stage_starts); a parameter-list model's chunks are cut by size, so
            # its layers must divide evenly.
            vs = [v for v in range(1, MAX_VIRTUAL_STAGES + 1)
                  if pp > 1 and (pp * v <= layers if tf is not None else layers % (pp * v) == 0)] or [1]
            # Recompute applies to transformer blocks only: tried once for other models. (ZeRO stages and bucket
            # caps are all tried at dp 1 too: with several micro-batches they time differently there.)
            for v, zero, mbs, recompute, sp, cap in itertools.product(
                    vs, (0, 1, 2, 3), _divisors(per_replica, MAX_PLAN_MICRO_BATCH), recomputes,
                    (False, True) if tp > 1 else (False,), BUCKET_CAPS_MB):
                if pp > 1 and zero >= 2 and not torch_fsdp:
                    continue  # DeepSpeed's pipeline engine refuses ZeRO-2/3, Megatron has neither; torch's FSDP runs
                    # beside its pipelining (torchtitan)
                micro = per_replica // mbs
                if v > 1 and micro % pp:
                    continue
                if cap != BUCKET_CAPS_MB[0] and ((torch_fsdp and zero >= 2) or one_bucket):
                    continue  # torch's ZeRO-2/3 is FSDP, which reduces per unit; Megatron without
                    # overlap_grad_reduce reduces one bucket: the bucket cap plays no part
                yield {
                    "parallelism": {"dp": None, "tp": tp, "pp": pp, "zero_stage": zero, "sequence_parallel": sp,
                                    "virtual_stages": v,
                                    "pipeline_schedule": "interleaved-1f1b" if v > 1 else
                                    (scenario.parallelism.pipeline_schedule
                                     if scenario.parallelism.pipeline_schedule != "interleaved-1f1b" else "1f1b")},
                    "training": {"micro_batch_size": mbs, "recompute": recompute, "global_batch_size": gbs},
                    "ddp": {"bucket_cap_mb": cap},
                }


def cluster_update(cluster: Cluster, num_gpus: int) -> dict[str, Any]:
    """The cluster keys that make ``cluster`` ``num_gpus`` GPUs: whole nodes, or one node's share of them."""
    per_node = cluster.gpus_per_node
    if num_gpus <= 0:
        raise ScenarioError(f"--gpus({num_gpus}) must be > 0")
    if num_gpus > MAX_GPUS:
        raise ScenarioError(f"--gpus({num_gpus}) exceeds the limit of {MAX_GPUS} GPUs")
    if num_gpus % per_node == 0:
        return {"num_nodes": num_gpus // per_node}
    if num_gpus < per_node and per_node % num_gpus == 0:
        return {"num_nodes": 1, "gpus_per_node": num_gpus}
    raise ScenarioError(f"--gpus({num_gpus}) is neither a whole number of {per_node}-GPU nodes nor a part of one "
                        f"node that divides its GPUs ({cluster.preset or 'cluster'}: gpus_per_node {per_node})")


@dataclass
class PlanStart:
    """Where a search starts (:func:`plan_start`)."""

    base: Scenario  # the scenario on the GPUs planned for, its layout valid there (the planner replaces it)
    own: Scenario | None  # the user's scenario on those GPUs with its own layout (None: not valid there)
    why_not: str | None  # then, why not
    cluster_sets: dict[str, Any]  # the cluster keys that make the user's cluster those GPUs


def plan_start(data: dict[str, Any], num_gpus: int | None = None) -> PlanStart:
    """The scenario a search over ``num_gpus`` GPUs (default: the scenario's) starts from, for ``simddp plan`` and
    the dashboard's Plan page alike.

    The planner replaces the layout, so a layout that does not validate (a tp that does not divide the heads, a
    dp that does not divide a batch smaller than the GPUs) does not stop it: the scenario is then validated
    with the first of :func:`layout_starts` that is valid. Where none is, the scenario's own error is the answer
    (it is not about the layout). A null global batch is derived on the GPUs planned for, as simulate would."""
    from simddp.config import format_validation_error, set_path, set_value
    from simddp.scenario_io import apply_calibration, scenario_from_dict

    calibrated = apply_calibration(data)  # the sections as validation sees them: a profile fills them in first
    try:
        cluster = Cluster.model_validate(calibrated.get("cluster") or {})
    except ValidationError as err:  # the cluster itself is wrong: the scenario's own one-line error
        scenario_from_dict(data)
        raise ScenarioError("cluster." + format_validation_error(err)) from None
    nodes = cluster_update(cluster, num_gpus) if num_gpus else {}
    cluster_sets = {f"cluster.{k}": v for k, v in nodes.items()}

    def variant(layout: list[str]) -> Scenario:
        out = data
        for key, value in cluster_sets.items():
            out = set_value(out, key, value)
        for item in layout:  # key.path=value, as --set gives them
            key, text = item.split("=", 1)
            out = set_path(out, key, text)
        return scenario_from_dict(out)

    try:
        own = variant([])
    except ScenarioError as err:
        first = err
    else:
        return PlanStart(own, own, None, cluster_sets)
    total = nodes.get("gpus_per_node", cluster.gpus_per_node) * nodes.get("num_nodes", cluster.num_nodes)
    starts = list(layout_starts(data, cluster.gpus_per_node, total))
    for layout in starts:
        try:
            base = variant(layout)
        except ScenarioError:
            continue
        return PlanStart(base, None, str(first), cluster_sets)
    training = data.get("training")
    batch = training.get("global_batch_size") if isinstance(training, dict) else None
    if batch is not None and starts:
        try:  # the batch's own value first (a negative or fractional one is not a batch no layout splits)
            Training.model_validate(calibrated.get("training") or {})
        except ValidationError as err:
            raise ScenarioError("training." + format_validation_error(err)) from None
        try:  # valid with the batch derived: then the batch is what no layout can split
            variant([*starts[0], "training.global_batch_size=null"])
        except ScenarioError:
            pass
        else:
            raise ScenarioError(
                f"training.global_batch_size({batch}): no layout splits it over {total:,} GPUs (dp = GPUs / (tp x "
                "pp) must divide it, with tp within a node and pp at most the stages the model allows); plan for "
                "fewer GPUs or a larger batch") from None
    raise first


def layout_starts(data: dict[str, Any], gpus_per_node: int, num_gpus: int) -> Iterator[list[str]]:
    """Layouts to validate a scenario dict with when its own does not validate (``key.path=value`` settings):
    tp x pp = 1, 2, 3, ... (tp a divisor of a node's GPUs, pp of the GPUs), dp derived, no interleaving or
    sequence parallelism, micro-batch 1 where the global batch is set; the planner replaces all of them."""
    schedule = (data.get("parallelism") or {}).get("pipeline_schedule") if isinstance(data.get("parallelism"),
                                                                                      dict) else None
    training = data.get("training")
    # A micro-batch of 1 lets a set batch split over more layouts; a null batch is micro_batch_size x dp, the
    # user's micro-batch kept.
    set_batch = isinstance(training, dict) and training.get("global_batch_size") is not None
    pairs = sorted(((tp, pp) for tp in _divisors(gpus_per_node) for pp in _divisors(num_gpus, 4096)
                    if num_gpus % (tp * pp) == 0), key=lambda p: (p[0] * p[1], p[0]))
    for tp, pp in pairs:
        yield [f"parallelism.tp={tp}", f"parallelism.pp={pp}", "parallelism.dp=null", "parallelism.virtual_stages=1",
               "parallelism.sequence_parallel=false", *(["training.micro_batch_size=1"] if set_batch else []),
               *(["parallelism.pipeline_schedule=1f1b"] if schedule == "interleaved-1f1b" else [])]


def _workload_key(update: dict[str, Any]) -> tuple[Any, ...]:
    """What a layout's workload (kernels, layers, stages) depends on: not ZeRO, not the bucket cap, not
    recompute (applied when layers are timed; ``tests/test_planner.py`` checks the workloads are equal)."""
    par, tr = update["parallelism"], update["training"]
    return (par["tp"], par["pp"], par["virtual_stages"], par["sequence_parallel"], tr["micro_batch_size"])


def step_lower_bound(scenario: Scenario, workload: Workload) -> float:
    """A step time the simulation of ``scenario`` never beats: each operation alone, in dependency order.

    Every forward or backward of a virtual stage takes at least its time on an otherwise idle GPU (its
    kernels and its own blocking TP collectives, :func:`simddp.sim.layers.pass_alone`); a synchronous
    send and the receiver's all-gather add theirs. Rank ``r`` cannot start before the first micro-batch went
    forward through the virtual stages ahead of its first chunk (``head``); it then runs its ``m`` forwards
    and backwards one after another; its last operation, the last micro-batch's backward of its first chunk
    (every schedule of :mod:`simddp.sim.pipeline` ends so; ``tests/test_planner.py`` checks it), is followed
    by that micro-batch's backward through those earlier stages (``tail``). Sharing a link, interference,
    gradient reduction and the optimizer only add time; the tests check the bound on random layouts.
    """
    par = scenario.parallelism
    m = scenario.num_micro_batches
    overlap, interference = par.tp_comm_overlap, scenario.cluster.comm_compute_interference
    num_vs = workload.num_stages
    fwd = [0.0] * num_vs
    bwd = [0.0] * num_vs
    seen: dict[tuple[Any, ...], LayerPlan] = {}  # ranks share their distinct layers' plans
    rule = zero_rule(scenario)
    for r in range(par.pp):
        plans = rank_layer_plans(scenario, workload, r, par.pp, seen, rule)
        for vs, where in workload.rank_stage_positions(r, par.pp).items():
            stage = [plans[i] for i in where]
            fwd[vs] = pass_alone(stage, overlap, "F", interference)[0]
            bwd[vs] = pass_alone(stage, overlap, "B", interference)[0]
    if par.pp > 1 and workload.boundary_activation_bytes:
        gather = (collective_cost("all-gather", workload.boundary_gather_bytes, tp_group(scenario)).time_s
                  if workload.boundary_gather_bytes else 0.0)
        sends = ([0.0] * (num_vs - 1) if par.pp_p2p_overlap else
                 [c.time_s for c in boundary_sends(scenario, num_vs - 1, workload.boundary_activation_bytes)])
        for vs, send in enumerate(sends):
            fwd[vs] += send  # sent by stage vs, forward
            bwd[vs + 1] += send  # sent by stage vs + 1, backward
            fwd[vs + 1] += gather  # received by stage vs + 1
            bwd[vs] += gather
    bound = 0.0
    for r in range(par.pp):
        own = range(r, num_vs, par.pp)
        work = m * sum(fwd[vs] + bwd[vs] for vs in own)
        bound = max(bound, sum(fwd[:r]) + work + sum(bwd[:r]))
    return bound


_RECOMPUTE_ORDER = {"full": 0, "selective": 1, "none": 2}


@dataclass
class _GroupCheck:
    """The memory check of one (tp, pp, virtual stages, SP) group of candidate layouts."""

    candidates: int
    evaluated: int
    dominated: int
    fitting: list[tuple[float, int, dict[str, Any], int]]  # (bound, candidate index, update, memory bytes)
    workloads: dict[tuple[Any, ...], Workload]  # in-process only (empty from a worker)


def _layout_scenario(data: dict[str, Any], update: dict[str, Any]) -> Scenario:
    variant = {section: ({**data[section], **values} if isinstance(data.get(section), dict) else values)
               for section, values in update.items()}
    return Scenario.model_validate({**data, **variant})


def _check_group(task: tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]) -> _GroupCheck:
    """Validate, prune by dominance and check the memory of one group's candidates, in their order."""
    data, members = task
    failed: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    bounds: dict[tuple[Any, ...], float] = {}
    out = _GroupCheck(len(members), 0, 0, [], {})
    for index, update in members:
        par, tr = update["parallelism"], update["training"]
        base = (par["tp"], par["pp"], par["virtual_stages"], par["sequence_parallel"], par["zero_stage"],
                update["ddp"]["bucket_cap_mb"])
        mbs, rc = tr["micro_batch_size"], _RECOMPUTE_ORDER[tr["recompute"]]
        try:
            s = _layout_scenario(data, update)
        except (ValidationError, ScenarioError, ValueError):
            continue  # a layout the scenario rules forbid (heads, layers, schedule)
        out.evaluated += 1
        if any(m0 <= mbs and r0 <= rc for m0, r0 in failed.get(base, ())):
            out.dominated += 1
            continue
        key = _workload_key(update)
        if key not in out.workloads:
            out.workloads[key] = build_workload(s)  # shared by layouts differing in ZeRO, bucket cap, recompute
        bound_key = (*key, tr["recompute"])
        if bound_key not in bounds:
            bounds[bound_key] = step_lower_bound(s, out.workloads[key])
        mem = memory_breakdown(s, out.workloads[key])
        if mem.fits:
            out.fitting.append((bounds[bound_key], index, update, mem.total_bytes))
        else:
            failed.setdefault(base, []).append((mbs, rc))
    return out


def _check_group_remote(task: tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]) -> _GroupCheck:
    """:func:`_check_group` in a worker process: its workloads stay there (the parent rebuilds the few it
    simulates)."""
    out = _check_group(task)
    out.workloads = {}
    return out


def plan_layouts(scenario: Scenario | dict[str, Any] | str | Path, num_gpus: int, top: int = 10,
                 objective: Objective = "step_time", progress: Callable[[int, int], None] | None = None,
                 pareto: bool = False, exact_front: bool = False, jobs: int = 1) -> PlanResult:
    """The ``top`` fastest layouts that fit ``scenario``'s model and global batch on ``num_gpus`` GPUs.

    Exact branch and bound: every valid layout is checked against the memory model; those that fit get a
    lower bound on their step (:func:`step_lower_bound`) and are simulated in increasing order of it, until
    the bound of the next one cannot beat the ``top``-th best simulated step. The result is the same as
    simulating every fitting layout (``tests/test_planner.py`` compares the two). ``pareto`` adds ``front``,
    the layouts no other simulated one beats on both step time and memory per GPU; with ``exact_front`` too,
    every layout that could still be on it is simulated, so it is the front over every fitting layout.
    ``jobs`` > 1 checks the candidates' memory in that many worker processes (same result).
    """
    scenario = as_scenario(scenario)  # a Scenario, a dict of its keys or a path, as simulate takes
    num_gpus = whole_number("num_gpus", num_gpus)  # "8" and None were TypeErrors, True and 8.0 taken
    if not 1 <= whole_number("--top", top) <= MAX_PLAN_TOP:
        raise ScenarioError(f"--top({top}) must be in 1..{MAX_PLAN_TOP}")
    if objective not in get_args(Objective):  # checked before the search, not when its result is built
        raise ScenarioError(f"--objective({objective!r}) must be one of {', '.join(get_args(Objective))}")
    data = _planning_data(scenario, num_gpus)
    candidates = list(candidate_layouts(scenario, num_gpus))
    if not candidates:
        raise ScenarioError(f"no layout splits global_batch_size({scenario.global_batch_size}) over {num_gpus} GPUs "
                            "(dp must divide the batch)")
    total = len(candidates)
    # Memory never falls as the micro-batch grows or as less is recomputed (tests/test_planner.py checks
    # both): a layout that does not fit rules out the larger micro-batches and lighter recompute beside it.
    candidates.sort(key=lambda u: (u["training"]["micro_batch_size"], _RECOMPUTE_ORDER[u["training"]["recompute"]]))
    # Dominance and shared workloads never cross a (tp, pp, virtual stages, SP) group: groups are checked
    # independently (in worker processes with ``jobs`` > 1), each in the candidates' order.
    groups: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
    for index, update in enumerate(candidates):
        par = update["parallelism"]
        groups.setdefault((par["tp"], par["pp"], par["virtual_stages"], par["sequence_parallel"]), []).append(
            (index, update))
    layers = num_model_layers(scenario)
    if layers * len(groups) > MAX_PLAN_LAYER_GROUPS:
        raise ScenarioError(
            f"{layers:,} layers in {len(groups):,} (tp, pp, virtual stages, SP) groups on {num_gpus:,} GPUs is more "
            f"than the planner searches ({MAX_PLAN_LAYER_GROUPS:,} layers x groups, a few minutes): plan fewer GPUs "
            "or a model of fewer layers, or try layouts with `simddp memory --fit-layout` and `simulate`")
    tasks = [(data, members) for members in groups.values()]
    checked: list[_GroupCheck] = []
    done = 0
    with contextlib.ExitStack() as stack:
        results: Iterator[_GroupCheck] = map(_check_group, tasks)
        jobs = worker_processes(jobs, len(tasks))
        if jobs > 1:
            results = stack.enter_context(worker_pool(jobs)).map(_check_group_remote, tasks)
        for result in results:
            checked.append(result)
            done += result.candidates
            if progress is not None:
                progress(done, total)
    evaluated = sum(c.evaluated for c in checked)
    dominated = sum(c.dominated for c in checked)
    workloads: dict[tuple[Any, ...], Workload] = {}
    fitting: list[tuple[float, int, dict[str, Any], int]] = []
    for c in checked:
        workloads.update(c.workloads)
        fitting += c.fitting
    fitting.sort(key=lambda f: (f[0], f[1]))
    rows: list[PlannedLayout] = []
    best: list[float] = []  # the top fastest simulated steps so far, ascending
    steps_total = total + len(fitting)
    skipped: str | None = None
    untimed = 0
    for k, (bound, _, update, mem_bytes) in enumerate(fitting):
        if progress is not None:
            progress(total + k, steps_total)
        if len(best) >= top and bound >= best[top - 1]:
            # No layout left can enter the top. For the front, one can still matter if nothing simulated
            # uses no more memory and is at least as fast as its bound.
            if not exact_front:
                break
            if any(r.memory_bytes <= mem_bytes and _time(r) <= bound for r in rows):
                continue
        if not bound <= MAX_STEP_TIME_S:
            # Sorted by the bound: this layout's step and every later one's is over the longest step answered for
            # (a peak of 1 FLOP/s, a batch of 1e15): none can be timed, and simulating each would only say so.
            try:
                check_range(bound, "even the fastest layout's step")
            except ScenarioError as err:
                skipped = skipped or str(err)
            untimed += len(fitting) - k
            break
        s = _layout_scenario(data, update)
        key = _workload_key(update)
        if key not in workloads:  # checked in a worker process
            workloads[key] = build_workload(s)
        try:
            r = simulate_step(s, trace=False, workload=workloads[key])
            check_range(r.step_time_s, "its step")  # the bound simulate's answers keep to (simddp.sanity)
        except ScenarioError as err:
            # Beyond the simulation size limit (simddp.limits) or the longest step answered for: not a layout
            # to rank. If no layout is left, that is the answer, not "nothing fits".
            skipped = skipped or str(err)
            untimed += 1
            continue
        rows.append(planned_layout(s, r, mem_bytes, True))
        best = sorted([*best, r.step_time_s])[:top]
    if progress is not None:
        progress(steps_total, steps_total)
    if skipped is not None and not rows:
        raise ScenarioError(f"the fastest layouts that fit cannot be timed: {skipped}")
    rows.sort(key=lambda r: (r.step_time_s if objective == "step_time" else -(r.tokens_per_s or 0.0),
                             r.memory_bytes))
    return PlanResult(num_gpus=num_gpus, objective=objective, evaluated=evaluated, dominated=dominated,
                      fitting=len(fitting), simulated=len(rows), untimed=untimed, untimed_reason=skipped,
                      layouts=rows[:top],
                      simulated_layouts=rows, front=pareto_front(rows) if pareto or exact_front else None,
                      exact_front=exact_front)


def _planning_data(scenario: Scenario, num_gpus: int) -> dict[str, Any]:
    """``scenario`` as a dict on ``num_gpus`` GPUs, for its layout to be replaced (a preset model by name, the
    name derived again)."""
    from simddp.sweeps import scenario_to_dict  # a preset model by name only where nothing overrides it

    data = scenario_to_dict(scenario)
    data["name"] = None
    data["cluster"] = {**data["cluster"], **cluster_update(scenario.cluster, num_gpus)}
    return data


def scenario_layout(scenario: Scenario) -> PlannedLayout | None:
    """The scenario's own layout (:func:`plan_start`'s ``own``, already on the GPUs planned for), simulated as the
    planner's rows are; None where it cannot be simulated (beside the ranking, ``you``)."""
    try:
        r = simulate_step(scenario, trace=False)
        check_range(r.step_time_s, "its step")
    except ScenarioError:
        return None
    mem = memory_breakdown(scenario)  # the rows' memory: the most loaded GPU
    return planned_layout(scenario, r, mem.total_bytes, mem.fits)


def fsdp_caveat(scenario: Scenario, layout: PlannedLayout) -> str | None:
    """What to keep in mind when ``layout`` (the best) is torch FSDP on a transformer: on published eager-PyTorch
    FSDP runs simddp's throughput is high (:data:`PUBLISHED_FSDP_ERROR`), while Megatron-style layouts match
    published A100 runs within 10%, and the one published ZeRO-3 run at scale was far slower than simddp times it
    (docs/validation.md)."""
    if scenario.ddp.implementation != "torch" or layout.zero_stage < 2 or scenario.model.transformer is None:
        return None
    return (f"the best layout is torch FSDP: {published_fsdp_gap()}, while Megatron-style tp/pp layouts match "
            "published A100 runs within 10% (Narayanan et al. 2021, 32-3,072 GPUs; none on H100), and DeepSpeed's "
            "2021 ZeRO-3 of GPT-3 on 384-1,536 A100s took 1.6-4.6x the step simddp gives it; weigh FSDP rows "
            "against the others with that in mind")


def planned_layout(scenario: Scenario, result: StepResult, memory_bytes: int, fits: bool) -> PlannedLayout:
    """A simulated scenario's row: its layout, its step and ``memory_bytes`` (the most loaded GPU's)."""
    par, tr = scenario.parallelism, scenario.training
    return PlannedLayout(
        tp=par.tp, pp=par.pp, dp=scenario.dp, virtual_stages=par.virtual_stages, zero_stage=par.zero_stage,
        micro_batch_size=tr.micro_batch_size, recompute=tr.recompute, sequence_parallel=par.sequence_parallel,
        bucket_cap_mb=scenario.ddp.bucket_cap_mb, step_time_s=result.step_time_s,
        tokens_per_s=result.tokens_per_s, mfu=result.mfu, memory_bytes=memory_bytes, fits=fits)


def layout_settings(scenario: Scenario, num_gpus: int, layout: PlannedLayout) -> dict[str, Any]:
    """The scenario keys (dotted paths) that turn ``scenario`` into ``layout`` on ``num_gpus`` GPUs."""
    sets: dict[str, Any] = {}
    if num_gpus != scenario.cluster.num_gpus:
        sets.update({f"cluster.{k}": v for k, v in cluster_update(scenario.cluster, num_gpus).items()})
    sets |= {"parallelism.dp": layout.dp, "parallelism.tp": layout.tp, "parallelism.pp": layout.pp,
             "parallelism.virtual_stages": layout.virtual_stages, "parallelism.zero_stage": layout.zero_stage,
             "parallelism.sequence_parallel": layout.sequence_parallel,
             "training.micro_batch_size": layout.micro_batch_size, "training.recompute": layout.recompute,
             "ddp.bucket_cap_mb": layout.bucket_cap_mb}
    if scenario.training.global_batch_size is None:  # derived from the scenario's layout: the layout changes
        sets["training.global_batch_size"] = scenario.global_batch_size
    if layout.virtual_stages > 1:
        sets["parallelism.pipeline_schedule"] = "interleaved-1f1b"
    elif scenario.parallelism.pipeline_schedule == "interleaved-1f1b":
        sets["parallelism.pipeline_schedule"] = "1f1b"
    return sets


def _time(layout: PlannedLayout) -> float:
    """A simulated layout's step time (one not simulated never wins)."""
    return math.inf if layout.step_time_s is None else layout.step_time_s


def pareto_front(layouts: list[PlannedLayout]) -> list[PlannedLayout]:
    """The layouts no other beats on both step time and memory per GPU, least memory first."""
    front: list[PlannedLayout] = []
    for lay in sorted(layouts, key=lambda r: (r.memory_bytes, _time(r))):
        if not front or _time(lay) < _time(front[-1]):
            front.append(lay)
    return front


def terminal_progress(label: str) -> Callable[[int, int], None] | None:
    """A progress bar on stderr when it is a terminal (nothing otherwise)."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show




__all__ = [
    "BUCKET_CAPS_MB",
    "OBJECTIVES",
    "PUBLISHED_FSDP_ERROR",
    "RECOMPUTE_MODES",
    "PlanResult",
    "PlanStart",
    "PlannedLayout",
    "candidate_layouts",
    "cluster_update",
    "fsdp_caveat",
    "layout_settings",
    "layout_starts",
    "pareto_front",
    "plan_layouts",
    "plan_start",
    "planned_layout",
    "scenario_layout",
    "step_lower_bound",
    "terminal_progress",
]
