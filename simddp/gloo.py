"""Cost of a collective on torch.distributed's gloo backend when the tensors live on GPUs.

``ProcessGroupGloo`` has no GPU transport of its own: for CUDA tensors its work objects
(``AsyncAllreduceCUDAWork`` and friends in ``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``) copy the
tensor into pinned host memory, run gloo's CPU algorithm over its TCP pairs, and copy the result back. So,
unlike NCCL, it never uses NVLink inside a node, never reads GPU memory from the NIC, and its reductions run on
the CPU. The model, per collective on a group of n ranks:

* device -> host copy, then host -> device copy: ``size / host_copy_bandwidth`` each (PCIe);
* gloo's ring (``gloo::allreduce``: reduce-scatter then all-gather of n segments, 2(n-1) steps; reduce-scatter
  and all-gather n-1 steps; a broadcast or reduce, a chain of n-1 steps): per step ``latency_s``, and the
  bytes a rank sends at one TCP stream's rate, ``bandwidth_bytes_per_s``, capped across nodes by the group's
  share of the NICs at the network's measured efficiency;
* no SM time: the copies run on copy engines and the ring on the CPU, so compute does not slow down beside it
  (``CollectiveCost.sm_interference`` is False).

The constants (:class:`simddp.config.GlooTransport`) come from published gloo benchmarks over TCP and the
gloo calibration of this repository's CPU machine (see their descriptions).
"""

from __future__ import annotations

from simddp.collectives import BUSBW_FACTOR, CollectiveCost, Op, checked_cost
from simddp.config import GlooTransport
from simddp.topology import CommGroup

#: Ring steps of gloo's algorithm for each collective on n ranks.
_STEPS = {
    "all-reduce": lambda n: 2 * (n - 1),
    "reduce-scatter": lambda n: n - 1,
    "all-gather": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
    "reduce": lambda n: n - 1,
}


def gloo_bandwidth_bytes_per_s(group: CommGroup, transport: GlooTransport) -> float:
    """Bytes/s of one rank's TCP ring: a stream's rate, or less where the group shares a node's NICs."""
    bw = transport.bandwidth_bytes_per_s
    if group.num_nodes > 1:
        bw = min(bw, group.inter_bus_bandwidth_bytes_per_s)
    return bw


def gloo_cost(op: Op, size_bytes: int, group: CommGroup, transport: GlooTransport) -> CollectiveCost:
    """Time of ``op`` on ``size_bytes`` of GPU tensors over ``group`` with the gloo backend."""
    if op not in _STEPS:
        raise ValueError(f"gloo collective {op!r} is not modelled; valid: {', '.join(_STEPS)}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes({size_bytes}) must be >= 0")
    n = group.num_ranks
    if n < 2 or size_bytes == 0:
        return CollectiveCost(op, size_bytes, n, "gloo-ring", "tcp", 0.0, 0.0, _tier(group), sm_interference=False)
    latency = _STEPS[op](n) * transport.latency_s
    wire = BUSBW_FACTOR[op](n) * size_bytes / gloo_bandwidth_bytes_per_s(group, transport)
    staging = 2 * size_bytes / transport.host_copy_bandwidth_bytes_per_s
    return checked_cost(CollectiveCost(op, size_bytes, n, "gloo-ring", "tcp", latency + wire + staging, latency,
                                       _tier(group), sm_interference=False))


def _tier(group: CommGroup) -> str:
    return "inter" if group.num_nodes > 1 else "intra"


__all__ = ["gloo_bandwidth_bytes_per_s", "gloo_cost"]
