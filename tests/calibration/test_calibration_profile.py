"""Profiles: reading (and rejecting) files, profile -> scenario -> simulate, bands, validation, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ALPHA_S, BUSBW, comm_measurements, compute_measurements, run_info, stats

import simddp
from simddp.cli import main
from simddp.config import ScenarioError
from simddp.fit import fit_profile
from simddp.profile import (
    PROFILE_VERSION,
    CalibrationProfile,
    CommMeasurements,
    DDPCase,
    DDPMeasurements,
    load_profile,
    merge_measurements,
    read_calibration_file,
    scenario_defaults_from_profile,
    write_json,
)
from simddp.report import extrapolate, predict, validate, write_html
from simddp.scenario_io import load_scenario, scenario_from_dict


# ------------------------------------------------------------------------------------ bad files
def _rewrite(path: Path, **changes: object) -> Path:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


def _one_line_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        load_profile(path)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_profile_round_trips(calibration_files: dict[str, Path]) -> None:
    prof = load_profile(calibration_files["profile"])
    assert prof.version == PROFILE_VERSION
    assert isinstance(prof, CalibrationProfile)


def test_old_profile_version_is_rejected(calibration_files: dict[str, Path]) -> None:
    msg = _one_line_error(_rewrite(calibration_files["profile"], version=0))
    assert "version 0 is not supported" in msg and "profile.json" in msg


def test_future_profile_version_is_rejected(calibration_files: dict[str, Path]) -> None:
    assert "version 99 is not supported" in _one_line_error(_rewrite(calibration_files["profile"], version=99))


def test_unversioned_file_is_named_as_old(calibration_files: dict[str, Path]) -> None:
    data = json.loads(calibration_files["profile"].read_text())
    del data["kind"], data["version"]
    calibration_files["profile"].write_text(json.dumps(data))
    assert "older simddp file" in _one_line_error(calibration_files["profile"])


def test_wrong_kind_is_rejected(calibration_files: dict[str, Path]) -> None:
    msg = _one_line_error(calibration_files["comm"])
    assert "expected kind 'simddp-profile', got 'simddp-comm'" in msg


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text('{"kind": "simddp-profile",\n "version": 1,, }')
    assert "malformed JSON at line 2" in _one_line_error(bad)


def test_missing_field_is_named(calibration_files: dict[str, Path]) -> None:
    data = json.loads(calibration_files["profile"].read_text())
    del data["cluster"]
    calibration_files["profile"].write_text(json.dumps(data))
    msg = _one_line_error(calibration_files["profile"])
    assert "malformed simddp-profile" in msg and "cluster: missing required key" in msg


def test_wrong_type_inside_is_named(calibration_files: dict[str, Path]) -> None:
    data = json.loads(calibration_files["profile"].read_text())
    data["fits"][0]["r2"] = "high"
    calibration_files["profile"].write_text(json.dumps(data))
    assert "fits.0.r2" in _one_line_error(calibration_files["profile"])


def test_missing_and_non_object_files(tmp_path: Path) -> None:
    assert "no such file" in _one_line_error(tmp_path / "nope.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "expected a JSON object" in _one_line_error(tmp_path / "list.json")


def test_scenario_naming_a_bad_profile_fails_with_scenario_error(calibration_files: dict[str, Path]) -> None:
    _rewrite(calibration_files["profile"], version=0)
    with pytest.raises(ScenarioError, match="version 0 is not supported"):
        scenario_from_dict({"calibration": str(calibration_files["profile"]), "parallelism": {"dp": 2}})


def test_measurement_file_versions_are_checked(calibration_files: dict[str, Path]) -> None:
    _rewrite(calibration_files["comm"], version=7)
    with pytest.raises(ScenarioError, match="simddp-comm version 7"):
        read_calibration_file(calibration_files["comm"], CommMeasurements)


# ------------------------------------------------------------------------- profile -> scenario
def test_profile_alone_is_a_complete_scenario(calibration_files: dict[str, Path]) -> None:
    scenario = scenario_from_dict({"calibration": str(calibration_files["profile"]), "parallelism": {"dp": 2},
                                   "ddp": {"bucket_cap_mb": 5}})
    assert scenario.cluster.num_gpus == 2
    assert scenario.training.optimizer_time_s == pytest.approx(1.5e-3)
    assert scenario.training.precision == "fp32"
    assert scenario.cluster.comm_compute_interference == pytest.approx(0.25)
    assert len(scenario.model.parameters or []) == 12
    assert all(la.fwd_time_s is not None for la in scenario.model.layers or [])
    result = simddp.simulate(scenario)
    compute = 19e-3 + 36.5e-3
    assert result.compute_time_s >= compute - 1e-9
    assert result.optimizer_time_s == pytest.approx(1.5e-3)
    assert result.step_time_s > compute + 1.5e-3
    assert {b.algorithm for b in result.buckets} == {"measured"}


def test_user_keys_override_profile_keys(calibration_files: dict[str, Path]) -> None:
    scenario = scenario_from_dict({"calibration": str(calibration_files["profile"]), "parallelism": {"dp": 2},
                                   "training": {"micro_batch_size": 3},
                                   "cluster": {"comm_compute_interference": 0.0}})
    assert scenario.training.micro_batch_size == 3
    assert scenario.training.optimizer_time_s == pytest.approx(1.5e-3)
    assert scenario.cluster.comm_compute_interference == 0.0


def test_relative_profile_path_resolves_against_the_scenario_file(calibration_files: dict[str, Path]) -> None:
    folder = calibration_files["profile"].parent
    (folder / "scenario.yaml").write_text("calibration: profile.json\nparallelism: {dp: 2}\n")
    scenario = load_scenario(folder / "scenario.yaml")
    assert scenario.cluster.gpus_per_node == 2


def test_defaults_are_plain_scenario_keys(calibration_files: dict[str, Path]) -> None:
    keys = scenario_defaults_from_profile(calibration_files["profile"])
    assert set(keys) >= {"cluster", "model", "training"}
    json.dumps(keys)  # plain JSON types


def test_fitted_collectives_match_the_measurements(calibration_files: dict[str, Path]) -> None:
    prof = load_profile(calibration_files["profile"])
    ar = [r.fit for r in prof.fits if r.fit.op == "all-reduce"]
    assert len(ar) == 1
    assert ar[0].latency_per_step_s == pytest.approx(ALPHA_S, rel=1e-3)
    assert ar[0].bus_bandwidth_bytes_per_s == pytest.approx(BUSBW, rel=1e-3)


def test_profile_turns_overlap_off_when_compute_and_comm_take_turns(tmp_path: Path) -> None:
    prof = fit_profile(comm_measurements(lost_fraction=1.0), compute_measurements())
    path = tmp_path / "profile.json"
    write_json(prof, path)
    scenario = scenario_from_dict({"calibration": str(path), "parallelism": {"dp": 2}})
    assert scenario.ddp.overlap is False
    result = simddp.simulate(scenario, trace=False)
    assert result.step_time_s == pytest.approx(result.bounds.no_overlap_s)


# ---------------------------------------------------------------------------- predict, validate
def test_band_contains_the_prediction_and_widens_with_world_size(calibration_files: dict[str, Path]) -> None:
    preds = extrapolate(calibration_files["profile"], [2, 8, 128], bucket_cap_mb=5)
    for p in preds:
        assert p.low_s <= p.step_time_s <= p.high_s
    assert not preds[0].extrapolated and preds[-1].extrapolated
    widths = [(p.high_s - p.low_s) for p in preds]
    assert widths[-1] >= widths[0]
    assert any("extrapolated from 2 measured ranks" in n for n in preds[-1].notes)


def test_multi_node_extrapolation_without_inter_fit_says_so(calibration_files: dict[str, Path]) -> None:
    (pred,) = extrapolate(calibration_files["profile"], [16], gpus_per_node=8)
    assert pred.num_nodes == 2
    assert any("no inter-node fit" in n for n in pred.notes)


def _ddp(calibration_files: dict[str, Path], error: float) -> DDPMeasurements:
    cases = []
    for cap in (0.5, 1.0, 4.0, 25.0):
        p = predict(calibration_files["profile"], {"parallelism": {"dp": 2}, "ddp": {"bucket_cap_mb": cap}})
        cases.append(DDPCase(bucket_cap_mb=cap, num_buckets=p.num_buckets, stats=stats(p.step_time_s * (1 + error))))
    return DDPMeasurements(kind="simddp-ddp", version=1, complete=True, run=run_info(2), model="toy.py:build",
                           optimizer="sgd", micro_batch_size=8, cases=cases)


def test_validation_mape_and_html(calibration_files: dict[str, Path], tmp_path: Path) -> None:
    ddp = _ddp(calibration_files, error=0.10)
    report = validate(calibration_files["profile"], ddp)
    assert len(report.cases) == 4
    assert report.mape == pytest.approx(0.1 / 1.1, rel=1e-6)
    for c in report.cases:
        assert c.error == pytest.approx(1 / 1.1 - 1, rel=1e-6)
    text = report.to_text()
    assert "MAPE 9.1%" in text
    html = write_html(report, tmp_path / "report.html", extrapolate(calibration_files["profile"], [2, 4, 8]))
    body = html.read_text()
    assert "plotly" in body.lower() and "MAPE" in body
    df = report.to_dataframe()
    assert list(df["bucket_cap_mb"]) == [0.5, 1.0, 4.0, 25.0]


# ------------------------------------------------------------------------------------------ CLI
def test_cli_fit_validate_predict(calibration_files: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "refit.json"
    assert main(["calibrate", "fit", str(calibration_files["comm"]), str(calibration_files["compute"]),
                 "--out", str(out)]) == 0
    assert "all-reduce" in capsys.readouterr().out
    load_profile(out)
    ddp_path = tmp_path / "ddp.json"
    write_json(_ddp(calibration_files, error=0.0), ddp_path)
    assert main(["calibrate", "validate", str(out), str(ddp_path), "--extrapolate", "2,8"]) == 0
    text = capsys.readouterr().out
    assert "MAPE 0.0%" in text and (tmp_path / "ddp_report.html").exists()
    (tmp_path / "ddp_report.html").unlink()
    assert main(["calibrate", "validate", str(out), str(ddp_path), "--json"]) == 0  # stdout is the report
    assert json.loads(capsys.readouterr().out)["mape"] == 0.0 and not (tmp_path / "ddp_report.html").exists()
    # --extrapolate under --json: its predictions listed beside the report (they used to be dropped silently),
    # the same as calibrate predict's at the same cap
    assert main(["calibrate", "validate", str(out), str(ddp_path), "--json", "--extrapolate", "2,8,128"]) == 0
    extra = json.loads(capsys.readouterr().out)["extrapolated"]
    assert [p["world_size"] for p in extra] == [2, 8, 128]
    cap = _ddp(calibration_files, error=0.0).cases[-1].bucket_cap_mb
    assert main(["calibrate", "predict", str(out), "--ranks", "2,8,128", "--bucket-cap-mb", str(cap), "--json"]) == 0
    assert [p["step_time_s"] for p in json.loads(capsys.readouterr().out)] == [p["step_time_s"] for p in extra]
    assert main(["calibrate", "predict", str(out), "--ranks", "2,128", "--bucket-cap-mb", "5", "--json"]) == 0
    preds = json.loads(capsys.readouterr().out)
    assert [p["world_size"] for p in preds] == [2, 128]
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"calibration": out.name, "parallelism": {"dp": 2}, "ddp": {"bucket_cap_mb": 5}}))
    assert main(["simulate", str(scenario), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dp"] == 2


def test_cli_errors_are_one_line(calibration_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _rewrite(calibration_files["profile"], version=0)
    assert main(["calibrate", "predict", str(calibration_files["profile"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simddp: error:") and "version 0" in err and "\n" not in err
    assert main(["calibrate", "fit", str(calibration_files["compute"]), str(calibration_files["comm"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "expected kind 'simddp-comm'" in err and "\n" not in err


# --------------------------------------------------------------------------------------------- merge
def test_merge_pools_repeats_of_each_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = compute_measurements(), compute_measurements()
    slow = b.model_copy(update={"step": stats(100e-3), "layers": [
        la.model_copy(update={"bwd": stats(2 * la.bwd.median_s)}) for la in b.layers]})
    merged = merge_measurements([a, slow])
    assert len(merged.step.times_s) == len(a.step.times_s) + len(slow.step.times_s)
    assert a.step.median_s < merged.step.median_s < slow.step.median_s + 1e-12
    assert len(merged.layers[1].bwd.times_s) == 12
    paths = []
    for k, m in enumerate((comm_measurements(), comm_measurements(0.4))):
        paths.append(tmp_path / f"comm_{k}.json")
        write_json(m, paths[-1])
    assert main(["calibrate", "merge", *map(str, paths), "--out", str(tmp_path / "comm.json")]) == 0
    comm = read_calibration_file(tmp_path / "comm.json", CommMeasurements)
    assert len(comm.interference) == 2
    assert all(len(c.stats.times_s) == 12 for c in comm.cases)
    assert "merged 2 simddp-comm files" in capsys.readouterr().out


def test_merge_refuses_mixed_files(calibration_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ScenarioError, match="different kinds"):
        merge_measurements([comm_measurements(), compute_measurements()])  # type: ignore[list-item]
    other = compute_measurements().model_copy(update={"model": "other.py:f"})
    with pytest.raises(ScenarioError, match="different models"):
        merge_measurements([compute_measurements(), other])
    assert main(["calibrate", "merge", str(calibration_files["profile"]), "--out", "x.json"]) == 2
    assert "expected a measurement file" in capsys.readouterr().err
