"""The memory verdict, said first: does the layout fit on the GPU, and by how much it misses.

A step that cannot run still gets simulated (the planner wants to see what the layout would cost), but
every report opens with the verdict and marks the rest as hypothetical: the CLI's first line, the JSON's
top-level ``fits`` and ``memory_bytes``, the dashboard's banner.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp.memory import MemoryBreakdown
from simddp.units import GiB, fmt_bytes

HYPOTHETICAL = ("Hypothetical: the figures below are what this layout would cost if it fitted; "
                "`simddp memory --fit-layout` finds layouts that do.")


class MemoryVerdict(BaseModel):
    """Peak memory per GPU (the most loaded one) against the GPU's capacity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fits: bool = Field(description="The peak fits in the GPU's memory.")
    memory_bytes: int = Field(ge=0, description="Peak memory of the most loaded GPU, bytes.")
    capacity_bytes: int = Field(gt=0, description="Memory of one GPU, bytes.")

    @classmethod
    def of(cls, memory: MemoryBreakdown) -> MemoryVerdict:
        """The layout's verdict: its most loaded stage's, whichever stage ``memory`` reports (``--stage``)."""
        peak = max(memory.stage_total_bytes, default=memory.total_bytes)
        return cls(fits=peak <= memory.capacity_bytes, memory_bytes=peak, capacity_bytes=memory.capacity_bytes)

    @classmethod
    def of_stage(cls, memory: MemoryBreakdown) -> MemoryVerdict:
        """The verdict of the stage ``memory`` reports (the layout's, unless ``--stage`` chose a lighter one)."""
        return cls(fits=memory.fits, memory_bytes=memory.total_bytes, capacity_bytes=memory.capacity_bytes)

    @property
    def over_bytes(self) -> int:
        """Bytes beyond capacity (0 when it fits)."""
        return max(0, self.memory_bytes - self.capacity_bytes)

    def headline(self) -> str:
        """'DOES NOT FIT: needs 134.9 GiB per GPU, 40.0 GiB available (94.9 GiB over)', or 'fits: ...'."""
        need = f"needs {self.memory_bytes / GiB:.1f} GiB per GPU, {self.capacity_bytes / GiB:.1f} GiB available"
        if self.fits:
            return f"fits: {need} ({(self.capacity_bytes - self.memory_bytes) / GiB:.1f} GiB headroom)"
        return f"DOES NOT FIT: {need} ({self.over_bytes / GiB:.1f} GiB over)"

    def short(self) -> str:
        """The verdict beside a memory figure: 'fits, 19.43 GiB headroom (24% of 79.65 GiB)' or 'does not fit:
        79.65 GiB available, 44.70 GiB over'."""
        cap = fmt_bytes(self.capacity_bytes)
        if self.fits:
            headroom = self.capacity_bytes - self.memory_bytes
            return f"fits, {fmt_bytes(headroom)} headroom ({headroom / self.capacity_bytes:.0%} of {cap})"
        return f"DOES NOT FIT: {cap} available, {fmt_bytes(self.over_bytes)} over"


def verdict_json(memory: MemoryBreakdown | None) -> dict[str, Any]:
    """The top-level JSON keys: ``fits`` and ``memory_bytes`` (null when memory is not modelled), capacity."""
    if memory is None:
        return {"fits": None, "memory_bytes": None, "capacity_bytes": None}
    return MemoryVerdict.of(memory).model_dump()


__all__ = ["HYPOTHETICAL", "MemoryVerdict", "verdict_json"]
