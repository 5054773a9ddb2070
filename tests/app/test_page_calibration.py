"""Calibration page: upload a profile and DDP measurements; measured-vs-model plots and the validation table."""

from __future__ import annotations

from pathlib import Path

import pytest
from apptest_helpers import assert_clean, figure, metric, open_page, start
from calibration_data import write_all

from simddp.profile import DDPMeasurements, read_calibration_file
from simddp.report import validate


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("calibration"))


def _upload(at, key: str, path: Path):  # type: ignore[no-untyped-def]
    return at.file_uploader(key=key).set_value((path.name, path.read_bytes(), "application/json"))


def test_explains_how_to_measure_before_an_upload() -> None:
    at = open_page(start(), "calibration")
    assert at.main.info
    assert any("simddp calibrate collect comm" in m.value for m in at.main.markdown)


def test_profile_and_ddp_give_fits_validation_and_extrapolation(files: dict[str, Path]) -> None:
    at = open_page(start(), "calibration")
    _upload(at, "cal_profile", files["profile"]).run()
    assert_clean(at)
    assert metric(at, "Measured on") == "2 ranks"
    fits = figure(at, "Collectives: measured")
    measured = [t for t in fits["data"] if t["mode"] == "markers"]
    assert len(measured[0]["x"]) == 9  # every measured size
    assert figure(at, "Extrapolation")
    _upload(at, "cal_ddp", files["ddp"]).run()
    assert_clean(at)
    ref = validate(files["profile"], read_calibration_file(files["ddp"], DDPMeasurements))
    assert metric(at, "MAPE") == f"{ref.mape:.1%}"
    table = at.main.dataframe[1].value  # fits, then validation
    assert list(table["simddp (ms)"]) == pytest.approx([c.prediction.step_time_s * 1e3 for c in ref.cases])
    assert list(table["error (%)"]) == pytest.approx([100 * c.error for c in ref.cases])
    assert figure(at, "measured vs model")


def test_band_width_changes_the_band(files: dict[str, Path]) -> None:
    at = open_page(start(), "calibration")
    _upload(at, "cal_profile", files["profile"])
    _upload(at, "cal_ddp", files["ddp"]).run()
    band = at.main.dataframe[1].value["band (ms)"].tolist()
    at.slider(key="cal_z").set_value(0.0).run()
    assert_clean(at)
    narrow = at.main.dataframe[1].value["band (ms)"].tolist()
    assert narrow != band


def test_fit_from_measurements_and_use_in_planner(files: dict[str, Path]) -> None:
    at = open_page(start(), "calibration")
    _upload(at, "cal_comm", files["comm"])
    _upload(at, "cal_compute", files["compute"]).run()
    assert_clean(at)
    assert metric(at, "Measured on") == "2 ranks"
    at.button(key="cal_use").click().run()
    assert_clean(at)
    data = at.session_state["scenario"]
    assert "parameters" in data["model"] and data["cluster"]["collective_fits"]
    at = open_page(at, "planner")
    assert metric(at, "Step time").endswith("ms")


def test_a_wrong_file_is_an_inline_error(files: dict[str, Path]) -> None:
    at = open_page(start(), "calibration")
    _upload(at, "cal_profile", files["ddp"]).run()  # a ddp.json where the profile goes
    assert_clean(at, errors_allowed=True)
    assert len(at.error) == 1
    assert "ddp.json" in at.error[0].value and "simddp-profile" in at.error[0].value


def test_a_setup_that_differs_from_the_profiles_is_warned(files: dict[str, Path], tmp_path: Path) -> None:
    """DDP steps measured with another model, micro-batch or optimizer than the profile's: the page shows the same
    warnings as `simddp calibrate validate` (it showed the MAPE alone, which then compares unlike runs)."""
    from calibration_data import ddp as measured

    from simddp.profile import write_json

    other = measured(files["profile"]).model_copy(update={"micro_batch_size": 16, "optimizer": "adam"})
    write_json(other, tmp_path / "ddp_other.json")
    at = open_page(start(), "calibration")
    _upload(at, "cal_profile", files["profile"])
    _upload(at, "cal_ddp", tmp_path / "ddp_other.json").run()
    expected = validate(files["profile"], other).warnings
    assert len(expected) == 2 and [w.value for w in at.warning] == expected
    assert_clean(at)
