"""Parameter sweeps: scaling with the number of GPUs, the DDP bucket cap, and grids over two scenario keys.

A sweep only builds variant scenarios, as dicts of scenario keys changed at dotted paths
(``ddp.bucket_cap_mb``, ``cluster.inter_node.latency_s``), validates each and simulates it with
:func:`simddp.simulate` (trace off). Every number in a sweep comes from the simulator; a variant that is not
a valid scenario becomes a point that carries its one-line error instead of numbers.

Changing the cluster size keeps the parallel layout: dp follows the GPUs (dp = GPUs / (tp x pp)). The batch
follows ``batch``: ``"weak"`` scales the global batch with the GPUs (the base's batch x GPUs / the base's GPUs),
which under the base's layout keeps the samples each data-parallel replica trains per step (the usual
data-parallel scaling); ``"strong"`` keeps the global batch, and GPU counts it does not divide into are reported
as invalid. Either way a point's batch depends only on its own GPU count: a point whose cluster is the base's
has the base's batch, whether or not the cluster size is among the keys varied, and whatever else varies beside
it (a micro-batch size changes the micro-batches per step, a tp or pp the samples per replica, not the batch).
A point that sets ``training.global_batch_size`` itself keeps it.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simddp.config import (
    Cluster,
    ModelConfig,
    Scenario,
    ScenarioError,
    Training,
    put_value,
    set_value,
    validate_scenario,
)
from simddp.errors import whole_number
from simddp.limits import worker_pool, worker_processes
from simddp.results import StepResult
from simddp.scenario_io import scenario_data, scenario_from_dict

BatchScaling = Literal["weak", "strong"]

#: Bucket caps (MiB) of the default bucket sweep: torch's 25 MiB default in the middle.
DEFAULT_BUCKET_CAPS_MB: tuple[float, ...] = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)
_CLUSTER_SIZE_PATHS = ("cluster.num_nodes", "cluster.gpus_per_node")


class _Sweep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PointMetrics(_Sweep):
    """Headline numbers of one simulated variant; all None (and ``error`` set) when it is not valid."""

    error: str | None = Field(default=None, description="Why the variant is not a valid scenario.")
    num_gpus: int | None = Field(default=None, description="GPUs of the variant.")
    dp: int | None = Field(default=None, description="Data-parallel degree.")
    global_batch_size: int | None = Field(default=None, description="Samples per optimizer step.")
    num_buckets: int | None = Field(default=None, description="DDP buckets of the most loaded GPU.")
    step_time_s: float | None = Field(default=None, description="Simulated step time, s.")
    compute_time_s: float | None = Field(default=None, description="Forward + backward, s.")
    comm_time_s: float | None = Field(default=None, description="All gradient communication, s.")
    exposed_comm_time_s: float | None = Field(default=None, description="Communication not hidden, s.")
    exposed_comm_fraction: float | None = Field(default=None, description="Exposed communication / step.")
    # The rest of the step's parts (simulate's breakdown): compute_time_s (recompute included) + these +
    # exposed_comm_time_s = step_time_s. Until 2026-11-29 a sweep carried none of them (a probe's GPT-3 pipeline
    # point left 3.0 s of its 19.2 s step unaccounted).
    recompute_time_s: float | None = Field(default=None, description="Activation recompute (in compute_time_s), s.")
    interference_time_s: float | None = Field(default=None, description="Compute slowed by NCCL kernels, s.")
    tp_comm_time_s: float | None = Field(default=None, description="Tensor-parallel communication waited for, s.")
    pipeline_bubble_time_s: float | None = Field(default=None, description="Pipeline fill and drain, s.")
    stage_imbalance_time_s: float | None = Field(default=None, description="Waits for slower pipeline stages, s.")
    pipeline_p2p_time_s: float | None = Field(default=None, description="Blocking pipeline send/recv, s.")
    ddp_host_time_s: float | None = Field(default=None, description="DDP's unused-parameter search (host), s.")
    grad_clip_time_s: float | None = Field(default=None, description="Gradient clipping, s.")
    optimizer_time_s: float | None = Field(default=None, description="Optimizer step, s.")
    host_overhead_s: float | None = Field(default=None, description="Per-step host overhead, s.")
    tokens_per_s: float | None = Field(default=None, description="Tokens per second, whole job.")
    samples_per_s: float | None = Field(default=None, description="Samples per second, whole job.")
    mfu: float | None = Field(default=None, description="Model FLOP utilisation.")
    scaling_efficiency: float | None = Field(default=None, description="Per-GPU throughput vs one GPU.")
    memory_bytes: int | None = Field(default=None, description="Memory per GPU, bytes (when modelled).")
    memory_fits: bool | None = Field(default=None, description="Whether that fits the GPU (when modelled).")

    @property
    def ok(self) -> bool:
        return self.error is None


class ScalingPoint(PointMetrics):
    """The scenario on ``num_gpus`` GPUs."""

    num_nodes: int = Field(description="Nodes of the variant.")
    gpus_per_node: int = Field(description="GPUs per node of the variant (fewer than a node: one partial node).")


class BucketCapPoint(PointMetrics):
    """The scenario with DDP's ``bucket_cap_mb`` set to ``bucket_cap_mb``."""

    bucket_cap_mb: float = Field(description="Bucket cap, MiB (as torch reads it).")


class StrategyPoint(PointMetrics):
    """The scenario with one parallel strategy, on the same GPUs; memory by category (simddp.memory)."""

    strategy: str = Field(description="Label, e.g. 'DDP', 'ZeRO-2', 'TP=8'.")
    zero_stage: int = Field(description="ZeRO stage of the variant.")
    tp: int = Field(description="Tensor-parallel degree of the variant.")
    pp: int = Field(description="Pipeline-parallel degree of the variant.")
    params_bytes: int | None = Field(default=None, description="Parameters, bytes per GPU.")
    grads_bytes: int | None = Field(default=None, description="Gradients, bytes per GPU.")
    optimizer_bytes: int | None = Field(default=None, description="Master weights + optimizer states, bytes.")
    activations_bytes: int | None = Field(default=None, description="Activations, bytes per GPU.")
    buffers_bytes: int | None = Field(default=None, description="Bucket, gather, pipeline and NCCL buffers.")
    overhead_bytes: int | None = Field(default=None, description="CUDA context and fragmentation.")
    capacity_bytes: int | None = Field(default=None, description="Device memory, bytes.")


class GridPoint(PointMetrics):
    """The scenario with two keys set."""

    x: Any = Field(description="Value at the x path.")
    y: Any = Field(description="Value at the y path.")


def _frame(points: Sequence[BaseModel]) -> Any:
    import pandas as pd  # lazily: the library does not depend on pandas

    rows = []
    for p in points:
        row = p.model_dump()
        if isinstance(p, PointMetrics):
            row["ok"] = p.ok
        rows.append(row)
    return pd.DataFrame(rows)


class ScalingSweep(_Sweep):
    """Step time, communication and efficiency of one scenario from 1 GPU to thousands."""

    scenario: str = Field(description="Name of the swept scenario.")
    batch: BatchScaling = Field(description="weak: global batch scaled with the GPUs (the samples per "
                                            "data-parallel replica kept, at the scenario's layout); strong: global "
                                            "batch kept.")
    reference_num_gpus: int = Field(description="GPUs of the scenario itself (marked on plots).")
    points: list[ScalingPoint]

    def to_dataframe(self) -> Any:
        return _frame(self.points)


class BucketCapSweep(_Sweep):
    """Step time and exposed communication against DDP's bucket cap."""

    scenario: str = Field(description="Name of the swept scenario.")
    reference_bucket_cap_mb: float | None = Field(description="The scenario's own cap (null = torch's default).")
    points: list[BucketCapPoint]

    def to_dataframe(self) -> Any:
        return _frame(self.points)


class StrategySweep(_Sweep):
    """One scenario under several parallel strategies on the same GPUs, side by side."""

    scenario: str = Field(description="Name of the swept scenario.")
    points: list[StrategyPoint]

    def to_dataframe(self) -> Any:
        return _frame(self.points)


class GridSweep(_Sweep):
    """Every combination of values at two dotted scenario paths."""

    scenario: str = Field(description="Name of the swept scenario.")
    x_path: str = Field(description="Dotted path of the first key, e.g. 'ddp.bucket_cap_mb'.")
    y_path: str = Field(description="Dotted path of the second key.")
    x_values: list[Any]
    y_values: list[Any]
    points: list[GridPoint]

    def to_dataframe(self) -> Any:
        return _frame(self.points)


# ---------------------------------------------------------------------------------------- scenarios
def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Scenario keys that validate back into ``scenario``.

    A model preset is kept by name, with the model's keys whose values differ from the preset's own beside it
    (``num_autograd_nodes`` set in the file, say): another preset set there replaces the preset's shape and keeps
    them, as ``--set model.preset=...`` does with the file. (Until 2026-11-29 such a model kept its expanded shape
    without the name, and a sweep's point setting another preset was refused: "give exactly one of preset,
    transformer or parameters".)
    """
    data = scenario.model_dump()
    data["model"] = _preset_own_keys(data["model"], ModelConfig)
    return data


def as_scenario_dict(scenario: Scenario | dict[str, Any] | str | Path) -> dict[str, Any]:
    """A deep copy of scenario keys, validated once so a bad base fails with one :class:`ScenarioError`.

    From a dict (a scenario file's, with its ``--set`` keys: what ``simddp sweep`` passes), the keys are the
    file's own: a preset or a calibration profile set on a point fills in under them, as ``simulate --set`` has
    it. From a :class:`Scenario`, they are :func:`scenario_to_dict`'s, its cluster less what its preset gave it
    (:func:`_preset_own_keys`), where a key the file set to the preset's own value cannot be told from the
    preset's, nor a calibration profile's values from the file's: pass the file's dict where that matters."""
    if isinstance(scenario, Scenario):
        data = scenario_to_dict(scenario)
        data["cluster"] = _preset_own_keys(data["cluster"], Cluster)
        return data
    if isinstance(scenario, str | Path):  # a scenario file: its own keys, as `simddp sweep` reads them
        scenario = scenario_data(scenario)
    scenario_from_dict(scenario)
    return copy.deepcopy(scenario)


def get_path(data: dict[str, Any], path: str, default: Any = None) -> Any:
    """The value at a dotted path of a scenario dict, or ``default`` when a key on the way is missing."""
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


_ATOMS = (str, int, float, bool, type(None))


def _copy_tree(data: Any) -> Any:
    """``copy.deepcopy`` of scenario keys (dicts, lists, numbers, strings), about four times faster: a sweep
    copies its base once per point. Anything else is deep-copied as usual."""
    if isinstance(data, dict):
        return {k: v if type(v) in _ATOMS else _copy_tree(v) for k, v in data.items()}
    if isinstance(data, list):
        return [v if type(v) in _ATOMS else _copy_tree(v) for v in data]
    return data if type(data) in _ATOMS else copy.deepcopy(data)


def with_values(
    base: dict[str, Any], updates: dict[str, Any], batch: BatchScaling = "weak",
    base_scenario: Scenario | None = None,
) -> dict[str, Any]:
    """``base`` with each dotted path of ``updates`` set; a new cluster size re-derives dp and the batch.

    When the cluster size changes, an explicit ``parallelism.dp`` is dropped (dp = GPUs / (tp x pp)), and
    with ``batch="weak"`` the global batch scales with the GPU count (a ScenarioError where that is not a whole
    number of samples). ``base_scenario`` is
    ``base`` validated, when the caller has it (a sweep validates its base once, not once per point; a caller
    that simulates the variant should take :func:`_variant`'s validated scenario rather than validate again).
    """
    return _variant(base, updates, batch, base_scenario)[0]


def _variant(
    base: dict[str, Any], updates: dict[str, Any], batch: BatchScaling = "weak",
    base_scenario: Scenario | None = None,
) -> tuple[dict[str, Any], Scenario | None]:
    """:func:`with_values`, and the variant validated where that was done on the way (else None).

    A weak-scaled variant's global batch needs its GPU count: the variant without its batch validated, then
    the variant validated again with it. Its cluster section gives that count alone (it validates independently
    of the others), so the variant with its batch is validated once; where that fails, the two-step route runs,
    so the dict (and any error) is always the two-step route's.
    """
    out = _copy_tree(base)
    # A section equal to the base's reuses its validated object; True == 1, so a boolean set where a number goes
    # would pass in a section equal to the base's (micro-batch "true" ran as 1, which --set refuses): a point
    # that sets a boolean is validated whole.
    reuse = base_scenario if not any(_holds_bool(v) for v in updates.values()) else None
    for path, value in updates.items():
        put_value(out, path, value)
    if not any(p in updates for p in _CLUSTER_SIZE_PATHS):
        return out, _reusing_sections(out, base, reuse)
    if get_path(out, "parallelism.dp") is not None and "parallelism.dp" not in updates:
        put_value(out, "parallelism.dp", None)  # the base's dp follows the GPUs; a dp the point sets is kept
    if batch != "weak" or _sets_batch(updates):
        # strong scaling, or a batch the point sets itself (varied beside the cluster size): kept as given
        return out, _reusing_sections(out, base, reuse)
    if base_scenario is None:
        try:
            base_scenario = scenario_from_dict(base)
        except ScenarioError:
            return out, None
    # The variant without its batch (a shallow copy down to the one key it changes).
    training = out.get("training")
    unbatched = {**out, "training": {**(training if isinstance(training, dict) else {}), "global_batch_size": None}}
    gpus = None if out.get("calibration") else _sections_gpus(unbatched)
    if gpus is not None:
        try:
            scaled = _weak_batch(base_scenario, gpus)
        except ScenarioError:
            if scenario_from_dict_or_none(unbatched) is None:  # the layout itself does not fit these GPUs: its
                return unbatched, None                        # own error says so (validated by the caller)
            raise
        batched = {**unbatched, "training": {**unbatched["training"], "global_batch_size": scaled}}
        try:
            return batched, _reusing_sections(batched, base, reuse) or scenario_from_dict(batched)
        except ScenarioError:
            pass  # the two-step route below says why, in its own words
    resized = scenario_from_dict_or_none(unbatched)
    if resized is not None:
        put_value(out, "training.global_batch_size", _weak_batch(base_scenario, resized.cluster.num_gpus))
    return out, None


def _holds_bool(value: Any) -> bool:
    """Whether a point's value is, or holds, a boolean."""
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return isinstance(value, list) and any(_holds_bool(v) for v in value)


def _preset_own_keys(section: dict[str, Any], cls: type[BaseModel]) -> dict[str, Any]:
    """A validated section (a model's or a cluster's dump, ``cls`` its model) less the values its preset gave it:
    the preset's name and the keys that differ from the preset's (nested sections key by key). A point that sets
    the preset merges the new one under these, as ``--set cluster.preset=...`` does with the file; on the expanded
    section, the old preset's values (a cluster's GPU, links, GPUs per node) stayed and only the name changed,
    until 2026-11-29. A section without a preset is returned as it is."""
    name = section.get("preset")
    if not name:
        return section
    return {**_differing(section, cls.model_validate({"preset": name}).model_dump()), "preset": name}


def _differing(values: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``values`` whose value differs from ``reference``'s (nested dicts compared key by key)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        ref = reference.get(key)
        if isinstance(value, dict) and isinstance(ref, dict):
            inner = _differing(value, ref)
            if inner:
                out[key] = inner
        elif key not in reference or value != ref or type(value) is not type(ref):
            out[key] = value
    return out


def _weak_batch(base: Scenario, gpus: int) -> int:
    """The base's global batch scaled to ``gpus`` GPUs (weak scaling), or a ScenarioError naming the batch."""
    batch, left = divmod(base.global_batch_size * gpus, base.cluster.num_gpus)
    if left or not batch:
        raise ScenarioError(
            f"training.global_batch_size: weak scaling gives {base.global_batch_size:,} x {gpus:,} / "
            f"{base.cluster.num_gpus:,} GPUs, not a whole number of samples (set the batch, or keep it: strong "
            "scaling)")
    return batch


def _sets_batch(updates: dict[str, Any]) -> bool:
    """Whether ``updates`` set the global batch (its dotted path, or a training section holding it)."""
    training = updates.get("training")
    return "training.global_batch_size" in updates or (isinstance(training, dict) and
                                                       "global_batch_size" in training)


def _reusing_sections(data: dict[str, Any], base: dict[str, Any], base_scenario: Scenario | None) -> Scenario | None:
    """``data``, a variant of ``base``, validated with ``base_scenario``'s own section objects wherever the
    variant's section equals the base's (pydantic takes a validated section as it is; the scenario's checks
    across sections all run), or None where that does not validate or does not apply (a calibrated base).

    A variant that fails here is validated whole by the caller, so its error is worded as always; one that
    passes equals its whole validation (its sections come from equal dicts, and no section's validation reads
    another's). A sweep point then validates only what it changed (``tests/test_sweeps.py`` checks both).
    """
    if base_scenario is None or data.get("calibration") or base.get("calibration"):
        return None
    same = {key: getattr(base_scenario, key) for key, value in data.items()
            if key in _SECTIONS and isinstance(value, dict) and value == base.get(key)}
    try:
        return validate_scenario(data, same)
    except ScenarioError:
        return None


#: The sections of a scenario that are models of their own (what :func:`_reusing_sections` can take as they are).
_SECTIONS = frozenset(name for name, f in Scenario.model_fields.items()
                      if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))


def _sections_gpus(data: dict[str, Any]) -> int | None:
    """A scenario dict's GPU count from its cluster section, or None where it, or the training section, does not
    validate (the caller then validates the whole scenario)."""
    try:
        cluster = Cluster.model_validate(data["cluster"])
        Training.model_validate(data["training"])
    except (ValidationError, KeyError, TypeError, ValueError, RecursionError):
        return None
    return cluster.num_gpus


def scenario_from_dict_or_none(data: dict[str, Any]) -> Scenario | None:
    try:
        return scenario_from_dict(data)
    except ScenarioError:
        return None


def evaluate(data: dict[str, Any], scenario: Scenario | None = None) -> tuple[PointMetrics, StepResult | None]:
    """Validate and simulate one variant (``scenario``: ``data`` already validated); a bad variant gives a
    point with ``error`` set."""
    from simddp import simulate

    try:
        if scenario is None:
            scenario = scenario_from_dict(data)
        result = simulate(scenario, trace=False)
    except ValueError as err:  # ScenarioError, or a choice the cost model rejects (e.g. NVLS without NVSwitch)
        return PointMetrics(error=str(err)), None
    memory = getattr(result, "memory", None)
    part = {p.key: p.time_s for p in result.breakdown}
    return (
        PointMetrics(
            num_gpus=result.num_gpus,
            dp=result.dp,
            global_batch_size=result.global_batch_size,
            num_buckets=len(result.buckets),
            step_time_s=result.step_time_s,
            compute_time_s=result.compute_time_s,
            comm_time_s=result.comm_time_s,
            exposed_comm_time_s=result.exposed_comm_time_s,
            exposed_comm_fraction=result.exposed_comm_fraction,
            recompute_time_s=part["recompute"],
            interference_time_s=part["interference"],
            tp_comm_time_s=part["tp_comm"],
            pipeline_bubble_time_s=part["pipeline_bubble"],
            stage_imbalance_time_s=part["stage_imbalance"],
            pipeline_p2p_time_s=part["pipeline_p2p"],
            ddp_host_time_s=part["ddp_host"],
            grad_clip_time_s=part["grad_clip"],
            optimizer_time_s=part["optimizer"],
            host_overhead_s=part["host"],
            tokens_per_s=result.tokens_per_s,
            samples_per_s=result.samples_per_s,
            mfu=result.mfu,
            scaling_efficiency=result.scaling_efficiency,
            memory_bytes=getattr(memory, "total_bytes", None),
            memory_fits=getattr(memory, "fits", None),
        ),
        result,
    )


def _metrics(data: dict[str, Any], scenario: Scenario | None = None) -> dict[str, Any]:
    return evaluate(data, scenario)[0].model_dump()


def _variant_metrics(base: dict[str, Any], updates: dict[str, Any], batch: BatchScaling = "weak",
                     base_scenario: Scenario | None = None) -> dict[str, Any]:
    """:func:`evaluate`'s metrics of a variant of ``base`` (one whose batch cannot be scaled carries why)."""
    try:
        return _metrics(*_variant(base, updates, batch, base_scenario))
    except ScenarioError as err:
        return PointMetrics(error=str(err)).model_dump()


_MEMORY_FIELDS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
                  "overhead_bytes", "capacity_bytes")


# ---------------------------------------------------------------------------------------- sweeps
def default_gpu_counts(gpus_per_node: int, max_gpus: int = 2048) -> list[int]:
    """1, 2, 4, ... up to one node, then whole nodes doubling up to ``max_gpus`` (always a node multiple)."""
    counts, g = [], 1
    while g < gpus_per_node:
        counts.append(g)
        g *= 2
    nodes = 1
    while nodes * gpus_per_node <= max(max_gpus, gpus_per_node):
        counts.append(nodes * gpus_per_node)
        nodes *= 2
    return counts


def _value_list(name: str, values: Iterable[Any]) -> list[Any]:
    """``values`` as a list, where they are a collection of values and not one string (``"5,25"`` swept ``'5'``,
    ``','``, ``'2'``, ``'5'``, and simulated a bucket cap of 2 MiB without a word)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ScenarioError(f"{name}: expected a list of values, not {type(values).__name__} {str(values)[:60]!r}")
    return list(values)


def scaling_sweep(
    scenario: Scenario | dict[str, Any] | str | Path,
    gpu_counts: Iterable[int] | None = None,
    batch: BatchScaling = "weak",
) -> ScalingSweep:
    """The scenario on each GPU count: fewer than a node = one partial node, else whole nodes."""
    base = as_scenario_dict(scenario)
    ref = scenario_from_dict(base)
    per_node = ref.cluster.gpus_per_node
    counts = _value_list("gpu_counts", gpu_counts) if gpu_counts is not None else default_gpu_counts(per_node)
    points = []
    for g in counts:
        g = whole_number("gpu count", g)
        if g < per_node:
            nodes, gpn = 1, g
        elif g % per_node:
            points.append(ScalingPoint(num_nodes=-(-g // per_node), gpus_per_node=per_node,
                                       error=f"{g} GPUs is not a whole number of {per_node}-GPU nodes"))
            continue
        else:
            nodes, gpn = g // per_node, per_node
        metrics = _variant_metrics(base, {"cluster.num_nodes": nodes, "cluster.gpus_per_node": gpn}, batch, ref)
        metrics["num_gpus"] = metrics["num_gpus"] or g
        points.append(ScalingPoint(num_nodes=nodes, gpus_per_node=gpn, **metrics))
    return ScalingSweep(scenario=ref.name, batch=batch, reference_num_gpus=ref.cluster.num_gpus, points=points)


def bucket_cap_sweep(
    scenario: Scenario | dict[str, Any] | str | Path, caps_mb: Iterable[float] = DEFAULT_BUCKET_CAPS_MB
) -> BucketCapSweep:
    """The scenario with each DDP bucket cap (MiB)."""
    caps = _value_list("caps_mb", caps_mb)
    base = as_scenario_dict(scenario)
    ref = scenario_from_dict(base)
    points = [
        BucketCapPoint(bucket_cap_mb=cap, **_variant_metrics(base, {"ddp.bucket_cap_mb": cap}, base_scenario=ref))
        for cap in caps
    ]
    return BucketCapSweep(scenario=ref.name, reference_bucket_cap_mb=ref.ddp.bucket_cap_mb, points=points)


def default_strategies(scenario: Scenario, tp: int | None = None, pp: int | None = None) -> dict[str, dict[str, Any]]:
    """DDP, ZeRO-1/2/3, tensor parallel (default: a whole node) and pipeline parallel (default: 4 stages).

    Each is a ``parallelism`` section; the TP variant keeps sequence parallelism when the scenario uses it.
    """
    tp = tp or scenario.cluster.gpus_per_node
    pp = pp or 4
    base = {"dp": None, "tp": 1, "pp": 1, "zero_stage": 0, "sequence_parallel": False,
            "pipeline_schedule": "1f1b", "virtual_stages": 1}
    return {
        "DDP": base,
        "ZeRO-1": {**base, "zero_stage": 1},
        "ZeRO-2": {**base, "zero_stage": 2},
        "ZeRO-3 (FSDP)": {**base, "zero_stage": 3},
        f"TP={tp}": {**base, "tp": tp, "sequence_parallel": scenario.parallelism.sequence_parallel and tp > 1},
        f"PP={pp}": {**base, "pp": pp},
    }


def strategy_sweep(
    scenario: Scenario | dict[str, Any] | str | Path, strategies: dict[str, dict[str, Any]] | None = None
) -> StrategySweep:
    """The scenario under each parallel strategy (a ``parallelism`` section), on the same GPUs and batch.

    Default strategies: :func:`default_strategies`. dp follows the GPUs; a strategy the scenario's rules
    forbid (heads, layers, batch) becomes a point with its error.
    """
    base = as_scenario_dict(scenario)
    ref = scenario_from_dict(base)
    strategies = strategies if strategies is not None else default_strategies(ref)
    points = []
    for label, parallelism in strategies.items():
        variant = copy.deepcopy(base)
        variant["parallelism"] = {**variant.get("parallelism", {}), **parallelism}
        metrics, result = evaluate(variant)
        memory = getattr(result, "memory", None)
        extra = {f: getattr(memory, f) for f in _MEMORY_FIELDS} if memory is not None else {}
        points.append(StrategyPoint(
            strategy=label,
            zero_stage=parallelism.get("zero_stage", 0),
            tp=parallelism.get("tp", 1),
            pp=parallelism.get("pp", 1),
            **metrics.model_dump(),
            **extra,
        ))
    return StrategySweep(scenario=ref.name, points=points)


def grid_sweep(
    scenario: Scenario | dict[str, Any] | str | Path,
    x_path: str,
    x_values: Sequence[Any],
    y_path: str,
    y_values: Sequence[Any],
    batch: BatchScaling = "weak",
) -> GridSweep:
    """Every (x, y) combination of values at two dotted paths, e.g. bucket cap against number of nodes."""
    if x_path == y_path:
        raise ScenarioError(f"grid sweep needs two different keys (got {x_path!r} twice)")
    x_values, y_values = _value_list(x_path, x_values), _value_list(y_path, y_values)
    base = as_scenario_dict(scenario)
    ref = scenario_from_dict(base)
    points = [
        GridPoint(x=x, y=y, **_variant_metrics(base, {x_path: x, y_path: y}, batch, ref))
        for y in y_values
        for x in x_values
    ]
    return GridSweep(scenario=ref.name, x_path=x_path, y_path=y_path, x_values=list(x_values),
                     y_values=list(y_values), points=points)


__all__ = [
    "DEFAULT_BUCKET_CAPS_MB",
    "BucketCapPoint",
    "BucketCapSweep",
    "GridPoint",
    "GridSweep",
    "PointMetrics",
    "ScalingPoint",
    "ScalingSweep",
    "StrategyPoint",
    "StrategySweep",
    "as_scenario_dict",
    "bucket_cap_sweep",
    "default_gpu_counts",
    "default_strategies",
    "evaluate",
    "get_path",
    "grid_sweep",
    "scaling_sweep",
    "scenario_to_dict",
    "set_value",
    "strategy_sweep",
    "with_values",
]


# ------------------------------------------------------------------------------------ N-key grids
class VaryPoint(PointMetrics):
    """The scenario with each varied key set to one value."""

    values: dict[str, Any] = Field(description="Dotted path -> value of this point.")


class VarySweep(_Sweep):
    """Every combination of values at any number of dotted scenario paths (``simddp sweep``)."""

    scenario: str = Field(description="Name of the swept scenario.")
    paths: list[str] = Field(description="The varied dotted paths, in --vary order.")
    values: list[list[Any]] = Field(description="The values of each path.")
    points: list[VaryPoint]

    def to_dataframe(self) -> Any:
        import pandas as pd

        rows = [{**p.values, **p.model_dump(exclude={"values"}), "ok": p.ok} for p in self.points]
        return pd.DataFrame(rows)

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows (one per point): the varied values, then every metric and the error (CSV, JSON)."""
        return [{**p.values, **p.model_dump(exclude={"values"})} for p in self.points]


def _vary_point(args: tuple[dict[str, Any], dict[str, Any], BatchScaling, Scenario]) -> VaryPoint:
    """One point of :func:`vary_sweep`; its values as the scenario took them (``200Gbit/s`` as 2.5e10 bytes/s,
    ``2.5e1`` as 25.0), or as typed where the point is invalid."""
    base, update, batch, base_scenario = args
    try:
        data, scenario = _variant(base, update, batch, base_scenario)
    except ScenarioError as err:
        return VaryPoint(values=update, **PointMetrics(error=str(err)).model_dump())
    scenario = scenario or scenario_from_dict_or_none(data)
    values = update if scenario is None else {path: _taken(scenario, path, v) for path, v in update.items()}
    return VaryPoint(values=values, **_metrics(data, scenario))


def _taken(scenario: Scenario, path: str, typed: Any) -> Any:
    """The value of a validated scenario at a dotted path, where it is a plain value (else ``typed``)."""
    value: Any = scenario
    for key in path.split("."):
        if isinstance(value, BaseModel) and key in type(value).model_fields:
            value = getattr(value, key)
        else:
            return typed
    return value if value is None or isinstance(value, bool | int | float | str) else typed


_SHARED_BASE: tuple[dict[str, Any], BatchScaling, Scenario] | None = None


def _share_base(base: dict[str, Any], batch: BatchScaling, ref: Scenario) -> None:
    """A sweep worker process's base (its initializer)."""
    global _SHARED_BASE
    _SHARED_BASE = (base, batch, ref)


def _shared_vary_point(update: dict[str, Any]) -> VaryPoint:
    assert _SHARED_BASE is not None, "a sweep worker runs _share_base first"
    base, batch, ref = _SHARED_BASE
    return _vary_point((base, update, batch, ref))


def vary_sweep(
    scenario: Scenario | dict[str, Any] | str | Path,
    varies: Mapping[str, Sequence[Any]],
    batch: BatchScaling = "weak",
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> VarySweep:
    """The scenario at every combination of ``varies`` (path -> values); ``jobs`` > 1 uses processes.

    A combination that is not a valid scenario, or that the cost model rejects, is kept with its reason.
    """
    if not isinstance(varies, Mapping) or not varies:
        raise ScenarioError("a sweep needs at least one --vary key.path=v1,v2,... (a mapping: path -> values)")
    varies = {path: _value_list(f"--vary {path}", values) for path, values in varies.items()}
    for path, values in varies.items():
        if not values:
            raise ScenarioError(f"--vary {path}: no values")
    base = as_scenario_dict(scenario)
    ref = scenario_from_dict(base)
    paths = list(varies)
    combos = [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*varies.values())]
    points: list[VaryPoint] = []
    jobs = worker_processes(jobs, len(combos))
    if jobs > 1:
        # The base goes to each worker once, not with each point (pickling it is 0.1 ms a point).
        with worker_pool(jobs, _share_base, (base, batch, ref)) as pool:
            chunk = max(1, len(combos) // (8 * jobs))
            for k, point in enumerate(pool.map(_shared_vary_point, combos, chunksize=chunk)):
                points.append(point)
                if progress is not None:
                    progress(k + 1, len(combos))
    else:
        for k, combo in enumerate(combos):
            points.append(_vary_point((base, combo, batch, ref)))
            if progress is not None:
                progress(k + 1, len(combos))
    return VarySweep(scenario=ref.name, paths=paths, values=[list(v) for v in varies.values()], points=points)


def _value_label(value: Any) -> str:
    """A varied value as the report shows it (mappings and lists as JSON text)."""
    return json.dumps(value, sort_keys=True, default=str) if isinstance(value, dict | list) else str(value)


def sweep_html(sweep: VarySweep) -> str:
    """A self-contained plotly page: step time against the first key (a line per value of the second), and
    every point in a table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    first = sweep.paths[0]
    second = sweep.paths[1] if len(sweep.paths) > 1 else None
    fig = make_subplots(rows=2, cols=1, row_heights=[0.55, 0.45], vertical_spacing=0.08,
                        specs=[[{"type": "xy"}], [{"type": "table"}]],
                        subplot_titles=[f"step time against {first}", "every point (invalid ones with their reason)"])
    # Lines by the second key's value as text: a varied value may be a list or a mapping (unhashable; a probe's
    # --vary 'parallelism.pp={}' ended --html with an internal error), and the x axis reads values as text too.
    groups: dict[str | None, list[VaryPoint]] = {}
    for p in sweep.points:
        groups.setdefault(_value_label(p.values.get(second)) if second else None, []).append(p)
    for key, pts in groups.items():
        ok = [p for p in pts if p.ok]
        fig.add_trace(go.Scatter(x=[_value_label(p.values[first]) for p in ok], y=[p.step_time_s for p in ok],
                                 mode="lines+markers", name=f"{second}={key}" if second else "step time (s)"),
                      row=1, col=1)
    fig.update_yaxes(title_text="step time (s)", row=1, col=1)
    fig.update_xaxes(title_text=first, type="category", row=1, col=1)
    rows = sweep.rows()
    columns = [*sweep.paths, "step_time_s", "exposed_comm_fraction", "mfu", "memory_bytes", "memory_fits", "error"]
    cells = [[("" if r.get(c) is None else (f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r[c])))
              for r in rows] for c in columns]
    fig.add_trace(go.Table(header={"values": columns}, cells={"values": cells}), row=2, col=1)
    fig.update_layout(height=900, title=f"simddp sweep of {sweep.scenario}")
    from simddp.safeio import titled_html

    return titled_html(str(fig.to_html(include_plotlyjs=True, full_html=True)), f"simddp sweep of {sweep.scenario}")


__all__ += ["VaryPoint", "VarySweep", "sweep_html", "vary_sweep"]
