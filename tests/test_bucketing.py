"""DDP bucket assignment: hand-derived cases and invariants (torch parity lives in tests/parity)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simddp.bucketing import (
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_BYTES,
    Bucket,
    _bucket_key_hash,
    _unordered_map_order,
    assign_in_order,
    bucket_assignment,
    bucket_size_limits,
    buckets_to_json,
    ddp_buckets,
)
from simddp.config import ParameterSpec
from simddp.units import DTYPE_BYTES, MiB, dtype_bytes

CPU = (0, -1)  # c10::DeviceType::CPU, index -1
CUDA0 = (1, 0)


def mib_params(*sizes_mib: float, dtype: str = "float32") -> list[ParameterSpec]:
    """Parameters of the given sizes in MiB (definition order)."""
    elem = dtype_bytes(dtype)
    return [ParameterSpec(name=f"p{i}", numel=int(size * MiB) // elem, dtype=dtype) for i, size in enumerate(sizes_mib)]


def layout(buckets: list[Bucket]) -> list[list[int]]:
    return [b.param_indices for b in buckets]


# ----------------------------------------------------------------------------------- size limits
def test_default_limits_are_one_mib_then_25_mib():
    assert DEFAULT_BUCKET_CAP_MB == 25.0
    assert DEFAULT_FIRST_BUCKET_BYTES == 1_048_576
    assert bucket_size_limits(None) == (MiB, 25 * MiB)


def test_explicit_cap_also_caps_first_bucket_and_truncates_like_torch():
    assert bucket_size_limits(25) == (25 * MiB, 25 * MiB)
    assert bucket_size_limits(0.1) == (104_857, 104_857)  # int(0.1 * 1024 * 1024)


@pytest.mark.parametrize("cap", [0, -1, -0.5, math.nan, math.inf])
def test_non_positive_or_non_finite_cap_is_rejected(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb") as err:
        ddp_buckets(mib_params(1.0), bucket_cap_mb=cap)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- hand-derived cases
def test_bucket_closes_when_reaching_cap_and_big_tensor_overshoots():
    # ready order 0..5 with sizes 1, 3, 0.5, 0.5, 1, 1 MiB and a 2 MiB cap:
    # [1, 3] = 4 MiB overshoots and closes; [0.5, 0.5, 1] = 2 MiB closes on equality; [1] is left over.
    params = mib_params(1, 3, 0.5, 0.5, 1, 1)
    buckets = ddp_buckets(params, ready_order=range(6), bucket_cap_mb=2)
    assert layout(buckets) == [[0, 1], [2, 3, 4], [5]]
    assert [b.size_bytes for b in buckets] == [4 * MiB, 2 * MiB, 1 * MiB]
    assert [b.cap_bytes for b in buckets] == [2 * MiB] * 3
    assert [b.index for b in buckets] == [0, 1, 2]


def test_single_tensor_larger_than_cap_gets_its_own_bucket():
    buckets = ddp_buckets(mib_params(0.25, 7, 0.25), ready_order=[1, 0, 2], bucket_cap_mb=2)
    assert layout(buckets) == [[1], [0, 2]]


def test_default_ready_order_is_reverse_definition_order():
    params = mib_params(1, 1, 1, 1)
    assert layout(ddp_buckets(params, bucket_cap_mb=2)) == [[3, 2], [1, 0]]


def test_default_cap_uses_small_first_bucket():
    # Reverse definition order: 0.5 + 0.5 MiB reach the 1 MiB first cap, then 25 MiB buckets follow.
    params = mib_params(20, 10, 0.5, 0.5)
    buckets = ddp_buckets(params)
    assert layout(buckets) == [[3, 2], [1, 0]]
    assert [b.cap_bytes for b in buckets] == [MiB, 25 * MiB]
    assert [b.size_bytes for b in buckets] == [MiB, 30 * MiB]


def test_explicit_25_mib_differs_from_default():
    params = mib_params(20, 10, 0.5, 0.5)
    buckets = ddp_buckets(params, bucket_cap_mb=25)
    assert layout(buckets) == [[3, 2, 1, 0]]
    assert buckets[0].cap_bytes == 25 * MiB


def test_first_bucket_cap_applies_to_first_closed_bucket_only():
    # 0.75 MiB does not reach the 1 MiB first cap; 0.75 + 0.75 does; the next 25 MiB never fills.
    params = mib_params(0.75, 0.75, 0.75, 0.75)
    buckets = ddp_buckets(params, ready_order=range(4))
    assert layout(buckets) == [[0, 1], [2, 3]]
    assert [b.cap_bytes for b in buckets] == [MiB, 25 * MiB]


def test_each_dtype_has_its_own_accumulator_and_first_bucket():
    # Ready order alternates dtypes. float32: 0.5 + 0.5 MiB closes the fp32 first bucket (1 MiB);
    # bfloat16: 0.75 then 0.75 MiB closes its own first bucket; leftovers come last.
    params = [
        *mib_params(0.5, 0.5, 2, dtype="float32"),  # 0, 1, 2
        *mib_params(0.75, 0.75, 2, dtype="bfloat16"),  # 3, 4, 5
    ]
    buckets = ddp_buckets(params, ready_order=[0, 3, 1, 4, 2, 5])
    assert layout(buckets) == [[0, 1], [3, 4], [5], [2]]
    assert [b.dtype for b in buckets] == ["float32", "bfloat16", "bfloat16", "float32"]
    assert [b.cap_bytes for b in buckets] == [MiB, MiB, 25 * MiB, 25 * MiB]


def test_leftovers_come_in_reverse_order_of_first_appearance_without_hash_collisions():
    params = [
        ParameterSpec(name="a", numel=10, dtype="float32"),
        ParameterSpec(name="b", numel=10, dtype="bfloat16"),
        ParameterSpec(name="c", numel=10, dtype="float64"),
        ParameterSpec(name="d", numel=10, dtype="float16"),
    ]
    buckets = ddp_buckets(params, ready_order=[1, 0, 3, 2])
    assert [b.dtype for b in buckets] == ["float64", "float16", "float32", "bfloat16"]


def test_leftovers_follow_libstdcxx_slot_collisions():
    # float8_e4m3fn and bool share one of libstdc++'s 13 hash slots: a key that lands in an occupied
    # slot is placed before that slot's first node, not at the front of the list.
    assert _unordered_map_order(["bool", "float32", "float8_e4m3fn"]) == ["float32", "float8_e4m3fn", "bool"]
    assert _unordered_map_order(["float32", "bool", "float8_e4m3fn"]) == ["float8_e4m3fn", "bool", "float32"]


def test_every_known_dtype_has_a_scalar_type_code():
    for dtype in DTYPE_BYTES:
        _bucket_key_hash(dtype)


def _slot_groups(device: tuple[int, int]) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for dtype in DTYPE_BYTES:
        groups.setdefault(_bucket_key_hash(dtype, *device) % 13, set()).add(dtype)
    return {frozenset(g) for g in groups.values()}


def test_cpu_and_cuda0_share_slot_collisions_so_cpu_parity_covers_rank0():
    assert _slot_groups(CPU) == _slot_groups(CUDA0)
    dtypes = list(DTYPE_BYTES)
    for k in range(len(dtypes)):
        seq = dtypes[k:] + dtypes[:k]
        assert _unordered_map_order(seq, *CPU) == _unordered_map_order(seq, *CUDA0)


# ----------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("order", "match"),
    [
        ([0, 1], "3 parameters"),
        ([0, 1, 1], "parameter 1 more than once"),
        ([0, 1, 3], "entry 3 is out of range"),
        ([0, 1, -1], "entry -1 is out of range"),
        ([0, 1, 2.0], "must be integers"),
    ],
)
def test_bad_ready_order_is_rejected_with_one_line_message(order, match):
    with pytest.raises(ValueError, match=match) as err:
        ddp_buckets(mib_params(1, 1, 1), ready_order=order)
    assert "\n" not in str(err.value)


def test_empty_parameter_list_is_rejected():
    with pytest.raises(ValueError, match="at least one parameter"):
        ddp_buckets([])


def test_bucket_is_frozen_and_strict():
    bucket = ddp_buckets(mib_params(1))[0]
    with pytest.raises(ValueError):
        bucket.index = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        Bucket(index=0, param_indices=[0], size_bytes=4, dtype="float32", cap_bytes=4, extra=1)  # type: ignore[call-arg]


def test_buckets_to_json():
    buckets = ddp_buckets(mib_params(1, 3, 0.5, 0.5, 1, 1), ready_order=range(6), bucket_cap_mb=2)
    assert buckets_to_json(buckets) == {
        "buckets": [
            {"size_bytes": 4 * MiB, "param_indices": [0, 1]},
            {"size_bytes": 2 * MiB, "param_indices": [2, 3, 4]},
            {"size_bytes": 1 * MiB, "param_indices": [5]},
        ]
    }


# ----------------------------------------------------------------------------------- properties
DTYPES = ["float32", "bfloat16", "float16", "float64"]


@st.composite
def bucketing_inputs(draw):
    num = draw(st.integers(1, 40))
    params = [
        ParameterSpec(
            name=f"p{i}",
            numel=draw(st.integers(1, 2 * MiB)),
            dtype=draw(st.sampled_from(DTYPES)),
        )
        for i in range(num)
    ]
    order = draw(st.none() | st.permutations(range(num)))
    cap = draw(st.none() | st.floats(0.01, 30.0))
    return params, order, cap


def _bytes(p: ParameterSpec) -> int:
    return p.numel * dtype_bytes(p.dtype)


@settings(max_examples=300, deadline=None)
@given(bucketing_inputs())
def test_buckets_conserve_bytes_and_cover_each_parameter_once(inputs):
    params, order, cap = inputs
    buckets = ddp_buckets(params, order, cap)
    covered = [i for b in buckets for i in b.param_indices]
    assert sorted(covered) == list(range(len(params)))
    assert sum(b.size_bytes for b in buckets) == sum(_bytes(p) for p in params)
    for b in buckets:
        assert b.size_bytes == sum(_bytes(params[i]) for i in b.param_indices)
    assert [b.index for b in buckets] == list(range(len(buckets)))


@settings(max_examples=300, deadline=None)
@given(bucketing_inputs())
def test_no_bucket_mixes_dtypes_and_ready_order_is_kept_per_dtype(inputs):
    params, order, cap = inputs
    order = list(range(len(params) - 1, -1, -1)) if order is None else list(order)
    buckets = ddp_buckets(params, order, cap)
    for b in buckets:
        assert {params[i].dtype for i in b.param_indices} == {b.dtype}
    for dtype in DTYPES:
        laid_out = [i for b in buckets if b.dtype == dtype for i in b.param_indices]
        assert laid_out == [i for i in order if params[i].dtype == dtype]


@settings(max_examples=300, deadline=None)
@given(bucketing_inputs())
def test_every_bucket_but_the_last_of_its_dtype_reaches_its_cap_as_late_as_possible(inputs):
    params, order, cap = inputs
    first_cap, cap_bytes = bucket_size_limits(cap)
    buckets = ddp_buckets(params, order, cap)
    for dtype in DTYPES:
        mine = [b for b in buckets if b.dtype == dtype]
        for k, b in enumerate(mine):
            assert b.cap_bytes == (first_cap if k == 0 else cap_bytes)
            if k < len(mine) - 1:
                assert b.size_bytes >= b.cap_bytes
            # it closes with the parameter that reaches the cap, not later
            assert b.size_bytes - _bytes(params[b.param_indices[-1]]) < b.cap_bytes
    # partial buckets (at most one per dtype) come after every full one
    full = [b.size_bytes >= b.cap_bytes for b in buckets]
    assert full == sorted(full, reverse=True)


@settings(max_examples=200, deadline=None)
@given(bucketing_inputs(), st.sampled_from(DTYPES), st.data())
def test_one_dtype_shortcut_equals_the_per_dtype_walk(inputs, dtype, data):
    """One dtype takes bucket_assignment's single-accumulator loop; the same dtype spelt two ways ("torch.x" and
    "x", one key in torch) takes the per-dtype walk: both give the same buckets."""
    params, order, cap = inputs
    if data.draw(st.booleans()):  # sizes that fill a bucket exactly: the cap's ">=" is exercised
        params = [p.model_copy(update={"numel": data.draw(st.sampled_from([MiB // 8, MiB // 4, MiB // 2]))})
                  for p in params]
        cap = data.draw(st.sampled_from([None, 1, 2]))
    one = [p.model_copy(update={"dtype": dtype}) for p in params]
    rest = max(0, len(params) - 2)  # both spellings appear once there are two parameters
    spelt = [True, False, *data.draw(st.lists(st.booleans(), min_size=rest, max_size=rest))][:len(params)]
    two = [p.model_copy(update={"dtype": f"torch.{dtype}" if s else dtype}) for p, s in zip(one, spelt, strict=True)]
    assert bucket_assignment(one, order, cap) == bucket_assignment(two, order, cap)


@settings(max_examples=200, deadline=None)
@given(bucketing_inputs())
def test_assign_in_order_is_bucket_assignment_without_the_check(inputs):
    """The engine's path (an order already checked) gives bucket_assignment's buckets, one dtype or several."""
    params, order, cap = inputs
    order = list(range(len(params) - 1, -1, -1)) if order is None else order
    assert assign_in_order(params, order, cap) == bucket_assignment(params, order, cap)


def test_stage_buckets_check_an_order_of_another_length():
    """stage_gradient_buckets trusts a full-length order only: a shorter one is refused, as bucket_assignment
    refuses it, not bucketed without the parameters it leaves out."""
    from scenarios import base_scenario

    from simddp.errors import ScenarioError
    from simddp.scenario_io import scenario_from_dict
    from simddp.workload import Param, build_workload
    from simddp.zero import stage_gradient_buckets, zero_rule

    scenario = scenario_from_dict(base_scenario())
    workload = build_workload(scenario)
    grads = [Param(f"p{i}", MiB, "float32") for i in range(3)]
    with pytest.raises(ScenarioError, match="must list each of the 3 parameters once"):
        stage_gradient_buckets(zero_rule(scenario), workload, 0, [0, 1, 2], grads, [2, 1], ())
