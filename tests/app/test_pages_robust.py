"""Every page, on scenarios that exercise other code paths, renders without a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apptest_helpers import PAGES, assert_clean, default_dict, start
from calibration_data import write_all

from simddp import sweeps
from simddp.profile import load_profile


def _variant(updates: dict[str, Any]) -> dict[str, Any]:
    return sweeps.with_values(default_dict(), updates)


SCENARIOS = {
    "pipeline interleaved": _variant({"parallelism.pp": 4, "parallelism.pipeline_schedule": "interleaved-1f1b",
                                      "parallelism.virtual_stages": 2}),
    "zero3": _variant({"parallelism.zero_stage": 3, "cluster.num_nodes": 4}),
    "tp8 sequence parallel": _variant({"parallelism.tp": 8, "parallelism.sequence_parallel": True}),
    "resnet50 on pcie": {"name": "resnet", "cluster": {"preset": "pcie-a100-80gb", "num_nodes": 2},
                         "model": {"preset": "resnet50"}, "training": {"micro_batch_size": 64, "seq_len": 1},
                         "ddp": {"bucket_cap_mb": 5}},
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_pages_on_other_scenarios(name: str) -> None:
    at = start()
    at.session_state["scenario"] = SCENARIOS[name]
    for page in PAGES:
        at.switch_page(f"app_pages/{page}.py").run()
        assert_clean(at, errors_allowed=False)


def test_pages_on_a_calibrated_scenario(tmp_path: Path) -> None:
    files = write_all(tmp_path)
    at = start()
    at.session_state["scenario"] = load_profile(files["profile"]).scenario_defaults()
    for page in PAGES:
        at.switch_page(f"app_pages/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.main.error, (page, [e.value for e in at.main.error])


def test_pages_on_an_invalid_scenario_say_why_inline() -> None:
    at = start()
    at.session_state["scenario"] = sweeps.set_value(default_dict(), "training.global_batch_size", 100)
    for page in ("planner", "timeline", "scaling", "memory", "whatif"):
        at.switch_page(f"app_pages/{page}.py").run()
        assert_clean(at, errors_allowed=True)
        assert any("global_batch_size(100)" in e.value for e in at.main.error), page
