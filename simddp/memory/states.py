"""Model states per GPU: parameters, gradients, master weights and optimizer states under ZeRO.

Model states (Rajbhandari et al., SC'20, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", sec. 3.1 and 5). With Ψ parameters on a GPU, mixed precision keeps a 16-bit working copy (2Ψ), its
16-bit gradient (2Ψ) and K = 12 bytes per parameter of fp32 master weight, Adam momentum and variance. ZeRO
shards over the Nd data-parallel ranks: stage 1 the K bytes (4Ψ + 12Ψ/Nd), stage 2 the gradients too
(2Ψ + 14Ψ/Nd), stage 3 everything (16Ψ/Nd). fp32 training keeps 4 + 4 + 8 (no master copy). SGD keeps
nothing beyond the master copy, SGD with momentum one fp32 buffer, Adafactor (Shazeer and Stern, 2018)
factored second moments: r + c values for an r x c matrix, taken as 2 sqrt(n) for a tensor of n elements
(square) and n for tensors smaller than that. A parameter list's own dtype is honoured: fp32 parameters
under mixed precision (torch.autocast) keep 4 + 4 bytes and no master copy, the same 16 bytes with Adam.
``ddp.reduce_in_fp32`` (Megatron's fp32 main grads) makes gradients 4 bytes. PyTorch FSDP maps onto the
same model: NO_SHARD = stage 0, SHARD_GRAD_OP = stage 2, FULL_SHARD = stage 3 (its fp32 sharded parameters,
gradients and Adam states are 4 + 4 + 8 = 16Ψ/Nd, the same total).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from simddp.bucketing import PARAM_SIZE, ParamLike
from simddp.config import ParameterSpec
from simddp.units import dtype_bytes
from simddp.workload import PRECISION_ACT_BYTES, PRECISION_PARAM_DTYPE

#: PyTorch FSDP sharding strategies as ZeRO stages (Zhao et al., VLDB'23, "PyTorch FSDP", sec. 3).
FSDP_SHARDING_ZERO_STAGE: dict[str, int] = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}

#: fp32 optimizer-state bytes per parameter besides the master weights (None: Adafactor, per tensor).
OPTIMIZER_STATE_BYTES_PER_PARAM: dict[str, int | None] = {
    "adamw": 8,  # exp_avg + exp_avg_sq
    "adam": 8,
    "sgd": 0,
    "sgd-momentum": 4,  # momentum_buffer
    "adafactor": None,  # factored second moment, no first moment (beta1 = None, the default)
}

_FP32_BYTES = 4


class ModelStatesBytes(NamedTuple):
    """Model-state bytes on one GPU after ZeRO sharding."""

    params_bytes: int
    grads_bytes: int
    master_bytes: int
    optimizer_state_bytes: int

    @property
    def optimizer_bytes(self) -> int:
        """Master weights + optimizer states (the ZeRO paper's K bytes per parameter)."""
        return self.master_bytes + self.optimizer_state_bytes

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _optimizer_state_numel(optimizer: str, numel: int) -> int:
    per_param = OPTIMIZER_STATE_BYTES_PER_PARAM[optimizer]
    if per_param is not None:
        return per_param * numel // _FP32_BYTES
    if numel <= 0:  # an empty tensor-parallel slice (a vocabulary smaller than tp) holds no state
        return 0
    return min(numel, 2 * math.isqrt(numel - 1) + 2)  # r + c of a square matrix, ceil(sqrt(n)) each


def model_states_bytes(
    params: Iterable[ParamLike],
    precision: str,
    optimizer: str,
    zero_stage: int = 0,
    dp: int = 1,
    reduce_in_fp32: bool = False,
) -> ModelStatesBytes:
    """Parameters, gradients, master weights and optimizer states of ``params`` on one of ``dp`` ranks.

    ZeRO shards flat buffers by element, so a shard is ``ceil(bytes / dp)`` (Rajbhandari et al., SC'20).
    """
    return model_states_of_sizes(param_size_counts(params), precision, optimizer, zero_stage, dp, reduce_in_fp32)


def param_size_counts(params: Iterable[ParamLike]) -> tuple[tuple[tuple[int, str], int], ...]:
    """How many of ``params`` have each (elements, dtype), in order of first appearance: all
    :func:`model_states_of_sizes` reads of them (a block's parameters repeat once per block)."""
    return tuple(Counter(map(PARAM_SIZE, params)).items())


def model_states_of_sizes(
    counts: Iterable[tuple[tuple[int, str], int]],
    precision: str,
    optimizer: str,
    zero_stage: int = 0,
    dp: int = 1,
    reduce_in_fp32: bool = False,
    optimizer_counts: Iterable[tuple[tuple[int, str], int]] | None = None,
) -> ModelStatesBytes:
    """:func:`model_states_bytes` of parameters given as :func:`param_size_counts`; with ``optimizer_counts``
    (ZeRO-1's partition of whole tensors, :func:`simddp.zero.zero_redundancy_share`), the master weights and
    optimizer states are those parameters' own, not an even 1/dp share."""
    if precision not in PRECISION_ACT_BYTES:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_ACT_BYTES)}")
    if optimizer not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(OPTIMIZER_STATE_BYTES_PER_PARAM)}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage({zero_stage}) must be 0, 1, 2 or 3")
    if dp < 1:
        raise ValueError(f"dp({dp}) must be >= 1")
    p_bytes = g_bytes = master = state = 0
    # Integer sums, so parameters of one size and dtype (every block's) are counted together.
    for (numel, dtype), count in counts:
        width = dtype_bytes(dtype)
        p_bytes += count * numel * width
        g_bytes += count * numel * (max(width, _FP32_BYTES) if reduce_in_fp32 else width)
        if precision != "fp32" and width < _FP32_BYTES:
            master += count * numel * _FP32_BYTES
        state += count * _optimizer_state_numel(optimizer, numel) * _FP32_BYTES

    def shard(num_bytes: int, sharded: bool) -> int:
        return -(-num_bytes // dp) if sharded else num_bytes

    if optimizer_counts is not None:
        own = model_states_of_sizes(optimizer_counts, precision, optimizer, 0, 1, reduce_in_fp32)
        return ModelStatesBytes(params_bytes=shard(p_bytes, zero_stage >= 3),
                                grads_bytes=shard(g_bytes, zero_stage >= 2), master_bytes=own.master_bytes,
                                optimizer_state_bytes=own.optimizer_state_bytes)

    return ModelStatesBytes(
        params_bytes=shard(p_bytes, zero_stage >= 3),
        grads_bytes=shard(g_bytes, zero_stage >= 2),
        master_bytes=shard(master, zero_stage >= 1),
        optimizer_state_bytes=shard(state, zero_stage >= 1),
    )


def zero_model_states_bytes(
    num_params: int, dp: int, zero_stage: int, precision: str = "bf16-mixed", optimizer: str = "adamw"
) -> ModelStatesBytes:
    """Model states of Ψ = ``num_params`` parameters in the training precision's dtype (the ZeRO formulas)."""
    if num_params <= 0:
        raise ValueError(f"num_params({num_params}) must be > 0")
    if precision not in PRECISION_PARAM_DTYPE:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_PARAM_DTYPE)}")
    param = ParameterSpec(name="params", numel=num_params, dtype=PRECISION_PARAM_DTYPE[precision])
    return model_states_bytes([param], precision, optimizer, zero_stage, dp)

