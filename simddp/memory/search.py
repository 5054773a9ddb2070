"""Searches over the memory model: the largest micro-batch that fits, the smallest layout that fits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simddp.config import Scenario, ScenarioError, format_validation_error
from simddp.errors import whole_number
from simddp.limits import MAX_GPUS
from simddp.memory.breakdown import memory_breakdown
from simddp.scenario_io import as_scenario


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


#: Activation recompute, least first: each step trades compute for memory.
RECOMPUTE_ORDER = ("none", "selective", "selective-op", "full")
#: Those the layout search tries (Megatron's three; torchtitan's op-level policy is ranked, not searched).
SEARCHED_RECOMPUTE = ("none", "selective", "full")


class LayoutFit(_Frozen):
    """One parallel layout and whether it fits."""

    zero_stage: int
    tp: int
    pp: int
    dp: int
    sequence_parallel: bool = Field(description="Megatron sequence parallelism (with tp > 1).")
    recompute: str = Field(description="Activation recompute: none, selective, selective-op or full.")
    total_bytes: int
    capacity_bytes: int
    fits: bool

    def label(self) -> str:
        """'ZeRO-3 tp=8 pp=1 dp=8, SP, recompute full'."""
        sp = ", SP" if self.sequence_parallel else ""
        return f"ZeRO-{self.zero_stage} tp={self.tp} pp={self.pp} dp={self.dp}{sp}, recompute {self.recompute}"


class LayoutSearch(_Frozen):
    """Layouts that make a scenario fit on ``num_gpus`` GPUs: ZeRO stage x tp x pp x sequence parallelism x
    recompute, each axis alone from the scenario's layout, the best overall, and every layout evaluated."""

    num_gpus: int
    current: LayoutFit | None = Field(description="The scenario's own layout (null if invalid on num_gpus).")
    smallest_zero_stage: LayoutFit | None = Field(
        description="Lowest ZeRO stage that fits at the same tp, pp, sequence parallelism and recompute.")
    least_recompute: LayoutFit | None = Field(
        description="Least activation recompute that fits at the same ZeRO stage, tp, pp and sequence parallelism.")
    smallest_tp: LayoutFit | None = Field(
        description="Lowest tp that fits at the same ZeRO stage, pp and recompute (sequence parallelism kept "
        "where tp > 1 allows it).")
    smallest_pp: LayoutFit | None = Field(
        description="Lowest pp that fits at the same ZeRO stage, tp, sequence parallelism and recompute.")
    best: LayoutFit | None = Field(
        description="Fitting layout with the least model parallelism (tp x pp), then the least recompute, then "
        "the lowest ZeRO stage, then fewer pipeline stages."
    )
    num_layouts: int = Field(description="Valid layouts evaluated.")
    evaluated: list[LayoutFit] = Field(
        default_factory=list, description="Every valid layout evaluated: fitting ones first, in the order of `best`.")

    def to_json_dict(self) -> dict[str, Any]:
        return {"layout": self.model_dump()}

    def to_dataframe(self) -> Any:
        """One row per evaluated layout (pandas, imported lazily)."""
        import pandas as pd

        return pd.DataFrame([f.model_dump() for f in self.evaluated], columns=list(LayoutFit.model_fields))


def _variant(scenario: Scenario, **sections: dict[str, Any]) -> Scenario:
    """``scenario`` with some section keys replaced, validated again (raises ScenarioError)."""
    data = scenario.model_dump()
    if scenario.model.preset is not None:
        data["model"] = {"preset": scenario.model.preset}  # a preset cannot carry its own expanded keys
    for section, updates in sections.items():
        data[section] = {**data[section], **updates}
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None


def max_micro_batch_that_fits(scenario: Scenario | dict[str, Any] | str | Path, limit: int = 1 << 16) -> int:
    """The largest micro-batch size that fits (0 if none does).

    With a global batch size set, only micro-batches that divide it over dp are tried (the number of
    micro-batches, and with it the pipeline's in-flight activations, follows); without one, a larger
    micro-batch only adds activations, so a binary search up to ``limit`` finds it.
    """
    limit = whole_number("limit", limit)
    scenario = as_scenario(scenario)

    def fits(b: int) -> bool:
        try:
            variant = _variant(scenario, training={"micro_batch_size": b})
            return memory_breakdown(variant).fits
        except ScenarioError:  # e.g. an interleaved schedule needs the micro-batch count to divide by pp, or the
            return False  # micro-batch's memory is beyond the range answered for (simddp.sanity.check_memory)

    gbs = scenario.training.global_batch_size
    if gbs is not None:
        per_rank = gbs // scenario.dp
        for b in sorted((d for d in range(1, min(per_rank, limit) + 1) if per_rank % d == 0), reverse=True):
            if fits(b):
                return b
        return 0
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:  # fits(lo), not fits(hi) (or hi beyond the limit)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in ascending order, from its prime factors (trial division up to sqrt(n)).

    O(sqrt(n)) at worst, a prime: 4,096 steps at the largest ``num_gpus`` (simddp.limits.MAX_GPUS).
    """
    if n < 1:
        raise ValueError(f"{n} has no positive divisors")
    factors: dict[int, int] = {}
    rest, p = n, 2
    while p * p <= rest:
        while rest % p == 0:
            factors[p] = factors.get(p, 0) + 1
            rest //= p
        p += 1 if p == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    divisors = [1]
    for prime, power in factors.items():
        divisors = [d * prime**k for d in divisors for k in range(power + 1)]
    return sorted(divisors)


def smallest_layout_that_fits(scenario: Scenario | dict[str, Any] | str | Path,
                              num_gpus: int | None = None) -> LayoutSearch:
    """Search ZeRO stage x tp x pp x sequence parallelism x recompute on ``num_gpus`` GPUs (default: the
    scenario's) for layouts that fit.

    tp stays inside a node; dp = GPUs / (tp x pp); sequence parallelism is tried on and off where tp > 1;
    recompute none, selective and full for transformers (parameter-list models are not recomputed); the
    schedule is kept; a layout the scenario rules forbid (heads, layers, global batch) is skipped.
    """
    scenario = as_scenario(scenario)
    if num_gpus is not None:
        num_gpus = whole_number("num_gpus", num_gpus)
    cluster = scenario.cluster
    n = num_gpus if num_gpus is not None else cluster.num_gpus
    per_node = cluster.gpus_per_node
    if n <= 0:
        raise ScenarioError(f"num_gpus({n}) must be > 0")
    if n > MAX_GPUS:
        raise ScenarioError(f"num_gpus({n:,}) is over the limit of {MAX_GPUS:,} (simddp.limits.MAX_GPUS)")
    if n % per_node == 0:
        cluster_update: dict[str, Any] = {"num_nodes": n // per_node}
    elif n < per_node and per_node % n == 0:
        cluster_update = {"num_nodes": 1, "gpus_per_node": n}
    else:
        raise ScenarioError(f"num_gpus({n}) is neither a multiple nor a divisor of gpus_per_node({per_node})")
    gpus_per_node = cluster_update.get("gpus_per_node", per_node)
    par, tr = scenario.parallelism, scenario.training
    recomputes = SEARCHED_RECOMPUTE if scenario.model.transformer is not None else (tr.recompute,)

    def evaluate(zero: int, tp: int, pp: int, sp: bool, recompute: str) -> LayoutFit | None:
        parallelism = {"dp": None, "tp": tp, "pp": pp, "zero_stage": zero, "sequence_parallel": sp,
                       "virtual_stages": par.virtual_stages if pp > 1 else 1}
        try:
            variant = _variant(scenario, cluster=cluster_update, parallelism=parallelism,
                               training={"recompute": recompute})
        except ScenarioError:
            return None
        m = memory_breakdown(variant)
        return LayoutFit(zero_stage=zero, tp=tp, pp=pp, dp=variant.dp, sequence_parallel=sp, recompute=recompute,
                         total_bytes=m.total_bytes, capacity_bytes=m.capacity_bytes, fits=m.fits)

    # What the scenario rules refuse is skipped by evaluate (DeepSpeed's ZeRO-2/3 with pipelines, Megatron's
    # ZeRO-2/3); torch's FSDP beside pipelining is tried, as simddp plan tries it (its parameters and gradients
    # stay unsharded across a step's micro-batches: simddp.zero.zero_rule).
    layouts = [(z, tp, pp, sp, rc) for tp in _divisors(gpus_per_node) for pp in _divisors(n // tp) for z in range(4)
               for sp in ((False, True) if tp > 1 else (False,)) for rc in recomputes]
    results = [r for r in (evaluate(*lay) for lay in layouts) if r is not None]

    def preference(r: LayoutFit) -> tuple[int, ...]:
        return (not r.fits, r.tp * r.pp, RECOMPUTE_ORDER.index(r.recompute), r.zero_stage, r.pp,
                r.sequence_parallel != par.sequence_parallel, r.tp)

    ranked = sorted(results, key=preference)

    def first(keep: Callable[[LayoutFit], bool]) -> LayoutFit | None:
        return next((r for r in ranked if r.fits and keep(r)), None)

    sp0 = par.sequence_parallel
    current = next((r for r in results if (r.zero_stage, r.tp, r.pp, r.sequence_parallel, r.recompute)
                    == (par.zero_stage, par.tp, par.pp, sp0, tr.recompute)), None)
    return LayoutSearch(
        num_gpus=n,
        current=current,
        smallest_zero_stage=first(lambda r: (r.tp, r.pp, r.sequence_parallel, r.recompute)
                                  == (par.tp, par.pp, sp0, tr.recompute)),
        least_recompute=first(lambda r: (r.zero_stage, r.tp, r.pp, r.sequence_parallel)
                              == (par.zero_stage, par.tp, par.pp, sp0)),
        smallest_tp=first(lambda r: (r.zero_stage, r.pp, r.recompute, r.sequence_parallel)
                          == (par.zero_stage, par.pp, tr.recompute, sp0 and r.tp > 1)),
        smallest_pp=first(lambda r: (r.zero_stage, r.tp, r.sequence_parallel, r.recompute)
                          == (par.zero_stage, par.tp, sp0, tr.recompute)),
        best=first(lambda r: True),
        num_layouts=len(results),
        evaluated=ranked,
    )
