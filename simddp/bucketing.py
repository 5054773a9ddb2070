"""DDP gradient buckets, exactly as PyTorch builds them after the first iteration.

``DistributedDataParallel`` flattens gradients into buckets and all-reduces one bucket at a time, in
bucket-index order, while backward still runs. The buckets that matter for a training run are the ones
the C++ ``Reducer`` builds once, before the second forward pass (``Reducer::rebuild_buckets`` in
``torch/csrc/distributed/c10d/reducer.cpp``, called from ``DistributedDataParallel._pre_forward`` in
``torch/nn/parallel/distributed.py``): during the first backward, ``Reducer::autograd_hook`` records
every parameter in the order its gradient became ready, and ``rebuild_buckets`` hands that order to
``compute_bucket_assignment_by_size`` with the size limits ``[first_bucket_bytes_cap, bucket_bytes_cap]``.
(Buckets are not rebuilt with ``find_unused_parameters=True`` unless ``static_graph=True``; see
``Reducer::should_rebuild_buckets``.)

Size limits (``_BucketCapacityConfig.create`` in ``distributed.py``): ``bucket_cap_mb`` is MiB and
converts as ``int(bucket_cap_mb * 1024 * 1024)``. Left at its default (``None``, meaning 25 MiB), the
first bucket is capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB; an explicit ``bucket_cap_mb``
(even 25) caps the first bucket at the same value as the others.

``compute_bucket_assignment_by_size`` walks the parameters in ready order and keeps one open bucket and
one position in the limit list per ``(dtype, device)`` key. Each parameter is appended to its key's
bucket; the bucket closes as soon as its size is ``>=`` its limit, so a large tensor overshoots the cap
rather than opening a bucket of its own, and only then does that key advance to the next limit (the
last limit repeats). Every dtype therefore gets its own small first bucket. Closed buckets are emitted
in the order they closed; the partial buckets left open at the end are appended afterwards by iterating
the ``std::unordered_map`` of accumulators. With the ready order given (``tensor_indices`` non-empty) the
result is not re-sorted, so bucket 0 holds the gradients that are ready first and is reduced first.

Order of leftover buckets with several dtypes. The map is keyed by ``BucketKey(dtype, device)`` and
hashed with ``c10::get_hash(type, device)``: ``hash_combine(hash(device), int(scalar_type))`` from
``c10/util/hash.h``, with ``hash(device) = device_type << 16 | uint8(device_index)`` from
``c10/core/Device.h``. libstdc++'s ``std::unordered_map`` (Linux wheels) starts at 13 hash slots on
first insert (``_Prime_rehash_policy::_M_need_rehash`` asks for at least 11) and does not rehash before
a 14th key; a key landing in an empty slot goes to the front of the iteration list, one landing in an
occupied slot goes just before that slot's first node (``_Hashtable::_M_insert_bucket_begin``). So the
leftovers come out in reverse order of first appearance except where two dtypes share a slot. This
module reproduces that exactly (checked against ``torch.distributed._compute_bucket_assignment_by_size``
in ``tests/parity``). The hash uses rank 0's device because ``Reducer::sync_bucket_indices`` broadcasts
rank 0's assignment to all ranks; rank 0 is normally ``cuda:0``, whose slot collisions among the dtypes
simddp knows are identical to the CPU's (only ``float8_e4m3fn`` and ``bool`` share a slot), so CPU
parity tests cover it. Not modelled: ``bucket_cap_mb_list`` and the ``DDP_SET_LAST_BUCKET_CAP=1``
environment switch; sparse gradients (which torch rejects when rebuilding buckets).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from simddp.errors import ScenarioError, whole_number
from simddp.units import MiB, dtype_bytes, mib_to_bytes


class ParamLike(Protocol):
    """What bucketing needs of a parameter (a ``ParameterSpec``, the engine's ``workload.Param`` or its
    ``workload.ParamSize``)."""

    @property
    def numel(self) -> int: ...
    @property
    def dtype(self) -> str: ...


#: A parameter's (elements, dtype): what its sizes in bytes, model states and bucket assignment depend on.
PARAM_SIZE = operator.attrgetter("numel", "dtype")

__all__ = [
    "DEFAULT_BUCKET_CAP_MB",
    "DEFAULT_FIRST_BUCKET_BYTES",
    "PARAM_SIZE",
    "Bucket",
    "BucketSpec",
    "assign_in_order",
    "bucket_assignment",
    "bucket_size_limits",
    "buckets_to_json",
    "ddp_buckets",
    "ddp_initial_buckets",
]

#: ``_DEFAULT_BUCKET_CAP_MB`` in ``torch/nn/parallel/distributed.py`` (MiB).
DEFAULT_BUCKET_CAP_MB = 25.0
#: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``: the first bucket's cap when ``bucket_cap_mb`` is unset.
DEFAULT_FIRST_BUCKET_BYTES = 1 * MiB

#: ``c10::ScalarType`` enum values (``torch/headeronly/core/ScalarType.h``); they feed the bucket-key hash.
_SCALAR_TYPE_CODE: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "float64": 7,
    "complex32": 8,
    "complex64": 9,
    "complex128": 10,
    "bool": 11,
    "bfloat16": 15,
    "float8_e5m2": 23,
    "float8_e4m3fn": 24,
}
_CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA
_RANK0_DEVICE_INDEX = 0
_LIBSTDCXX_INITIAL_SLOTS = 13  # libstdc++ _Prime_rehash_policy: next prime >= 12 on the first insert
_SIZE_T_MASK = 2**64 - 1


class Bucket(BaseModel):
    """One DDP gradient bucket: the parameters whose gradients are flattened and all-reduced together."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Reduction order: bucket 0 is all-reduced first.")
    param_indices: list[int] = Field(
        description="Indices into the parameter list, in the order torch lays them out in the bucket."
    )
    size_bytes: int = Field(ge=0, description="Sum of numel x element size of the bucket's parameters, bytes.")
    dtype: str = Field(description="torch dtype name shared by every parameter in the bucket.")
    cap_bytes: int = Field(ge=0, description="Size limit the bucket was built against, bytes.")


def bucket_size_limits(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """``(first_bucket_bytes_cap, bucket_bytes_cap)`` as DDP derives them from ``bucket_cap_mb``.

    ``None`` is torch's default: 25 MiB buckets after a 1 MiB first bucket. An explicit value caps every
    bucket, the first included (``_BucketCapacityConfig.create``).
    """
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, mib_to_bytes(DEFAULT_BUCKET_CAP_MB)
    if not (math.isfinite(bucket_cap_mb) and bucket_cap_mb > 0):
        raise ScenarioError(f"bucket_cap_mb must be a finite number > 0 (MiB), got {bucket_cap_mb!r}")
    cap_bytes = mib_to_bytes(bucket_cap_mb)
    return cap_bytes, cap_bytes


@dataclass(slots=True)
class BucketSpec:
    """A bucket as the engine uses it (the fields of :class:`Bucket`, without validation's cost). Not frozen:
    a frozen dataclass's constructor sets each field through ``object.__setattr__``, and a 7B model's step
    builds 226 of them (1.2 M instructions, 3% of its evaluation); nothing changes one once built."""

    index: int
    param_indices: list[int]
    size_bytes: int
    dtype: str
    cap_bytes: int


def ddp_buckets(
    params: Sequence[ParamLike],
    ready_order: Sequence[int] | None = None,
    bucket_cap_mb: float | None = None,
) -> list[Bucket]:
    """DDP's rebuilt buckets for ``params`` as :class:`Bucket` models (see :func:`bucket_assignment`)."""
    return [Bucket.model_construct(index=b.index, param_indices=b.param_indices, size_bytes=int(b.size_bytes),
                                   dtype=b.dtype, cap_bytes=b.cap_bytes)
            for b in bucket_assignment(params, ready_order, bucket_cap_mb)]


def bucket_assignment(
    params: Sequence[ParamLike],
    ready_order: Sequence[int] | None = None,
    bucket_cap_mb: float | None = None,
) -> list[BucketSpec]:
    """DDP's rebuilt buckets for ``params`` (the parameters DDP sees: those requiring grad, deduplicated).

    ``ready_order`` lists parameter indices in gradient-ready order; ``None`` means reverse definition
    order, which is what autograd gives for a sequential model. Returns buckets in reduction order
    (index 0 reduced first), as ``compute_bucket_assignment_by_size`` does when ``Reducer::rebuild_buckets``
    calls it.
    """
    num_params = len(params)
    if num_params == 0:
        raise ScenarioError("ddp_buckets needs at least one parameter (DDP rejects a model without any)")
    _check_params(params)
    order = list(range(num_params - 1, -1, -1)) if ready_order is None else _checked_order(ready_order, num_params)
    return assign_in_order(params, order, bucket_cap_mb)


def _check_params(params: Sequence[ParamLike]) -> None:
    """Each of ``params`` a parameter with a whole number of elements >= 0 and a dtype simddp knows, else one
    :class:`ScenarioError` naming it (a numel of -100 made a bucket of -400 B, 2.5 a fractional one). The engine's
    own parameters were checked when the scenario was validated: :func:`assign_in_order` takes them as they are."""
    for i, p in enumerate(params):
        numel, dtype = getattr(p, "numel", None), getattr(p, "dtype", None)
        if numel is None or dtype is None:
            raise ScenarioError(f"params[{i}]: expected a parameter with numel and dtype "
                                f"(simddp.config.ParameterSpec), got {type(p).__name__}")
        whole_number(f"params[{i}].numel", numel, 0)  # an int, or a numpy integer
        try:
            dtype_bytes(dtype)
        except (ValueError, AttributeError) as e:  # an unknown name, or not a name (a torch.dtype)
            why = e if isinstance(e, ValueError) else f"expected a torch dtype name (text), got {dtype!r}"
            raise ScenarioError(f"params[{i}].dtype: {why}") from None


def assign_in_order(params: Sequence[ParamLike], order: Sequence[int],
                    bucket_cap_mb: float | None = None) -> list[BucketSpec]:
    """:func:`bucket_assignment` of an ``order`` known to list each of ``params`` (at least one) once: the
    engine's, a workload's ready order restricted to a rank's parameters (:meth:`simddp.workload.Workload.
    reduced_gradients`), which was checked once, when the scenario was validated or the transformer built.
    Checking it again per step cost 1.2% of the default's instructions."""
    limits = bucket_size_limits(bucket_cap_mb)

    if len({p.dtype for p in params}) == 1:  # one dtype (most models): one accumulator, in locals
        dtype = params[0].dtype.removeprefix("torch.")
        width, (limit, cap) = dtype_bytes(dtype), limits
        out: list[BucketSpec] = []
        indices: list[int] = []
        size = 0
        for param_index, numel in zip(order, [params[i].numel for i in order], strict=True):
            indices.append(param_index)
            size += numel * width
            if size >= limit:
                out.append(BucketSpec(len(out), indices, size, dtype, limit))
                indices, size, limit = [], 0, cap  # the last limit repeats
        if indices:
            out.append(BucketSpec(len(out), indices, size, dtype, limit))
        return out
    # Per-dtype accumulators [indices, bytes, position in limits]; dict order is first appearance, as the
    # unordered_map's insertion order. The current dtype's are kept in locals.
    closed: list[tuple[list[int], int, str, int]] = []
    accumulators: dict[str, list[Any]] = {}
    widths: dict[str, tuple[str, int]] = {}  # a parameter's dtype as given -> (without "torch.", element bytes)
    last = len(limits) - 1
    indices = []
    dtype, width, size, pos = "", 0, 0, 0
    for param_index in order:
        param = params[param_index]
        known = widths.get(param.dtype)
        if known is None:
            name = param.dtype.removeprefix("torch.")
            known = widths[param.dtype] = (name, dtype_bytes(name))
        if known[0] != dtype:  # another dtype's accumulator: put this one back, take that one out
            if dtype:
                accumulators[dtype] = [indices, size, pos]
            dtype, width = known
            indices, size, pos = accumulators.setdefault(dtype, [[], 0, 0])
        indices.append(param_index)
        size += param.numel * width
        if size >= limits[pos]:
            closed.append((indices, size, dtype, limits[pos]))
            indices, size, pos = [], 0, min(pos + 1, last)
    if dtype:
        accumulators[dtype] = [indices, size, pos]

    for dtype in _unordered_map_order(list(accumulators)):
        indices, size, pos = accumulators[dtype]
        if indices:
            closed.append((indices, size, dtype, limits[pos]))

    return [BucketSpec(i, indices, size, dtype, cap) for i, (indices, size, dtype, cap) in enumerate(closed)]


def buckets_to_json(buckets: Sequence[Bucket]) -> dict[str, list[dict[str, int | list[int]]]]:
    """The JSON form of a bucket list: ``{"buckets": [{"size_bytes": ..., "param_indices": [...]}, ...]}``."""
    return {"buckets": [{"size_bytes": b.size_bytes, "param_indices": list(b.param_indices)} for b in buckets]}


def _checked_order(ready_order: Sequence[int], num_params: int) -> list[int]:
    try:
        order = list(map(operator.index, ready_order))
    except TypeError:
        raise ScenarioError(f"ready_order entries must be integers, got {list(ready_order)!r}") from None
    if len(order) != num_params:
        raise ScenarioError(f"ready_order must list each of the {num_params} parameters once, got {len(order)} entries")
    if len(set(order)) == num_params and (not order or (min(order) >= 0 and max(order) < num_params)):
        return order  # each of 0..n-1 once (the usual case, checked without a loop in Python)
    seen: set[int] = set()
    for i in order:
        if not 0 <= i < num_params:
            raise ScenarioError(f"ready_order entry {i} is out of range for {num_params} parameters")
        if i in seen:
            raise ScenarioError(f"ready_order lists parameter {i} more than once")
        seen.add(i)
    raise AssertionError("unreachable: a bad order fails one of the checks above")


def _bucket_key_hash(dtype: str, device_type: int = _CUDA_DEVICE_TYPE, device_index: int = 0) -> int:
    """``c10::get_hash(scalar_type, device)`` of reducer.cpp's ``BucketKey``, as a 64-bit ``size_t``."""
    try:
        code = _SCALAR_TYPE_CODE[dtype]
    except KeyError:
        raise ScenarioError(f"no c10::ScalarType code known for dtype {dtype!r}") from None
    # std::hash<c10::Device>: uint32(uint8(type)) << 16 | uint32(uint8(index)); CPU's index is -1 -> 255.
    seed = (device_type & 0xFF) << 16 | (device_index & 0xFF)
    # c10::hash_combine(seed, value), with the device as seed (tuple elements combine last to first).
    return (seed ^ ((code + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _SIZE_T_MASK)) & _SIZE_T_MASK


def _unordered_map_order(
    dtypes_by_first_use: Sequence[str],
    device_type: int = _CUDA_DEVICE_TYPE,
    device_index: int = _RANK0_DEVICE_INDEX,
) -> list[str]:
    """Iteration order of libstdc++'s ``unordered_map<BucketKey, ...>`` after inserting these keys in turn."""
    if len(dtypes_by_first_use) > _LIBSTDCXX_INITIAL_SLOTS:
        # Cannot happen with the dtypes simddp knows; beyond 13 keys libstdc++ would rehash.
        raise ScenarioError(f"{len(dtypes_by_first_use)} gradient dtypes; at most 13 are modelled")
    slot_of = {
        d: _bucket_key_hash(d, device_type, device_index) % _LIBSTDCXX_INITIAL_SLOTS for d in dtypes_by_first_use
    }
    order: list[str] = []
    for dtype in dtypes_by_first_use:
        same_slot = [pos for pos, other in enumerate(order) if slot_of[other] == slot_of[dtype]]
        order.insert(same_slot[0] if same_slot else 0, dtype)
    return order


def ddp_initial_buckets(params: Sequence[ParamLike], bucket_cap_mb: float | None = None) -> list[Bucket]:
    """The buckets DDP builds at construction, which it keeps when it never rebuilds them.

    ``DistributedDataParallel._ddp_init_helper`` assigns buckets over the parameters in definition order
    (``_compute_bucket_assignment_by_size`` with no ready order, so the buckets are sorted by their smallest
    parameter index), then hands the Reducer the *reversed* list, "to approximate the order in which their
    gradients are produced". With ``find_unused_parameters=True`` and no ``static_graph`` the Reducer never
    rebuilds (``Reducer::should_rebuild_buckets``), so these are the buckets of every step: the small first
    bucket (1 MiB with the default cap) holds the first-defined parameters and is reduced last. (Without
    find_unused_parameters, the first iteration uses one bucket and every later one the rebuilt buckets of
    :func:`ddp_buckets`.)
    """
    built = ddp_buckets(params, list(range(len(params))), bucket_cap_mb)
    ordered = sorted(built, key=lambda b: min(b.param_indices))
    return [b.model_copy(update={"index": i}) for i, b in enumerate(reversed(ordered))]
