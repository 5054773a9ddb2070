"""One training step in simpy: compute streams, TP/DP/PP collectives on shared links, pipeline schedules.

Model (PyTorch DDP, Li et al., VLDB 2020, "PyTorch Distributed"): backward runs layer by layer in
reverse; a parameter's gradient is ready when its layer's weight-grad finishes; a bucket is reduced once
all its gradients are ready, buckets in index order on one NCCL stream, overlapping the rest of backward
(or after it, when the rank plan says the reduction does not overlap); the optimizer steps after the last
reduction. With gradient accumulation only the last micro-step communicates (``no_sync`` on the others),
unless the plan reduces every micro-batch (DeepSpeed ZeRO-2). ZeRO-1/2 sync the updated parameters after a
sharded optimizer step (an all-gather, or ZeroRedundancyOptimizer's broadcasts; Rajbhandari et al., SC'20),
or bucket by bucket while the next forward runs (Megatron's ``--overlap-param-gather``). Units whose
parameters are sharded (FSDP, DeepSpeed ZeRO-3) are gathered before their forward and, unless kept, again
before their backward, as many units ahead as the plan says, and their gradients reduce-scattered after
their backward (Zhao et al., VLDB 2023), gathers and reduce-scatters on the data-parallel group's one NCCL
stream (:func:`simddp.sim.plan.fsdp_reduce_scatter_stream`); a backward that reduces waits for its reductions
before the next micro-batch. Which of these a step runs is the data-parallel implementation's rule
(:mod:`simddp.zero`), turned into plan data by :mod:`simddp.sim.plan`.

Tensor parallelism (Megatron-LM) adds the collectives of :mod:`simddp.sim.layers` inside each layer.
Pipeline parallelism runs the schedules of :mod:`simddp.sim.pipeline`, one process per pipeline rank,
with activation and gradient send/recv between stages on the links; a rank's gradients become ready during
its last backward of each virtual stage, and Megatron all-reduces a tied word embedding's gradient between
the first and the last stage before the optimizer.

Every collective runs on this GPU's link (:mod:`simddp.sim.resources`): collectives in flight at the same
time share its bandwidth, and compute slows while any is in flight. Ranks that behave identically are
simulated once: one GPU per pipeline stage. Pipeline operations that release no gradients run as one piece
(their layers' own TP collectives included, timed on an otherwise idle GPU); so do the micro-batches that
do not communicate.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy
from pydantic import TypeAdapter

from simddp.analytical import in_order_overlap_step_s
from simddp.config import Scenario, ScenarioError
from simddp.engine_caches import KeyedCache, collector_paused
from simddp.memory import memory_breakdown
from simddp.results import BREAKDOWN_PARTS, Bounds, BucketTiming, Span, StepPart, StepResult, Trace
from simddp.sanity import check_range
from simddp.sim.layers import TP_STREAM, LayerPlan, Recorder, backward, forward, pass_alone_s
from simddp.sim.periodic import Linear, ScheduleRun, steady
from simddp.sim.pipeline import PipeOp, dependency, last_backward, op_codes
from simddp.sim.plan import (
    FSDP_STREAM,
    BucketPlan,
    FsdpUnitPlan,
    RankPlan,
    StepPlan,
    build_plan,
    fsdp_reduce_scatter_stream,
    last_backwards,
    root_prefetch,
)
from simddp.sim.resources import Gpu
from simddp.workload import Workload
from simddp.zero import zero_rule

DP_STREAM = "dp"
ProcessGen = Generator[simpy.Event, Any, Any]


#: Mean over-prediction of simddp's throughput on published eager-PyTorch FSDP runs of transformers, by GPU: the
#: figures tests/validation/test_published_throughput.py measures and asserts (14 A100 runs, 7 H100 runs).
PUBLISHED_FSDP_ERROR = {"A100": 0.150, "H100": 0.404}


def published_fsdp_gap() -> str:
    """:data:`PUBLISHED_FSDP_ERROR` in words (simulate's not-modelled note and the planner's note say it alike)."""
    a100, h100 = (round(100 * PUBLISHED_FSDP_ERROR[g]) for g in ("A100", "H100"))
    return (f"on 21 published FSDP runs of transformers in eager PyTorch simddp's throughput is high by {a100}% "
            f"(A100) to {h100}% (H100) on average (docs/validation.md)")


#: The most MFU a step can show: model FLOP count attention's whole s x s (PaLM's and Megatron's convention, so
#: MFU compares across kernels), where causal kernels compute half of it, so a step whose every kernel ran at
#: the peak could read up to twice 100%; the kernel model itself stays under 100%. Beyond twice, layer times given
#: or measured are shorter than their FLOP allow (a probe: a profile measured at micro-batch 8 run at 10^8 read
#: MFU 55,564,455%).
MAX_MFU = 2.0


#: A profile's measured (micro-batch, sequence), by the file's path and identity (a file rewritten is read again):
#: reading and validating the profile for every step cost a third of a small calibrated step's evaluation.
_MEASURED_AT = KeyedCache(maxsize=64)


def _measured_elsewhere(scenario: Scenario) -> str | None:
    """Where a calibrated scenario runs its profile's measured layer times at another micro-batch or sequence
    than they were measured at: a note saying so, else None."""
    path = scenario.calibration
    if not path:
        return None
    from simddp.profile import load_profile

    def measured() -> dict[str, Any]:
        st = os.stat(path)
        return _MEASURED_AT.get((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns),
                                lambda: load_profile(path).training)

    try:
        return measured_elsewhere(scenario, measured)
    except (ScenarioError, OSError):
        return None


def measured_elsewhere(scenario: Scenario, measured: Callable[[], dict[str, Any]]) -> str | None:
    """The note of :func:`_measured_elsewhere` for a scenario and its profile's ``training`` keys (``measured``,
    read only where the scenario's layers carry measured times: where their layer times were measured)."""
    if not any(la.fwd_time_s is not None for la in scenario.model.layers or []):
        return None
    tr, known = scenario.training, measured()
    at = (known.get("micro_batch_size"), known.get("seq_len"))
    if at == (tr.micro_batch_size, tr.seq_len) or None in at:
        return None
    return (f"the calibration profile's layer times were measured at micro-batch {at[0]} x {at[1]} tokens and are "
            f"used as they are at {tr.micro_batch_size} x {tr.seq_len}, not scaled: the compute part of this step "
            "is the measured one (re-measure at this micro-batch, or drop the layers' times for the kernel model)")


def not_modelled(scenario: Scenario) -> list[str]:
    """What this scenario asks for that the step time does not include, said plainly."""
    par, notes = scenario.parallelism, []
    rule = zero_rule(scenario)
    if rule.unsharded_across_micro_batches:
        notes.append(
            f"{rule.name} with pp > 1: each unit's reduce-scatter is timed after the last micro-batch and its "
            "all-gather after the optimizer step, not overlapped with the first forward"
        )
    if rule.reduce_op != "all-reduce" and scenario.ddp.algorithm != "auto":
        notes.append(
            f"ddp.algorithm={scenario.ddp.algorithm} applies to all-reduce; {rule.name}'s reduce-scatter and "
            "all-gather use NCCL's own choice"
        )
    tf, seq = scenario.model.transformer, scenario.training.seq_len
    if tf is not None and rule.implementation == "torch" and rule.stage >= 2:
        notes.append(f"eager PyTorch's costs beside the kernels: {published_fsdp_gap()}; read this step as a "
                     "lower bound")
    if tf is not None and tf.position_embedding == "learned" and seq > tf.max_position_embeddings:
        notes.append(  # GPT-2's 1,024 positions against a 4,096-token sequence: a real model raises an index error
            f"training.seq_len({seq}) exceeds the model's {tf.max_position_embeddings} learned positions "
            f"(model.transformer.max_position_embeddings): the model as defined cannot embed this sequence; the "
            f"step is timed as if its position table were long enough")
    layers = scenario.model.layers
    if seq > 1 and layers and all(s.fwd_flop_per_sample is not None or s.gemm_shape is not None
                                  or not s.param_indices for s in layers):
        # ResNet-50 left at the default seq_len printed 73.5 M tokens/s: every layer costs per sample (a layer
        # without parameters or FLOP costs nothing), so the step does not read the length
        # (workload._parameter_list_workload)
        notes.append(f"training.seq_len({seq}) does not change this step: this model's layers give their cost per "
                     f"sample (model.layers), so the length only multiplies samples into tokens/s (x {seq}); set "
                     "training.seq_len=1 for a model that does not take sequences")
    if par.tp > 1 and scenario.model.transformer is None:
        notes.append(f"tp={par.tp}: a parameter-list model is not split by tensor parallelism: each GPU of a tp group "
                     "computes and holds every layer whole, and no tensor-parallel collective is timed (only a "
                     "transformer's layers are split)")
    if par.pp > 1 and scenario.model.transformer is None:
        notes.append(f"pp={par.pp}: activation send/recv between stages is not timed for parameter-list models")
    ddp = scenario.ddp
    if (ddp.find_unused_parameters or ddp.static_graph) and (par.zero_stage > 1 or par.pp > 1
                                                              or ddp.implementation != "torch"):
        notes.append("ddp.find_unused_parameters and ddp.static_graph are not timed here: they are timed for torch "
                     "DDP (implementation torch, zero_stage 0, or 1: ZeroRedundancyOptimizer on DDP) at pp 1")
    if ddp.static_graph:
        notes.append("ddp.static_graph: the first iteration (graph recording, one delayed all-reduce) is not in "
                     "this steady-state step")
    elsewhere = _measured_elsewhere(scenario)
    if elsewhere is not None:
        notes.append(elsewhere)
    return notes


@dataclass
class _Rank:
    """Runtime state of one pipeline rank."""

    plan: RankPlan
    gpu: Gpu
    rec: Recorder
    ready: dict[tuple[int, int], simpy.Event] = field(default_factory=dict)
    remaining: dict[tuple[int, int], int] = field(default_factory=dict)
    ready_at: dict[tuple[int, int], float] = field(default_factory=dict)
    reduced: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    acct: dict[str, float] = field(default_factory=dict)
    overlap: str = "backward"
    compute_end_s: float = 0.0
    end_s: float = 0.0
    dp_comm_s: float = 0.0
    unused_marked: set[int] = field(default_factory=set)
    names: list[str] = field(default_factory=list)  # the plan's layers' names, read once (spans are named after them)

    def add(self, key: str, seconds: float) -> None:
        self.acct[key] = self.acct.get(key, 0.0) + seconds

    @property
    def link_busy_s(self) -> dict[str, float]:
        return {tier: link.busy_s for tier, link in self.gpu.links.items()}

    @property
    def link_work_s(self) -> dict[str, float]:
        return {tier: link.work_s for tier, link in self.gpu.links.items()}

    def release(self, rnd: int, layer: int) -> None:
        """The gradients of ``layer`` are ready (micro-batch round ``rnd``).

        The round's first gradient hook also marks the parameters that get no gradient ready (torch's
        ``Reducer::autograd_hook``: ``has_marked_unused_parameters_``)."""
        if self.plan.unused_per_bucket and rnd not in self.unused_marked:
            self.unused_marked.add(rnd)
            for b, count in self.plan.unused_per_bucket.items():
                self._decrement((rnd, b), count)
        for b in self.plan.bucket_of_layer[layer]:
            self._decrement((rnd, b), 1)

    def _decrement(self, key: tuple[int, int], count: int) -> None:
        self.remaining[key] -= count
        if self.remaining[key] == 0:
            self.ready_at[key] = self.gpu.env.now
            self.ready[key].succeed()


class _Accounting(Recorder):
    """A recorder that also books every wait and kernel of the compute path into breakdown parts."""

    def __init__(self, spans: list[Span] | None, suffix: str, rank: _Rank | None = None) -> None:
        super().__init__(spans, suffix)
        self.rank = rank

    def booked(self, key: str, seconds: float) -> None:
        if self.rank is not None:
            self.rank.add(key, seconds)


def _fused(st: _Rank, vs: int, kind: str, times: int = 1, label: str = "") -> ProcessGen:
    """``times`` forwards (kind F) or backwards (B) through virtual stage ``vs`` that release no gradients.

    ``label`` names the span: a pipeline operation ("F3", "B3 vs1") or the quiet accumulation
    micro-batches ("micro-batches ...").
    """
    p = st.plan
    alone = (p.fwd_alone_s if kind == "F" else p.bwd_alone_s)[vs] * times
    busy = (p.fwd_busy_s if kind == "F" else p.bwd_busy_s)[vs] * times
    work = (p.fwd_work_s if kind == "F" else p.bwd_work_s)[vs] * times
    recompute = 0.0 if kind == "F" else p.bwd_recompute_s[vs] * times
    env = st.gpu.env
    start = env.now
    yield st.gpu.run(work)
    ran = env.now - start
    st.add("compute", work - recompute)
    st.add("recompute", recompute)
    st.add("interference", ran - work)
    if alone > work:
        # On an idle GPU the pass took ``alone``: its kernels ``busy`` (slowed beside its own TP
        # collectives), the rest waiting for them. The trace shows the kernels on the compute stream and the
        # wait on the TP stream (until 2026-11-29 one compute span held both: a trace's compute spans summed
        # to 5.9% over compute_time_s at tp 2, and its TP stream showed only the last micro-batch's collectives).
        # One timeout, as the engines' sums have it; the kernels' end is placed in it for the trace only (busy and
        # work can differ by a rounding below zero: two timeouts made simpy refuse a delay of -1e-19 s).
        kernels_end = env.now + max(0.0, min(busy - work, alone - work))
        yield env.timeout(alone - work)
        st.add("interference", busy - work)
        st.add("tp_comm", alone - busy)
        st.rec.add(label or kind, "compute", start, kernels_end, virtual_stage=vs)
        st.rec.add(f"{label or kind}: tensor-parallel collectives", f"comm {TP_STREAM}", kernels_end, env.now,
                   virtual_stage=vs)
        return
    st.rec.add(label or kind, "compute", start, env.now, virtual_stage=vs)


def _layer_forward(st: _Rank, positions: list[int], gate: Callable[[int], simpy.Event | None]) -> ProcessGen:
    p = st.plan
    for i in positions:
        wait = gate(i)
        if wait is not None:
            yield from _waited(st, wait)
        name = st.names[i]
        yield from _booked_layer(st, forward(st.gpu, p.plans[i], st.overlap, st.rec, name=name), p.plans[i], "F", name)


def _layer_backward(st: _Rank, positions: list[int], rnd: int | None) -> ProcessGen:
    p = st.plan
    for i in reversed(positions):
        done = (lambda i=i: st.release(rnd, i)) if rnd is not None else None
        name = st.names[i]
        yield from _booked_layer(st, backward(st.gpu, p.plans[i], st.overlap, st.rec, done, name), p.plans[i], "B",
                                 name)


def _booked_layer(st: _Rank, gen: ProcessGen, plan: LayerPlan, kind: str, name: str) -> ProcessGen:
    """Run one layer pass and book its time: kernels at full speed, their slowdown, and TP waits."""
    env = st.gpu.env
    start = env.now
    work = plan.timing.fwd_s if kind == "F" else plan.timing.bwd_s
    recompute = plan.timing.recompute_s if kind == "B" else 0.0
    busy0 = st.gpu.compute.busy_s
    yield from gen
    st.gpu.compute.rerate()  # settle the busy time up to now
    ran = st.gpu.compute.busy_s - busy0
    st.add("compute", work - recompute)
    st.add("recompute", recompute)
    st.add("interference", max(0.0, ran - work))
    st.add("tp_comm", max(0.0, (env.now - start) - ran))
    st.rec.add(f"{'fwd' if kind == 'F' else 'bwd'} {name}", "compute", start, env.now, keep_empty=True)


def _dp_comm(st: _Rank, rounds: int, start_after: simpy.Event | None,
             rounds_done: list[simpy.Event] | None = None) -> ProcessGen:
    """Gradient buckets in index order on the data-parallel stream, each once all its gradients are ready;
    then, with find_unused_parameters, the all-reduce of the used-parameter map. ``rounds_done[rnd]`` succeeds
    once round ``rnd``'s are all done."""
    if start_after is not None:
        yield start_after
    for rnd in range(rounds):
        for b in st.plan.buckets:
            yield st.ready[(rnd, b.index)]
            start, end = yield from st.gpu.collective(b.reduce, DP_STREAM)
            st.reduced[(rnd, b.index)] = (start, end)
            st.dp_comm_s += end - start
            st.rec.add(f"{b.reduce.op} bucket {b.index}", "comm", start, end, size_bytes=b.size_bytes,
                       algorithm=f"{b.reduce.algorithm}/{b.reduce.protocol}")
        used_map = st.plan.unused_map_reduce
        if used_map is not None and st.plan.buckets:
            start, end = yield from st.gpu.collective(used_map, DP_STREAM)
            st.dp_comm_s += end - start
            st.rec.add("all-reduce used-parameter map", "comm", start, end, size_bytes=used_map.size_bytes)
        if rounds_done is not None:
            rounds_done[rnd].succeed()


def _waited(st: _Rank, ev: simpy.Event) -> ProcessGen:
    """The compute stream waits for ``ev`` (data-parallel collectives): booked as exposed DP comm."""
    t0 = st.gpu.env.now
    yield ev
    st.add("dp_comm", st.gpu.env.now - t0)


def _host(st: _Rank, seconds: float, key: str, name: str) -> ProcessGen:
    """Host-side work the GPU waits for (nothing is queued behind it), booked as ``key``."""
    if seconds <= 0:
        return
    env = st.gpu.env
    start = env.now
    yield env.timeout(seconds)
    st.add(key, seconds)
    st.rec.add(name, "host", start, env.now)


def _param_gathers(st: _Rank) -> dict[int, simpy.Event]:
    """Overlapped parameter all-gathers of the previous step's update: buckets in forward order."""
    env = st.gpu.env
    events = {b.index: env.event() for b in st.plan.buckets}

    def run() -> ProcessGen:
        for b in reversed(st.plan.buckets):
            assert b.gather is not None
            start, end = yield from st.gpu.collective(b.gather, DP_STREAM)
            st.dp_comm_s += end - start
            st.rec.add(f"all-gather params bucket {b.index}", "comm", start, end, size_bytes=b.gather.size_bytes)
            events[b.index].succeed()

    env.process(run())
    return events


def _finish(st: _Rank, compute: simpy.Process, comm: simpy.Event) -> ProcessGen:
    """After compute and gradient reduction: embedding sync, optimizer step, ZeRO parameter all-gather."""
    env, p = st.gpu.env, st.plan
    yield compute
    st.compute_end_s = env.now
    yield comm
    st.add("dp_comm", env.now - st.compute_end_s)
    if p.embedding_sync is not None:
        t0 = env.now
        start, end = yield from st.gpu.collective(p.embedding_sync, "embedding")
        st.dp_comm_s += end - start
        st.add("dp_comm", env.now - t0)
        st.rec.add("all-reduce tied embedding", "comm", start, end)
    if p.clip_norm_s or p.clip_reduces:
        yield from _clip(st)
    start = env.now
    yield st.gpu.run(p.opt_s)
    st.add("optimizer", p.opt_s)
    st.add("interference", env.now - start - p.opt_s)
    st.rec.add("optimizer step", "compute", start, env.now)
    if p.gather_after_step is not None:
        t0 = env.now
        start, end = yield from st.gpu.collective(p.gather_after_step, DP_STREAM)
        st.dp_comm_s += end - start
        st.add("dp_comm", env.now - t0)
        st.rec.add("all-gather params", "comm", start, end)
    st.end_s = env.now


def _clip(st: _Rank) -> ProcessGen:
    """clip_grad_norm_: the norm's pass over the gradients, its scalar all-reduces, the scaling pass."""
    env, p = st.gpu.env, st.plan
    t0 = env.now
    yield st.gpu.run(p.clip_norm_s)
    for k, cost in enumerate(p.clip_reduces):
        start, end = yield from st.gpu.collective(cost, f"clip {k}")
        st.rec.add("all-reduce gradient norm", "comm", start, end, size_bytes=cost.size_bytes)
    yield st.gpu.run(p.clip_scale_s)
    st.add("grad_clip", env.now - t0)
    st.rec.add("clip gradients", "compute", t0, env.now)


# ------------------------------------------------------------------------------------------ modes
def _run_dp(env: simpy.Environment, plan: StepPlan, st: _Rank) -> None:
    """pp = 1, DDP or ZeRO-1/2: silent micro-batches in one piece, the communicating ones layer by layer."""
    p, m = st.plan, plan.num_micro_batches
    positions = list(range(len(p.layers)))
    gathers = _param_gathers(st) if any(b.gather for b in p.buckets) else None
    bucket_sets = [set(bs) for bs in p.bucket_of_layer]

    def gate(i: int) -> simpy.Event | None:
        if gathers is None or not bucket_sets[i]:
            return None
        return simpy.AllOf(env, [gathers[b] for b in bucket_sets[i]])

    silent = m - p.rounds  # micro-batches that do not communicate come first

    def compute() -> ProcessGen:
        j = 0
        if gathers is not None:  # the step's first forward waits for the parameter gathers, layer by layer
            yield from _layer_forward(st, positions, gate)
            if silent:
                yield from _fused(st, 0, "B", label="micro-batch 0 backward (no_sync)")
            else:
                yield from _layer_backward(st, positions, 0)
            j = 1
        quiet = max(0, silent - j)
        if quiet:
            yield from _fused(st, 0, "F", quiet, label=f"micro-batches {j}-{j + quiet - 1} forward (no_sync)")
            yield from _fused(st, 0, "B", quiet, label=f"micro-batches {j}-{j + quiet - 1} backward (no_sync)")
            j += quiet
        for k in range(j, m):
            yield from _layer_forward(st, positions, lambda i: None)
            if k >= silent:  # DDP prepares the reducing backward: find_unused_parameters' graph search
                yield from _host(st, p.traversal_s, "ddp_host", "search unused parameters")
            yield from _layer_backward(st, positions, k - silent)
            if k >= silent and k < m - 1 and p.overlap:
                # A backward that reduces (every micro-batch: DeepSpeed ZeRO-2) ends waiting for its reductions:
                # DeepSpeed's independent_gradient_partition_epilogue synchronizes the device with overlap_comm
                # (torch DDP's finalize_backward waits for its buckets likewise). Until 2026-11-29 they ran on into
                # the next micro-batch (DeepSpeed ZeRO-2, 8 micro-batches: 934 ms for 1,108 ms).
                yield from _waited(st, rounds_done[k - silent])

    rounds_done = [env.event() for _ in range(p.rounds)]
    proc = env.process(compute())
    comm = env.process(_dp_comm(st, p.rounds, None if p.overlap else proc, rounds_done))
    env.process(_finish(st, proc, comm))


def _run_fsdp(env: simpy.Environment, plan: StepPlan, st: _Rank) -> None:
    """ZeRO-3 / FSDP: every micro-batch gathers and reduce-scatters unit by unit; then the sharded step."""
    p, m, gpu = st.plan, plan.num_micro_batches, st.gpu
    units, root = p.fsdp_units, p.fsdp_root
    reduces: list[simpy.Process] = []
    # DeepSpeed's reduce bucket is issued after a module's backward and holds the gradients that filled it (the
    # module's own may open the next one): named for when it goes, not as if it held that module's gradients.
    ds_bucket = plan.rule.unit_rule != "block"
    rs_stream = fsdp_reduce_scatter_stream(plan.rule)
    rs_lane = "comm" if rs_stream == FSDP_STREAM else "comm reduce-scatter"  # the trace's row: the gathers' or its own
    prefetch_at_root = root_prefetch(plan.rule, units)

    def gather(unit: FsdpUnitPlan, phase: str) -> simpy.Process:
        def run() -> ProcessGen:
            start, end = yield from gpu.collective(unit.gather, FSDP_STREAM)
            st.dp_comm_s += end - start
            st.rec.add(f"all-gather {unit.name} ({phase})", "comm", start, end, size_bytes=unit.gather.size_bytes)
        return env.process(run())

    def reduce(unit: FsdpUnitPlan, record: bool) -> simpy.Process:
        assert unit.reduce is not None

        def run() -> ProcessGen:
            assert unit.reduce is not None
            ready = env.now
            start, end = yield from gpu.collective(unit.reduce, rs_stream)
            st.dp_comm_s += end - start
            if record:
                st.ready_at[(0, unit.index)] = ready
                st.reduced[(0, unit.index)] = (start, end)
            name = f"bucket {unit.index} (after {unit.name}'s backward)" if ds_bucket else unit.name
            st.rec.add(f"reduce-scatter {name}", rs_lane, start, end,
                       size_bytes=unit.reduce.size_bytes)
        return env.process(run())

    root_pos = list(root.layers) if root else []
    head = [i for i in root_pos if units and i < units[0].layers[0]] if units else root_pos
    tail = [i for i in root_pos if i not in head]

    def compute() -> ProcessGen:
        reduced = 0  # reduce-scatters of the micro-batches before this one (waited for)
        for j in range(m):
            last = j == m - 1
            root_ready = gather(root, "fwd") if root else None
            fwd: dict[int, simpy.Process] = {}
            bwd: dict[int, simpy.Process] = {}

            def issue_fwd(k: int, fwd: dict[int, simpy.Process] = fwd) -> None:
                if k < len(units) and k not in fwd:
                    fwd[k] = gather(units[k], "fwd")

            def issue_bwd(k: int, bwd: dict[int, simpy.Process] = bwd) -> None:  # a kept unit needs none
                if k >= 0 and k not in bwd and units[k].gather_bwd:
                    bwd[k] = gather(units[k], "bwd")

            issue_fwd(0)
            if root_ready is not None:
                yield from _waited(st, root_ready)
            yield from _layer_forward(st, head, lambda i: None)
            for k, unit in enumerate(units):
                issue_fwd(k)
                yield from _waited(st, fwd[k])
                for ahead in range(k + 1, k + 1 + unit.prefetch_fwd):  # prefetch: the next units' gathers
                    issue_fwd(ahead)
                yield from _layer_forward(st, list(unit.layers), lambda i: None)
            yield from _layer_forward(st, tail, lambda i: None)
            for ahead in range(len(units) - 1, len(units) - 1 - prefetch_at_root, -1):  # the root's prefetch
                issue_bwd(ahead)
            yield from _layer_backward(st, tail, None)
            issue_bwd(len(units) - 1)
            for k in range(len(units) - 1, -1, -1):
                issue_bwd(k)
                if k in bwd:
                    yield from _waited(st, bwd[k])
                for ahead in range(k - 1, k - 1 - units[k].prefetch_bwd, -1):
                    issue_bwd(ahead)
                yield from _layer_backward(st, list(units[k].layers), None)
                if units[k].reduce is not None:
                    reduces.append(reduce(units[k], last))
                    if units[k].reduce_blocks:  # reduction not overlapped: compute waits for it
                        yield from _waited(st, reduces[-1])
            yield from _layer_backward(st, head, None)
            if root is not None and root.reduce is not None:
                reduces.append(reduce(root, last))
                if root.reduce_blocks:
                    yield from _waited(st, reduces[-1])
            if not last and len(reduces) > reduced:
                # The end of backward waits for its reduce-scatters before the next micro-batch: FSDP's
                # _post_backward_final_callback (the compute stream waits for the post-backward stream), DeepSpeed
                # ZeRO-3's epilogue (reduce_and_partition_stream.synchronize()).
                yield from _waited(st, simpy.AllOf(env, reduces[reduced:]))
            reduced = len(reduces)

    proc = env.process(compute())

    def all_reduced() -> ProcessGen:
        yield proc
        yield simpy.AllOf(env, list(reduces))

    env.process(_finish(st, proc, env.process(all_reduced())))


def _run_pipeline(env: simpy.Environment, plan: StepPlan, states: list[_Rank]) -> None:
    """One process per pipeline rank running its schedule, with send/recv and its DP comm and finish."""
    par = plan.scenario.parallelism
    num_vs = par.pp * par.virtual_stages
    arrived: dict[tuple[str, int, int], simpy.Event] = {}

    def arrival(key: tuple[str, int, int]) -> simpy.Event:
        if key not in arrived:
            arrived[key] = env.event()
        return arrived[key]

    def send(st: _Rank, op: PipeOp) -> ProcessGen:
        """Send ``op``'s output (activation forward, gradient backward) to the next stage."""
        boundary = op.virtual_stage if op.kind == "F" else op.virtual_stage - 1
        cost = plan.p2p.get(boundary)
        key = (op.kind, op.micro_batch, op.virtual_stage)
        if cost is None:
            arrival(key).succeed()
            return
        # One pipeline communicator, one NCCL stream: a rank's sends go out one after another (Megatron).
        start, end = yield from st.gpu.collective(cost, "p2p")
        st.rec.add(f"send {op.kind}{op.micro_batch}", "comm p2p", start, end, size_bytes=cost.size_bytes)
        arrival(key).succeed()

    def rank(st: _Rank, ops: Sequence[PipeOp]) -> ProcessGen:
        last_b = last_backward(ops, par.virtual_stages)
        sends: list[simpy.Process] = []
        by_stage = plan.workload.rank_stage_positions(st.plan.index, par.pp)
        for i in range(len(ops)):
            op = ops[i]
            dep = dependency(op, num_vs)
            if dep is not None:
                t0 = env.now
                yield arrival(dep)
                st.add("pipeline_wait", env.now - t0)
                if plan.p2p_gather is not None:  # reassemble the tp slices of what arrived
                    t0 = env.now
                    start, end = yield from st.gpu.collective(plan.p2p_gather, "tp")
                    st.add("tp_comm", env.now - t0)
                    st.rec.add(f"all-gather received {op.kind}{op.micro_batch}", "comm tp", start, end)
            if op.kind == "B" and last_b.get(op.virtual_stage) == i:
                yield from _layer_backward(st, by_stage.get(op.virtual_stage, []), 0)
            else:
                vs_label = f" vs{op.virtual_stage}" if par.virtual_stages > 1 else ""
                yield from _fused(st, op.virtual_stage, op.kind, label=f"{op.kind}{op.micro_batch}{vs_label}")
            if par.pp_p2p_overlap:
                sends.append(env.process(send(st, op)))
            else:
                t0 = env.now
                yield from send(st, op)
                st.add("pipeline_p2p", env.now - t0)
        # The schedule returns once its sends are done (Megatron waits on its p2p requests), and only then
        # does a rank without overlapped gradient reduction start it.
        t0 = env.now
        yield simpy.AllOf(env, sends)
        st.add("pipeline_p2p", env.now - t0)

    for st, ops in zip(states, plan.ops, strict=True):
        proc = env.process(rank(st, ops))
        comm = env.process(_dp_comm(st, 1, None if st.plan.overlap else proc))
        env.process(_finish(st, proc, comm))


# ----------------------------------------------------------------------------------------- result
_PART_LIST = TypeAdapter(list[StepPart])


def simulate_step(scenario: Scenario, trace: bool = True, exact: bool = False,
                  workload: Workload | None = None) -> StepResult:
    """Simulate one optimizer step of ``scenario`` and return its typed breakdown.

    The fast engine (:mod:`simddp.sim.fast`) answers when it follows the plan exactly and no trace is asked
    for; ``exact=True`` always runs the full simpy simulation, the reference.
    """
    from simddp.limits import MAX_LAYER_PASSES, check_scenario_size, check_simulation_size
    from simddp.sim import fast
    from simddp.sim.periodic import TooManyOperations

    check_scenario_size(scenario)
    if scenario.ddp.wrapper == "dataparallel":
        check_simulation_size(scenario)
        from simddp.sim.dataparallel import simulate_dataparallel

        return simulate_dataparallel(scenario, trace)
    with collector_paused():  # the plan and the fast engine make no reference cycles (engine_caches)
        plan = build_plan(scenario, workload)
        # Every rank runs at least its kernels, one micro-batch after another: a step whose kernels alone are over
        # the range the model answers for (or not finite: a peak of 1e-300 FLOP/s) is refused before any engine
        # runs (the fluid engine's clock does not advance past an infinite time).
        check_range(plan.num_micro_batches * max(rp.kernel_s for rp in plan.ranks))
        if plan.mode == "fsdp" or plan.ranks[0].rounds > 1:
            check_simulation_size(scenario)  # ZeRO-3, or reductions every micro-batch: layer by layer either way
        if not (exact or trace) and fast.supported(plan):
            # The fast engine extends a repeating pipeline steady state, so its cost does not grow with the
            # micro-batches; only what it would run one by one is bounded (a pass is a forward and a backward).
            try:
                result = fast.run(plan, max_operations=2 * MAX_LAYER_PASSES)
                del plan  # freed before the collector resumes, so its first collection need not walk it
                return result
            except TooManyOperations:
                pass  # the check below says why
    check_simulation_size(scenario)  # a pipeline or ZeRO-3 step simulates every micro-batch: bound it
    return run_plan(plan, trace)


def run_plan(plan: StepPlan, trace: bool = True) -> StepResult:
    """Run the simpy simulation of a prepared plan (the reference every shortcut must equal)."""
    env = simpy.Environment()
    spans: list[Span] | None = [] if trace else None
    states = _rank_states(env, plan, spans)
    if plan.mode == "fsdp":
        _run_fsdp(env, plan, states[0])
    elif plan.mode == "dp":
        _run_dp(env, plan, states[0])
    else:
        _run_pipeline(env, plan, states)
    env.run()
    return _result(plan, states, spans)


def _rank_states(env: simpy.Environment, plan: StepPlan, spans: list[Span] | None) -> list[_Rank]:
    """Each rank's runtime state: its GPU, its bookkeeping and its buckets' ready events."""
    par = plan.scenario.parallelism
    states = []
    for rp in plan.ranks:
        gpu = Gpu(env, plan.interference, name=str(rp.index))
        suffix = f" {rp.index}" if par.pp > 1 else ""
        st = _Rank(rp, gpu, Recorder(None), overlap=plan.overlap, names=[la.name for la in rp.layers])
        st.rec = _Accounting(spans, suffix, st)
        for rnd in range(rp.rounds if plan.mode == "dp" else 1):
            for b in rp.buckets:
                st.ready[(rnd, b.index)] = env.event()
                st.remaining[(rnd, b.index)] = b.num_params
        states.append(st)
    return states


def _pipeline_parts(plan: StepPlan, st: Any) -> tuple[float, float]:
    """Split the reported rank's pipeline waits into the bubble of a balanced pipeline and the rest."""
    waits = st.acct.get("pipeline_wait", 0.0)
    par = plan.scenario.parallelism
    if par.pp == 1:
        return 0.0, 0.0
    # A stage's time per micro-batch: its kernels and TP collectives, and its blocking sends (a receiver waits
    # for the sender's kernels and its send: a pipeline of equal stages whose sends take c fills in (p - 1) x
    # (t_f + t_b + 2c) / v). Each boundary carries two sends a micro-batch (an activation, a gradient).
    sends = 0.0 if par.pp_p2p_overlap else 2 * sum(max(c.time_s, 0.0) for c in plan.p2p.values())
    work = sum(sum(r.fwd_alone_s.values()) + sum(r.bwd_alone_s.values()) for r in plan.ranks)
    balanced = (par.pp - 1) / par.virtual_stages * (work + sends) / len(plan.ranks)
    bubble = min(waits, balanced)
    return bubble, waits - bubble


def reported_state(states: list[Any]) -> Any:
    """The rank a result reports: the one that ends last (the most kernel time among those), the first such."""
    return max(states, key=lambda s: (s.end_s, s.plan.kernel_s))


def _result(plan: StepPlan, states: list[Any], spans: list[Span] | None) -> StepResult:
    """The typed result of a run; ``states`` are the engine's per-rank outcomes (see :class:`_Rank`'s fields:
    plan, acct, ready_at, reduced, compute_end_s, end_s, dp_comm_s, link_busy_s, link_work_s)."""
    scenario, workload = plan.scenario, plan.workload
    cluster, tr, par = scenario.cluster, scenario.training, scenario.parallelism
    host = cluster.host_overhead_s
    step_s = max(st.end_s for st in states) + host
    if step_s <= 0:
        raise ScenarioError("the step takes no time: every layer has zero FLOP and no measured time")
    st = reported_state(states)
    rp = st.plan
    m = plan.num_micro_batches
    bubble, imbalance = _pipeline_parts(plan, st)
    values = {
        "compute": st.acct.get("compute", 0.0),
        "recompute": st.acct.get("recompute", 0.0),
        "interference": st.acct.get("interference", 0.0),
        "tp_comm": st.acct.get("tp_comm", 0.0),
        "dp_comm": st.acct.get("dp_comm", 0.0),
        "pipeline_bubble": bubble,
        "stage_imbalance": imbalance,
        "pipeline_p2p": st.acct.get("pipeline_p2p", 0.0),
        "ddp_host": st.acct.get("ddp_host", 0.0),
        "grad_clip": st.acct.get("grad_clip", 0.0),
        "optimizer": st.acct.get("optimizer", 0.0),
        "host": host,
    }
    # A part that is zero in exact arithmetic can come out of the sums as a rounding residue below zero (-6e-19 s
    # of interference with overlap off, a probe's --json): no time is negative.
    values = {k: max(0.0, v) for k, v in values.items()}
    breakdown = _PART_LIST.validate_python([{"key": k, "label": BREAKDOWN_PARTS[k][0], "time_s": v,
                                             "description": BREAKDOWN_PARTS[k][1]} for k, v in values.items()])
    comm_s = st.dp_comm_s
    bounds = _bounds(plan, states, host)
    gbs = scenario.global_batch_size
    gpu = cluster.gpu
    one_gpu_s = m * rp.kernel_s + rp.opt_s + host
    mfu = workload.model_flop_per_sample * gbs / step_s / (cluster.num_gpus * gpu.peak_flop_per_s(tr.precision))
    if mfu > MAX_MFU:
        raise ScenarioError(
            f"the step would do {mfu:.3g}x the model FLOP/s its {cluster.num_gpus:,} GPUs peak at (MFU {mfu:.0%}): "
            "layer times measured or given (model.layers' fwd_time_s, bwd_time_s) are shorter than their FLOP allow; "
            "measured times hold at the micro-batch and sequence they were measured at (the calibration profile's "
            "training keys)")
    rounds_reported = rp.rounds if plan.mode == "dp" else 1
    last = rounds_reported - 1
    # Records made from the engine's numbers (BucketTiming is a plain dataclass: see its docstring).
    buckets: list[BucketTiming] = []
    if plan.mode == "fsdp":
        for u in rp.reduced_units:
            assert u.reduce is not None
            ready = st.ready_at.get((0, u.index), 0.0)
            start, end = st.reduced.get((0, u.index), (ready, ready))
            buckets.append(BucketTiming(u.index, u.grad_bytes, len(u.reduce_ids), ready, start, end,
                                        u.reduce.algorithm, u.reduce.protocol))
    else:
        reduced, ready_at = st.reduced, st.ready_at
        for b in rp.buckets:
            key = (last, b.index)
            start, end = reduced[key]
            buckets.append(BucketTiming(b.index, b.size_bytes, b.num_params, ready_at[key], start, end,
                                        b.reduce.algorithm, b.reduce.protocol))
    return StepResult(
        scenario=scenario.name,
        model=scenario.model.name,
        cluster=cluster.preset or "custom",
        num_gpus=cluster.num_gpus,
        dp=scenario.dp,
        tp=par.tp,
        pp=par.pp,
        num_micro_batches=m,
        global_batch_size=gbs,
        step_time_s=step_s,
        compute_time_s=values["compute"] + values["recompute"],
        optimizer_time_s=rp.opt_s,
        host_overhead_s=host,
        comm_time_s=comm_s,
        exposed_comm_time_s=values["dp_comm"],
        tp_comm_time_s=values["tp_comm"],
        tp_comm_total_s=m * rp.tp_comm_s,
        pipeline_bubble_time_s=bubble,
        stage_imbalance_time_s=imbalance,
        pipeline_p2p_time_s=values["pipeline_p2p"],
        recompute_time_s=values["recompute"],
        interference_time_s=values["interference"],
        breakdown=breakdown,
        link_busy_s=dict(st.link_busy_s),
        samples_per_s=gbs / step_s,
        tokens_per_s=gbs * tr.seq_len / step_s,
        mfu=mfu,
        scaling_efficiency=one_gpu_s / step_s,
        num_params=rp.grads.num_params,
        reported_rank=f"pipeline stage {rp.index} of {par.pp}" if par.pp > 1 else "every rank (data parallel)",
        reported_stage=rp.index,
        buckets=buckets,
        bounds=bounds,
        not_modelled=not_modelled(scenario) + workload.notes,
        memory=memory_breakdown(scenario, workload),
        trace=Trace(spans=spans) if spans is not None else None,
    )


def _bounds(plan: StepPlan, states: list[Any], host: float) -> Bounds:
    """Closed-form bounds: every collective serialised after the compute it follows (no overlap, no sharing,
    no interference), and the most any resource of a GPU must be busy (perfect overlap)."""
    m, rule = plan.num_micro_batches, plan.rule
    upper, lower = [], []
    # A pipeline rank's own kernels-only end: its optimizer follows its own backwards (nothing in the step waits
    # for every rank before it). Until 2026-11-29 each rank added its optimizer to the latest rank's end: a lower
    # bound above the step where the last rank to finish its kernels is not the one with the longest optimizer
    # (ResNet-50 on pp 2: 2.47 ms for a 2.05 ms step, which `simddp simulate` refused as an internal error).
    pipeline = plan.mode == "pipeline"
    kernel_ends, serial_ends = (_pipeline_ends(plan, False), _pipeline_ends(plan, True)) if pipeline else ([], [])
    for st in states:
        rp = st.plan
        dp_serial = _reductions(plan, rp.buckets)[1] * rp.rounds
        if rule.overlap_param_gather:  # the buckets' gathers (build_plan)
            dp_serial += sum(b.gather.time_s for b in rp.buckets if b.gather)
        if rp.unused_map_reduce is not None and rp.buckets:
            dp_serial += rp.unused_map_reduce.time_s * rp.rounds
        clip_comm = sum(c.time_s for c in rp.clip_reduces)
        clip_passes = rp.clip_norm_s + rp.clip_scale_s
        host_serial = rp.traversal_s * rp.rounds if plan.mode == "dp" else 0.0
        tail_serial = rp.opt_s + (rp.gather_after_step.time_s if rp.gather_after_step else 0.0)
        tail_serial += rp.embedding_sync.time_s if rp.embedding_sync else 0.0
        tail_serial += clip_passes + clip_comm + host_serial
        if plan.mode == "fsdp":
            units = rp.fsdp_units + ([rp.fsdp_root] if rp.fsdp_root else [])
            # Every unit is gathered for forward and, unless kept gathered (the root among them), for backward.
            dp_serial = m * sum(u.gather.time_s * (2 if u.gather_bwd else 1)
                                + (u.reduce.time_s if u.reduce is not None else 0.0) for u in units)
        if pipeline:
            serial, kernels = serial_ends[rp.index], kernel_ends[rp.index]
        else:
            serial, kernels = m * (rp.kernel_s + rp.tp_comm_s), m * rp.kernel_s
        upper.append(serial + dp_serial + tail_serial)
        work_before_step = dict(st.link_work_s)
        if rp.gather_after_step is not None:
            work_before_step[rp.gather_after_step.tier] -= rp.gather_after_step.transfer_s
        for c in rp.clip_reduces:  # after every gradient reduction: counted whole, below
            work_before_step[c.tier] -= c.transfer_s
        gather_after = rp.gather_after_step.time_s if rp.gather_after_step else 0.0
        # The graph search holds the GPU between a forward and its backward: it adds to the kernels' path.
        lower.append(max(kernels + host_serial, *work_before_step.values()) + clip_passes + clip_comm + rp.opt_s
                     + gather_after)
    in_order = None
    gathers = rule.overlap_param_gather and any(b.gather for b in plan.ranks[0].buckets)
    if plan.mode == "dp" and plan.ranks[0].rounds == 1 and not gathers:
        st = states[0]
        ready_at = st.ready_at
        # Without overlap the reductions wait for the whole backward (until 2026-11-29 the recurrence read the
        # gradients' ready times regardless: 0.329 s for the default's 0.390 s step with ddp.overlap false).
        readies = ([ready_at[(0, b.index)] for b in st.plan.buckets] if st.plan.overlap
                   else [st.compute_end_s] * len(st.plan.buckets))
        costs = list(_reductions(plan, st.plan.buckets)[0])  # appended to below
        if st.plan.unused_map_reduce is not None and readies:  # queued behind the last bucket
            readies.append(max(readies))
            costs.append(st.plan.unused_map_reduce.time_s)
        tail = st.plan.opt_s + (st.plan.gather_after_step.time_s if st.plan.gather_after_step else 0.0) + host
        tail += st.plan.clip_norm_s + st.plan.clip_scale_s + sum(c.time_s for c in st.plan.clip_reduces)
        in_order = in_order_overlap_step_s(st.compute_end_s, readies, costs, tail) if costs else None
    return Bounds(no_overlap_s=max(upper) + host, perfect_overlap_s=max(lower) + host, in_order_overlap_s=in_order)


def _reductions(plan: StepPlan, buckets: list[BucketPlan]) -> tuple[list[float], float]:
    """Each bucket's reduction time, in bucket order, and their sum: once per step and bucket list (twin ranks
    share one), for the bounds and the bounds' schedules alike."""
    memo: dict[int, tuple[list[float], float]] = plan.cache.setdefault("reductions", {})
    got = memo.get(id(buckets))  # the plan keeps its ranks' bucket lists alive, so their ids stay theirs
    if got is None:
        times = [b.reduce.time_s for b in buckets]
        got = memo[id(buckets)] = (times, sum(times))
    return got


def _pipeline_ends(plan: StepPlan, serial: bool) -> list[float]:
    """Every rank's schedule end, with TP and send/recv serialised (``serial``) or kernels only: both kinds in
    one traversal, once per plan (the fast engine runs them in its own traversal and records them,
    :func:`record_pipeline_ends`)."""
    if "pipeline_ends" not in plan.cache:
        par = plan.scenario.parallelism
        run = ScheduleRun(plan.ops, par.pp * par.virtual_stages, list(bound_steps(plan)))
        run.run(steady(plan.ops, last_backwards(plan)))
        record_pipeline_ends(plan, run.clocks[0], run.clocks[1])
    return plan.cache["pipeline_ends"][serial]  # type: ignore[no-any-return]


def record_pipeline_ends(plan: StepPlan, serial: list[float], kernels: list[float]) -> None:
    """Keep the ends of :func:`bound_steps`' two schedules for :func:`_bounds`."""
    plan.cache["pipeline_ends"] = {True: serial, False: kernels}


def bound_steps(plan: StepPlan) -> tuple[Linear, Linear]:
    """The operation steps of the two bounds' schedules: TP and send/recv serialised, and kernels only.

    Serialised, a rank whose gradient reduction overlaps its last backwards pays for it on each operation that
    can run beside it (from its first release of gradients on), by what that operation can lose:
    * its kernels run at no less than ``1 / (1 + i)`` while any collective is in flight (:mod:`simddp.sim.resources`):
      at most ``i`` times its kernel work more;
    * its collectives share a link with one reduction at a time (the DP stream runs its buckets one after
      another) in processor sharing: the reduction is served no more than they are, so they end at most their
      own (serialised) time later.
    Each operation's bound is then ``(1 + i) work + 2 comm``, a path through the schedule picks up only the
    operations on it, and the reduction itself is counted whole after the schedule (:func:`_bounds`: it has
    at most all its work left when the rank's last operation ends, and nothing shares the link after that).
    Until 2026-11-24 each rank paid ``(1 + 2 i)`` times its whole reduction (and the comm after it) up front
    at its first release; along the drain, where each rank waits for the next one's backwards, those charges
    added up rank after rank (the GPT-3 175B 3D example: 26.2 s for a 19.3 s step). A reduction that takes no
    time (dp = 1: nothing to reduce) is never in flight, and adds nothing.
    """
    par = plan.scenario.parallelism
    num_vs = par.pp * par.virtual_stages
    i = plan.interference
    first_release = [min(last.values(), default=len(ops)) for last, ops in zip(last_backwards(plan), plan.ops,
                                                                              strict=True)]
    two, ranks, p2p = 2 * num_vs, len(plan.ranks), plan.p2p
    # By slot (2 virtual stage + 1 if backward): one row each for every rank (a slot is one rank's, and each
    # reads its own, periodic.Linear). An operation's comm: its TP time (the plan's, plan._stage_passes), its
    # send and the gather of what it received.
    works, comms, lates = [0.0] * two, [0.0] * two, [0.0] * two
    gather = plan.p2p_gather.time_s if plan.p2p_gather is not None else 0.0
    for rp in plan.ranks:
        for vs in rp.fwd_work_s:
            send, back = p2p.get(vs), p2p.get(vs - 1)
            works[2 * vs], works[2 * vs + 1] = rp.fwd_work_s[vs], rp.bwd_work_s[vs]
            comms[2 * vs] = rp.fwd_tp_s[vs] + (send.time_s if send is not None else 0.0) + (gather if vs > 0 else 0.0)
            comms[2 * vs + 1] = (rp.bwd_tp_s[vs] + (back.time_s if back is not None else 0.0)
                                 + (gather if vs < num_vs - 1 else 0.0))
    late = False  # whether a send delays what receives it (the lates row)
    if par.pp_p2p_overlap:
        for rp in plan.ranks:
            # Its layers' TP parts are never negative, so their per-stage sums (the plan's) show whether any is.
            tp_stream = plan.p2p_gather is not None or any(rp.fwd_tp_s.values()) or any(rp.bwd_tp_s.values())
            dp_stream = rp.overlap and any(b.reduce.time_s > 0 for b in rp.buckets)
            shared = int(tp_stream) + int(dp_stream)  # streams besides the send's own
            for vs in rp.fwd_work_s:
                for slot, receiver, boundary in ((2 * vs, vs + 1, vs), (2 * vs + 1, vs - 1, vs - 1)):
                    send = p2p.get(boundary)
                    if send is not None and 0 <= receiver < num_vs:
                        late = True
                        lates[2 * receiver + (slot & 1)] = shared * send.time_s  # the receiver's operation
                        # the sender's next kernels run slowed while the send is in flight (at most k sends long)
                        comms[slot] += i * (shared + 1) * send.time_s

    zeros = [0.0] * two  # read only, shared by every rank's lists that are all zero
    serial = Linear(pre=[lates if late else zeros] * ranks, mid=[zeros] * ranks, hold=[works] * ranks,
                    tail=[comms] * ranks, extra=[])
    kernels = Linear(pre=[zeros] * ranks, mid=[zeros] * ranks, hold=serial.hold, tail=[zeros] * ranks,
                     extra=[{} for _ in range(ranks)])
    for r, rp in enumerate(plan.ranks):
        reduce = _reductions(plan, rp.buckets)[1] if rp.overlap else 0.0
        if reduce > 0:  # a reduction in flight beside the rank's operations (none with dp = 1: nothing to reduce)
            ops, start = plan.ops[r], first_release[r]
            serial.extra.append({position: i * works[code % two] + comms[code % two]
                                 for position, code in enumerate(op_codes(ops, start, len(ops), num_vs), start)})
        else:
            serial.extra.append({})
    return serial, kernels


__all__ = ["not_modelled", "pass_alone_s", "run_plan", "simulate_step"]
