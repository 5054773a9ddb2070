"""Typed results: step breakdown, per-bucket timings, bounds and a Chrome/Perfetto trace."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp.memory import MemoryBreakdown


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Span(_Result):
    """One interval on one stream of the timeline."""

    name: str
    stream: str
    start_s: float
    end_s: float
    args: dict[str, Any] = Field(default_factory=dict)


class Trace(_Result):
    """The simulated timeline of one GPU (ranks that behave identically are simulated once)."""

    spans: list[Span]

    def to_chrome(self) -> dict[str, Any]:
        """Chrome trace-event JSON (opens in Perfetto / chrome://tracing); times in microseconds."""
        streams = sorted({s.stream for s in self.spans}, key=lambda n: (n != "compute", n))
        tid = {name: i for i, name in enumerate(streams)}
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": name}}
            for name, i in tid.items()
        ]
        for s in self.spans:
            events.append(
                {
                    "name": s.name,
                    "cat": s.stream,
                    "ph": "X",
                    "ts": s.start_s * 1e6,
                    "dur": (s.end_s - s.start_s) * 1e6,
                    "pid": 0,
                    "tid": tid[s.stream],
                    "args": s.args,
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str | Path, inputs: Sequence[str | Path] = ()) -> None:
        """Strict JSON, written by :func:`simddp.safeio.write_text` (never over an input, a device or a FIFO)."""
        from simddp.safeio import json_text, write_text

        write_text(path, json_text(self.to_chrome()), inputs, "--trace")


@dataclasses.dataclass(slots=True)
class BucketTiming:
    """When a DDP bucket (or an FSDP unit) became ready, and when its reduction ran.

    A plain record, not a pydantic model: a step makes one per bucket (226 for the default scenario, 291 at a
    1 MiB cap), from the engine's own numbers, and validating each cost a sweep a quarter of its time.
    :class:`StepResult` still validates them from dicts (a result read back from JSON) and dumps them as
    objects, as before."""

    index: int
    size_bytes: int
    num_params: int
    ready_s: float
    start_s: float
    end_s: float
    algorithm: str
    protocol: str

    def model_dump(self) -> dict[str, Any]:
        """The record as a dict (the spelling of the pydantic records around it)."""
        return dataclasses.asdict(self)


class StepPart(_Result):
    """One named part of the step on the reported GPU; the parts add up to the step time."""

    key: str = Field(description="compute, recompute, interference, tp_comm, dp_comm, pipeline_bubble, "
                     "stage_imbalance, pipeline_p2p, ddp_host, grad_clip, optimizer or host.")
    label: str = Field(description="Human name.")
    time_s: float = Field(ge=0, description="Seconds of the step.")
    description: str = Field(description="What the part counts.")


BREAKDOWN_PARTS: dict[str, tuple[str, str]] = {
    "compute": ("compute", "forward and backward kernels at full speed"),
    "recompute": ("recompute", "forward kernels run again inside backward (activation recompute)"),
    "interference": ("compute slowed by NCCL", "extra kernel time while collectives share the SMs"),
    "tp_comm": ("tensor-parallel comm (blocking)", "compute waits for tensor-parallel collectives"),
    "dp_comm": ("data-parallel comm (exposed)", "compute or the optimizer waits for gradient reduction, "
                "parameter gathers or the embedding sync"),
    "pipeline_bubble": ("pipeline bubble", "waiting for other stages: (p-1)/v of a balanced stage's work and sends "
                        "per micro-batch"),
    "stage_imbalance": ("stage imbalance", "waiting beyond the bubble: stages do unequal work, or transfers "
                        "between them hold up the steady state"),
    "pipeline_p2p": ("pipeline send/recv (blocking)", "a stage waits for its own sends: activations to the next "
                     "stage, gradients to the previous one (blocking p2p transfers; Megatron's default)"),
    "ddp_host": ("framework host time", "GPU idle while the host works: DDP's search for unused parameters "
                 "(find_unused_parameters), DataParallel's forward launches serialised by the GIL"),
    "grad_clip": ("gradient clipping", "the gradient norm's pass, its all-reduces and the scaling pass"),
    "optimizer": ("optimizer", "the optimizer step"),
    "host": ("host", "cluster.host_overhead_s per step"),
}


class Bounds(_Result):
    """Closed-form bounds on the step time (see :mod:`simddp.analytical`)."""

    no_overlap_s: float = Field(
        description="Upper bound: compute with its tensor- and pipeline-parallel communication serialised, then every "
        "gradient reduction, then the optimizer (a pipeline rank whose reduction overlaps its last backwards also "
        "pays what each of those operations can lose beside it: interference on its kernels, a shared link).")
    perfect_overlap_s: float = Field(description="Lower bound: communication hidden as far as causality allows.")
    in_order_overlap_s: float | None = Field(
        default=None,
        description="FIFO recurrence of one NCCL stream over the bucket ready times (data parallel, pp = 1); "
        "equals the simulation when nothing else shares the link and there is no interference.",
    )


class StepResult(_Result):
    """One training step on the most loaded GPU."""

    scenario: str
    model: str
    cluster: str
    num_gpus: int
    dp: int
    tp: int
    pp: int
    num_micro_batches: int
    global_batch_size: int
    step_time_s: float
    compute_time_s: float = Field(description="Forward + backward kernels (incl. recompute) of all micro-batches.")
    optimizer_time_s: float
    host_overhead_s: float
    comm_time_s: float = Field(description="Data-parallel communication: gradient reductions and parameter gathers.")
    exposed_comm_time_s: float = Field(
        description="Data-parallel communication the GPU waits for (not hidden behind compute)."
    )
    tp_comm_time_s: float = Field(default=0.0, description="Time compute waits for tensor-parallel collectives.")
    tp_comm_total_s: float = Field(
        default=0.0,
        description="All tensor-parallel collective time (hidden or not), each collective timed alone on its link; "
        "where data-parallel reductions share that link they take longer, and tp_comm_time_s can exceed this.",
    )
    pipeline_bubble_time_s: float = Field(
        default=0.0, description="Waiting for other pipeline stages, up to a balanced pipeline's bubble."
    )
    stage_imbalance_time_s: float = Field(
        default=0.0, description="Waiting for other stages beyond the bubble (unequal stage work, or transfers "
        "between stages that hold up the steady state)."
    )
    pipeline_p2p_time_s: float = Field(
        default=0.0, description="Blocking pipeline sends: the reported stage waits for its own activation and "
        "gradient sends (receives are in the waits above).")
    recompute_time_s: float = Field(default=0.0, description="Recomputed forward kernels (part of compute).")
    interference_time_s: float = Field(default=0.0, description="Kernel time lost to collectives sharing the SMs.")
    breakdown: list[StepPart] = Field(default_factory=list, description="Named parts that sum to the step.")
    link_busy_s: dict[str, float] = Field(
        default_factory=dict, description="Seconds each link of the reported GPU carried data (intra, inter)."
    )
    samples_per_s: float
    tokens_per_s: float
    mfu: float = Field(description="Model FLOP utilisation (no recompute FLOP) of dense peak.")
    scaling_efficiency: float = Field(description="Throughput per GPU relative to one GPU without communication.")
    num_params: int = Field(description="Parameters on this GPU (its tp shard and pipeline stage).")
    reported_rank: str = Field(default="every rank (data parallel)", description="Which GPU the figures are for.")
    reported_stage: int = Field(default=0, description="Pipeline stage of the GPU the figures are for (0 without "
                                "pipelining): its buckets are the result's buckets.")
    buckets: list[BucketTiming]
    bounds: Bounds
    not_modelled: list[str] = Field(default_factory=list)
    memory: MemoryBreakdown | None = Field(default=None, description="Peak memory of the most loaded GPU.")
    trace: Trace | None = None

    @property
    def exposed_comm_fraction(self) -> float:
        return self.exposed_comm_time_s / self.step_time_s if self.step_time_s else 0.0

    def part(self, key: str) -> float:
        """Seconds of one breakdown part (0 when the step has none)."""
        return sum(p.time_s for p in self.breakdown if p.key == key)

    def to_json_dict(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"trace"})
        data["exposed_comm_fraction"] = self.exposed_comm_fraction
        return data

    def to_dataframe(self) -> Any:
        """Per-bucket table (pandas, imported lazily: the library does not depend on it)."""
        import pandas as pd

        return pd.DataFrame([b.model_dump() for b in self.buckets])

    def summary_dataframe(self) -> Any:
        import pandas as pd

        rows = {k: v for k, v in self.to_json_dict().items() if not isinstance(v, list | dict)}
        return pd.DataFrame({"metric": list(rows), "value": list(rows.values())})
