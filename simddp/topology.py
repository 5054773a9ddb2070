"""Placement of parallel groups on nodes, and which link tiers a group's collectives cross.

Ranks are laid out as Megatron-LM does by default (tensor-parallel fastest, then data-parallel, then
pipeline): global rank = tp_rank + tp * (dp_rank + dp * pp_rank). Consecutive global ranks share a node.
All groups of one kind communicate at the same time, so a group gets its share of the node's NICs:
``ranks_per_node / gpus_per_node`` of the node's network bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simddp.config import MAX_GPUS, Cluster, CollectiveFit, Link, Network, Scenario
from simddp.engine_caches import without_init
from simddp.errors import ScenarioError, whole_number


@dataclass(frozen=True)
class CommGroup:
    """A communicator: its size, how it spreads over nodes, and the link tiers it uses."""

    num_ranks: int
    num_nodes: int
    ranks_per_node: int
    gpus_per_node: int
    intra: Link
    inter: Network
    fits: tuple[CollectiveFit, ...] = ()

    def __hash__(self) -> int:
        """The group's shape, not its link tiers: a group keys the collective costs' caches, and hashing its
        pydantic links cost 9,500 instructions a group (10 groups per GPT-3 step). Equal groups have equal
        shapes, so it agrees with ``==``; groups of one shape over other links are told apart by ``==``."""
        return hash((self.num_ranks, self.num_nodes, self.ranks_per_node, self.gpus_per_node))

    @property
    def intra_bus_bandwidth_bytes_per_s(self) -> float:
        """Per-rank bandwidth a ring sustains inside a node."""
        return self.intra.bus_bandwidth_bytes_per_s

    @property
    def inter_bus_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth a ring crossing nodes sustains at each node boundary: this group's NIC share."""
        return self.ranks_per_node * self.inter.node_bandwidth_bytes_per_s / self.gpus_per_node

    @property
    def nic_share(self) -> float:
        """Share of each node's NICs this group crosses nodes on (its ranks per node over the node's GPUs)."""
        return self.ranks_per_node / self.gpus_per_node

    @property
    def inter_rank_bandwidth_bytes_per_s(self) -> float:
        """Network bandwidth of one rank when every GPU of the node uses the network at once."""
        return self.inter.node_bandwidth_bytes_per_s / self.gpus_per_node


def group(cluster: Cluster, num_ranks: int, stride: int = 1) -> CommGroup:
    """A group of ``num_ranks`` ranks ``stride`` apart in global rank order (whole numbers: ``num_ranks`` from 1 to
    :data:`simddp.config.MAX_GPUS`, ``stride`` from 1; a group of 0 or -3 ranks gave a ZeroDivisionError and a
    negative collective time, and is a :class:`ScenarioError` now)."""
    if type(num_ranks) is not int or type(stride) is not int or not 1 <= num_ranks <= MAX_GPUS or stride < 1:
        num_ranks, stride = _group_counts(num_ranks, stride)  # the engine's own calls never come here
    per_node_slots = max(1, cluster.gpus_per_node // stride) if stride <= cluster.gpus_per_node else 1
    ranks_per_node = min(num_ranks, per_node_slots)
    num_nodes = -(-num_ranks // ranks_per_node)
    return _make(cluster, num_ranks, num_nodes, ranks_per_node)


def _group_counts(num_ranks: object, stride: object) -> tuple[int, int]:
    """:func:`group`'s counts as ints (a numpy integer is one), else a :class:`ScenarioError` naming the bad one."""
    ranks = whole_number("group: num_ranks", num_ranks)
    if ranks > MAX_GPUS:
        raise ScenarioError(f"group: num_ranks({num_ranks!r}) must be at most {MAX_GPUS:,} (simddp.config.MAX_GPUS)")
    return ranks, whole_number("group: stride", stride)


def _make(cluster: Cluster, num_ranks: int, num_nodes: int, ranks_per_node: int) -> CommGroup:
    """The :class:`CommGroup` its constructor would make (:func:`simddp.engine_caches.without_init`)."""
    return without_init(CommGroup, {
        "num_ranks": num_ranks, "num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
        "gpus_per_node": cluster.gpus_per_node, "intra": cluster.intra_node, "inter": cluster.inter_node,
        "fits": tuple(cluster.collective_fits)})


def dp_group(scenario: Scenario) -> CommGroup:
    """The data-parallel group of one (tp, pp) coordinate: of the pipeline stages' groups, the one spread over the
    most nodes (then with the fewest ranks on its fullest node, as :func:`group` counts a node's ranks). Stage s's
    group of tp coordinate t holds the global ranks s S + t + d tp, d < dp, S = tp dp (Megatron's order: tp
    fastest, then dp, then pp); where S is not a multiple of the GPUs per node G, a stage after the first can start
    inside a node and straddle it, though stage 0's group fits in one. Every stage reduces at once and the step
    waits for the slowest, so every rank is timed over the slowest stage's group. Until 2026-11-29 it was stage
    0's (tp 2, dp 3, pp 4 on 8-GPU nodes: stages 1 and 2 span two nodes; a 25 MiB all-reduce read 173 us for
    789 us)."""
    par, cluster = scenario.parallelism, scenario.cluster
    tp, dp, gpus = par.tp, scenario.dp, cluster.gpus_per_node
    first = group(cluster, dp, stride=tp)
    span = tp * dp
    if par.pp == 1 or span % gpus == 0 or gpus % tp:  # every stage starts on a node boundary (or tp spans nodes)
        return first
    worst = (first.num_nodes, -first.ranks_per_node)
    # Stage offsets s S mod G repeat every G / gcd(S, G) stages. tp divides G, so tp coordinate 0 stands for all.
    for stage in range(1, min(par.pp, gpus // math.gcd(span, gpus))):
        lo, hi = stage * span, (stage + 1) * span  # the stage's ranks [lo, hi), its group every tp-th
        nodes = range(lo // gpus, (hi - 1) // gpus + 1)
        most = max((min(hi, (k + 1) * gpus) - max(lo, k * gpus)) // tp for k in nodes)
        worst = max(worst, (len(nodes), -most))
    if worst == (first.num_nodes, -first.ranks_per_node):
        return first
    return _make(cluster, dp, worst[0], -worst[1])


def tp_group(scenario: Scenario) -> CommGroup:
    """The tensor-parallel group (always inside one node, see config validation)."""
    return group(scenario.cluster, scenario.parallelism.tp, stride=1)


def pp_boundary_crosses_nodes(scenario: Scenario, stage: int) -> bool:
    """Whether any (tp, dp) pair of the boundary between pipeline stages ``stage`` and ``stage + 1`` crosses
    a node.

    The two stages hold the consecutive global ranks [stage x S, (stage + 2) x S), S = tp x dp, and the pair
    of a (tp, dp) coordinate is (a, a + S). A node boundary k x G inside that span splits some pair: the
    one with a = max(stage x S, k x G - S). So the boundary crosses nodes exactly when the span does.
    """
    pp = scenario.parallelism.pp
    if not 0 <= stage < pp - 1:
        raise ValueError(f"stage({stage}) must be in 0..{pp - 2}: pp({pp}) has {pp - 1} stage boundaries")
    return _span_crosses(stage, stage + 1, scenario.parallelism.tp * scenario.dp, scenario.cluster.gpus_per_node)


def pp_boundaries_crossing_nodes(scenario: Scenario) -> list[bool]:
    """:func:`pp_boundary_crosses_nodes` of every stage boundary, ``0 .. pp - 2``."""
    span, gpus = scenario.parallelism.tp * scenario.dp, scenario.cluster.gpus_per_node
    return [_span_crosses(stage, stage + 1, span, gpus) for stage in range(scenario.parallelism.pp - 1)]


def _span_crosses(first: int, last: int, span: int, gpus: int) -> bool:
    """Whether global ranks [first x span, (last + 1) x span), pipeline stages ``first`` to ``last``, lie on more
    than one node of ``gpus`` GPUs."""
    return first * span // gpus != ((last + 1) * span - 1) // gpus


def _pair(cluster: Cluster, crosses: bool) -> CommGroup:
    """Two ranks: on two nodes where ``crosses``, else on one."""
    return _make(cluster, 2, 2, 1) if crosses else _make(cluster, 2, 1, 2)


def pp_boundary_group(scenario: Scenario, stage: int) -> CommGroup:
    """The send/recv pair between pipeline stages ``stage`` and ``stage + 1``.

    Inter-node when any (tp, dp) pair of the boundary crosses a node: all pairs exchange activations at once
    and the slowest replica gates the data-parallel step, so one pair on the network sets the boundary's
    time. :func:`group` with a stride decides by the stride alone (intra-node whenever stride < GPUs per
    node), which misses boundaries that straddle a node.
    """
    return _pair(scenario.cluster, pp_boundary_crosses_nodes(scenario, stage))


def stage_pair_group(scenario: Scenario, first: int, last: int) -> CommGroup:
    """The pairs of ranks of one (tp, dp) coordinate in pipeline stages ``first`` < ``last`` (the tied
    embedding's all-reduce pairs stage 0 with the last): inter-node when any pair crosses a node. The pair of
    coordinate ``a`` is (first x S + a, last x S + a), S = tp x dp; their spans cover the ranks [first x S,
    (last + 1) x S), so some pair crosses a node boundary exactly when that span does (:func:`_span_crosses`'s
    argument). :func:`group` with the pair's stride would call any stride over half a node inter-node (the
    first and last of 4 stages on one 4-GPU node: 3.9x the NVLink time)."""
    return _pair(scenario.cluster, _span_crosses(first, last, scenario.parallelism.tp * scenario.dp,
                                                 scenario.cluster.gpus_per_node))


def world_group(cluster: Cluster, num_nodes: int | None = None) -> CommGroup:
    """All GPUs of ``num_nodes`` nodes (default: the whole cluster)."""
    nodes = num_nodes or cluster.num_nodes
    return group(cluster, nodes * cluster.gpus_per_node)


__all__ = [
    "CommGroup",
    "Link",
    "Network",
    "dp_group",
    "group",
    "pp_boundaries_crossing_nodes",
    "pp_boundary_crosses_nodes",
    "pp_boundary_group",
    "stage_pair_group",
    "tp_group",
    "world_group",
]
