"""Tables to share: DDP buckets with their parameters, and a simulated step's per-layer and per-bucket rows.

Every row is a typed model; a table turns into CSV (the column order is the model's field order), a
pandas frame, or JSON. Parameter and layer names are the workload's (Hugging Face parameter names), so a
bucket row, a layer row and a trace span can be joined on them. Sizes are bytes, times seconds.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp import safeio
from simddp.config import Scenario
from simddp.results import StepResult
from simddp.units import dtype_bytes


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ParamEntry(_Row):
    """One parameter's gradient in a DDP bucket, in the order torch lays it out."""

    index: int = Field(description="Index in this GPU's model.parameters() (its tp shard and pipeline stage).")
    name: str = Field(description="Parameter name.")
    dtype: str = Field(description="Parameter dtype (torch name).")
    numel: int = Field(description="Elements on this GPU.")
    size_bytes: int = Field(description="Bytes of its gradient in the bucket (in the bucket's dtype).")


class BucketEntry(_Row):
    """One DDP bucket: its size, dtype and parameters."""

    index: int = Field(description="Reduction order: bucket 0 is reduced first.")
    size_bytes: int = Field(description="Bytes the bucket's collective moves.")
    dtype: str = Field(description="Dtype of the bucket (the gradients' reduction dtype).")
    cap_bytes: int | None = Field(description="Size limit the bucket was built against, bytes (None: an FSDP "
                                              "unit, cut by module rather than by size).")
    param_indices: list[int] = Field(description="Parameter indices, in the order torch lays them out.")
    params: list[ParamEntry] = Field(description="The parameters, in the same order.")


class BucketParamRow(_Row):
    """One row of ``simddp buckets --csv``: a parameter and the bucket it is reduced in."""

    bucket: int
    bucket_size_bytes: int
    bucket_dtype: str
    param_index: int
    name: str
    dtype: str
    numel: int
    size_bytes: int


class BucketExport(_Row):
    """The DDP buckets of one GPU (pipeline stage ``stage``, one tp shard), with parameter names."""

    scenario: str = Field(description="Scenario name.")
    stage: int = Field(description="Pipeline stage whose buckets these are.")
    kind: str = Field(default="DDP buckets", description="What the entries are: 'DDP buckets' (torch's, or the "
                      "implementation's own), or under FSDP / DeepSpeed ZeRO-3 without pipelining the units the step "
                      "reduce-scatters ('FSDP units', 'ZeRO-3 reduce buckets').")
    buckets: list[BucketEntry]

    def rows(self) -> list[BucketParamRow]:
        return [BucketParamRow(bucket=b.index, bucket_size_bytes=b.size_bytes, bucket_dtype=b.dtype,
                               param_index=p.index, name=p.name, dtype=p.dtype, numel=p.numel,
                               size_bytes=p.size_bytes) for b in self.buckets for p in b.params]

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def to_csv(self) -> str:
        return rows_to_csv(self.rows(), BucketParamRow)

    def to_dataframe(self) -> Any:
        return rows_to_dataframe(self.rows(), BucketParamRow)


def bucket_export(scenario: Scenario, stage: int = 0) -> BucketExport:
    """DDP buckets of pipeline stage ``stage``, exactly as the simulator (and torch) builds them; under FSDP or
    DeepSpeed ZeRO-3 without pipelining, the units the simulated step reduce-scatters instead."""
    from simddp.errors import pipeline_stage
    from simddp.sim.plan import rank_gradients
    from simddp.workload import build_workload
    from simddp.zero import zero_rule

    pp = scenario.parallelism.pp
    stage = pipeline_stage(stage, pp)
    rule = zero_rule(scenario)
    if rule.sharded_params and pp == 1:
        return _unit_export(scenario, rule)
    if scenario.ddp.wrapper == "dataparallel":  # it reduces gradients to GPU 0 by its own means: no DDP bucket
        return BucketExport(scenario=scenario.name, stage=stage, kind="none (DataParallel)", buckets=[])
    workload = build_workload(scenario)
    grads = rank_gradients(scenario, workload, stage)
    buckets = []
    for b in grads.buckets:
        params = []
        for i in b.param_indices:
            spec = workload.parameters[grads.global_ids[i]]
            reduced = grads.params[i]
            params.append(ParamEntry(index=i, name=spec.name, dtype=spec.dtype, numel=spec.numel,
                                     size_bytes=reduced.numel * dtype_bytes(reduced.dtype)))
        buckets.append(BucketEntry(index=b.index, size_bytes=b.size_bytes, dtype=b.dtype, cap_bytes=b.cap_bytes,
                                   param_indices=list(b.param_indices), params=params))
    return BucketExport(scenario=scenario.name, stage=stage, buckets=buckets)


def _unit_export(scenario: Scenario, rule: Any) -> BucketExport:
    """The FSDP units or DeepSpeed ZeRO-3 reduce buckets whose gradients the step reduce-scatters, in order,
    with their parameters (global indices: ZeRO-3 without pipelining holds every parameter's shard)."""
    from simddp.sim.plan import build_plan
    from simddp.workload import grad_reduce_spec

    plan = build_plan(scenario)
    rank, params = plan.ranks[0], plan.workload.parameters
    cap = (rule.bucket_numel * rule.gradient_dtype_bytes  # DeepSpeed's reduce_bucket_size, in elements
           if rule.unit_rule != "block" and rule.bucket_numel else None)
    buckets = []
    for u in rank.reduced_units:  # numbered as the step's records number them (a unit's or module's index)
        grads = [grad_reduce_spec(params[g], rule.reduce_in_fp32) for g in u.reduce_ids]
        entries = [ParamEntry(index=g, name=params[g].name, dtype=params[g].dtype, numel=params[g].numel,
                              size_bytes=grad.numel * dtype_bytes(grad.dtype))
                   for g, grad in zip(u.reduce_ids, grads, strict=True)]
        buckets.append(BucketEntry(index=u.index, size_bytes=u.grad_bytes, dtype=grads[0].dtype, cap_bytes=cap,
                                   param_indices=list(u.reduce_ids), params=entries))
    kind = "FSDP units" if rule.unit_rule == "block" else "ZeRO-3 reduce buckets"
    return BucketExport(scenario=scenario.name, stage=0, kind=kind, buckets=buckets)


# ----------------------------------------------------------------------------- simulate --csv
class BucketTimingRow(_Row):
    """One bucket (or ZeRO-3 unit) of a simulated step: what it holds and when it was reduced."""

    bucket: int
    size_bytes: int
    dtype: str | None = Field(description="Reduction dtype (DDP buckets; empty for ZeRO-3 units).")
    num_params: int
    first_param: str | None = Field(description="First parameter in the bucket (DDP buckets).")
    last_param: str | None = Field(description="Last parameter in the bucket (DDP buckets).")
    ready_s: float = Field(description="When its last gradient was ready, s from the step start.")
    start_s: float
    end_s: float
    wait_s: float = Field(description="start - ready: time queued behind earlier collectives.")
    algorithm: str
    protocol: str


class LayerRow(_Row):
    """One layer of a GPU's model: its parameters, FLOP per micro-batch, buckets and traced times."""

    stage: int = Field(description="Pipeline stage (virtual stage with interleaving).")
    layer: str
    num_params: int = Field(description="Parameters whose gradients this layer completes.")
    param_bytes: int
    fwd_flop: float
    input_grad_flop: float
    weight_grad_flop: float
    buckets: str = Field(description="DDP buckets its gradients go to, ';'-separated (empty: none, or ZeRO-3).")
    fwd_start_s: float | None = Field(description="Forward start in the traced micro-batch (pp = 1), s.")
    fwd_s: float | None
    bwd_start_s: float | None = Field(description="Backward start in the traced micro-batch (pp = 1), s.")
    bwd_s: float | None


def bucket_timing_rows(result: StepResult, export: BucketExport) -> list[BucketTimingRow]:
    """``result.buckets`` with names from the DDP buckets they are (ZeRO-3 units carry none)."""
    named = len(export.buckets) == len(result.buckets) and all(
        e.size_bytes == t.size_bytes for e, t in zip(export.buckets, result.buckets, strict=True))
    rows = []
    for k, t in enumerate(result.buckets):
        entry = export.buckets[k] if named else None
        rows.append(BucketTimingRow(
            bucket=t.index, size_bytes=t.size_bytes, dtype=entry.dtype if entry else None, num_params=t.num_params,
            first_param=entry.params[0].name if entry else None, last_param=entry.params[-1].name if entry else None,
            ready_s=t.ready_s, start_s=t.start_s, end_s=t.end_s, wait_s=t.start_s - t.ready_s,
            algorithm=t.algorithm, protocol=t.protocol))
    return rows


def layer_rows(scenario: Scenario, result: StepResult) -> list[LayerRow]:
    """Every layer of every pipeline stage; forward and backward times where the trace has the layer."""
    from simddp.sim.plan import rank_gradients
    from simddp.workload import build_workload
    from simddp.zero import zero_rule

    workload = build_workload(scenario)
    # Sharded parameters reduce per unit, and DataParallel has no DDP bucket: no bucket column then.
    sharded = zero_rule(scenario).sharded_params or scenario.ddp.wrapper == "dataparallel"
    spans: dict[str, tuple[float, float]] = {}
    for s in result.trace.spans if result.trace is not None else []:
        if s.stream == "compute":  # pp = 1: one span per layer and phase of the traced micro-batch
            spans[s.name] = (s.start_s, s.end_s)
    rows = []
    for rank in range(scenario.parallelism.pp):
        grads = rank_gradients(scenario, workload, rank)
        local = {g: k for k, g in enumerate(grads.global_ids)}
        bucket_of = {p: b.index for b in grads.buckets for p in b.param_indices}
        for layer in workload.rank_layers(rank, scenario.parallelism.pp):
            params = [workload.parameters[g] for g in layer.param_indices]
            buckets = sorted({bucket_of[local[g]] for g in layer.param_indices if local.get(g) in bucket_of}
                             if not sharded else [])  # sharded parameters reduce per unit
            fwd, bwd = spans.get(f"fwd {layer.name}"), spans.get(f"bwd {layer.name}")
            rows.append(LayerRow(
                stage=layer.stage, layer=layer.name, num_params=sum(p.numel for p in params),
                param_bytes=sum(p.numel * dtype_bytes(p.dtype) for p in params), fwd_flop=layer.fwd_flop,
                input_grad_flop=layer.dgrad_flop, weight_grad_flop=layer.wgrad_flop,
                buckets=";".join(map(str, buckets)),
                fwd_start_s=fwd[0] if fwd else None, fwd_s=fwd[1] - fwd[0] if fwd else None,
                bwd_start_s=bwd[0] if bwd else None, bwd_s=bwd[1] - bwd[0] if bwd else None))
    return rows


def summary_rows(result: StepResult, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """``metric,value`` rows: the verdict first, then every scalar of the step result, then each part of the step
    (``breakdown.<key>``, seconds, adding up to ``step_time_s`` as the JSON's breakdown does; until 2026-11-29 the
    parts without a scalar field of their own, gradient clipping and DDP's host time, were missing)."""
    scalars = {k: v for k, v in {**extra, **result.to_json_dict()}.items() if not isinstance(v, list | dict)}
    parts = {f"breakdown.{p.key}": p.time_s for p in result.breakdown}
    return [{"metric": k, "value": v} for k, v in {**scalars, **parts}.items()]


#: The files ``simddp simulate --csv DIR`` writes into DIR.
STEP_CSV_NAMES = ("summary.csv", "buckets.csv", "layers.csv")


def write_step_csv(directory: str | Path, scenario: Scenario, result: StepResult,
                   extra: dict[str, Any], inputs: Sequence[str | Path] = ()) -> list[Path]:
    """Write :data:`STEP_CSV_NAMES` into ``directory`` (created if missing; an existing one is written into),
    each file as :func:`simddp.safeio.write_text` writes it: never over one of ``inputs``."""
    paths = safeio.check_output_dir(directory, STEP_CSV_NAMES, inputs, "--csv")
    # The reported GPU's buckets (until 2026-11-29 stage 0's: a pipeline reported on stage 1 had its buckets named
    # with stage 0's parameters and dtypes, or left unnamed where the sizes differed).
    export = bucket_export(scenario, result.reported_stage)
    tables = (
        dicts_to_csv(summary_rows(result, extra), ["metric", "value"]),
        rows_to_csv(bucket_timing_rows(result, export), BucketTimingRow),
        rows_to_csv(layer_rows(scenario, result), LayerRow),
    )
    return [safeio.write_text(path, text, inputs, "--csv") for path, text in zip(paths, tables, strict=True)]


# ----------------------------------------------------------------------------- CSV helpers
def frame_to_csv(frame: Any) -> str:
    """A pandas DataFrame (the dashboard's downloads) as :func:`dicts_to_csv` writes it: missing values empty,
    formula-like texts quoted."""
    plain = frame.astype(object).where(frame.notna(), None)
    return dicts_to_csv(plain.to_dict("records"), [str(c) for c in frame.columns])


def rows_to_csv(rows: Sequence[BaseModel], model: type[BaseModel]) -> str:
    """CSV with a header of ``model``'s fields; None is an empty cell."""
    return dicts_to_csv([r.model_dump() for r in rows], list(model.model_fields))


def rows_to_dataframe(rows: Sequence[BaseModel], model: type[BaseModel]) -> Any:
    import pandas as pd

    return pd.DataFrame([r.model_dump() for r in rows], columns=list(model.model_fields))


#: First characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell: None empty; a text that a spreadsheet would run as a formula (a user's parameter or scenario
    name starting with ``=``) behind a ``'``, as OWASP advises, so it opens as the text it is."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def dicts_to_csv(rows: Sequence[dict[str, Any]], columns: list[str]) -> str:
    """CSV with a header of ``columns``, one row per dict (:func:`_cell` per value)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


__all__ = ["STEP_CSV_NAMES", "BucketEntry", "BucketExport", "BucketParamRow", "BucketTimingRow", "LayerRow",
           "ParamEntry", "bucket_export", "bucket_timing_rows", "dicts_to_csv", "frame_to_csv", "layer_rows",
           "rows_to_csv", "rows_to_dataframe", "summary_rows", "write_step_csv"]
