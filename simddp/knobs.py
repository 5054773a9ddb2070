"""What each DDP knob a user toggles costs in this scenario (``simddp knobs``).

Each row simulates the scenario with one setting changed, by its scenario key (torch's own names), and
says which part of the step moved. The costs are those of :mod:`simddp.sim` (see docs/ddp_knobs.md):

* ``ddp.find_unused_parameters``: the autograd-graph search after each reducing forward (host time), the
  used-parameter map all-reduced after the last bucket, and buckets kept in reverse definition order;
* ``ddp.static_graph``: none of that after the first iteration;
* ``training.grad_clip_norm``: a pass over the gradients, the norm's all-reduces, a scaling pass;
* ``ddp.backend: gloo``: gradients staged through host memory, reduced over TCP on the CPU;
* ``ddp.wrapper: dataparallel``: one process on one node (compared with DDP on that node);
* the one-time parameter broadcast of DDP's constructor, which a run pays once (:func:`simddp.run.startup_time`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp.config import Scenario, ScenarioError, deep_merge
from simddp.results import BREAKDOWN_PARTS, StepResult
from simddp.sanity import check_range
from simddp.scenario_io import scenario_from_dict


class KnobRow(BaseModel):
    """One setting against the scenario as given (or against DDP on one node, for DataParallel)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str = Field(description="Scenario keys changed.")
    setting: str = Field(description="What they were set to.")
    step_time_s: float | None = Field(description="Simulated step, s; null when the setting does not apply.")
    baseline_s: float | None = Field(description="The step it is compared with, s.")
    delta_s: float | None = Field(description="step - baseline, s.")
    moved: str = Field(default="", description="The breakdown parts that changed most.")
    note: str = Field(default="", description="Why it does not apply, or what it is compared with.")


class KnobTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str
    baseline_s: float
    startup_broadcast_s: float = Field(description="DDP's one-time parameter broadcast from rank 0, s.")
    rows: list[KnobRow]

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.model_dump() for r in self.rows])


#: (knob label, setting label, scenario override)
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ddp.find_unused_parameters", "true", {"ddp": {"find_unused_parameters": True, "static_graph": False}}),
    ("ddp.static_graph", "true", {"ddp": {"static_graph": True, "find_unused_parameters": False}}),
    ("ddp.find_unused_parameters + static_graph", "true, true",
     {"ddp": {"find_unused_parameters": True, "static_graph": True}}),
    ("training.grad_clip_norm", "1.0", {"training": {"grad_clip_norm": 1.0}}),
    ("ddp.backend", "gloo", {"ddp": {"backend": "gloo"}}),
)


def _moved(new: StepResult, base: StepResult) -> str:
    diffs = [(new.part(k) - base.part(k), k) for k in BREAKDOWN_PARTS]
    diffs = [(d, k) for d, k in diffs if abs(d) > 1e-6 * max(base.step_time_s, 1e-12)]
    diffs.sort(key=lambda x: -abs(x[0]))
    return ", ".join(f"{BREAKDOWN_PARTS[k][0]} {d * 1e3:+.3g} ms" for d, k in diffs[:3])


def _variant(data: dict[str, Any], override: dict[str, Any]) -> Scenario:
    merged = deep_merge(data, override)
    merged["name"] = None
    return scenario_from_dict(merged)


def knob_table(scenario: Scenario) -> KnobTable:
    """Simulate every knob against ``scenario``."""
    from simddp.run import startup_time
    from simddp.sim import simulate_step
    from simddp.sweeps import scenario_to_dict

    data = scenario_to_dict(scenario)
    base = simulate_step(scenario, trace=False)
    check_range(base.step_time_s)  # the bound `simulate` keeps to (simddp.sanity)
    rows = []
    for knob, setting, override in VARIANTS:
        try:
            variant = _variant(data, override)
        except ScenarioError as err:
            rows.append(KnobRow(knob=knob, setting=setting, step_time_s=None, baseline_s=base.step_time_s,
                                delta_s=None, note=f"does not apply: {err}"))
            continue
        try:  # a knob that alone takes a collective or the step out of range is listed, not timed
            new = simulate_step(variant, trace=False)
            check_range(new.step_time_s, "its step")
        except ScenarioError as err:
            rows.append(_untimed(knob, setting, err, base.step_time_s))
            continue
        rows.append(KnobRow(knob=knob, setting=setting, step_time_s=new.step_time_s, baseline_s=base.step_time_s,
                            delta_s=new.step_time_s - base.step_time_s, moved=_moved(new, base),
                            note="; ".join(n for n in new.not_modelled if n not in base.not_modelled)))
    rows.append(_dataparallel_row(data))
    return KnobTable(scenario=scenario.name, baseline_s=base.step_time_s, startup_broadcast_s=startup_time(scenario),
                     rows=rows)


def _untimed(knob: str, setting: str, err: ScenarioError, baseline_s: float | None) -> KnobRow:
    """A knob whose step (or one of its collectives) is beyond what the model answers for
    (:data:`simddp.sanity.MAX_STEP_TIME_S`): listed with why, not timed."""
    return KnobRow(knob=knob, setting=setting, step_time_s=None, baseline_s=baseline_s, delta_s=None,
                   note=f"not timed: {err}")


def _dataparallel_row(data: dict[str, Any]) -> KnobRow:
    """DataParallel against DDP, both on one node of the scenario's GPUs (DataParallel cannot span nodes)."""
    from simddp.sim import simulate_step
    from simddp.sweeps import with_values

    knob, setting = "ddp.wrapper", "dataparallel (one node)"
    try:
        one_node = with_values(data, {"cluster.num_nodes": 1})
        ddp = _variant(one_node, {"ddp": {"wrapper": "ddp"}})
        dpar = _variant(one_node, {"ddp": {"wrapper": "dataparallel"}})
    except ScenarioError as err:
        return KnobRow(knob=knob, setting=setting, step_time_s=None, baseline_s=None, delta_s=None,
                       note=f"does not apply: {err}")
    try:
        a, b = simulate_step(ddp, trace=False), simulate_step(dpar, trace=False)
        check_range(max(a.step_time_s, b.step_time_s), "its step")
    except ScenarioError as err:
        return _untimed(knob, setting, err, None)
    return KnobRow(knob=knob, setting=setting, step_time_s=b.step_time_s, baseline_s=a.step_time_s,
                   delta_s=b.step_time_s - a.step_time_s, moved=_moved(b, a),
                   note=f"against DDP on one node of the same GPUs ({ddp.cluster.num_gpus} GPUs)")


__all__ = ["VARIANTS", "KnobRow", "KnobTable", "knob_table"]
