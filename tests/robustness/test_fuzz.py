"""Hypothesis fuzzing of scenario dicts and `--set` strings: each ends in a valid, sane result or in one
clean error line (a ScenarioError, or exit status 2), within a time bound."""

from __future__ import annotations

import contextlib
import io
import json
import math
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from robustness_probe import time_bound

import simddp
from simddp import cli, safeio
from simddp.config import Scenario, ScenarioError, deep_merge, set_value
from simddp.sanity import check_step_result
from simddp.scenario_io import scenario_from_dict

TIME_BOUND_S = 30
BASE: dict[str, Any] = {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2}, "model": {"preset": "gpt2"},
                        "training": {"micro_batch_size": 2, "seq_len": 512}}


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the scenario schema (nested models followed)."""
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _paths(arg, path + ".")
    return out


PATHS = _paths(Scenario)


def _clean_message(message: str) -> None:
    assert "\n" not in message and len(message) < 4000, message[:300]
    assert safeio.strip_control(message) == message


nasty_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["", "\x1b[31m", "gpt2", "dgx-a100-80gb", "auto", "ring", "1f1b", "fp32", "null", "nan", "1e400", "[[[", "{a: 1}"])
numbers = (st.integers(min_value=-(2**70), max_value=2**70) | st.integers(min_value=0, max_value=64)
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1, 2, 3, 8, 1e-300, 1e300, 0.5]))
scalars = st.none() | st.booleans() | numbers | nasty_text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nasty_text, inner,
                                                                                           max_size=4), max_leaves=12)
plausible = (st.integers(min_value=1, max_value=64) | st.floats(min_value=0, max_value=1)
             | st.floats(min_value=1e-7, max_value=1e13) | st.booleans() | st.none()
             | st.sampled_from(["bf16-mixed", "fp32", "fp16-mixed", "sgd", "adam", "adafactor", "ring", "tree",
                                "hierarchical", "nvls", "gpipe", "interleaved-1f1b", "selective", "full",
                                "rmsnorm", "rope", "dgx-h100-80gb", "pcie-a100-80gb", "llama2-7b", "resnet50"]))
keys = st.sampled_from(PATHS) | st.lists(nasty_text.filter(lambda k: k and "." not in k), min_size=1,
                                         max_size=3).map(".".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(keys, values), min_size=1, max_size=4))
def test_fuzzed_scenario_dicts(edits: list[tuple[str, Any]]) -> None:
    data: dict[str, Any] = json.loads(json.dumps(BASE))
    for path, value in edits:
        with contextlib.suppress(ScenarioError):
            data = set_value(data, path, value)
    with time_bound(TIME_BOUND_S):
        try:
            scenario = scenario_from_dict(data)
        except ScenarioError as err:
            _clean_message(str(err))
            return
        try:
            result = simddp.simulate(scenario, trace=False)
            check_step_result(result)  # an InternalError here is a bug; a ScenarioError an out-of-range input
        except ScenarioError as err:  # a cap, a choice the cost model refuses, a step beyond any range
            _clean_message(str(err))
            return
        assert math.isfinite(result.step_time_s)


set_values = (st.sampled_from(["1", "0", "-1", "true", "null", ".inf", ".nan", "1e400", "[1, 2]", "{a: 1}", "''",
                               "&a [*a]", "[" * 50, "99999999999999999999999", "ring", "gpt2-xl", "\x1b[2J"])
              | nasty_text)
set_strings = st.builds(lambda k, v: f"{k}={v}", keys, set_values) | nasty_text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(set_strings, min_size=1, max_size=3))
def test_fuzzed_set_strings(overrides: list[str]) -> None:
    argv = ["simulate", "--json", "--set", "model.preset=gpt2", "--set", "parallelism.dp=null",
            "--set", "training.global_batch_size=null"]
    for item in overrides:
        argv += ["--set", item]
    out, err = io.StringIO(), io.StringIO()
    with time_bound(TIME_BOUND_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exit_:
            rc = int(exit_.code or 0)
    assert rc in (0, 2), err.getvalue()
    if rc == 0:
        data = json.loads(out.getvalue(), parse_constant=lambda token: pytest.fail(f"non-standard JSON {token}"))
        assert data["exposed_comm_time_s"] <= data["step_time_s"] * (1 + 1e-9)
    else:
        assert out.getvalue() == ""
        line = err.getvalue()
        # "simddp: error: ..." or argparse's "simddp simulate: error: ..."
        assert line.startswith("simddp") and ": error: " in line and line.count("\n") == 1, line
        _clean_message(err.getvalue().rstrip("\n"))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(keys, values, max_size=4))
def test_fuzzed_dicts_merged_into_presets(extra: dict[str, Any]) -> None:
    """Nested dicts under preset sections go through the preset merge (recursive) first."""
    nested: dict[str, Any] = {}
    for path, value in extra.items():
        with contextlib.suppress(ScenarioError):
            nested = set_value(nested, path, value)
    data = deep_merge(BASE, nested) if isinstance(nested, dict) else BASE
    with time_bound(TIME_BOUND_S):
        try:
            scenario_from_dict(data)
        except ScenarioError as err:
            _clean_message(str(err))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), plausible), min_size=1, max_size=5))
def test_plausible_edits_simulate_sanely(edits: list[tuple[str, Any]]) -> None:
    """Values in range for their fields: most scenarios are valid, and every result must pass its checks."""
    test_fuzzed_scenario_dicts.hypothesis.inner_test(edits)  # type: ignore[attr-defined]
