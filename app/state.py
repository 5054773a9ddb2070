"""Dashboard state: the scenario being planned (a dict of scenario keys in session state), validation that
reports inline, and cached calls into simddp.

The scenario dict holds what the user chose (presets by name plus their overrides), exactly what the
exported YAML contains; :func:`validate` turns it into a :class:`simddp.Scenario`. Streamlit caching lives
here, keyed by the scenario's JSON, and never in simddp.

The dashboard stays home (docs/safety.md): uploads are parsed in memory, within the caps of
:mod:`simddp.safeio`, and never written to disk; a scenario may not name a file on the server
(``calibration:``), since calibration profiles come only by upload on the Calibration page.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import streamlit as st

import simddp
from simddp import safeio, sweeps
from simddp.cli import default_scenario_path
from simddp.config import read_mapping
from simddp.results import StepResult

SCENARIO_KEY = "scenario"
LAST_VALID_KEY = "last_valid_scenario"
SAVED_KEY = "saved_scenarios"
WIDGET_PREFIX = "w:"  # session-state keys of widgets that mirror the scenario dict


# ------------------------------------------------------------------------------------ scenario dict
def default_scenario_dict() -> dict[str, Any]:
    """The embedded default scenario; it does not pin dp (dp follows the GPUs), so resizing stays valid."""
    return read_mapping(default_scenario_path())


def scenario_dict() -> dict[str, Any]:
    """The current scenario dict (a copy: change it through :func:`set_scenario_dict`)."""
    if SCENARIO_KEY not in st.session_state:
        st.session_state[SCENARIO_KEY] = default_scenario_dict()
    return copy.deepcopy(st.session_state[SCENARIO_KEY])


def set_scenario_dict(data: dict[str, Any]) -> None:
    st.session_state[SCENARIO_KEY] = copy.deepcopy(data)


def replace_scenario(data: dict[str, Any]) -> None:
    """Load a whole new scenario: widgets that mirrored the old one re-read their values."""
    set_scenario_dict(data)
    forget_widgets()


def forget_widgets(prefix: str = WIDGET_PREFIX) -> None:
    for key in [k for k in st.session_state if isinstance(k, str) and k.startswith(prefix)]:
        del st.session_state[key]


def set_path(path: str, value: Any) -> None:
    """Set one dotted key of the scenario dict (``ddp.bucket_cap_mb``)."""
    set_scenario_dict(sweeps.set_value(scenario_dict(), path, value))


def to_json(data: dict[str, Any]) -> str:
    """The cache key of a scenario: canonical JSON."""
    return json.dumps(data, sort_keys=True, default=str)


def to_yaml(data: dict[str, Any]) -> str:
    return safeio.dump_yaml(data, sort_keys=False)


def refuse_server_paths(data: dict[str, Any]) -> None:
    """A dashboard scenario may not name a file on the server: calibration profiles come only by upload."""
    if data.get("calibration") not in (None, ""):
        raise simddp.ScenarioError("calibration: a scenario in the dashboard cannot name a file on the server; "
                                   "upload the profile on the Calibration page and use it in the planner")


def parse_scenario_upload(name: str, content: bytes) -> dict[str, Any]:
    """Scenario keys from an uploaded YAML/JSON file, parsed in memory within simddp's input caps (size, nesting,
    entries, duplicate keys); raises ScenarioError with one line naming the file."""
    data = safeio.parse_mapping(safeio.decode(content, name), name)  # YAML is a superset of JSON
    try:
        refuse_server_paths(data)
        simddp.scenario_from_dict(data)
    except simddp.ScenarioError as err:
        raise simddp.ScenarioError(f"{name}: {err}") from None
    return data


# ------------------------------------------------------------------------------------ validation
def validate(data: dict[str, Any], where: Any = None, show: bool = True) -> simddp.Scenario | None:
    """The validated scenario, or None after showing the one-line error inline (never a traceback)."""
    try:
        refuse_server_paths(data)
        scenario = simddp.scenario_from_dict(data)
    except (simddp.ScenarioError, OSError) as err:
        if show:
            (where or st).error(f"Invalid scenario: {safeio.one_line(err)}", icon=":material/error:")
        return None
    return scenario


def validation_error(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not a valid scenario (None when it is)."""
    try:
        refuse_server_paths(data)
        simddp.scenario_from_dict(data)
    except (simddp.ScenarioError, OSError) as err:
        return str(err)
    return None


def valid_cluster(data: dict[str, Any], where: Any = None) -> Any:
    """The scenario's cluster validated alone (a :class:`simddp.config.Cluster`), or None after showing the
    scenario's one-line error inline."""
    from simddp.config import Cluster

    try:
        return Cluster.model_validate(data.get("cluster") or {})
    except ValueError:
        validate(data, where)
        return None


def current_scenario(where: Any = None) -> simddp.Scenario | None:
    """The planner's scenario validated; the last valid one is kept to seed widgets while it is invalid."""
    scenario = validate(scenario_dict(), where)
    if scenario is not None:
        st.session_state[LAST_VALID_KEY] = scenario
    return scenario


def offer_to_drop(section: str, what: str) -> None:
    """Where the scenario is invalid only because of its ``section`` (a variability mean longer than a sequence
    the planner shortened since, more stragglers than the GPUs left), a button that drops that section: the page
    that sets it stops before its widgets while the scenario is invalid, and only "Reset to default" was left."""
    data = scenario_dict()
    if section not in data:
        return
    rest = {k: v for k, v in data.items() if k != section}
    if validation_error(data) is not None and validation_error(rest) is None:
        st.button(f"Drop the {what} settings (the scenario is valid without them)", key=f"drop_{section}",
                  on_click=replace_scenario, args=(rest,), icon=":material/delete:")


def last_valid_scenario() -> simddp.Scenario:
    if LAST_VALID_KEY not in st.session_state:
        st.session_state[LAST_VALID_KEY] = simddp.scenario_from_dict(default_scenario_dict())
    return st.session_state[LAST_VALID_KEY]


# ------------------------------------------------------------------------------------ cached simddp
@st.cache_data(max_entries=512, show_spinner=False)
def _simulate(scenario_json: str, trace: bool = False) -> StepResult:
    # Without a trace the fast engine answers (simddp.sim.fast: the same numbers, a 512-micro-batch
    # pipeline in about 0.1 s instead of several); the timeline page asks for the trace.
    return simddp.simulate(json.loads(scenario_json), trace=trace)


def perfetto_json(scenario_json: str) -> str:
    """The step's Chrome trace-event JSON (the sidebar's download; runs when clicked, outside the script,
    so it calls no Streamlit command)."""
    result = simddp.simulate(json.loads(scenario_json), trace=True)
    assert result.trace is not None  # trace=True always records one
    return json.dumps(result.trace.to_chrome())


def simulate(data: dict[str, Any], where: Any = None, show: bool = True, trace: bool = False) -> StepResult | None:
    """Simulate a scenario dict (cached by its JSON); errors are shown inline and give None. ``trace`` records
    the timeline (the simpy engine runs every event; only the Timeline page needs it)."""
    from simddp.errors import InternalError
    from simddp.sanity import check_step_result

    if validate(data, where, show) is None:
        return None
    try:
        result = _simulate(to_json(data), trace)
        check_step_result(result)  # finite, and the parts add up: never show a result that fails it
        return result
    except ValueError as err:  # a choice the cost model rejects (NVLS without NVSwitch), a cap, a range
        if show:
            (where or st).error(f"Cannot simulate this scenario: {safeio.one_line(err)}", icon=":material/error:")
    except InternalError as err:
        if show:
            (where or st).error(f"simddp internal error (a bug, please report it): {safeio.one_line(err)}",
                                icon=":material/bug_report:")
    return None


@st.cache_data(max_entries=64, show_spinner="Simulating every GPU count...")
def _scaling(scenario_json: str, batch: str, max_gpus: int) -> sweeps.ScalingSweep:
    data = json.loads(scenario_json)
    per_node = simddp.scenario_from_dict(data).cluster.gpus_per_node
    return sweeps.scaling_sweep(data, sweeps.default_gpu_counts(per_node, max_gpus), batch=batch)  # type: ignore[arg-type]


def scaling_sweep(data: dict[str, Any], batch: str = "weak", max_gpus: int = 2048) -> sweeps.ScalingSweep | None:
    if validate(data) is None:
        return None
    return _scaling(to_json(data), batch, max_gpus)


@st.cache_data(max_entries=64, show_spinner="Simulating every bucket cap...")
def _bucket_sweep(scenario_json: str, caps_mb: tuple[float, ...]) -> sweeps.BucketCapSweep:
    return sweeps.bucket_cap_sweep(json.loads(scenario_json), caps_mb)


def bucket_cap_sweep(data: dict[str, Any], caps_mb: tuple[float, ...]) -> sweeps.BucketCapSweep | None:
    if validate(data) is None:
        return None
    return _bucket_sweep(to_json(data), tuple(caps_mb))


@st.cache_data(max_entries=64, show_spinner="Simulating the grid...")
def _grid(scenario_json: str, x_path: str, x_values: tuple[Any, ...], y_path: str,
          y_values: tuple[Any, ...], batch: str) -> sweeps.GridSweep:
    return sweeps.grid_sweep(json.loads(scenario_json), x_path, x_values, y_path, y_values,
                             batch="strong" if batch == "strong" else "weak")


def grid_sweep(data: dict[str, Any], x_path: str, x_values: tuple[Any, ...], y_path: str,
               y_values: tuple[Any, ...], batch: str = "weak") -> sweeps.GridSweep | None:
    """The grid of ``simddp sweep`` over two keys; ``batch`` as its ``--batch`` when a key is the cluster size."""
    if validate(data) is None:
        return None
    try:
        return _grid(to_json(data), x_path, tuple(x_values), y_path, tuple(y_values), batch)
    except simddp.ScenarioError as err:
        st.error(str(err), icon=":material/error:")
        return None


# ------------------------------------------------------------------------------------ saved scenarios
def saved_scenarios() -> dict[str, dict[str, Any]]:
    """Scenarios saved for the Compare page, by name (insertion order)."""
    if SAVED_KEY not in st.session_state:
        st.session_state[SAVED_KEY] = {}
    return st.session_state[SAVED_KEY]


def save_scenario(name: str, data: dict[str, Any]) -> None:
    saved_scenarios()[name] = copy.deepcopy(data)


def remove_saved(name: str) -> None:
    saved_scenarios().pop(name, None)


# ------------------------------------------------------------------------------------ memory
@st.cache_data(max_entries=64, show_spinner="Sizing every strategy...")
def _strategies(scenario_json: str, tp: int, pp: int) -> sweeps.StrategySweep:
    data = json.loads(scenario_json)
    strategies = sweeps.default_strategies(simddp.scenario_from_dict(data), tp=tp, pp=pp)
    return sweeps.strategy_sweep(data, strategies)


def strategy_sweep(data: dict[str, Any], tp: int, pp: int) -> sweeps.StrategySweep | None:
    if validate(data) is None:
        return None
    return _strategies(to_json(data), tp, pp)


@st.cache_data(max_entries=32, show_spinner="Searching the layouts that fit...")
def _layout_search(scenario_json: str) -> Any:
    from simddp.memory import smallest_layout_that_fits

    return smallest_layout_that_fits(simddp.scenario_from_dict(json.loads(scenario_json)))


def layout_search(data: dict[str, Any]) -> Any:
    """simddp.memory's search for the smallest ZeRO stage / tp / pp that fits (a LayoutSearch)."""
    if validate(data, show=False) is None:
        return None
    try:
        return _layout_search(to_json(data))
    except ValueError as err:
        st.error(str(err), icon=":material/error:")
        return None


# ------------------------------------------------------------------------------------ calibration
# Uploads are parsed from their bytes: nothing is written to disk, so nothing is left behind, shared
# between sessions, or reachable through a planted symlink.
def _calibration(name: str, content: bytes, expected: type[Any]) -> Any:
    from simddp.profile import calibration_from_dict

    data = safeio.parse_json(safeio.decode(content, name, "UTF-8 JSON"), name)
    if not isinstance(data, dict):
        raise simddp.ScenarioError(f"{name}: expected a JSON object at the top level, got {type(data).__name__}")
    return calibration_from_dict(data, expected, name)


@st.cache_data(max_entries=16, show_spinner="Reading the profile...")
def load_profile(name: str, content: bytes) -> Any:
    """A CalibrationProfile from an uploaded profile.json (raises ScenarioError naming the file)."""
    from simddp.profile import CalibrationProfile

    return _calibration(name, content, CalibrationProfile)


@st.cache_data(max_entries=16, show_spinner="Fitting the profile...")
def fit_profile(comm_name: str, comm: bytes, compute_name: str, compute: bytes) -> Any:
    """simddp.fit.fit_profile of an uploaded comm.json and compute.json."""
    from simddp.fit import fit_profile as fit
    from simddp.profile import CommMeasurements, ComputeMeasurements

    measured_comm = _calibration(comm_name, comm, CommMeasurements)
    measured_compute = _calibration(compute_name, compute, ComputeMeasurements)
    return fit(measured_comm, measured_compute, sources={"comm": comm_name, "compute": compute_name})


@st.cache_data(max_entries=16, show_spinner="Simulating every measured step...")
def validate_profile(profile_name: str, profile: bytes, ddp_name: str, ddp: bytes, z: float) -> Any:
    """simddp.report.validate: the simulator's prediction of every measured DDP step."""
    from simddp.profile import DDPMeasurements
    from simddp.report import validate as run_validation

    measured = _calibration(ddp_name, ddp, DDPMeasurements)
    report = run_validation(load_profile(profile_name, profile), measured, ddp_name, z=z)
    return report.model_copy(update={"profile": profile_name})


@st.cache_data(max_entries=16, show_spinner="Extrapolating...")
def extrapolate_profile(profile_name: str, profile: bytes, world_sizes: tuple[int, ...], gpus_per_node: int,
                        z: float) -> Any:
    """simddp.report.extrapolate: predicted steps (with their band) at other data-parallel world sizes."""
    from simddp.report import extrapolate

    return extrapolate(load_profile(profile_name, profile), world_sizes, gpus_per_node=gpus_per_node, z=z)


# ------------------------------------------------------------------------------------ tails, run, knobs
def _guarded(cached: Any, data: dict[str, Any], what: str, *args: Any, show: bool = True) -> Any:
    """``cached(scenario JSON, *args)`` for a valid scenario; None after an inline one-line error otherwise."""
    if validate(data, show=show) is None:
        return None
    try:
        return cached(to_json(data), *args)
    except (simddp.ScenarioError, ValueError) as err:
        st.error(f"{what}: {safeio.one_line(err)}", icon=":material/error:")
        return None


@st.cache_data(max_entries=64, show_spinner="Drawing the Monte Carlo steps...")
def _tails(scenario_json: str, steps: int) -> Any:
    from simddp.variability import max_tail_steps, simulate_tails

    scenario = simddp.scenario_from_dict(json.loads(scenario_json))
    # No more steps than the draws' limit allows (every choice was refused for a 64k-sample pipeline batch, and the
    # page showed nothing): the page says when it drew fewer (result.num_steps).
    return simulate_tails(scenario, min(steps, max_tail_steps(scenario)))


def tails(data: dict[str, Any], steps: int = 200) -> Any:
    """simddp.variability.simulate_tails of a scenario dict (a VariabilityResult), or None after an inline error."""
    return _guarded(_tails, data, "Cannot draw these steps", steps)


@st.cache_data(max_entries=32, show_spinner="Drawing the steps at every number of nodes...")
def _tails_vs_ranks(scenario_json: str, nodes: tuple[int, ...], steps: int) -> Any:
    from simddp.variability import tails_vs_ranks

    return tails_vs_ranks(simddp.scenario_from_dict(json.loads(scenario_json)), list(nodes), steps)


def tails_vs_ranks(data: dict[str, Any], nodes: tuple[int, ...], steps: int = 200) -> Any:
    """p50/p99 at several node counts (weak scaling), or None after an inline error."""
    return _guarded(_tails_vs_ranks, data, "Cannot sweep the node counts", tuple(nodes), steps, show=False)


@st.cache_data(max_entries=64, show_spinner="Simulating the run...")
def _run(scenario_json: str) -> Any:
    from simddp.run import simulate_run

    return simulate_run(simddp.scenario_from_dict(json.loads(scenario_json)))


def run(data: dict[str, Any]) -> Any:
    """simddp.run.simulate_run of a scenario dict (a RunResult), or None after an inline error."""
    return _guarded(_run, data, "Cannot plan this run")


@st.cache_data(max_entries=32, show_spinner="Simulating every knob...")
def _knobs(scenario_json: str) -> Any:
    from simddp.knobs import knob_table

    return knob_table(simddp.scenario_from_dict(json.loads(scenario_json)))


def knobs(data: dict[str, Any]) -> Any:
    """simddp.knobs.knob_table of a scenario dict (a KnobTable), or None after an inline error."""
    return _guarded(_knobs, data, "Cannot simulate the knobs")
