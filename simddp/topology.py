"""Placement of parallel groups on nodes, and which link tiers a group's collectives cross.

Ranks are laid out as Megatron-LM does by default (tensor-parallel fastest, then data-parallel, then
pipeline): global rank = tp_rank + tp * (dp_rank + dp * pp_rank). Consecutive global ranks share a node.
All groups of one kind communicate at the same time, so a group gets its share of the node's NICs:
``ranks_per_node / gpus_per_node`` of the node's network bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from simddp.config import Cluster, CollectiveFit, Link, Network, Scenario


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

    @property
    def intra_bus_bandwidth_bytes_per_s(self) -> float:
        """Per-rank bandwidth a ring sustains inside a node."""
        return self.intra.bus_bandwidth_bytes_per_s

    @property
    def inter_bus_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth a ring crossing nodes sustains at each node boundary: this group's NIC share."""
        return self.ranks_per_node * self.inter.node_bandwidth_bytes_per_s / self.gpus_per_node

    @property
    def inter_rank_bandwidth_bytes_per_s(self) -> float:
        """Network bandwidth of one rank when every GPU of the node uses the network at once."""
        return self.inter.node_bandwidth_bytes_per_s / self.gpus_per_node


def group(cluster: Cluster, num_ranks: int, stride: int = 1) -> CommGroup:
    """A group of ``num_ranks`` ranks ``stride`` apart in global rank order."""
    per_node_slots = max(1, cluster.gpus_per_node // stride) if stride <= cluster.gpus_per_node else 1
    ranks_per_node = min(num_ranks, per_node_slots)
    num_nodes = -(-num_ranks // ranks_per_node)
    return CommGroup(
        num_ranks=num_ranks,
        num_nodes=num_nodes,
        ranks_per_node=ranks_per_node,
        gpus_per_node=cluster.gpus_per_node,
        intra=cluster.intra_node,
        inter=cluster.inter_node,
        fits=tuple(cluster.collective_fits),
    )


def dp_group(scenario: Scenario) -> CommGroup:
    """The data-parallel group of one (tp, pp) coordinate."""
    return group(scenario.cluster, scenario.dp, stride=scenario.parallelism.tp)


def tp_group(scenario: Scenario) -> CommGroup:
    """The tensor-parallel group (always inside one node, see config validation)."""
    return group(scenario.cluster, scenario.parallelism.tp, stride=1)


def world_group(cluster: Cluster, num_nodes: int | None = None) -> CommGroup:
    """All GPUs of ``num_nodes`` nodes (default: the whole cluster)."""
    nodes = num_nodes or cluster.num_nodes
    return group(cluster, nodes * cluster.gpus_per_node)


__all__ = ["CommGroup", "Link", "Network", "dp_group", "group", "tp_group", "world_group"]
