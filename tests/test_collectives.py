"""Collective cost model: hand-derived alpha-beta cases, NCCL tuner structure, properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simddp.collectives import (
    BUSBW_FACTOR,
    collective_cost,
    hierarchical_all_reduce_s,
    ring_s,
    tree_all_reduce_s,
)
from simddp.config import Cluster, Link, Network
from simddp.topology import CommGroup, group, world_group
from simddp.units import GB, US


def _group(n: int = 8, nodes: int = 1, bw: float = 100 * GB, lat: float = 2 * US) -> CommGroup:
    link = Link(kind="nvlink", latency_s=lat, bandwidth_bytes_per_s=bw, efficiency=1.0)
    net = Network(kind="infiniband", nics_per_node=8, nic_bandwidth_bytes_per_s=bw / 2, latency_s=10 * US,
                  efficiency=1.0)
    return CommGroup(num_ranks=n, num_nodes=nodes, ranks_per_node=n // nodes, gpus_per_node=n // nodes,
                     intra=link, inter=net)


def test_ring_all_reduce_hand_derived_single_node() -> None:
    # 8 ranks, Simple: baseLat 8.4 us + 2*7 steps * 2 us; data 2*7/8 * 1 GB / 100 GB/s.
    g = _group()
    size = 10**9
    expected = 8.4 * US + 14 * 2 * US + 2 * 7 / 8 * size / (100 * GB)
    assert ring_s("all-reduce", size, g, "Simple") == pytest.approx(expected, rel=1e-12)


def test_ring_multi_node_uses_net_hops_and_plateau() -> None:
    # 16 ranks on 2 nodes: 30 steps, 2 of them over the network; busbw = min(100, 8 NICs*50/8*8 = 400)=100.
    g = _group(16, 2)
    size = 2**30
    lat = (8.4 * US + 28 * 2 * US + 2 * 10 * US) * 1.4
    expected = lat + 2 * 15 / 16 * size / (100 * GB)
    assert ring_s("all-reduce", size, g, "Simple") == pytest.approx(expected, rel=1e-12)


def test_network_bottleneck_is_the_nic_share() -> None:
    # 4 NICs x 12.5 GB/s shared by 8 GPUs per node: a cross-node ring runs at 50 GB/s.
    c = Cluster.model_validate({"preset": "aws-p4d-24xlarge", "num_nodes": 4,
                                "inter_node": {"efficiency": 1.0}})
    g = world_group(c)
    assert g.inter_bus_bandwidth_bytes_per_s == pytest.approx(50 * GB)
    big = collective_cost("all-reduce", 8 * 2**30, g, "ring")
    assert big.busbw_bytes_per_s == pytest.approx(50 * GB, rel=0.01)


def test_tree_uses_half_busbw_and_log_latency() -> None:
    g = _group(32, 4)
    size = 2**20
    lat = 0.0 + 2 * (7 * 2 * US * 28 / 3.4 + 2 * 10 * US * 28 / 14)
    expected = lat + size / (0.5 * 0.92 * 100 * GB)
    assert tree_all_reduce_s(size, g, "Simple") == pytest.approx(expected, rel=1e-12)


def test_busbw_factors_match_nccl_tests() -> None:
    assert BUSBW_FACTOR["all-reduce"](8) == pytest.approx(1.75)
    assert BUSBW_FACTOR["all-gather"](8) == pytest.approx(0.875)
    assert BUSBW_FACTOR["reduce-scatter"](4) == pytest.approx(0.75)
    assert BUSBW_FACTOR["broadcast"](8) == 1.0


def test_auto_is_the_fastest_candidate() -> None:
    c = Cluster.model_validate({"preset": "dgx-a100-80gb", "num_nodes": 16})
    g = world_group(c)
    for size in (8, 2**16, 2**22, 2**28, 2**33):
        auto = collective_cost("all-reduce", size, g)
        for algo in ("ring", "tree"):
            assert auto.time_s <= collective_cost("all-reduce", size, g, algo).time_s
    # Small messages at scale favour the tree (log latency), large ones the ring (bandwidth).
    assert collective_cost("all-reduce", 8, g).algorithm == "tree"
    assert collective_cost("all-reduce", 2**33, g).algorithm == "ring"


def test_single_rank_and_empty_messages_cost_nothing() -> None:
    g = _group(1, 1)
    assert collective_cost("all-reduce", 2**20, g).time_s == 0.0
    assert collective_cost("all-gather", 0, _group()).time_s == 0.0


def test_hierarchical_decomposes() -> None:
    # 2 nodes x 8: intra reduce-scatter + all-gather of S over 8 ranks, inter all-reduce of S/8 over the
    # 2 nodes (one rank per node, its NIC share), each part the fastest NCCL choice.
    from simddp.collectives import best

    g = _group(16, 2)
    size = 2**28
    local = CommGroup(8, 1, 8, 8, g.intra, g.inter)
    across = CommGroup(2, 2, 1, 8, g.intra, g.inter)
    expected = 2 * best("reduce-scatter", size, local).time_s + best(
        "all-reduce", size // 8, across, allow_nvls=False
    ).time_s
    assert hierarchical_all_reduce_s(size, g) == pytest.approx(expected, rel=1e-12)
    assert collective_cost("all-reduce", size, g, "hierarchical").time_s == pytest.approx(expected, rel=1e-12)
    # Across nodes each rank only has its share of the NICs: 50 GB/s x 8 / 8.
    assert across.inter_bus_bandwidth_bytes_per_s == pytest.approx(50 * GB)


def test_group_placement_strides_by_tp() -> None:
    c = Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 4})
    dp = group(c, 8, stride=4)  # dp=8 with tp=4: 2 dp ranks per node
    assert (dp.ranks_per_node, dp.num_nodes) == (2, 4)
    assert dp.inter_bus_bandwidth_bytes_per_s == pytest.approx(c.inter_node.node_bandwidth_bytes_per_s / 4)


def test_invalid_requests() -> None:
    g = _group()
    with pytest.raises(ValueError, match="size_bytes"):
        collective_cost("all-reduce", -1, g)
    with pytest.raises(ValueError, match="tree is an all-reduce algorithm"):
        collective_cost("all-gather", 10, g, "tree")
    with pytest.raises(ValueError, match="nvls needs"):
        collective_cost("all-reduce", 10, g, "nvls")


sizes = st.integers(min_value=1, max_value=2**34)
bandwidths = st.floats(min_value=1 * GB, max_value=1000 * GB)
ops = st.sampled_from(["all-reduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all", "send-recv"])


@settings(max_examples=200, deadline=None)
@given(size=sizes, bw=bandwidths, factor=st.floats(1.0, 10.0), nodes=st.sampled_from([1, 2, 4, 16]), op=ops)
def test_more_bandwidth_never_slower(size: int, bw: float, factor: float, nodes: int, op: str) -> None:
    slow = collective_cost(op, size, _group(8 * nodes, nodes, bw))  # type: ignore[arg-type]
    fast = collective_cost(op, size, _group(8 * nodes, nodes, bw * factor))  # type: ignore[arg-type]
    assert fast.time_s <= slow.time_s * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(a=sizes, b=sizes, nodes=st.sampled_from([1, 2, 8]), op=ops)
def test_bigger_messages_never_faster(a: int, b: int, nodes: int, op: str) -> None:
    g = _group(8 * nodes, nodes)
    lo, hi = sorted((a, b))
    assert collective_cost(op, lo, g).time_s <= collective_cost(op, hi, g).time_s * (1 + 1e-12)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(size=sizes, lat=st.floats(0, 50e-6), extra=st.floats(0, 50e-6))
def test_more_latency_never_faster(size: int, lat: float, extra: float) -> None:
    assert collective_cost("all-reduce", size, _group(lat=lat)).time_s <= collective_cost(
        "all-reduce", size, _group(lat=lat + extra)
    ).time_s * (1 + 1e-12)


def test_busbw_never_exceeds_link_for_rings() -> None:
    g = _group(64, 8)
    for size in (2**20, 2**26, 2**32):
        c = collective_cost("all-reduce", size, g, "ring")
        assert c.busbw_bytes_per_s <= 100 * GB + 1
        assert math.isfinite(c.time_s)
