"""torch.nn.DataParallel on one node: one process drives every GPU (``ddp.wrapper: dataparallel``).

What one ``DataParallel.forward`` does (``torch/nn/parallel/data_parallel.py``), every micro-batch:

1. **scatter** the inputs from GPU 0 to the other GPUs (``scatter_kwargs``);
2. **replicate** the module from GPU 0 to every GPU (``replicate`` -> ``Broadcast.apply`` ->
   ``comm.broadcast_coalesced`` of every parameter and buffer, in 10 MiB chunks);
3. **parallel_apply**: one Python thread per GPU runs its replica's forward. Each operator is issued by
   Python holding the GIL, so N threads issue their kernels one at a time: the forward takes the longer of
   its kernels and N x (operators x ``cluster.host_op_dispatch_s``);
4. **gather** the outputs onto GPU 0, where the loss is computed over the whole batch.

Backward runs on the autograd engine's per-device threads (C++, no GIL). Its last node is the backward of
the broadcast, ``ReduceAddCoalesced``: the replicas' gradients are summed onto GPU 0 (``comm.
reduce_add_coalesced``, NCCL reduce in 10 MiB chunks) only once every replica's backward is done, so nothing
overlaps it; the gradient of the gathered outputs is scattered back first. The optimizer steps on GPU 0
alone. The PyTorch documentation recommends DistributedDataParallel instead "even on a single node" for
these reasons (replication every iteration, scatter/gather, GIL contention); this module prices each one.

Everything runs one after another on GPU 0 (its link carries every copy), so the simulation is a chain of
costs; it runs in simpy on the same :class:`~simddp.sim.resources.Gpu` as the DDP step, so traces look alike.
Every cost is plan data (:class:`DataParallelPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simddp.collectives import CollectiveCost, chunked_cost, collective_cost
from simddp.compute import memory_s
from simddp.config import Scenario, ScenarioError
from simddp.memory import memory_breakdown
from simddp.results import BREAKDOWN_PARTS, Bounds, Span, StepPart, StepResult, Trace
from simddp.sanity import check_range
from simddp.sim.layers import Recorder
from simddp.sim.plan import RankPlan, build_plan
from simddp.sim.resources import Gpu
from simddp.topology import group
from simddp.units import MiB, dtype_bytes
from simddp.workload import PRECISION_ACT_BYTES, Workload

#: ``comm.broadcast_coalesced`` / ``reduce_add_coalesced`` default buffer: 10 MiB chunks.
COALESCE_BYTES = 10 * MiB
#: Token ids are int64 (the input DataParallel scatters for a language model).
TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class DataParallelPlan:
    """Costs of one DataParallel step on GPU 0 (times per micro-batch unless said otherwise)."""

    num_gpus: int
    num_micro_batches: int
    scatter: CollectiveCost  # inputs, GPU 0 -> the others
    replicate: CollectiveCost  # parameters broadcast from GPU 0, every forward
    fwd_kernels_s: float  # one replica's forward kernels
    fwd_launch_s: float  # N threads x operators x dispatch time, serialised by the GIL
    gather: CollectiveCost  # outputs, the others -> GPU 0
    loss_s: float  # loss forward and backward over the gathered outputs, on GPU 0
    scatter_grad: CollectiveCost  # gradient of the outputs, GPU 0 -> the others
    bwd_kernels_s: float  # one replica's backward kernels (recompute included)
    recompute_s: float
    reduce: CollectiveCost  # gradients summed onto GPU 0 (ReduceAddCoalesced)
    opt_s: float  # per step, on GPU 0
    num_params: int
    model_flop_per_sample: float
    rank: RankPlan  # the per-GPU plan the kernel times come from

    @property
    def forward_s(self) -> float:
        return max(self.fwd_kernels_s, self.fwd_launch_s)

    @property
    def comm_costs(self) -> tuple[CollectiveCost, ...]:
        return (self.scatter, self.replicate, self.gather, self.scatter_grad, self.reduce)


def _chunked(op: str, size_bytes: int, scenario: Scenario, n: int) -> CollectiveCost:
    """``op`` over the node's N GPUs in COALESCE_BYTES chunks, one after another: the chunks' latencies add."""
    return chunked_cost(op, size_bytes, COALESCE_BYTES, group(scenario.cluster, n))  # type: ignore[arg-type]


def _copies(size_bytes: int, scenario: Scenario, n: int) -> CollectiveCost:
    """N - 1 copies between GPU 0 and the others, all through GPU 0's link: one send-recv of their sum."""
    pair = group(scenario.cluster, 2)
    cost = collective_cost("send-recv", (n - 1) * size_bytes, pair)
    return CollectiveCost("scatter/gather", cost.size_bytes, n, "copy", "p2p", cost.time_s, cost.latency_s,
                          cost.tier)


def io_bytes(scenario: Scenario, workload: Workload) -> tuple[int, int]:
    """Bytes of one replica's inputs and outputs per micro-batch: token ids and logits for a transformer; the
    first and last layers' activations for a parameter-list model (0 when unknown)."""
    tr, model = scenario.training, scenario.model
    act = PRECISION_ACT_BYTES[tr.precision]
    b = tr.micro_batch_size
    tf = model.transformer
    if tf is not None:
        return b * tr.seq_len * TOKEN_ID_BYTES, b * tr.seq_len * tf.vocab_size * act
    layers = model.layers or []
    first = (layers[0].activation_numel_per_sample or 0) if layers else 0
    last = (layers[-1].activation_numel_per_sample or 0) if layers else 0
    return first * b * act, last * b * act


def dataparallel_plan(scenario: Scenario) -> DataParallelPlan:
    """Every cost of a DataParallel step (ddp.wrapper: dataparallel)."""
    step_plan = build_plan(scenario)
    rank = step_plan.ranks[0]
    workload = step_plan.workload
    n = scenario.cluster.gpus_per_node
    gpu = scenario.cluster.gpu
    in_bytes, out_bytes = io_bytes(scenario, workload)
    param_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in workload.parameters)
    grad_bytes = sum(p.numel * dtype_bytes(p.dtype) for p in rank.grads.params)
    num_ops = sum(len(la.fwd) for la in rank.layers)
    fwd = sum(rank.fwd_work_s.values())
    bwd = sum(rank.bwd_work_s.values())
    recompute = sum(rank.bwd_recompute_s.values())
    # The loss over the N gathered outputs: the forward reads them, the backward reads and writes them.
    loss_s = memory_s(3 * n * out_bytes, gpu)
    return DataParallelPlan(
        num_gpus=n,
        num_micro_batches=scenario.num_micro_batches,
        scatter=_copies(in_bytes, scenario, n),
        replicate=_chunked("broadcast", param_bytes, scenario, n),
        fwd_kernels_s=fwd,
        fwd_launch_s=n * num_ops * scenario.cluster.host_op_dispatch_s,
        gather=_copies(out_bytes, scenario, n),
        loss_s=loss_s,
        scatter_grad=_copies(out_bytes, scenario, n),
        bwd_kernels_s=bwd,
        recompute_s=recompute,
        reduce=_chunked("reduce", grad_bytes, scenario, n),
        opt_s=rank.opt_s,
        num_params=sum(p.numel for p in rank.grads.params),
        model_flop_per_sample=workload.model_flop_per_sample,
        rank=rank,
    )


def simulate_dataparallel(scenario: Scenario, trace: bool = True) -> StepResult:
    """Simulate one optimizer step of ``scenario`` under torch.nn.DataParallel."""
    plan = dataparallel_plan(scenario)
    # Its kernels alone, one micro-batch after another, must be within the range the model answers for (a peak of
    # 1e-300 FLOP/s made them infinite, and the simpy run never ended), as simulate_step checks the others.
    check_range(plan.num_micro_batches * (plan.fwd_kernels_s + plan.bwd_kernels_s + plan.loss_s) + plan.opt_s)
    return run_dataparallel(scenario, plan, trace)


def run_dataparallel(scenario: Scenario, plan: DataParallelPlan, trace: bool = True) -> StepResult:
    env = simpy.Environment()
    gpu = Gpu(env, scenario.cluster.comm_compute_interference, name="0")
    spans: list[Span] | None = [] if trace else None
    rec = Recorder(spans)
    acct: dict[str, float] = {}

    def book(key: str, seconds: float) -> None:
        acct[key] = acct.get(key, 0.0) + seconds

    def comm(cost: CollectiveCost, name: str) -> simpy.events.ProcessGenerator:
        start, end = yield from gpu.collective(cost, "dp")
        book("dp_comm", end - start)
        rec.add(name, "comm", start, end, size_bytes=cost.size_bytes)

    def kernels(work_s: float, name: str, key: str = "compute") -> simpy.events.ProcessGenerator:
        start = env.now
        yield gpu.run(work_s)
        book(key, work_s)
        book("interference", env.now - start - work_s)
        rec.add(name, "compute", start, env.now)

    def step() -> simpy.events.ProcessGenerator:
        for k in range(plan.num_micro_batches):
            yield from comm(plan.scatter, f"scatter inputs {k}")
            yield from comm(plan.replicate, f"replicate parameters {k}")
            yield from kernels(plan.fwd_kernels_s, f"forward {k}")
            if plan.fwd_launch_s > plan.fwd_kernels_s:  # the GPU waits for launches serialised by the GIL
                start = env.now
                yield env.timeout(plan.fwd_launch_s - plan.fwd_kernels_s)
                book("ddp_host", env.now - start)
                rec.add("forward launches (GIL)", "host", start, env.now)
            yield from comm(plan.gather, f"gather outputs {k}")
            yield from kernels(plan.loss_s, f"loss on GPU 0 {k}")
            yield from comm(plan.scatter_grad, f"scatter output gradients {k}")
            yield from kernels(plan.bwd_kernels_s - plan.recompute_s, f"backward {k}")
            yield from kernels(plan.recompute_s, f"recompute {k}", "recompute")
            yield from comm(plan.reduce, f"reduce gradients to GPU 0 {k}")
        yield from kernels(plan.opt_s, "optimizer step", "optimizer")

    env.process(step())
    env.run()
    return _result(scenario, plan, env.now, acct, spans)


def _result(scenario: Scenario, plan: DataParallelPlan, end_s: float, acct: dict[str, float],
            spans: list[Span] | None) -> StepResult:
    cluster, tr = scenario.cluster, scenario.training
    host = cluster.host_overhead_s
    step_s = end_s + host
    if step_s <= 0:
        raise ScenarioError("the step takes no time: every layer has zero FLOP and no measured time")
    values = {
        "compute": acct.get("compute", 0.0),
        "recompute": acct.get("recompute", 0.0),
        "interference": acct.get("interference", 0.0),
        "tp_comm": 0.0,
        "dp_comm": acct.get("dp_comm", 0.0),
        "pipeline_bubble": 0.0,
        "stage_imbalance": 0.0,
        "pipeline_p2p": 0.0,
        "ddp_host": acct.get("ddp_host", 0.0),
        "grad_clip": 0.0,
        "optimizer": acct.get("optimizer", 0.0),
        "host": host,
    }
    breakdown = [StepPart(key=k, label=BREAKDOWN_PARTS[k][0], time_s=max(0.0, v), description=BREAKDOWN_PARTS[k][1])
                 for k, v in values.items()]
    m = plan.num_micro_batches
    per_micro = (sum(c.time_s for c in plan.comm_costs) + plan.forward_s + plan.loss_s + plan.bwd_kernels_s)
    serial = m * per_micro + plan.opt_s + host  # nothing overlaps in DataParallel: both bounds are the chain
    gbs = scenario.global_batch_size
    one_gpu_s = m * plan.rank.kernel_s + plan.rank.opt_s + host
    comm_s = values["dp_comm"]
    return StepResult(
        scenario=scenario.name,
        model=scenario.model.name,
        cluster=cluster.preset or "custom",
        num_gpus=cluster.num_gpus,
        dp=scenario.dp,
        tp=1,
        pp=1,
        num_micro_batches=m,
        global_batch_size=gbs,
        step_time_s=step_s,
        compute_time_s=values["compute"] + values["recompute"],
        optimizer_time_s=plan.opt_s,
        host_overhead_s=host,
        comm_time_s=comm_s,
        exposed_comm_time_s=comm_s,
        recompute_time_s=values["recompute"],
        interference_time_s=values["interference"],
        breakdown=breakdown,
        link_busy_s={},
        samples_per_s=gbs / step_s,
        tokens_per_s=gbs * tr.seq_len / step_s,
        mfu=plan.model_flop_per_sample * gbs / step_s / (cluster.num_gpus * cluster.gpu.peak_flop_per_s(tr.precision)),
        scaling_efficiency=one_gpu_s / step_s,
        num_params=plan.num_params,
        reported_rank="GPU 0 (DataParallel: one process drives the node)",
        buckets=[],
        bounds=Bounds(no_overlap_s=serial, perfect_overlap_s=serial),
        not_modelled=["ddp.wrapper=dataparallel: GPU 0 also holds the gathered outputs and the optimizer "
                      "states of the whole model; the memory figures are those of one DDP rank"],
        memory=memory_breakdown(scenario),
        trace=Trace(spans=spans) if spans is not None else None,
    )


__all__ = ["DataParallelPlan", "dataparallel_plan", "io_bytes", "run_dataparallel", "simulate_dataparallel"]
