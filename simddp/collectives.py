"""Cost of collectives: ring, double binary tree, NVLS, NVLS-tree and hierarchical algorithms, alpha-beta.

The model is NCCL's own tuning model (NVIDIA/nccl ``src/graph/tuning.cc`` @ b6475625, NCCL 2.20.3), driven
by the link parameters of the scenario instead of NCCL's hard-coded ones:

* time = latency + bytes / algbw, where algbw = busbw x (nRanks / nsteps) for rings and 0.5 x busbw for
  trees (``ncclTopoTuneModel``: ``ratio``).
* busbw = the slowest tier the collective crosses: the intra-node ring bandwidth, or the group's share of
  the node's NICs; then NCCL's protocol factors: ring LL 1/4 (all-reduce) or 1/3, ring LL128 0.92
  (120/128) with >= 2 ranks per node and 0.7 with one (``ppn < 2``: the GPU sends and receives through its
  NIC); tree x0.92, tree LL 1/3.8, tree LL128 x7/9 (one node) or x120/128.
* ring latency = baseLat + (nsteps - nInterSteps) x intraLat + nInterSteps x interLat (x1.4 for
  multi-node Simple all-reduce, NCCL's "plateau effect" on Ampere and newer);
  tree latency = baseLat + 2 x ((ranksPerNode - 1) x intraLat + log2(nNodes) x interLat).
* Per-hop latencies: a link's ``latency_s`` is NCCL's ring/Simple ``hwLat`` for its tier (NVLink 3.4 us,
  PCIe 5.7 us, NET 14 us); every other algorithm and protocol on that tier (LL, LL128, tree, NVLS) keeps
  NCCL's ratio to it (``HW_LAT_US`` below), so a slower fabric slows every protocol alike.
* NVLS (NVLink SHARP, one node). NCCL's NVLS all-reduce is a reduce-scatter through the switch (``multimem
  ld_reduce``) followed by an all-gather (``multimem st``) (``src/device/all_reduce.h``: scatter, "Reduce
  through NVLS", broadcast through NVLS, gather; ``reduce_scatter.h`` runs the first half alone). Per GPU
  and per direction the reduce-scatter moves S one way and S/N the other, the all-gather the mirror image
  (S. Jeaugey, NVIDIA/nccl#1083, #1506), so the pipelined all-reduce moves S(N+1)/N each way:
  algbw = wire x N/(N+1) (NVIDIA/nccl-tests#239). ``nvls_algbw_bytes_per_s`` (measured on a full node of
  G GPUs) gives the wire rate, algbw x (G+1)/G; reduce-scatter and all-gather then run at algbw = wire
  (slower than a ring at large sizes, as NCCL's maintainers say, but one hop of latency).
* NVLS-tree (all-reduce across nodes, NCCL's ``NVLS_TREE``): NVLS inside each node, and a tree over the
  NICs between nodes; each of the r ranks of a node heads 1/r of the data on its own NIC share. Between two
  nodes the tree is a pairwise exchange (S/r each way per NIC); beyond, a double binary tree (2S/r each
  way), as NCCL's tuner takes ``bwInter`` (two nodes) or ``bwInter/2``. The stages are pipelined:
  algbw = min(intra NVLS, NIC stage); latency = NVLS hop + 2 x log2(nNodes) x NET NVLSTree hop. NVLS (not
  tree) across nodes and NVLS reduce-scatter / all-gather across nodes need IB SHARP (CollNet), which simddp
  does not model.

``auto`` picks the fastest (algorithm, protocol) pair, as NCCL's tuner does. Hierarchical all-reduce
(intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather; Horovod / torch 2D style) is
available by name but, like in NCCL, never picked by ``auto``.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, reduce-scatter and
all-gather (n-1)/n, all-to-all (n-1)/n, broadcast, reduce and send/recv 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from simddp.engine_caches import cached, without_init
from simddp.errors import ScenarioError
from simddp.limits import MAX_MESSAGE_BYTES
from simddp.sanity import SIZE_CAUSE, check_range
from simddp.topology import CommGroup
from simddp.units import US

Op = Literal["all-reduce", "reduce-scatter", "all-gather", "broadcast", "reduce", "all-to-all", "send-recv"]
OPS: tuple[Op, ...] = (
    "all-reduce",
    "reduce-scatter",
    "all-gather",
    "broadcast",
    "reduce",
    "all-to-all",
    "send-recv",
)
AlgorithmName = Literal["auto", "ring", "tree", "nvls", "hierarchical"]
ALGORITHMS: tuple[AlgorithmName, ...] = ("auto", "ring", "tree", "nvls", "hierarchical")
Protocol = Literal["LL", "LL128", "Simple"]
PROTOCOLS: tuple[Protocol, ...] = ("LL", "LL128", "Simple")
#: Collectives NCCL 2.20's tuner allows on NVLS (tuning.cc: reduce-scatter and all-gather skip every
#: algorithm but ring, NVLS and CollNet-direct).
NVLS_OPS: tuple[Op, ...] = ("all-reduce", "reduce-scatter", "all-gather")

# NCCL tuning.cc (b6475625, 2.20.3): baseLat[algo][proto] and hwLat[tier][algo][proto], microseconds.
BASE_LAT_US: dict[str, dict[Protocol, float]] = {
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 0.0},
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
    "nvls_tree": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
}
HW_LAT_US: dict[str, dict[str, dict[Protocol, float]]] = {
    "nvlink": {
        "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 28.0},
        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
        "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 23.0},
        "nvls_tree": {"LL": 0.0, "LL128": 0.0, "Simple": 23.0},
    },
    "pcie": {
        "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 28.0},
        "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
        "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
        "nvls_tree": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
    },
    "net": {
        "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 28.0},
        "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
        "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 18.0},  # NVLS over IB SHARP: not modelled
        "nvls_tree": {"LL": 0.0, "LL128": 0.0, "Simple": 14.0},
    },
}
RING_MULTINODE_SIMPLE_PLATEAU = 1.4
#: Ring LL128 bandwidth factor (tuning.cc): 120/128 with >= 2 ranks per node, 0.7 with one.
LL128_RING_FACTOR = 0.92
LL128_RING_FACTOR_ONE_PER_NODE = 0.7

BUSBW_FACTOR = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send-recv": lambda n: 1.0,
}


@dataclass(frozen=True)
class CollectiveCost:
    """Time of one collective and the nccl-tests bandwidths it implies.

    ``time_s`` = ``latency_s`` (hops, fixed) + the transfer, which occupies the link ``tier`` that bounds it
    ("intra": NVLink/PCIe; "inter": the GPU's share of the NICs); the simulator shares that part of a link
    between collectives in flight at the same time. ``sm_interference``: whether compute slows while it runs
    (NCCL kernels occupy SMs; a collective staged through host memory does not).
    """

    op: str
    size_bytes: int
    num_ranks: int
    algorithm: str
    protocol: str
    time_s: float
    latency_s: float = 0.0
    tier: str = "intra"
    sm_interference: bool = True  # NCCL's kernels take SMs; gloo's host-staged work (simddp.gloo) does not

    @property
    def transfer_s(self) -> float:
        return self.time_s - self.latency_s

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.size_bytes / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw_bytes_per_s(self) -> float:
        factor = BUSBW_FACTOR[self.op](self.num_ranks)
        # nccl-tests' factor is 0 for one rank (nothing crosses a link), and so is the bus bandwidth (inf x 0 was NaN)
        return self.algbw_bytes_per_s * factor if factor else 0.0


def _hop_latency_s(group: CommGroup, tier: str, algo: str, proto: Protocol) -> float:
    """Per-hop latency of ``algo``/``proto`` on ``tier`` ('intra' or 'inter').

    NCCL's table value scaled by the link's ``latency_s`` over NCCL's ring/Simple hop for that tier, so
    the link's latency (which a calibration can fit, or a user can raise) moves every algorithm and
    protocol and keeps NCCL's ratios between them. The intra-node NVLS hop is the link's own
    ``nvls_latency_s``, scaled the same way.
    """
    kind = group.intra.kind if tier == "intra" else "net"
    latency_s = group.intra.latency_s if tier == "intra" else group.inter.latency_s
    scale = latency_s / (HW_LAT_US[kind]["ring"]["Simple"] * US)
    if tier == "intra" and algo in ("nvls", "nvls_tree"):
        return group.intra.nvls_latency_s * scale
    return HW_LAT_US[kind][algo][proto] * US * scale


def _raw_busbw(group: CommGroup) -> float:
    """The slowest tier a group-wide ring crosses."""
    bw = math.inf
    if group.ranks_per_node > 1:
        bw = group.intra_bus_bandwidth_bytes_per_s
    if group.num_nodes > 1:
        bw = min(bw, group.inter_bus_bandwidth_bytes_per_s)
    return bw


def ring_s(op: Op, size_bytes: int, group: CommGroup, proto: Protocol = "Simple") -> float:
    """Ring (or pipelined chain, for broadcast/reduce) collective time."""
    return sum(_ring(op, size_bytes, group, proto))


def _ring(op: Op, size_bytes: int, group: CommGroup, proto: Protocol) -> tuple[float, float]:
    """(latency, transfer) of a ring."""
    if group.num_ranks == 1 or size_bytes == 0:
        return 0.0, 0.0
    latency_s, data, busbw = _ring_terms(op, group, proto)
    return latency_s, data * size_bytes / busbw


def _ring_terms(op: Op, group: CommGroup, proto: Protocol) -> tuple[float, float, float]:
    """A ring's latency, and the data factor and bus bandwidth of its transfer (``data * size / busbw``): what
    does not depend on the size."""
    n = group.num_ranks
    if op == "all-reduce":
        nsteps, inter_steps, data = 2 * (n - 1), 2 * (group.num_nodes - 1), 2 * (n - 1) / n
    elif op in ("reduce-scatter", "all-gather"):
        nsteps, inter_steps, data = n - 1, group.num_nodes - 1, (n - 1) / n
    elif op in ("broadcast", "reduce"):
        nsteps, inter_steps, data = n - 1, group.num_nodes - 1, 1.0
    else:
        raise ValueError(f"ring does not implement {op}")
    latency_s = BASE_LAT_US["ring"][proto] * US
    latency_s += (nsteps - inter_steps) * _hop_latency_s(group, "intra", "ring", proto)
    latency_s += inter_steps * _hop_latency_s(group, "inter", "ring", proto)
    if op == "all-reduce" and proto == "Simple" and group.num_nodes > 1:
        latency_s *= RING_MULTINODE_SIMPLE_PLATEAU
    busbw = _raw_busbw(group)
    if proto == "LL":
        busbw *= 1 / 4 if (group.num_nodes > 1 or op in ("all-reduce", "reduce")) else 1 / 3
    elif proto == "LL128":
        busbw *= LL128_RING_FACTOR if group.ranks_per_node >= 2 else LL128_RING_FACTOR_ONE_PER_NODE
    return latency_s, data, busbw


def tree_all_reduce_s(size_bytes: int, group: CommGroup, proto: Protocol = "Simple") -> float:
    """NCCL double binary tree across nodes with a chain inside each node."""
    return sum(_tree(size_bytes, group, proto))


def _tree(size_bytes: int, group: CommGroup, proto: Protocol) -> tuple[float, float]:
    if group.num_ranks == 1 or size_bytes == 0:
        return 0.0, 0.0
    latency_s, busbw = _tree_terms(group, proto)
    return latency_s, size_bytes / (0.5 * busbw)


def _tree_terms(group: CommGroup, proto: Protocol) -> tuple[float, float]:
    """A tree all-reduce's latency and bus bandwidth (its transfer: ``size / (0.5 busbw)``)."""
    latency_s = BASE_LAT_US["tree"][proto] * US + 2 * (
        (group.ranks_per_node - 1) * _hop_latency_s(group, "intra", "tree", proto)
        + math.log2(group.num_nodes) * _hop_latency_s(group, "inter", "tree", proto)
    )
    busbw = _raw_busbw(group) * 0.92
    if proto == "LL":
        busbw /= 3.8
    elif proto == "LL128":
        busbw *= 7 / 9 if group.num_nodes == 1 else 120 / 128
    return latency_s, busbw


def nvls_all_reduce_s(size_bytes: int, group: CommGroup) -> float:
    """NVLink SHARP all-reduce: NVLS inside one node, NVLS-tree across nodes (Simple protocol only)."""
    return sum(_nvls("all-reduce", size_bytes, group))


def nvls_wire_bytes_per_s(group: CommGroup) -> float | None:
    """Per-GPU NVLink bandwidth, each direction, that NVLS multimem traffic reaches (None: no NVLS).

    A full-node NVLS all-reduce over G GPUs moves S(G+1)/G each way at algbw ``nvls_algbw_bytes_per_s``
    (NVIDIA/nccl-tests#239: algbw = wire x G/(G+1)), G the GPUs it was measured over (``nvls_measured_gpus``, else
    the node's). Until 2026-11-29 G was always the node's: the H100 preset cut to 2 GPUs a node read a wire of
    412 GB/s, over its links' 369, and a 2-rank NVLS all-reduce slowed as idle GPUs were added to the node.
    """
    link = group.intra
    algbw = link.nvls_algbw_bytes_per_s
    if algbw is None:
        return None
    g = link.nvls_measured_gpus or group.gpus_per_node
    return algbw * (g + 1) / g


def _nvls(op: str, size_bytes: int, group: CommGroup) -> tuple[float, float]:
    """(latency, transfer) of NVLS (one node) or NVLS-tree (all-reduce across nodes); inf when unavailable."""
    terms = _nvls_terms(op, group)
    if terms is None:
        return math.inf, math.inf
    if group.num_ranks == 1 or size_bytes == 0:
        return 0.0, 0.0
    return terms[0], size_bytes / terms[1]


def _nvls_terms(op: str, group: CommGroup) -> tuple[float, float] | None:
    """NVLS's latency and algorithm bandwidth (its transfer: ``size / algbw``); None when unavailable."""
    wire = nvls_wire_bytes_per_s(group)
    r, nodes = group.ranks_per_node, group.num_nodes
    if wire is None or r < 2 or op not in NVLS_OPS or (nodes > 1 and op != "all-reduce"):
        return None
    # All-reduce: S(r+1)/r each way per GPU; reduce-scatter sends S, all-gather receives S.
    algbw = wire * r / (r + 1) if op == "all-reduce" else wire
    if nodes == 1:
        return _hop_latency_s(group, "intra", "nvls", "Simple"), algbw
    # NVLS-tree: each GPU heads 1/r of the data over its NIC share; a 2-node tree is a pairwise exchange
    # (S/r each way), a double binary tree moves 2S/r each way (tuning.cc: bwInter vs bwInter/2).
    nic_algbw = group.inter_bus_bandwidth_bytes_per_s / (1 if nodes == 2 else 2)
    latency_s = _hop_latency_s(group, "intra", "nvls_tree", "Simple") + 2 * math.log2(nodes) * _hop_latency_s(
        group, "inter", "nvls_tree", "Simple"
    )
    return latency_s, min(algbw, nic_algbw)


def _subgroup(group: CommGroup, num_ranks: int, num_nodes: int, ranks_per_node: int) -> CommGroup:
    return CommGroup(num_ranks, num_nodes, ranks_per_node, group.gpus_per_node, group.intra, group.inter, group.fits)


def fitted_s(op: str, size_bytes: int, group: CommGroup) -> float | None:
    """Time from a measured fit (calibration), or None when no fit covers this op and tier."""
    parts = _fitted(op, size_bytes, group)
    return None if parts is None else sum(parts)


def _fitted(op: str, size_bytes: int, group: CommGroup) -> tuple[float, float] | None:
    """Time from a measured fit (calibration) for this op on the tier the group crosses, if one covers it.

    The fit's per-step latency and bus bandwidth carry to other world sizes through the ring step count
    and the nccl-tests data factor; this is the extrapolation assumption documented in docs/calibration.md.
    An inter-node fit's bus bandwidth scales with the group's share of the node's NICs over the share it
    was measured with: a tp=8 data-parallel group (one rank per node) gets 1/8 of a world-group fit.
    """
    tier = "inter" if group.num_nodes > 1 else "intra"
    segments = [f for f in group.fits if f.op == op and f.tier == tier]
    if not segments or group.num_ranks == 1:
        return None if not segments else (0.0, 0.0)
    covering = [f for f in segments if f.min_bytes <= size_bytes <= f.max_bytes]
    fit = covering[0] if covering else min(
        segments, key=lambda f: min(abs(size_bytes - f.min_bytes), abs(size_bytes - f.max_bytes))
    )
    n = group.num_ranks
    steps = 2 * (n - 1) if op == "all-reduce" else n - 1
    busbw = fit.bus_bandwidth_bytes_per_s
    if tier == "inter":
        # The fit measured the NIC share of its communicator (ranks_per_node / gpus_per_node of each node's
        # NICs); this group crosses nodes on its own share (topology.CommGroup.inter_bus_bandwidth_bytes_per_s).
        busbw *= group.nic_share / (fit.ranks_per_node / fit.gpus_per_node)
    return steps * fit.latency_per_step_s, size_bytes * BUSBW_FACTOR[op](n) / busbw


def hierarchical_all_reduce_s(size_bytes: int, group: CommGroup) -> float:
    """Intra-node reduce-scatter, inter-node all-reduce of 1/r of the data, intra-node all-gather."""
    return sum(_hierarchical(size_bytes, group))


def _hierarchical(size_bytes: int, group: CommGroup) -> tuple[float, float]:
    r, nodes = group.ranks_per_node, group.num_nodes
    if group.num_ranks == 1 or size_bytes == 0:
        return 0.0, 0.0
    local = _subgroup(group, r, 1, r)
    # Each of the r inter-node groups (one per local rank) runs at the same time on its NIC share.
    across = _subgroup(group, nodes, nodes, 1)
    shard = -(-size_bytes // r)
    intra = best("reduce-scatter", size_bytes, local) if r > 1 else None
    inter = best("all-reduce", shard, across, allow_nvls=False) if nodes > 1 else None
    latency = (2 * intra.latency_s if intra else 0.0) + (inter.latency_s if inter else 0.0)
    total = (2 * intra.time_s if intra else 0.0) + (inter.time_s if inter else 0.0)
    return latency, total - latency


def all_to_all_s(size_bytes: int, group: CommGroup) -> float:
    """Each rank sends size/n to every other rank: intra-node and network parts run side by side."""
    return sum(_all_to_all(size_bytes, group))


def _all_to_all(size_bytes: int, group: CommGroup) -> tuple[float, float]:
    n = group.num_ranks
    if n == 1 or size_bytes == 0:
        return 0.0, 0.0
    r = group.ranks_per_node
    latency_s = BASE_LAT_US["ring"]["Simple"] * US + _hop_latency_s(group, "intra", "ring", "Simple")
    intra_s = (r - 1) / n * size_bytes / group.intra_bus_bandwidth_bytes_per_s if r > 1 else 0.0
    inter_s = 0.0
    if group.num_nodes > 1:
        latency_s += _hop_latency_s(group, "inter", "ring", "Simple")
        inter_s = (n - r) / n * size_bytes / group.inter_rank_bandwidth_bytes_per_s
    return latency_s, max(intra_s, inter_s)


def send_recv_s(size_bytes: int, group: CommGroup) -> float:
    """Point-to-point between the two ranks of ``group`` (inside a node, or across on one NIC)."""
    return sum(_send_recv(size_bytes, group))


def _send_recv(size_bytes: int, group: CommGroup) -> tuple[float, float]:
    if size_bytes == 0 or group.num_ranks == 1:  # a rank sends to itself: nothing moves (it cost a hop, 14.6 us)
        return 0.0, 0.0
    if group.num_nodes == 1:
        bw, lat = group.intra_bus_bandwidth_bytes_per_s, _hop_latency_s(group, "intra", "ring", "Simple")
    else:
        # Every GPU of the node sends at once (pipeline neighbours): each gets its share of the NICs,
        # and never more than one NIC.
        inter = group.inter
        bw = min(inter.nic_bandwidth_bytes_per_s * inter.efficiency, group.inter_rank_bandwidth_bytes_per_s)
        lat = _hop_latency_s(group, "inter", "ring", "Simple")
    return BASE_LAT_US["ring"]["Simple"] * US + lat, size_bytes / bw


def _tier(group: CommGroup) -> str:
    return "inter" if group.num_nodes > 1 else "intra"


def _cost(op: str, size_bytes: int, group: CommGroup, algorithm: str, protocol: str,
          parts: tuple[float, float]) -> CollectiveCost:
    """The :class:`CollectiveCost` its constructor would make (:func:`simddp.engine_caches.without_init`: a GPT-3
    step costs 13 collectives, a sweep's every configuration its own)."""
    latency, transfer = parts
    return without_init(CollectiveCost, {
        "op": op, "size_bytes": size_bytes, "num_ranks": group.num_ranks, "algorithm": algorithm,
        "protocol": protocol, "time_s": latency + transfer, "latency_s": latency, "tier": _tier(group),
        "sm_interference": True})


@cached()
def collective_cost(
    op: Op,
    size_bytes: int,
    group: CommGroup,
    algorithm: AlgorithmName = "auto",
    protocol: Protocol | Literal["auto"] = "auto",
) -> CollectiveCost:
    """Time of ``op`` on ``size_bytes`` (nccl-tests size: the full buffer) over ``group``.

    A collective longer than the longest step answered for (:data:`simddp.sanity.MAX_STEP_TIME_S`, or not finite)
    comes from a link latency or bandwidth out of any physical range: a :class:`ScenarioError` (an infinite
    collective once left the fluid engine's event loop without progress). Arguments that are not what the types
    say (a protocol not in ``PROTOCOLS``, a size that is not a number, no :class:`CommGroup`) are one too."""
    # Checked here, on a cache miss only (the cache answers repeats): arguments the types do not allow are a
    # ScenarioError naming them, and an error inside the cost model stays a bug.
    if not isinstance(group, CommGroup):
        raise ScenarioError(f"collective_cost: group must be a CommGroup (simddp.topology.group), not "
                            f"{type(group).__name__}")
    if algorithm not in _ALGORITHMS:
        raise ScenarioError(f"collective_cost: unknown algorithm {algorithm!r}; valid: {', '.join(_ALGORITHMS)}")
    if protocol not in _PROTOCOLS:
        raise ScenarioError(f"collective_cost: unknown protocol {protocol!r}; valid: {', '.join(_PROTOCOLS)}")
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int | float):
        raise ScenarioError(f"collective_cost: size_bytes must be a number of bytes, not {type(size_bytes).__name__}")
    return checked_cost(_collective_cost(op, size_bytes, group, algorithm, protocol))


_ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)
_PROTOCOLS: tuple[str, ...] = (*get_args(Protocol), "auto")


def chunked_cost(op: Op, size_bytes: int, chunk_bytes: int, group: CommGroup,
                 cost: Callable[[Op, int, CommGroup], CollectiveCost] | None = None) -> CollectiveCost:
    """``op`` on ``size_bytes`` sent as ``chunk_bytes`` chunks and a remainder, one after another (DataParallel's
    coalesced broadcasts, DDP's start-up parameter broadcast): their times and latencies add. The full chunks are
    counted, not listed (a 10^15-element model has 10^8 of them). ``cost`` times one chunk: NCCL's
    :func:`collective_cost`, or the group's backend's (gloo's)."""
    one = cost or collective_cost
    full, rest = divmod(size_bytes, chunk_bytes)
    parts = ([(one(op, chunk_bytes, group), full)] if full else []) + ([(one(op, rest, group), 1)] if rest else [])
    if not parts:
        return one(op, 0, group)
    first = parts[0][0]
    return CollectiveCost(op, size_bytes, group.num_ranks, first.algorithm, first.protocol,
                          sum(c.time_s * k for c, k in parts), sum(c.latency_s * k for c, k in parts), first.tier,
                          first.sm_interference)


class UnsupportedAlgorithm(ScenarioError):
    """An algorithm or protocol asked for that NCCL does not run for this op on this group (tree for a
    reduce-scatter, NVLS without NVSwitch SHARP): the caller's choice, which the plan names (``ddp.algorithm``)."""


_LINKS_CAUSE = "a link latency or bandwidth is out of range (cluster.intra_node, cluster.inter_node, cluster.gloo)"


def checked_cost(cost: CollectiveCost) -> CollectiveCost:
    """``cost``, unless it is beyond :data:`simddp.sanity.MAX_STEP_TIME_S` (see :func:`collective_cost`). Its name
    in the message is made only for a cost refused (formatting it for every one cost 1.4 us each)."""
    check_range(cost.time_s, lambda: f"one {cost.op} of {cost.size_bytes:,} B over {cost.num_ranks:,} ranks",
                _LINKS_CAUSE if cost.size_bytes <= MAX_MESSAGE_BYTES else SIZE_CAUSE)
    return cost


def _collective_cost(op: Op, size_bytes: int, group: CommGroup, algorithm: AlgorithmName,
                     protocol: Protocol | Literal["auto"]) -> CollectiveCost:
    if size_bytes < 0:
        raise ScenarioError(f"size_bytes({size_bytes}) must be >= 0")
    if op not in BUSBW_FACTOR:
        raise ScenarioError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
    if op == "all-to-all":
        return _cost(op, size_bytes, group, "direct", "Simple", _all_to_all(size_bytes, group))
    if op == "send-recv":
        return _cost(op, size_bytes, group, "p2p", "Simple", _send_recv(size_bytes, group))
    measured = _fitted(op, size_bytes, group)
    if measured is not None:
        return _cost(op, size_bytes, group, "measured", "fit", measured)
    if algorithm == "hierarchical":
        if op != "all-reduce":
            raise UnsupportedAlgorithm(f"hierarchical is an all-reduce algorithm, not {op}")
        return _cost(op, size_bytes, group, "hierarchical", "mixed", _hierarchical(size_bytes, group))
    if algorithm == "tree" and op != "all-reduce":
        raise UnsupportedAlgorithm(f"tree is an all-reduce algorithm in NCCL, not {op}")
    if algorithm == "nvls":
        if op not in NVLS_OPS:
            raise UnsupportedAlgorithm(f"nvls runs {', '.join(NVLS_OPS)} in NCCL, not {op}")
        if protocol not in ("auto", "Simple"):
            raise UnsupportedAlgorithm(f"nvls runs only the Simple protocol (got {protocol})")
        if group.intra.nvls_algbw_bytes_per_s is None:
            raise UnsupportedAlgorithm(
                "nvls needs an intra-node link with nvls_algbw_bytes_per_s (NVSwitch with SHARP)")
        if group.ranks_per_node < 2:
            raise UnsupportedAlgorithm(f"nvls needs >= 2 ranks per node (group has {group.ranks_per_node})")
        if group.num_nodes > 1 and op != "all-reduce":
            raise UnsupportedAlgorithm(
                f"nvls {op} across nodes ({group.num_nodes}) needs IB SHARP (CollNet), not modelled")
    return best(op, size_bytes, group, algorithm, protocol)


def best(
    op: Op,
    size_bytes: int,
    group: CommGroup,
    algorithm: AlgorithmName = "auto",
    protocol: Protocol | Literal["auto"] = "auto",
    allow_nvls: bool = True,
) -> CollectiveCost:
    """The fastest (algorithm, protocol) among those allowed, as NCCL's tuner picks."""
    terms = _candidate_terms(op, group, algorithm, protocol, allow_nvls)
    if not terms:
        why = f"no algorithm runs {op} with algorithm={algorithm}, protocol={protocol} on this group"
        if algorithm == "auto" and protocol == "auto":  # nothing was asked for: a bug in the tuner's tables
            raise ValueError(why)
        raise UnsupportedAlgorithm(why)
    if group.num_ranks == 1 or size_bytes == 0:  # nothing to send: every candidate takes 0, the first wins
        name, proto_name = terms[0][:2]
        return _cost(op, size_bytes, group, name, proto_name, (0.0, 0.0))
    # (time, algorithm, protocol, (latency, transfer)) of each candidate; only the fastest becomes a cost.
    candidates: list[tuple[float, str, str, tuple[float, float]]] = []
    for name, proto, latency_s, data, bandwidth in terms:
        # each transfer in its own function's arithmetic (_ring, _tree, _nvls), so times are the same
        parts = (latency_s, (data * size_bytes if data is not None else size_bytes) / bandwidth)
        candidates.append((parts[0] + parts[1], name, proto, parts))
    _, name, proto_name, parts = min(candidates, key=lambda c: c[0])  # the first of equals, as NCCL's tuner
    return _cost(op, size_bytes, group, name, proto_name, parts)


@cached()
def _candidate_terms(op: Op, group: CommGroup, algorithm: AlgorithmName, protocol: Protocol | Literal["auto"],
                     allow_nvls: bool) -> list[tuple[str, str, float, float | None, float]]:
    """What :func:`best` weighs, without the size, once per group and choice: each allowed (algorithm,
    protocol) in the tuner's order, with its latency and the terms of its transfer (``data * size / bandwidth``,
    or ``size / bandwidth`` where ``data`` is None). A collective costs a step one call per distinct size."""
    protos: tuple[Protocol, ...] = PROTOCOLS if protocol == "auto" else (protocol,)
    if protocol == "auto" and group.ranks_per_node > 1 and group.intra.kind == "pcie":
        # NCCL enables LL128 by default only where the GPUs of a node talk over NVLink (tuning.cc: pEnable &=
        # typeIntra <= PATH_NVB; "other cases are not tested and may cause silent data corruption"); NCCL_PROTO
        # can still ask for it (protocol="LL128"). Until 2026-11-29 the tuner here picked it on PCIe nodes (512 KiB
        # on 8 PCIe A100: 98.5 us with ring/LL128 for 133.7 us).
        protos = tuple(p for p in protos if p != "LL128")
    out: list[tuple[str, str, float, float | None, float]] = []
    for proto in protos:
        if algorithm in ("auto", "ring"):
            out.append(("ring", proto, *_ring_terms(op, group, proto)))
        if op == "all-reduce" and algorithm in ("auto", "tree"):
            latency_s, busbw = _tree_terms(group, proto)
            out.append(("tree", proto, latency_s, None, 0.5 * busbw))
    if op in NVLS_OPS and algorithm in ("auto", "nvls") and allow_nvls and protocol in ("auto", "Simple"):
        nvls = _nvls_terms(op, group)
        if nvls is not None:
            out.append(("nvls" if group.num_nodes == 1 else "nvls-tree", "Simple", nvls[0], None, nvls[1]))
    return out


__all__ = [
    "ALGORITHMS",
    "NVLS_OPS",
    "OPS",
    "PROTOCOLS",
    "CollectiveCost",
    "UnsupportedAlgorithm",
    "all_to_all_s",
    "best",
    "checked_cost",
    "chunked_cost",
    "collective_cost",
    "fitted_s",
    "hierarchical_all_reduce_s",
    "nvls_all_reduce_s",
    "nvls_wire_bytes_per_s",
    "ring_s",
    "send_recv_s",
    "tree_all_reduce_s",
]
