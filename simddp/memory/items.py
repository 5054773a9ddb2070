"""Typed memory results: one line of the breakdown, and the breakdown of the most loaded GPU."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from simddp.units import fmt_bytes

Category = Literal["params", "grads", "optimizer", "activations", "buffers", "overhead"]


class Item(NamedTuple):
    """A line of a stage's breakdown before it is typed: the breakdown sizes every pipeline stage and types the
    lines of the one it reports (:class:`MemoryItem`, validated), not the 64 stages of a 1T model's."""

    category: Category
    name: str
    size_bytes: int
    note: str = ""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryItem(_Frozen):
    """One line of the breakdown."""

    category: Category = Field(description="params, grads, optimizer, activations, buffers or overhead.")
    name: str = Field(description="What the bytes hold.")
    size_bytes: int = Field(ge=0, description="Bytes on the GPU.")
    note: str = Field(default="", description="How the size was obtained.")


class MemoryBreakdown(_Frozen):
    """Peak memory of the most loaded GPU in one training step, by category."""

    scenario: str
    model: str
    gpu: str
    num_gpus: int
    dp: int
    tp: int
    pp: int
    zero_stage: int
    precision: str
    optimizer: str
    recompute: str
    stage: int = Field(description="Pipeline stage of the most loaded GPU (0-based); every rank in it is alike.")
    rank: int = Field(description="Global rank of the first GPU of that stage (tp fastest, then dp, then pp).")
    num_params: int = Field(description="Parameters on this GPU before ZeRO sharding (its tp shard and stage).")
    in_flight_micro_batches: float = Field(description="Micro-batches whose activations the stage holds at peak.")
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int = Field(description="fp32 master weights + optimizer states.")
    activations_bytes: int
    buffers_bytes: int = Field(description="Bucket copies, gathered parameters, pipeline and NCCL buffers.")
    overhead_bytes: int = Field(description="CUDA context and allocator fragmentation.")
    total_bytes: int
    capacity_bytes: int = Field(description="Device memory (cluster.gpu.hbm_bytes).")
    fits: bool = Field(description="total_bytes fits in capacity_bytes: the reported stage's (the layout fits when "
                                   "every stage_total_bytes does; the CLI's top-level fits says that)")
    headroom_bytes: int = Field(description="capacity - total; negative when it does not fit.")
    stage_total_bytes: list[int] = Field(description="Total bytes of each pipeline stage.")
    items: list[MemoryItem]
    notes: list[str] = Field(default_factory=list)

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def verdict(self) -> str:
        """'fits, 12.3 GiB headroom (15% of 79.6 GiB)' or 'does not fit: 3.1 GiB over 79.6 GiB'."""
        cap = fmt_bytes(self.capacity_bytes)
        if self.fits:
            share = self.headroom_bytes / self.capacity_bytes
            return f"fits, {fmt_bytes(self.headroom_bytes)} headroom ({share:.0%} of {cap})"
        return f"does not fit: {fmt_bytes(-self.headroom_bytes)} over {cap}"

    def to_json_dict(self) -> dict[str, Any]:
        """The CLI's ``--json`` form: ``{"memory": {...}}``."""
        return {"memory": self.model_dump()}

    def to_dataframe(self) -> Any:
        """One row per item (pandas, imported lazily: the library does not depend on it)."""
        import pandas as pd

        return pd.DataFrame([i.model_dump() for i in self.items])
