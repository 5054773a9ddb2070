"""Widgets that mirror one key of the planner's scenario dict.

A widget is seeded from the validated scenario (so preset values show), and writes back only when the
user changes it, through its ``on_change`` callback: the scenario dict stays "preset + overrides", exactly
what the exported YAML holds. Help texts are the config fields' descriptions.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

import streamlit as st
from pydantic import BaseModel

from simddp import sweeps
from simddp.results import StepResult
from simddp.verdict import MemoryVerdict
from simddp_app import state


def field_help(model: type[BaseModel], name: str) -> str:
    """The config field's description: the same help text as the CLI's."""
    return model.model_fields[name].description or ""


def fit_banner(result: StepResult) -> None:
    """The memory verdict first, as the CLI's first line: a banner when the layout does not fit."""
    memory = getattr(result, "memory", None)
    if memory is not None and not memory.fits:
        st.error(f"**{MemoryVerdict.of(memory).headline()}**. The figures below are hypothetical: what this layout "
                 "would cost if it fitted (the Memory page finds layouts that do).", icon=":material/memory:")


def span(low: float, high: float, value: float) -> tuple[float, float]:
    """A widget's bounds widened to hold ``value``: a scenario may hold any value its config takes (a Compare
    upload, a calibration's 150 us latency), and a widget seeded outside its bounds ends the page in a traceback."""
    return min(low, value), max(high, value)


def _key(path: str) -> str:
    return state.WIDGET_PREFIX + path


def _seed(key: str, value: Any) -> None:
    if key not in st.session_state:
        st.session_state[key] = value


def _write(key: str, path: str, to_value: Callable[[Any], Any]) -> None:
    state.set_path(path, to_value(st.session_state[key]))


def number(
    label: str,
    path: str,
    value: float | int | None,
    *,
    model: type[BaseModel],
    field: str,
    scale: float = 1.0,
    integer: bool = False,
    placeholder: str | None = None,
    nullable: bool = False,
    min_value: float | int | None = None,
    max_value: float | int | None = None,
    step: float | int | None = None,
    fmt: str | None = None,
    where: Any = None,
) -> Any:
    """A number input for ``path``; ``scale`` converts the shown unit into the scenario's (GB/s -> bytes/s). A
    ``nullable`` key (null: the framework's default) shows ``placeholder`` in an empty field while null, and
    emptying the field writes null back (without ``nullable`` Streamlit refills an emptied field with its minimum).
    An integer field shown in a scaled unit (HBM in GiB) writes whole numbers: 80.3 GiB was refused as
    "86221468467.2 bytes"."""
    key = _key(path)
    shown = None if value is None else int(value) if integer else float(value) / scale
    _seed(key, shown)
    kind = model.model_fields[field].annotation
    whole = integer or (isinstance(kind, type) and issubclass(kind, int))

    def to_value(v: Any) -> Any:
        if v is None:
            return None
        return int(v) if integer else round(float(v) * scale) if whole else float(v) * scale

    if shown is not None:  # bounds that hold the scenario's own value (8,192 nodes: the config takes 2^24 GPUs)
        low, high = span(min_value if min_value is not None else shown, max_value if max_value is not None else shown,
                         shown)
        min_value = None if min_value is None else type(min_value)(low)
        max_value = None if max_value is None else type(max_value)(high)
    if not integer and scale > 1.0:  # a shown value whose scaled one would overflow to inf is refused here
        max_value = min(max_value if max_value is not None else math.inf, sys.float_info.max / scale / (1 + 1e-9))
    return (where or st).number_input(
        label, min_value=min_value, max_value=max_value, step=step, format=fmt, key=key, placeholder=placeholder,
        value=None if nullable else "min",
        help=field_help(model, field), on_change=_write, args=(key, path, to_value),
    )


def choice(
    label: str,
    path: str,
    value: Any,
    options: Sequence[Any],
    *,
    model: type[BaseModel],
    field: str,
    format_func: Callable[[Any], str] = str,
    where: Any = None,
) -> Any:
    """A selectbox for a ``Literal`` field."""
    key = _key(path)
    _seed(key, value)
    return (where or st).selectbox(
        label, list(options), key=key, format_func=format_func, help=field_help(model, field),
        on_change=_write, args=(key, path, lambda v: v),
    )


def flag(label: str, path: str, value: bool, *, model: type[BaseModel], field: str, where: Any = None,
         follows_default: bool = False) -> bool:
    """A toggle for a boolean field. ``follows_default``: ``value`` is a default that depends on other keys (the
    data-parallel implementation's overlap), so while the scenario leaves ``path`` unset the toggle shows the
    default of this run, not the one it was seeded with (a stale "on" could not be switched on)."""
    key = _key(path)
    if follows_default and sweeps.get_path(state.scenario_dict(), path) is None:
        st.session_state[key] = bool(value)
    _seed(key, bool(value))
    return (where or st).toggle(
        label, key=key, help=field_help(model, field), on_change=_write, args=(key, path, bool)
    )


#: Display formats of table columns by the unit in their name (the data keep full precision for export).
_FORMATS = (("tokens/s", "%d"), ("(ms)", "%.3f"), ("(%)", "%.2f"), ("(GiB)", "%.2f"), ("(MiB)", "%.2f"),
            ("(us)", "%.2f"), ("(GB/s)", "%.3f"), ("R²", "%.4f"))


def table(df: Any, height: int | Literal["auto"] = "auto", key: str | None = None) -> Any:
    """``st.dataframe`` with numbers formatted by their unit and no index."""
    config = {}
    for col in df.columns:
        if str(df[col].dtype).startswith("float"):
            fmt = next((f for unit, f in _FORMATS if unit in str(col)), "%.4g")
            config[col] = st.column_config.NumberColumn(format=fmt)
    return st.dataframe(df, hide_index=True, column_config=config, height=height, key=key)
