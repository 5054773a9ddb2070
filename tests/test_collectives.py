"""Collective cost model: hand-derived alpha-beta cases, NCCL tuner structure, properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios import base_scenario

from simddp.collectives import (
    BUSBW_FACTOR,
    OPS,
    collective_cost,
    hierarchical_all_reduce_s,
    ring_s,
    tree_all_reduce_s,
)
from simddp.config import Cluster, CollectiveFit, Link, Network, Scenario
from simddp.sim.plan import boundary_group, boundary_groups
from simddp.topology import (
    CommGroup,
    group,
    pp_boundaries_crossing_nodes,
    pp_boundary_crosses_nodes,
    pp_boundary_group,
    world_group,
)
from simddp.units import GB, MS, US, GiB, MiB


def _group(n: int = 8, nodes: int = 1, bw: float = 100 * GB, lat: float = 2 * US, net_lat: float = 10 * US,
           nvls: float | None = None, gpus_per_node: int | None = None) -> CommGroup:
    link = Link(kind="nvlink", latency_s=lat, bandwidth_bytes_per_s=bw, efficiency=1.0, nvls_algbw_bytes_per_s=nvls)
    net = Network(kind="infiniband", nics_per_node=8, nic_bandwidth_bytes_per_s=bw / 2, latency_s=net_lat,
                  efficiency=1.0)
    per_node = n // nodes
    return CommGroup(num_ranks=n, num_nodes=nodes, ranks_per_node=per_node,
                     gpus_per_node=gpus_per_node or per_node, intra=link, inter=net)


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
    with pytest.raises(ValueError, match="nvls runs"):
        collective_cost("broadcast", 10, _group(nvls=200 * GB), "nvls")
    with pytest.raises(ValueError, match="IB SHARP"):
        collective_cost("reduce-scatter", 10, _group(16, 2, nvls=200 * GB), "nvls")


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


# --- issue 9, item 3: the collective model's corrections ------------------------------------------------
def test_link_latency_moves_every_protocol() -> None:
    # A 1 ms NVLink hop: NCCL's LL / LL128 hops keep their ratio to the ring/Simple hop (0.6/3.4, 1.9/3.4),
    # so an 8-rank ring all-reduce's 14 hops cost 14 x 1 ms x ratio on top of the base latency.
    slow = _group(lat=1 * MS)
    for proto, ratio, base_us in (("LL", 0.6 / 3.4, 6.6), ("LL128", 1.9 / 3.4, 14.0), ("Simple", 1.0, 8.4)):
        cost = collective_cost("all-reduce", 2**20, slow, "ring", proto)  # type: ignore[arg-type]
        assert cost.latency_s == pytest.approx(base_us * US + 14 * 1 * MS * ratio, rel=1e-12)
    # Tree and NVLS hops scale too, intra and inter: twice the link latencies, twice the hop part.
    fast, double = _group(32, 4, lat=2 * US), _group(32, 4, lat=4 * US, net_lat=20 * US)
    for proto in ("LL", "LL128", "Simple"):
        a = collective_cost("all-reduce", 8, fast, "tree", proto).latency_s  # type: ignore[arg-type]
        b = collective_cost("all-reduce", 8, double, "tree", proto).latency_s  # type: ignore[arg-type]
        base = {"LL": 6.8, "LL128": 14.0, "Simple": 0.0}[proto] * US
        assert b - base == pytest.approx(2 * (a - base), rel=1e-12)
    nvls = collective_cost("all-reduce", 2**20, _group(lat=3.4 * US * 10, nvls=200 * GB), "nvls")
    assert nvls.latency_s == pytest.approx(23 * US * 10, rel=1e-12)


def test_nvls_reduce_scatter_and_all_gather_are_half_an_nvls_all_reduce() -> None:
    # NVLS all-reduce = reduce-scatter (multimem ld_reduce) + all-gather (multimem st): S(N+1)/N each way
    # per GPU, so algbw = wire x N/(N+1); reduce-scatter sends S and all-gather receives S: algbw = wire.
    c = Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 1})
    g = world_group(c)
    wire = 275 * GB * 9 / 8
    size = 1 * GiB
    for op in ("reduce-scatter", "all-gather"):
        cost = collective_cost(op, size, g, "nvls")  # type: ignore[arg-type]
        assert (cost.algorithm, cost.protocol) == ("nvls", "Simple")
        assert cost.latency_s == pytest.approx(60 * US, rel=1e-12)
        assert cost.transfer_s == pytest.approx(size / wire, rel=1e-12)
        # At 1 GiB the ring (370 GB/s busbw, (N-1)/N of S each way) beats it, as NCCL's maintainers say.
        assert collective_cost(op, size, g).algorithm == "ring"  # type: ignore[arg-type]
    ar = collective_cost("all-reduce", size, g, "nvls")
    assert ar.transfer_s == pytest.approx(size / (wire * 8 / 9), rel=1e-12)
    # Fewer ranks in the node: algbw = wire x r/(r+1) (4 GPUs: 247.5 GB/s).
    four = group(c, 4)
    assert collective_cost("all-reduce", size, four, "nvls").transfer_s == pytest.approx(size / (wire * 0.8))
    # With NCCL's own NVLS latency (23 us) auto picks NVLS for a mid-size reduce-scatter: one hop beats
    # the ring's 7 steps.
    g23 = world_group(Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 1,
                                             "intra_node": {"nvls_latency_s": 23 * US}}))
    assert collective_cost("reduce-scatter", 4 * MiB, g23).algorithm == "nvls"


def test_ll128_ring_factor_is_0_7_with_one_rank_per_node() -> None:
    # NCCL tuning.cc: busBw * (ppn < 2 ? 0.7 : 0.92) for ring/LL128 (the GPU sends and receives on its NIC).
    size = 2**26
    one = _group(4, 4)  # 4 nodes, 1 rank each: only the network tier, its NIC share 8 x 50 / 1 = 400 GB/s
    cost = collective_cost("all-reduce", size, one, "ring", "LL128")
    assert cost.transfer_s == pytest.approx(2 * 3 / 4 * size / (0.7 * one.inter_bus_bandwidth_bytes_per_s))
    two = _group(8, 4)  # 2 ranks per node keep 0.92 (of the 100 GB/s intra link, the slower tier)
    assert collective_cost("all-reduce", size, two, "ring", "LL128").transfer_s == pytest.approx(
        2 * 7 / 8 * size / (0.92 * 100 * GB))


def test_inter_node_fit_scales_to_the_groups_nic_share() -> None:
    # A world-group fit (8 ranks per node of 8: the whole node's NICs) used by a tp=8 data-parallel group
    # (one rank per node: 1/8 of the NICs) gives that group 1/8 of the fitted bus bandwidth.
    fit = CollectiveFit(op="all-reduce", tier="inter", min_bytes=0, max_bytes=2**34, latency_per_step_s=10 * US,
                        bus_bandwidth_bytes_per_s=178 * GB, measured_ranks=16, ranks_per_node=8, gpus_per_node=8)
    c = Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 4, "collective_fits": [fit.model_dump()],
                                "inter_node": {"nics_per_node": 1, "nic_bandwidth_bytes_per_s": 25 * GB}})
    dp = group(c, 4, stride=8)
    size = 1 * GiB
    cost = collective_cost("all-reduce", size, dp)
    assert cost.algorithm == "measured"
    assert cost.busbw_bytes_per_s == pytest.approx(178 * GB / 8, rel=0.01)
    # A fit measured on one rank per node of 8 (calibration's inter-node group) applies as measured.
    narrow = fit.model_copy(update={"ranks_per_node": 1})
    c1 = c.model_copy(update={"collective_fits": [narrow]})
    assert collective_cost("all-reduce", size, group(c1, 4, stride=8)).busbw_bytes_per_s == pytest.approx(
        178 * GB, rel=0.01)
    with pytest.raises(ValueError, match="ranks_per_node"):
        CollectiveFit(op="all-reduce", tier="inter", min_bytes=0, max_bytes=1, latency_per_step_s=0,
                      bus_bandwidth_bytes_per_s=1, ranks_per_node=8, gpus_per_node=4)


def _pp_scenario(tp: int, dp: int, pp: int, nodes: int) -> Scenario:
    return Scenario.model_validate(base_scenario(
        cluster={"preset": "dgx-a100-80gb", "num_nodes": nodes},
        parallelism={"tp": tp, "dp": dp, "pp": pp}))


def _brute_force_crosses(tp: int, dp: int, stage: int, gpus: int) -> bool:
    span = tp * dp
    return any((a // gpus) != ((a + span) // gpus) for a in range(stage * span, (stage + 1) * span))


def test_pp_boundary_that_straddles_a_node_is_inter_node() -> None:
    # tp=2, dp=2, pp=4 on 2 x 8 GPUs: stages hold ranks 0-3, 4-7 | 8-11, 12-15. The stride (4) is under the
    # 8 GPUs per node, so group(..., stride=4) says intra-node for every boundary, but the 1|2 boundary pairs
    # rank 4 with rank 8 (node 0 -> node 1).
    sc = _pp_scenario(2, 2, 4, 2)
    assert group(sc.cluster, 2, stride=2 * 2).num_nodes == 1
    assert [pp_boundary_group(sc, s).num_nodes for s in range(3)] == [1, 2, 1]
    inter = pp_boundary_group(sc, 1)
    assert (inter.num_ranks, inter.ranks_per_node, inter.gpus_per_node) == (2, 1, 8)
    assert collective_cost("send-recv", 2**24, inter).tier == "inter"
    assert collective_cost("send-recv", 2**24, pp_boundary_group(sc, 0)).tier == "intra"
    # tp=2, dp=3, pp=4 on 3 nodes (stages 0-5, 6-11, 12-17, 18-23): every boundary straddles a node.
    assert [pp_boundary_group(_pp_scenario(2, 3, 4, 3), s).num_nodes for s in range(3)] == [2, 2, 2]
    with pytest.raises(ValueError, match="stage"):
        pp_boundary_group(sc, 3)


@settings(max_examples=200, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 12), pp=st.sampled_from([2, 3, 4, 6]),
       gpus=st.sampled_from([4, 8]))
def test_pp_boundary_closed_form_matches_brute_force(tp: int, dp: int, pp: int, gpus: int) -> None:
    if tp > gpus or (tp * dp * pp) % gpus:
        return
    sc = Scenario.model_validate(base_scenario(
        cluster={"preset": "dgx-a100-80gb", "num_nodes": tp * dp * pp // gpus, "gpus_per_node": gpus},
        model={"preset": "gpt2"}, parallelism={"tp": tp, "dp": dp, "pp": pp}))
    for stage in range(pp - 1):
        assert pp_boundary_crosses_nodes(sc, stage) == _brute_force_crosses(tp, dp, stage, gpus)
    assert pp_boundaries_crossing_nodes(sc) == [pp_boundary_crosses_nodes(sc, s) for s in range(pp - 1)]
    # The plan's boundaries, interleaved (three chunks: the last rank's pairs wrap to the first): each is
    # boundary_group's, and equal pairs are one shared object.
    groups = boundary_groups(sc, 3 * pp - 1)
    assert groups == [boundary_group(sc, vs) for vs in range(3 * pp - 1)]
    assert len({id(g) for g in groups}) == len({(g, vs % pp == pp - 1) for vs, g in enumerate(groups)})


def test_multi_node_nvls_is_nvls_tree_with_log_latency() -> None:
    # DGX H100: NVLS inside each node, a tree over the NICs: latency = NVLS hop (60 us) + 2 log2(N) x 14 us;
    # algbw = min(NVLS intra 275 GB/s, NIC stage: node NICs (8 x 50 x 0.94 = 376 GB/s), halved beyond 2 nodes).
    size = 1 * GiB
    node_bw = 8 * 50 * GB * 0.94
    times = {}
    for nodes in (2, 16, 128):
        g = world_group(Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": nodes}))
        cost = collective_cost("all-reduce", size, g, "nvls")
        assert (cost.algorithm, cost.tier) == ("nvls-tree", "inter")
        assert cost.latency_s == pytest.approx(60 * US + 2 * math.log2(nodes) * 14 * US, rel=1e-12)
        algbw = min(275 * GB, node_bw if nodes == 2 else node_bw / 2)
        assert cost.transfer_s == pytest.approx(size / algbw, rel=1e-12)
        times[nodes] = cost.time_s
    # No longer flat from 16 to 128 nodes: the tree's log2 latency grows (7 x 28 us vs 4 x 28 us).
    assert times[128] - times[16] == pytest.approx(3 * 2 * 14 * US, rel=1e-9)
    # auto picks it at scale (the ring's 2(n-1) hops cost milliseconds there).
    g128 = world_group(Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 128}))
    assert collective_cost("all-reduce", size, g128).algorithm == "nvls-tree"


# --- properties every code path keeps (the simulator shares the transfer part of a link) -----------------
_ALGOS = st.sampled_from(["auto", "ring", "tree", "nvls", "hierarchical"])
_LAYOUTS = st.sampled_from([(8, 1, None), (16, 2, None), (64, 8, None), (4, 4, 8), (8, 4, 8), (32, 4, 8)])


def _cost_or_none(op: str, size: int, g: CommGroup, algo: str):  # type: ignore[no-untyped-def]
    try:
        return collective_cost(op, size, g, algo)  # type: ignore[arg-type]
    except ValueError:
        return None  # an (op, algorithm) pair NCCL does not run


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(OPS), algo=_ALGOS, layout=_LAYOUTS, a=sizes, b=sizes, bw=bandwidths,
       factor=st.floats(1.0, 10.0), nvls=st.sampled_from([None, 150 * GB, 300 * GB]))
def test_latency_within_time_and_monotonic(op: str, algo: str, layout: tuple[int, int, int | None], a: int,
                                           b: int, bw: float, factor: float, nvls: float | None) -> None:
    n, nodes, gpus = layout
    g = _group(n, nodes, bw, nvls=nvls, gpus_per_node=gpus)
    lo, hi = sorted((a, b))
    small, large = _cost_or_none(op, lo, g, algo), _cost_or_none(op, hi, g, algo)
    if small is None or large is None:
        return
    for c in (small, large):
        assert 0.0 <= c.latency_s <= c.time_s
        assert c.tier == ("inter" if nodes > 1 else "intra")
    assert small.time_s <= large.time_s * (1 + 1e-12)
    fast = _cost_or_none(op, hi, _group(n, nodes, bw * factor, nvls=nvls, gpus_per_node=gpus), algo)
    assert fast is not None and fast.time_s <= large.time_s * (1 + 1e-12)


_PRESET_GROUPS = [(preset, ranks, stride) for preset in ("dgx-a100-80gb", "dgx-h100-80gb", "pcie-a100-80gb")
                  for ranks, stride in ((2, 1), (8, 1), (16, 1), (16, 8), (128, 1), (4, 32))]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_PRESET_GROUPS), st.sampled_from(["all-reduce", "reduce-scatter", "all-gather", "broadcast"]),
       st.integers(min_value=0, max_value=10**10))
def test_the_tuner_picks_the_fastest_of_the_algorithms_own_times(where: tuple[str, int, int], op: str,
                                                                 size: int) -> None:
    """best() weighs terms kept per group (its size-free part): its pick's (latency, transfer) must be exactly
    what that algorithm's own function gives at this size, and no allowed algorithm may be faster."""
    from simddp.collectives import PROTOCOLS, _nvls, _ring, _tree, best

    preset, ranks, stride = where
    cluster = Cluster.model_validate({"preset": preset, "num_nodes": 16})
    g = group(cluster, ranks, stride=stride)
    # LL128 only where a node's GPUs talk over NVLink (NCCL's default; see the test below)
    protos = [p for p in PROTOCOLS if p != "LL128" or g.ranks_per_node == 1 or g.intra.kind != "pcie"]
    direct = {("ring", p): _ring(op, size, g, p) for p in protos}  # type: ignore[arg-type]
    if op == "all-reduce":
        direct.update({("tree", p): _tree(size, g, p) for p in protos})  # type: ignore[arg-type]
    nvls = _nvls(op, size, g)
    if math.isfinite(nvls[0]):
        direct[("nvls" if g.num_nodes == 1 else "nvls-tree", "Simple")] = nvls
    cost = best(op, size, g)  # type: ignore[arg-type]
    latency, transfer = direct[(cost.algorithm, cost.protocol)]
    assert cost.latency_s == latency
    assert cost.time_s == latency + transfer
    assert cost.time_s == min(sum(parts) for parts in direct.values())


def test_a_collective_beyond_the_longest_step_is_the_users_error() -> None:
    """A latency of 1e308 s made collectives infinite, and the fluid engine's event loop (ZeRO-3, TP) never
    advanced past them: `simulate` hung. Such a collective is refused where it is costed."""
    import simddp
    from simddp.cli import default_scenario_path
    from simddp.config import ScenarioError, read_mapping

    base = read_mapping(default_scenario_path())
    for extra in ({"parallelism": {"zero_stage": 3}}, {"parallelism": {"zero_stage": 1}}):
        data = {**base, **extra, "cluster": {**base["cluster"], "intra_node": {"latency_s": 1e308}}}
        with pytest.raises(ScenarioError, match=r"would take (inf|nan|[0-9.e+]+) s, beyond the 1e\+09 s .* link "
                                                r"latency or bandwidth"):
            simddp.simulate(data, trace=False)


def test_the_tuner_leaves_ll128_out_on_pcie_nodes_unless_asked_for() -> None:
    """NCCL enables LL128 by default only where a node's GPUs talk over NVLink (tuning.cc: ``pEnable &= typeIntra
    <= PATH_NVB``). Until 2026-11-29 the tuner picked it on PCIe nodes: 512 KiB on 8 PCIe A100 read 98.5 us
    (ring/LL128) for ring/Simple's 133.7 us."""
    pcie = _group()
    pcie = CommGroup(pcie.num_ranks, pcie.num_nodes, pcie.ranks_per_node, pcie.gpus_per_node,
                     pcie.intra.model_copy(update={"kind": "pcie"}), pcie.inter)
    nvlink = _group()
    sizes = [2**k for k in range(3, 31, 2)]
    assert any(collective_cost("all-reduce", s, nvlink).protocol == "LL128" for s in sizes)
    for s in sizes:
        auto = collective_cost("all-reduce", s, pcie)
        assert auto.protocol != "LL128"
        assert auto.time_s == min(collective_cost("all-reduce", s, pcie, protocol=p).time_s for p in ("LL", "Simple"))
    assert collective_cost("all-reduce", 2**19, pcie, protocol="LL128").protocol == "LL128"  # NCCL_PROTO=LL128
    one_per_node = CommGroup(2, 2, 1, 1, pcie.intra, pcie.inter)  # no intra-node hop: LL128 stays a choice
    assert any(collective_cost("all-reduce", s, one_per_node).protocol == "LL128" for s in sizes)


def test_the_data_parallel_group_is_the_most_spread_stage_s() -> None:
    """Stage s's data-parallel ranks are s S + d tp (S = tp dp): with tp 2, dp 3, pp 4 on 8-GPU nodes stage 0's
    {0, 2, 4} fit one node, but stage 1's {6, 8, 10} and stage 2's {12, 14, 16} span two. Every stage reduces at once
    and the step waits for the slowest: the group is the most spread one. Until 2026-11-29 it was stage 0's (a
    25 MiB all-reduce 4.6x faster than across nodes)."""
    from simddp.topology import dp_group

    data = base_scenario()
    data["cluster"]["num_nodes"] = 3
    data["parallelism"] = {"tp": 2, "pp": 4}
    data["training"] = {**data["training"], "global_batch_size": 48, "micro_batch_size": 1}
    scenario = Scenario.model_validate(data)
    assert scenario.dp == 3 and scenario.cluster.gpus_per_node == 8
    g = dp_group(scenario)
    assert (g.num_ranks, g.num_nodes, g.ranks_per_node) == (3, 2, 2)
    one_node = group(scenario.cluster, 3, stride=2)
    assert (one_node.num_nodes, one_node.ranks_per_node) == (1, 3)
    assert collective_cost("all-reduce", 25 * MiB, g).time_s > 3 * collective_cost("all-reduce", 25 * MiB,
                                                                                     one_node).time_s
    # Where every stage starts on a node boundary (S a multiple of G), or with one stage, it is stage 0's.
    for tp, pp, nodes in ((2, 4, 4), (1, 1, 3)):
        data["cluster"]["num_nodes"], data["parallelism"] = nodes, {"tp": tp, "pp": pp}
        data["training"]["global_batch_size"] = 8 * nodes // (tp * pp) * 4
        s = Scenario.model_validate(data)
        assert dp_group(s) == group(s.cluster, s.dp, stride=tp)


def test_a_group_of_one_moves_nothing() -> None:
    """One rank: every collective takes no time, its bus bandwidth is 0 where nccl-tests' factor is (it was inf x 0,
    NaN), and a send to itself costs nothing (it cost a hop, 14.6 us)."""
    g = _group(1, 1)
    for op in OPS:
        cost = collective_cost(op, 2**20, g)
        assert cost.time_s == 0.0 and not math.isnan(cost.busbw_bytes_per_s), op
        if BUSBW_FACTOR[op](1) == 0:
            assert cost.busbw_bytes_per_s == 0.0, op


def test_the_nvls_wire_rate_is_the_measured_node_s_whatever_this_node_s_size() -> None:
    """The H100 preset's NVLS algbw (275 GB/s) was measured over 8 GPUs: its wire rate is 275 x 9/8 = 309.4 GB/s on a
    node of any size. Until 2026-11-29 it was scaled by this node's GPU count: cut to 2 GPUs a node, 412 GB/s, over
    the links' 369 GB/s, and a 2-rank NVLS all-reduce slowed as idle GPUs were added (270.8 -> 203.9 GB/s algbw)."""
    from simddp.collectives import nvls_wire_bytes_per_s

    times = []
    for gpus in (2, 4, 8):
        cluster = Cluster.model_validate({"preset": "dgx-h100-80gb", "num_nodes": 1, "gpus_per_node": gpus})
        pair = group(cluster, 2)
        assert nvls_wire_bytes_per_s(pair) == pytest.approx(275 * GB * 9 / 8, rel=1e-12)
        assert nvls_wire_bytes_per_s(pair) < cluster.intra_node.bandwidth_bytes_per_s * cluster.intra_node.efficiency
        times.append(collective_cost("all-reduce", GiB, pair, "nvls").time_s)
    assert times == pytest.approx([times[0]] * 3, rel=1e-12)
    # A link without the field: measured over every GPU of its own node, as before.
    custom = _group(8, nvls=240 * GB)
    assert nvls_wire_bytes_per_s(custom) == pytest.approx(240 * GB * 9 / 8, rel=1e-12)
