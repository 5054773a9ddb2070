"""Calibration files: what the torch collectors measure, and the fitted profile a scenario can name.

Three measurement files come from the collectors of the top-level ``calibration`` package (which import
torch; this module does not):

* :class:`CommMeasurements` (``comm.json``, ``python -m simddp_calibration.collectives``): collective times per
  op, message size and communicator (world, intra-node, inter-node), and the compute/communication
  interference micro-benchmark.
* :class:`ComputeMeasurements` (``compute.json``, ``python -m simddp_calibration.compute``): the model's
  parameters, gradient-ready order, per-layer forward and backward times, optimizer and host times.
* :class:`DDPMeasurements` (``ddp.json``, ``python -m simddp_calibration.ddp_step``): real DDP step times per
  bucket cap, used only to validate predictions (never to fit them).

:func:`simddp.fit.fit_profile` turns comm + compute into a :class:`CalibrationProfile` (``profile.json``).
A scenario that says ``calibration: profile.json`` takes its cluster, model and training keys from
:func:`scenario_defaults_from_profile`; the user's own keys override them.

Every file carries ``kind`` and ``version``; a file of another kind, an unknown version or a malformed
body raises :class:`~simddp.config.ScenarioError` with a one-line message naming the problem.

Timings are summarised by the median of repeats (robust to the outliers of shared machines), with the
10th/90th percentiles, min/max and a count of far-out values (Tukey: beyond 3 x IQR from the quartiles).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from simddp import safeio
from simddp.config import (
    MAX_BUCKET_CAP_MB,
    MAX_GPUS,
    Cluster,
    CollectiveFit,
    DDPConfig,
    LayerSpec,
    ModelConfig,
    ParameterSpec,
    ScenarioError,
    Training,
    format_validation_error,
    known_dtype,
)
from simddp.config import _Frozen as _Frozen  # input models: finite floats, no booleans as numbers
from simddp.limits import MAX_COMM_SIZES

#: Version of the measurement files (comm.json, compute.json, ddp.json) this simddp reads and writes.
MEASUREMENT_VERSION = 1
#: Version of :class:`CalibrationProfile` this simddp reads and writes.
PROFILE_VERSION = 1

CollectiveOp = Literal["all-reduce", "reduce-scatter", "all-gather", "broadcast"]
GroupName = Literal["world", "intra-node", "inter-node"]


# ------------------------------------------------------------------------------------ statistics
class TimingStats(_Frozen):
    """Repeated timings of one measurement, summarised robustly (a difference of times may be negative)."""

    times_s: list[float] = Field(description="Every repeat after warm-up (slowest rank's time), seconds.")
    median_s: float = Field(description="Median of the repeats, seconds: the value fits and predictions use.")
    p10_s: float = Field(description="10th percentile, seconds.")
    p90_s: float = Field(description="90th percentile, seconds.")
    min_s: float = Field(description="Fastest repeat, seconds.")
    max_s: float = Field(description="Slowest repeat, seconds.")
    num_outliers: int = Field(ge=0, description="Repeats beyond 3 x IQR from the quartiles (kept, but not used).")

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the central 80% of repeats."""
        return (self.p90_s - self.p10_s) / abs(self.median_s) if self.median_s else 0.0

    @property
    def rel_sigma(self) -> float:
        """A robust relative standard deviation: p10..p90 spans 2 x 1.2816 sigma of a normal distribution."""
        return self.spread / (2 * 1.2816)


def timing_stats(samples: Sequence[float]) -> TimingStats:
    """Summarise repeats: median, 10th/90th percentiles, extremes and the number of far-out values."""
    if len(samples) == 0:
        raise ValueError("timing_stats needs at least one sample")
    x = np.asarray(samples, dtype=float)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    iqr = q3 - q1
    outliers = int(np.sum((x < q1 - 3 * iqr) | (x > q3 + 3 * iqr))) if iqr > 0 else 0
    p10, p90 = np.percentile(x, [10, 90])
    return TimingStats(
        times_s=[float(v) for v in x],
        median_s=float(med),
        p10_s=float(p10),
        p90_s=float(p90),
        min_s=float(x.min()),
        max_s=float(x.max()),
        num_outliers=outliers,
    )


#: Relative slack of the order min <= p10 <= median <= p90 <= max: percentiles interpolate in floating point.
_ORDER_SLACK = 1e-9


def timing_problem(st: TimingStats, path: str, kind: Literal["time", "positive", "difference"] = "time") -> str | None:
    """What is wrong with a timing summary at field ``path``, or None (one rule for every collector file).

    Every value is finite and at most :data:`~simddp.limits.MAX_TIMING_S` in size, ``times_s`` is not empty,
    and min <= p10 <= median <= p90 <= max. ``time``: no value is negative; ``positive`` (what a fit or a
    relative error divides by): also a median of at least :data:`~simddp.limits.MIN_TIMING_S`;
    ``difference`` (of two measured times, so noise may make it negative): only the bounds and the order.
    """
    from simddp.limits import MAX_TIMING_S, MIN_TIMING_S

    if not st.times_s:
        return f"{path}.times_s: is empty; a timing needs at least one repeat"
    named = [("min_s", st.min_s), ("p10_s", st.p10_s), ("median_s", st.median_s), ("p90_s", st.p90_s),
             ("max_s", st.max_s)]
    for k, v in enumerate(st.times_s):
        named.append((f"times_s.{k}", v))
    for name, v in named:
        if kind != "difference" and v < 0:
            return f"{path}.{name}: {v} s is negative; a measured time is >= 0"
        if not abs(v) <= MAX_TIMING_S:  # also NaN
            return f"{path}.{name}: {v} s is over the limit of {MAX_TIMING_S:g} s (simddp.limits.MAX_TIMING_S)"
    for (lo_name, lo), (hi_name, hi) in itertools.pairwise(named[:5]):
        if lo > hi + _ORDER_SLACK * max(abs(lo), abs(hi)):
            return f"{path}: {lo_name}({lo}) > {hi_name}({hi}); expected min <= p10 <= median <= p90 <= max"
    if kind == "positive" and st.median_s < MIN_TIMING_S:
        return (f"{path}.median_s: {st.median_s} s is below {MIN_TIMING_S:g} s (simddp.limits.MIN_TIMING_S); "
                "a measured median must be a real duration")
    return None


# ------------------------------------------------------------------------------- measurement files
class RunInfo(_Frozen):
    """Where and how a collector ran."""

    world_size: int = Field(gt=0, le=MAX_GPUS, description="Ranks in the run.")
    num_nodes: int = Field(gt=0, le=MAX_GPUS, description="Distinct hosts.")
    ranks_per_node: int = Field(gt=0, le=MAX_GPUS,
                                description="Ranks on each host (the collectors need it uniform).")
    backend: str = Field(description="torch.distributed backend: gloo or nccl ('none' for one process).")
    device: Literal["cpu", "cuda"] = Field(description="Where tensors lived.")
    hosts: list[str] = Field(default_factory=list, description="Host name of each rank, by rank.")
    device_names: list[str] = Field(default_factory=list, description="Device (GPU or CPU model) of each rank.")
    torch_version: str = Field(description="torch.__version__.")
    nccl_version: str | None = Field(default=None, description="NCCL version torch was built with (CUDA only).")
    num_threads: int = Field(gt=0, description="torch intra-op threads per rank (torch.get_num_threads()).")
    pinned_cores: list[list[int]] = Field(
        default_factory=list, description="CPU cores each rank was pinned to, by rank ([] = not pinned)."
    )
    started_at: str = Field(description="UTC start time, ISO 8601.")
    argv: list[str] = Field(default_factory=list, description="Command line of the collector.")
    load_average_1m: list[float] = Field(
        default_factory=list,
        description="Rank 0 host's 1-minute load average at the start and at the end of the run (other work on "
        "the machine makes timings noisy).",
    )

    @model_validator(mode="after")
    def _uniform_hosts(self) -> RunInfo:
        """torchrun's ranks: as many on each host. A file that said otherwise was refused later as a scenario key
        the user never wrote (``cluster.num_nodes: ... greater than 0``, a probe)."""
        if self.num_nodes * self.ranks_per_node != self.world_size:
            raise ValueError(f"world_size({self.world_size}) is not num_nodes({self.num_nodes}) x "
                             f"ranks_per_node({self.ranks_per_node})")
        return self


class CommCase(_Frozen):
    """One collective at one message size on one communicator."""

    op: CollectiveOp = Field(description="Collective.")
    group: GroupName = Field(description="world, intra-node (ranks of one host) or inter-node (one per host).")
    tier: Literal["intra", "inter"] = Field(description="Link tier crossed: inter when the group spans hosts.")
    num_ranks: int = Field(gt=1, description="Ranks in the communicator.")
    num_nodes: int = Field(gt=0, description="Hosts the communicator spans.")
    size_bytes: int = Field(gt=0, description="nccl-tests size: the full buffer (all-gather: the output).")
    iters: int = Field(default=1, gt=0, description="Back-to-back ops timed together in each repeat.")
    stats: TimingStats = Field(description="Slowest rank's time per op, one value per repeat.")


class InterferenceCase(_Frozen):
    """Compute and an all-reduce run alone, then side by side (both start together on every rank).

    ``lost_fraction`` = (both - compute alone) / comm alone: the share of the collective's duration that
    compute loses. With the simulator's model (a backward layer that starts while a collective is in
    flight runs ``1 + i`` times slower) compute loses ``i / (1 + i)`` of it, so ``i = f / (1 - f)``.
    """

    size_bytes: int = Field(gt=0, description="All-reduce message size, bytes.")
    compute_alone_s: float = Field(gt=0, description="Median time of the compute kernel alone, s.")
    comm_alone_s: float = Field(gt=0, description="Median time of the all-reduce alone, s.")
    both_s: float = Field(gt=0, description="Median time until both finish when started together, s.")
    comm_in_both_s: float = Field(ge=0, description="Median time until the all-reduce finished, side by side, s.")
    repeats: int = Field(gt=0, description="Repeats of each of the three measurements.")
    lost_fractions: list[float] = Field(
        default_factory=list,
        description="(both - compute alone) / comm alone of each repeat, the three measured back to back.",
    )

    @property
    def lost_fraction(self) -> float:
        """Median over repeats of the paired lost share (robust to a machine that drifts between repeats)."""
        if self.lost_fractions:
            return float(np.median(self.lost_fractions))
        return (self.both_s - self.compute_alone_s) / self.comm_alone_s


class _MeasurementFile(_Frozen):
    """Fields every collector file carries: what it is, and where and how complete the run was."""

    kind: str = Field(description="File kind.")
    version: int = Field(description="Measurement file version.")
    complete: bool = Field(description="False when the collector stopped early (partial results kept).")
    error: str | None = Field(default=None, description="Why the collector stopped early.")
    run: RunInfo = Field(description="Where and how the collector ran.")


class CommMeasurements(_MeasurementFile):
    """``comm.json``: collective timings from ``python -m simddp_calibration.collectives``."""

    kind: Literal["simddp-comm"] = Field(description="File kind.")
    cases: list[CommCase] = Field(default_factory=list, description="One entry per op, group and size.")
    interference: list[InterferenceCase] = Field(default_factory=list, description="Interference benchmark.")


class MeasuredParameter(_Frozen):
    """A parameter as ``named_parameters()`` yields it, with the module that owns it."""

    name: str = Field(description="Parameter name.")
    numel: int = Field(gt=0, description="Elements.")
    dtype: str = Field(description="torch dtype name.")
    module: str = Field(description="Name of the module that owns it directly ('' = the root).")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        """Checked when the file is read: an unknown one reached ``calibrate fit``'s scenario model and came out as
        pydantic's raw multi-line error, without the file (a probe). Kept as written."""
        known_dtype(value)
        return value


class MeasuredLayer(_Frozen):
    """A group of parameters whose gradients become ready together, in forward order.

    ``bwd`` is the time from the previous group's gradients being ready (or backward starting) to this
    group's; ``fwd`` is the owning module's own forward time (its children that own parameters excluded).
    A layer without parameters holds what no module accounts for (functional ops, the loss, the input's
    gradient at the end of backward).
    """

    name: str = Field(description="Owning module, or a label for parameter-free time.")
    param_indices: list[int] = Field(description="Indices into the parameter list.")
    fwd: TimingStats = Field(description="Forward time, s.")
    bwd: TimingStats = Field(description="Backward time until this layer's gradients are ready, s.")


class PeakRates(_Frozen):
    """Measured device rates: they stand in for a spec sheet where simddp needs one (MFU, fallbacks)."""

    matmul_flop_per_s: float = Field(gt=0, description="fp32 matmul rate of one rank, FLOP/s.")
    copy_bytes_per_s: float = Field(gt=0, description="Large tensor copy rate (read + write), bytes/s.")
    memory_bytes: int = Field(gt=0, description="Device memory (CPU: RAM / ranks per node), bytes.")


class ComputeMeasurements(_MeasurementFile):
    """``compute.json``: per-layer times of one model from ``python -m simddp_calibration.compute``."""

    kind: Literal["simddp-compute"] = Field(description="File kind.")
    model: str = Field(description="FILE.py:factory the model came from.")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(description="Optimizer stepped.")
    micro_batch_size: int = Field(gt=0, description="Samples per forward (first dim of the first input).")
    input_shapes: list[list[int]] = Field(default_factory=list, description="Shapes of the example inputs.")
    parameters: list[MeasuredParameter] = Field(description="Trainable parameters, definition order.")
    grad_ready_order: list[int] = Field(description="Parameter indices in gradient-ready order.")
    layers: list[MeasuredLayer] = Field(description="Gradient-ready groups, forward order.")
    forward: TimingStats = Field(description="Whole forward incl. loss, s.")
    backward: TimingStats = Field(description="Whole backward, s.")
    optimizer_step: TimingStats = Field(description="optimizer.step(), s.")
    host: TimingStats = Field(description="Rest of the step: zero_grad and Python between the phases, s.")
    step: TimingStats = Field(description="Whole step without DDP, s.")
    ddp_overhead: TimingStats | None = Field(
        default=None,
        description="DDP step on a one-rank group minus the plain step, s: the Reducer's bucket copies and "
        "hooks with no communication.",
    )
    peak: PeakRates | None = Field(default=None, description="Measured device rates.")
    rank_step_times_s: list[list[float]] = Field(
        default_factory=list,
        description="Each rank's own whole-step time per clean iteration, by rank (the jitter fit's data).",
    )
    num_autograd_nodes: int | None = Field(
        default=None, gt=0, description="Nodes of one forward's autograd graph (what DDP's unused search visits)."
    )
    graph_search: TimingStats | None = Field(
        default=None,
        description="A DDP forward with find_unused_parameters minus one without (one-rank group, paired, each "
        "rank's own, averaged over ranks): DDP's search of the autograd graph, s.",
    )


class DDPCase(_Frozen):
    """Real DDP step times at one bucket cap."""

    bucket_cap_mb: float | None = Field(gt=0, le=MAX_BUCKET_CAP_MB,
                                        description="bucket_cap_mb passed to DDP (null = torch's default).")
    num_buckets: int = Field(ge=0, description="Buckets DDP built (after its rebuild), 0 if unknown.")
    bucket_sizes_bytes: list[int] = Field(default_factory=list, description="Bucket sizes in reduction order.")
    stats: TimingStats = Field(description="Slowest rank's step time per measured step.")


class DDPKnobCase(_Frozen):
    """Real DDP steps with one setting of torch's unused-parameter options (``--knobs``)."""

    find_unused_parameters: bool = Field(description="DDP's find_unused_parameters.")
    static_graph: bool = Field(description="DDP's static_graph.")
    bucket_cap_mb: float | None = Field(gt=0, le=MAX_BUCKET_CAP_MB,
                                        description="bucket_cap_mb of these steps (null = torch's default).")
    stats: TimingStats = Field(description="Slowest rank's step time per measured step, in the order measured "
                               "(steps of every setting are interleaved round by round, so index k of two settings "
                               "were measured close together).")


class DDPMeasurements(_MeasurementFile):
    """``ddp.json``: real DDP steps from ``torchrun -m simddp_calibration.ddp_step`` (validation only)."""

    kind: Literal["simddp-ddp"] = Field(description="File kind.")
    model: str = Field(description="FILE.py:factory the model came from.")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(description="Optimizer stepped.")
    micro_batch_size: int = Field(gt=0, description="Samples per forward per rank.")
    cases: list[DDPCase] = Field(description="One entry per bucket cap.")
    knob_cases: list[DDPKnobCase] = Field(default_factory=list, description="Steps per unused-parameter setting.")
    num_autograd_nodes: int | None = Field(default=None, gt=0, description="Nodes of one forward's autograd graph.")


# --------------------------------------------------------------------------------------- profile
class FitReport(_Frozen):
    """A collective fit segment with its quality: what :class:`~simddp.config.CollectiveFit` keeps, and more."""

    fit: CollectiveFit = Field(description="The segment as the simulator uses it.")
    group: GroupName = Field(description="Communicator the points came from.")
    num_points: int = Field(gt=0, le=MAX_COMM_SIZES, description="Message sizes in the segment.")
    r2: float = Field(description="Coefficient of determination of the times in the segment.")
    latency_stderr_s: float = Field(ge=0, description="Standard error of the per-step latency, s.")
    inv_bandwidth_stderr_s_per_byte: float = Field(ge=0, description="Standard error of 1/busbw, s/byte.")
    points: list[tuple[int, float, float]] = Field(
        default_factory=list, description="(size_bytes, measured median s, fitted s) of each point."
    )

    @property
    def simulated(self) -> bool:
        """Whether the simulator reads this segment: one set per (op, tier), the world group's for its tier and the
        intra-node group's for intra (the inter-node group, one rank per host, is kept for inspection)."""
        return self.group == "world" or (self.group == "intra-node" and self.fit.tier == "intra")


class InterferenceFit(_Frozen):
    """The compute slowdown factor ``i`` fitted from the interference benchmark."""

    value: float = Field(ge=0, description="cluster.comm_compute_interference.")
    lost_fraction: float = Field(description="Median share of a collective's time that compute loses.")
    lost_fraction_p10: float = Field(description="10th percentile over message sizes.")
    lost_fraction_p90: float = Field(description="90th percentile over message sizes.")
    overlap: bool = Field(
        default=True,
        description="False when compute loses most of every collective's time (lost share >= "
        "simddp.fit.NO_OVERLAP_LOST_FRACTION): compute and communication take turns, and the profile sets "
        "ddp.overlap false, the simulator's exact form of that limit.",
    )
    note: str = Field(default="", description="How it was derived, and any clipping.")


class JitterFit(_Frozen):
    """The lognormal jitter of one rank's step, fitted from each rank's own step times."""

    cv: float = Field(ge=0, description="variability.jitter_cv: coefficient of variation of a rank's step.")
    sigma_log: float = Field(ge=0, description="Robust standard deviation of log(step / the rank's median).")
    num_samples: int = Field(ge=0, description="Step times pooled over ranks.")
    note: str = Field(default="", description="How it was derived.")


class CalibrationProfile(_Frozen):
    """``profile.json``: everything a scenario needs from a calibration, and how good the fits are.

    The cluster's ``intra_node``/``inter_node`` link dicts are placeholders filled with the fitted
    all-reduce numbers: the ``collective_fits`` replace the link model for every op they cover
    (:func:`simddp.collectives.fitted_s`), so on a CPU/gloo calibration the link ``kind`` means nothing.
    """

    kind: Literal["simddp-profile"] = Field(description="File kind.")
    version: int = Field(description="Profile version (see PROFILE_VERSION).")
    created_at: str = Field(description="UTC time of the fit, ISO 8601.")
    sources: dict[str, str] = Field(default_factory=dict, description="Measurement files fitted.")
    comm_run: RunInfo = Field(description="Run of the collective collector.")
    compute_run: RunInfo = Field(description="Run of the compute collector.")
    model_name: str = Field(description="FILE.py:factory of the model.")
    fits: list[FitReport] = Field(description="Collective fits with their quality.")
    interference: InterferenceFit = Field(description="Compute slowdown while a collective runs.")
    compute_rel_sigma: float = Field(ge=0, le=10, description="Robust relative std of the measured step (noise; at "
                                     "most 10: ten times the median is no measurement of a step)")
    cluster: dict[str, Any] = Field(description="Scenario `cluster` keys.")
    model: dict[str, Any] = Field(description="Scenario `model` keys: parameters, grad_ready_order, layers.")
    training: dict[str, Any] = Field(description="Scenario `training` keys.")
    ddp: dict[str, Any] = Field(default_factory=dict, description="Scenario `ddp` keys (overlap, if measured off).")
    jitter: JitterFit | None = Field(default=None, description="Step-time jitter of one rank (simddp tails).")
    notes: list[str] = Field(default_factory=list, description="What is measured and what is assumed.")

    @model_validator(mode="before")
    @classmethod
    def _typed_sections(cls, data: Any) -> Any:
        """Validate the scenario sections with the scenario models and store them complete (defaults
        filled), so a hand-edited profile fails here, naming the field, rather than later."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, model in (("cluster", Cluster), ("model", ModelConfig), ("training", Training)):
            if isinstance(out.get(key), dict):
                out[key] = model.model_validate(out[key]).model_dump(mode="json", exclude_none=True)
        if isinstance(out.get("ddp"), dict):  # checked, kept as given (only the keys measured, under the user's):
            try:  # a cap of -5 failed later, as a scenario key the user never wrote
                DDPConfig.model_validate(out["ddp"])
            except ValidationError as err:
                raise ValueError("ddp." + format_validation_error(err)) from None
        return out

    def scenario_defaults(self) -> dict[str, Any]:
        """Scenario keys; the user's own keys are merged over them."""
        return {
            "name": f"calibrated {self.model_name}",
            "cluster": json.loads(json.dumps(self.cluster)),
            "model": json.loads(json.dumps(self.model)),
            "training": dict(self.training),
            **({"ddp": dict(self.ddp)} if self.ddp else {}),
            **({"variability": {"jitter_cv": self.jitter.cv}} if self.jitter is not None else {}),
        }


# --------------------------------------------------------------------------------------- reading
_M = TypeVar("_M", bound=BaseModel)

_KIND_OF: dict[str, tuple[type[BaseModel], int]] = {
    "simddp-comm": (CommMeasurements, MEASUREMENT_VERSION),
    "simddp-compute": (ComputeMeasurements, MEASUREMENT_VERSION),
    "simddp-ddp": (DDPMeasurements, MEASUREMENT_VERSION),
    "simddp-profile": (CalibrationProfile, PROFILE_VERSION),
}


def _read_json_object(path: str | Path, what: str) -> tuple[Path, dict[str, Any]]:
    p = Path(path)
    if not isinstance(path, str | Path):
        raise ScenarioError(f"expected the path of {what}, got {type(path).__name__}")
    data = safeio.parse_json(safeio.decode(safeio.read_bytes(p, what), str(p), "UTF-8 JSON"), str(p))
    if not isinstance(data, dict):
        raise ScenarioError(f"{p}: expected a JSON object at the top level, got {type(data).__name__}")
    return p, data


def read_calibration_file(path: str | Path, expected: type[_M]) -> _M:
    """Read and validate one calibration file; every problem is a one-line :class:`ScenarioError`.

    The file obeys the caps of :mod:`simddp.safeio`; a field error names the file, the field and, for
    a measurement, what was measured (``cases.3 (all-reduce on world, 4096 B)``).
    """
    want = next(kind for kind, (cls, _) in _KIND_OF.items() if cls is expected)
    p, data = _read_json_object(path, f"a {want} JSON file")
    return calibration_from_dict(data, expected, str(p))


def calibration_from_dict(data: dict[str, Any], expected: type[_M], source: str) -> _M:
    """Validate the parsed body of a calibration file named ``source`` (a path, or an upload's name)."""
    want = next(kind for kind, (cls, _) in _KIND_OF.items() if cls is expected)
    p = source
    kind = data.get("kind")
    if kind != want:
        hint = " (is this an older simddp file, written before files carried a kind?)" if kind is None else ""
        raise ScenarioError(f"{p}: expected kind {want!r}, got {safeio.short_repr(kind)}{hint}")
    version = data.get("version")
    supported = _KIND_OF[want][1]
    if version != supported:
        raise ScenarioError(
            f"{p}: {want} version {safeio.short_repr(version)} is not supported (this simddp reads version "
            f"{supported}); "
            "re-run the collectors or `simddp calibrate fit` with this simddp"
        )
    try:
        parsed = expected.model_validate(data)
    except ValidationError as err:
        message = format_validation_error(err)
        raise ScenarioError(f"{p}: malformed {want}: {_name_measurements(message, data)}") from None
    problem = measurement_problem(parsed)
    if problem:
        raise ScenarioError(f"{p}: {_name_measurements(problem, data)}")
    return parsed


def _timing_fields(m: BaseModel) -> Iterable[tuple[str, TimingStats, Literal["time", "positive", "difference"]]]:
    """(field path, summary, kind of check) of every timing summary of a measurement file."""
    if isinstance(m, CommMeasurements):
        for k, c in enumerate(m.cases):
            yield f"cases.{k}.stats", c.stats, "positive"
    elif isinstance(m, DDPMeasurements):
        for k, d in enumerate(m.cases):
            yield f"cases.{k}.stats", d.stats, "positive"
        for k, knob in enumerate(m.knob_cases):
            yield f"knob_cases.{k}.stats", knob.stats, "time"
    elif isinstance(m, ComputeMeasurements):
        for k, la in enumerate(m.layers):
            yield f"layers.{k}.fwd", la.fwd, "time"
            yield f"layers.{k}.bwd", la.bwd, "time"
        for name in ("forward", "backward", "optimizer_step", "step"):
            yield name, getattr(m, name), "time"
        # The rest of the step and the DDP costs are differences of measured times: timer noise may make
        # them slightly negative (the fit counts a negative one as 0).
        yield "host", m.host, "difference"
        if m.ddp_overhead is not None:
            yield "ddp_overhead", m.ddp_overhead, "difference"
        if m.graph_search is not None:
            yield "graph_search", m.graph_search, "difference"


def measurement_problem(m: BaseModel) -> str | None:
    """What makes a parsed measurement file unusable, naming the field, or None: timing summaries (see
    :func:`timing_problem`; rank counts are bounded by the schema), message sizes beyond
    :data:`~simddp.limits.MAX_MESSAGE_BYTES`, a difference of times more negative than the whole step."""
    from simddp.limits import MAX_MESSAGE_BYTES, MAX_TIMING_S

    if not isinstance(m, _MeasurementFile):
        return None
    if isinstance(m, CommMeasurements):
        for k, c in enumerate(m.cases):
            if c.size_bytes > MAX_MESSAGE_BYTES:
                return (f"cases.{k}.size_bytes({c.size_bytes:,}) is over the limit of {MAX_MESSAGE_BYTES:,} "
                        "(simddp.limits.MAX_MESSAGE_BYTES)")
        for k, ic in enumerate(m.interference):
            for name in ("compute_alone_s", "comm_alone_s", "both_s", "comm_in_both_s"):
                if getattr(ic, name) > MAX_TIMING_S:
                    return (f"interference.{k}.{name}: {getattr(ic, name)} s is over {MAX_TIMING_S:g} s "
                            "(simddp.limits.MAX_TIMING_S)")
    for path, st, kind in _timing_fields(m):
        problem = timing_problem(st, path, kind)
        if problem:
            return problem
    if isinstance(m, ComputeMeasurements):
        for name in ("host", "ddp_overhead", "graph_search"):
            st = getattr(m, name)
            if st is not None and st.median_s < -m.step.median_s:
                return (f"{name}.median_s: {st.median_s} s is more negative than the whole step "
                        f"({m.step.median_s} s); not a difference of this run's times")
    return None


def _name_measurements(message: str, data: dict[str, Any]) -> str:
    """``cases.3.stats.median_s: ...`` -> ``cases.3 (all-reduce on world, 4096 B).stats.median_s: ...``."""
    import re

    def label(match: re.Match[str]) -> str:
        section, index = match.group(1), int(match.group(2))
        items = data.get(section)
        item = items[index] if isinstance(items, list) and 0 <= index < len(items) else None
        if not isinstance(item, dict):
            return match.group(0)
        if section == "cases" and "op" in item:
            what = f"{item.get('op')} on {item.get('group')}, {item.get('size_bytes')} B"
        elif section == "cases":
            cap = item.get("bucket_cap_mb")
            what = f"bucket_cap_mb {'default' if cap is None else cap}"
        elif section == "interference":
            what = f"interference at {item.get('size_bytes')} B"
        else:
            what = str(item.get("name", ""))
        return f"{section}.{index} ({safeio.short_repr(what, 60).strip(chr(39))})"

    return re.sub(r"\b(cases|interference|layers|parameters)\.(\d+)\b", label, message)


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read ``profile.json`` (see :class:`CalibrationProfile`)."""
    return read_calibration_file(path, CalibrationProfile)


def scenario_defaults_from_profile(path: str | Path) -> dict[str, Any]:
    """Scenario keys (cluster, model, training, name) from a calibration profile.

    Called by :func:`simddp.scenario_io.scenario_from_dict` for a scenario that names ``calibration``.
    """
    return load_profile(path).scenario_defaults()


def write_json(model: BaseModel, path: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Write a calibration file safely and atomically (:func:`simddp.safeio.write_text`: never one of
    ``inputs``, never a device or FIFO, and a reader never sees half a file)."""
    safeio.write_text(path, model.model_dump_json(indent=1), inputs)


# ----------------------------------------------------------------------------------------- merging
_Measurements = TypeVar("_Measurements", CommMeasurements, ComputeMeasurements, DDPMeasurements)


def _pool(stats: Sequence[TimingStats]) -> TimingStats:
    return timing_stats([t for s in stats for t in s.times_s])


def model_key(spec: str) -> str:
    """A collector's ``--model`` spec (``PATH.py:factory``) as ``validate``'s warning compares it: the file's name and
    the factory, wherever the file was run from (``models/x.py:tiny`` and ``/abs/models/x.py:tiny`` were warned
    about as "different models"). Merging compares the spec exactly: two folders' ``model.py`` may differ, and only
    the warning has the gradient bytes beside it."""
    path, colon, factory = spec.rpartition(":")
    return f"{Path(path).name}:{factory}" if colon and path.endswith(".py") else spec


def merge_measurements(items: Sequence[_Measurements]) -> _Measurements:
    """Pool the repeats of several runs of one collector (same kind, same model) into one file.

    Runs launched minutes apart see different machine states (on a shared CPU host a whole run can be
    5-30% slower than the next), so a calibration and its validation are steadier when each pools a few
    launches spread in time. Every measurement's repeats are concatenated and re-summarised; run info,
    device rates and bucket layouts come from the first run; ``complete`` is true only if all were.
    """
    if not items:
        raise ScenarioError("merge needs at least one measurement file")
    first = items[0]
    kinds = {m.kind for m in items}
    if len(kinds) > 1:
        raise ScenarioError(f"cannot merge different kinds of files: {sorted(kinds)}")
    # A file given twice (or under two names) would count its repeats twice and narrow the band.
    for (i, a), (j, b) in itertools.combinations(enumerate(items), 2):
        if a == b:
            raise ScenarioError(f"merge: files {i + 1} and {j + 1} hold identical measurements (the same file "
                                "twice?): pooling a run twice would double its repeats; give each run once")
    errors = [m.error for m in items if m.error]
    common: dict[str, Any] = {"complete": all(m.complete for m in items), "error": errors[0] if errors else None}
    if isinstance(first, CommMeasurements):
        comm_items = [m for m in items if isinstance(m, CommMeasurements)]
        if len({(m.run.world_size, m.run.num_nodes) for m in comm_items}) > 1:
            raise ScenarioError("cannot merge collective timings of different world sizes or host counts")
        groups: dict[tuple[str, str, int], list[CommCase]] = {}
        for m in comm_items:
            for c in m.cases:
                groups.setdefault((c.op, c.group, c.size_bytes), []).append(c)
        cases = [cs[0].model_copy(update={"stats": _pool([c.stats for c in cs])}) for cs in groups.values()]
        inter = [c for m in comm_items for c in m.interference]
        return first.model_copy(update={**common, "cases": cases, "interference": inter})  # type: ignore[return-value]
    if isinstance(first, ComputeMeasurements):
        comp_items = [m for m in items if isinstance(m, ComputeMeasurements)]
        shape = [(la.name, la.param_indices) for la in first.layers]
        for m in comp_items[1:]:
            if (m.model, m.parameters, m.grad_ready_order, m.micro_batch_size, m.optimizer) != (
                    first.model, first.parameters, first.grad_ready_order, first.micro_batch_size, first.optimizer):
                raise ScenarioError(f"cannot merge compute timings of different models or settings ({m.model!r})")
            if [(la.name, la.param_indices) for la in m.layers] != shape:
                raise ScenarioError("cannot merge compute timings with different layer groupings")
        layers = [
            la.model_copy(update={"fwd": _pool([m.layers[k].fwd for m in comp_items]),
                                  "bwd": _pool([m.layers[k].bwd for m in comp_items])})
            for k, la in enumerate(first.layers)
        ]
        pooled = {key: _pool([getattr(m, key) for m in comp_items])
                  for key in ("forward", "backward", "optimizer_step", "host", "step")}
        overheads = [m.ddp_overhead for m in comp_items if m.ddp_overhead is not None]
        ranks = max((len(m.rank_step_times_s) for m in comp_items), default=0)
        rank_steps = [[t for m in comp_items if r < len(m.rank_step_times_s) for t in m.rank_step_times_s[r]]
                      for r in range(ranks)]
        searches = [m.graph_search for m in comp_items if m.graph_search is not None]
        return first.model_copy(update={**common, **pooled, "layers": layers,  # type: ignore[return-value]
                                        "ddp_overhead": _pool(overheads) if overheads else None,
                                        "rank_step_times_s": rank_steps,
                                        "graph_search": _pool(searches) if searches else None})
    ddp_items = [m for m in items if isinstance(m, DDPMeasurements)]
    by_cap: dict[float | None, list[DDPCase]] = {}
    for m in ddp_items:
        if (m.model, m.run.world_size, m.optimizer) != (first.model, first.run.world_size, first.optimizer):
            raise ScenarioError(f"cannot merge DDP timings of different models, worlds or optimizers ({m.model!r})")
        for c in m.cases:
            by_cap.setdefault(c.bucket_cap_mb, []).append(c)
    ddp_cases = [max(cs, key=lambda c: c.num_buckets).model_copy(update={"stats": _pool([c.stats for c in cs])})
                 for cs in by_cap.values()]
    by_knob: dict[tuple[bool, bool, float | None], list[DDPKnobCase]] = {}
    for m in ddp_items:
        for k in m.knob_cases:
            by_knob.setdefault((k.find_unused_parameters, k.static_graph, k.bucket_cap_mb), []).append(k)
    knobs = [ks[0].model_copy(update={"stats": _pool([k.stats for k in ks])}) for ks in by_knob.values()]
    return first.model_copy(update={**common, "cases": ddp_cases, "knob_cases": knobs})  # type: ignore[return-value]


def read_measurements(path: str | Path) -> CommMeasurements | ComputeMeasurements | DDPMeasurements:
    """Read a comm, compute or ddp measurement file, whichever its ``kind`` says."""
    classes: dict[str, type[Any]] = {"simddp-comm": CommMeasurements, "simddp-compute": ComputeMeasurements,
                                     "simddp-ddp": DDPMeasurements}
    p, data = _read_json_object(path, "a measurement JSON file")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in classes:
        raise ScenarioError(f"{p}: expected a measurement file (kind simddp-comm, simddp-compute or simddp-ddp), "
                            f"got kind {safeio.short_repr(kind)}")
    return calibration_from_dict(data, classes[kind], str(p))  # type: ignore[no-any-return]


def layer_specs(layers: Sequence[MeasuredLayer]) -> list[LayerSpec]:
    """Scenario layers with the measured median forward and backward times."""
    return [
        LayerSpec(name=la.name, param_indices=list(la.param_indices), fwd_time_s=la.fwd.median_s,
                  bwd_time_s=la.bwd.median_s)
        for la in layers
    ]


def parameter_specs(params: Sequence[MeasuredParameter]) -> list[ParameterSpec]:
    return [ParameterSpec(name=p.name, numel=p.numel, dtype=p.dtype) for p in params]


__all__ = [
    "MEASUREMENT_VERSION",
    "PROFILE_VERSION",
    "CalibrationProfile",
    "CommCase",
    "CommMeasurements",
    "ComputeMeasurements",
    "DDPCase",
    "DDPKnobCase",
    "DDPMeasurements",
    "FitReport",
    "InterferenceCase",
    "InterferenceFit",
    "JitterFit",
    "MeasuredLayer",
    "MeasuredParameter",
    "PeakRates",
    "RunInfo",
    "TimingStats",
    "calibration_from_dict",
    "layer_specs",
    "load_profile",
    "measurement_problem",
    "merge_measurements",
    "parameter_specs",
    "read_calibration_file",
    "read_measurements",
    "scenario_defaults_from_profile",
    "timing_problem",
    "timing_stats",
    "write_json",
]
