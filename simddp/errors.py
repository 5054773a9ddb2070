"""The two kinds of failure simddp reports: the user's input is wrong, or simddp is.

This module imports nothing, so that every other module (:mod:`simddp.safeio` below the config models
included) can raise them.
"""

from __future__ import annotations

import operator


class ScenarioError(ValueError):
    """A scenario, preset, flag or file the user gave is invalid. The message is one line, naming the field."""


class InternalError(RuntimeError):
    """simddp produced something it must not print (a non-finite number, parts that do not add up): a bug.

    The CLI reports it in one line with exit status :data:`INTERNAL_ERROR_EXIT`, never as output.
    """


#: Exit status of a failed internal check (BSD sysexits EX_SOFTWARE).
INTERNAL_ERROR_EXIT = 70


def whole_number(name: str, value: object, low: int = 1) -> int:
    """``value`` as an int where it is a whole number >= ``low`` (an int or anything ``operator.index`` takes, a
    numpy integer; not a bool), else a :class:`ScenarioError` naming the argument: the Python API's counts
    (steps, limits, GPUs, a stage) fail in one line, not in a loop or deep in numpy."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < low:
        raise ScenarioError(f"{name}({value!r}) must be a whole number >= {low}")
    return number


def pipeline_stage(stage: object, pp: int) -> int:
    """``stage`` as an int where it is a pipeline stage of ``pp`` (0 .. pp - 1), else a :class:`ScenarioError`."""
    number = whole_number("stage", stage, 0)
    if number >= pp:
        raise ScenarioError(f"stage({stage}) must be in 0..{pp - 1} for pp({pp})")
    return number


__all__ = ["INTERNAL_ERROR_EXIT", "InternalError", "ScenarioError", "pipeline_stage", "whole_number"]
