"""Scenarios from files and dicts: presets, ``--set`` overrides and calibration profiles, then validation.

This layer sits above :mod:`simddp.config` and :mod:`simddp.profile`: a scenario that names
``calibration: profile.json`` takes its cluster, model and training keys from the profile
(:func:`simddp.profile.scenario_defaults_from_profile`), the user's own keys overriding them, and only then
is validated by :func:`simddp.config.validate_scenario`. The config models never import the profile module,
so the two cannot import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simddp.config import Scenario, ScenarioError, deep_merge, read_mapping, set_path, validate_scenario


def apply_calibration(data: dict[str, Any]) -> dict[str, Any]:
    """Fill model, layer times and links from a calibration profile named by ``calibration``.

    The profile's keys are defaults that the user's own keys override, so
    ``{"calibration": "profile.json", "parallelism": {"dp": 2}}`` is a complete scenario.
    """
    path = data.get("calibration")
    if path is None or path == "":
        return data
    if not isinstance(path, str | Path):
        raise ScenarioError(f"calibration: expected the path of a profile, got {type(path).__name__}")
    from simddp.profile import scenario_defaults_from_profile

    return deep_merge(scenario_defaults_from_profile(path), data)


def scenario_from_dict(data: dict[str, Any]) -> Scenario:
    """Validate a scenario dict (a calibration profile it names filled in first); raises
    :class:`~simddp.config.ScenarioError` with a one-line message."""
    if not isinstance(data, dict):
        raise ScenarioError(f"a scenario must be a mapping, got {type(data).__name__}")
    return validate_scenario(apply_calibration(data))


def as_scenario(scenario: Scenario | dict[str, Any] | str | Path) -> Scenario:
    """A :class:`Scenario` from a scenario, a dict of scenario keys, or a YAML/JSON path."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario)
    if isinstance(scenario, str | Path):
        return load_scenario(scenario)
    raise ScenarioError(f"a scenario is a Scenario, a dict of scenario keys or a YAML/JSON path, not a "
                        f"{type(scenario).__name__}")


def load_scenario(path: str | Path, overrides: list[str] | None = None, layout: list[str] | None = None) -> Scenario:
    """Load and validate a scenario file, applying ``key.path=value`` overrides first (and then ``layout``'s,
    which the scenario's name does not mention: a planner's choice of GPUs and layout, not the user's)."""
    for what, items in (("overrides", overrides), ("layout", layout)):
        if items is not None and (isinstance(items, str) or not all(isinstance(i, str) for i in items)):
            raise ScenarioError(f"{what}: a list of 'key.path=value' strings, not {type(items).__name__} "
                                f"{str(items)[:60]!r}")
    data = scenario_data(path, overrides)
    for item in layout or []:
        if "=" not in item:
            raise ScenarioError(f"layout {item!r}: expected key.path=value")
        key, value = item.split("=", 1)
        data = set_path(data, key, value)
    return scenario_from_dict(mark_modified(data, overrides or []))


def scenario_data(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """A scenario file's mapping with ``key.path=value`` overrides applied, not yet validated."""
    data = read_mapping(path)
    if data.get("calibration") and isinstance(data["calibration"], str):
        cal = Path(data["calibration"])
        if not cal.is_absolute():
            data["calibration"] = str((Path(path).parent / cal).resolve())
    for item in overrides or []:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected key.path=value")
        key, value = item.split("=", 1)
        data = set_path(data, key.strip(), value)
    return data


def mark_modified(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A named scenario changed by ``--set`` says so in its name (an unnamed one derives its name anyway)."""
    keys = [item.split("=", 1)[0].strip() for item in overrides]
    if not data.get("name") or not keys or "name" in keys:
        return data
    return {**data, "name": f"{data['name']} (modified: {', '.join(o.strip() for o in overrides)})"}


__all__ = ["apply_calibration", "as_scenario", "load_scenario", "mark_modified", "scenario_data", "scenario_from_dict"]
