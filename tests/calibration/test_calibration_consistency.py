"""Calibration consistency: no profile from made-up numbers, no mixed world sizes, validation warns when
it compares different setups, and every fit error names the file and the measurement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import comm_measurements, compute_measurements, run_info, stats

from simddp.cli import main
from simddp.config import ScenarioError
from simddp.fit import fit_profile
from simddp.profile import (
    CommMeasurements,
    DDPCase,
    DDPMeasurements,
    load_profile,
    read_calibration_file,
    write_json,
)
from simddp.report import validate

SOURCES = {"comm": "comm.json", "compute": "compute.json"}


def _comm(**update: object) -> CommMeasurements:
    return comm_measurements().model_copy(update=update)


def _fit_error(comm: CommMeasurements | None = None, compute=None, **kw: bool) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ScenarioError) as err:
        fit_profile(comm or comm_measurements(), compute or compute_measurements(), SOURCES, **kw)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_complete_pair_fits_without_placeholders() -> None:
    profile = fit_profile(comm_measurements(), compute_measurements(), SOURCES)
    assert not [n for n in profile.notes if n.startswith("PLACEHOLDER")]
    assert any(r.fit.op == "all-reduce" for r in profile.fits)


def test_one_message_size_is_refused_unless_partial_is_allowed() -> None:
    comm = comm_measurements()
    one = comm.model_copy(update={"cases": [c for c in comm.cases if c.size_bytes == 2**20]})
    message = _fit_error(one)
    assert message.startswith("comm.json: all-reduce was measured at 1 message size(s) on the intra-node tier")
    assert "--allow-partial" in message
    profile = fit_profile(one, compute_measurements(), SOURCES, allow_partial=True)
    placeholders = [n for n in profile.notes if n.startswith("PLACEHOLDER")]
    assert len(placeholders) == 1 and "intra-node links use 1 GB/s and 10 us" in placeholders[0]


def test_no_all_reduce_is_refused() -> None:
    comm = comm_measurements()
    only_broadcast = comm.model_copy(update={"cases": [c for c in comm.cases if c.op == "broadcast"]})
    assert "all-reduce was measured at 0 message size(s)" in _fit_error(only_broadcast)


def test_partial_runs_and_missing_rates_are_refused_unless_allowed() -> None:
    assert _fit_error(_comm(complete=False, error="rank 1 died")).startswith(
        "comm.json: the collector stopped early (rank 1 died)")
    no_peak = compute_measurements().model_copy(update={"peak": None})
    assert "compute.json: no measured device rates" in _fit_error(compute=no_peak)
    profile = fit_profile(_comm(complete=False, error="x"), no_peak, SOURCES, allow_partial=True)
    assert sum(n.startswith("PLACEHOLDER") for n in profile.notes) == 2
    assert profile.cluster["gpu"]["hbm_bytes"] == 16 * 2**30  # the placeholder, said so in the notes


def test_different_ranks_per_node_are_refused_unless_mixed_is_allowed() -> None:
    compute4 = compute_measurements().model_copy(update={"run": run_info(4)})
    message = _fit_error(compute=compute4)
    assert "comm.json was measured on 2 ranks (2 per node) and compute.json on 4 (4 per node)" in message
    fit_profile(comm_measurements(), compute4, SOURCES, allow_mixed=True)
    alone = compute_measurements().model_copy(update={"run": run_info(1)})
    fit_profile(comm_measurements(), alone, SOURCES)  # one process (a GPU, or an uncontended CPU) is fine


def test_mixed_num_ranks_within_comm_are_refused_unless_allowed() -> None:
    comm = comm_measurements()
    four = [c.model_copy(update={"num_ranks": 4}) for c in comm.cases if c.op == "all-reduce"][:5]
    mixed = comm.model_copy(update={"cases": [*comm.cases, *four]})
    message = _fit_error(mixed)
    assert message.startswith("comm.json: all-reduce on world was measured at 2 ranks (17 sizes), 4 ranks (5 sizes)")
    profile = fit_profile(mixed, compute_measurements(), SOURCES, allow_mixed=True)
    assert all(r.fit.measured_ranks == 2 for r in profile.fits)
    assert any(n.startswith("mixed numbers of ranks") for n in profile.notes)


def test_every_fit_error_names_the_file_and_the_measurement(tmp_path: Path) -> None:
    comm = comm_measurements()
    zero = comm.model_copy(update={"cases": [comm.cases[0].model_copy(
        update={"stats": stats(1e-3).model_copy(update={"median_s": 0.0})}), *comm.cases[1:]]})
    assert _fit_error(zero).startswith(f"comm.json: all-reduce on world at {comm.cases[0].size_bytes} B: median time 0")
    path = tmp_path / "nan.json"
    data = json.loads(comm.model_dump_json())
    data["cases"][3]["stats"]["median_s"] = math.nan
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError) as err:
        read_calibration_file(path, CommMeasurements)
    assert str(err.value).startswith(f"{path}: malformed simddp-comm: cases.3 (all-reduce on world, "
                                     f"{comm.cases[3].size_bytes} B).stats.median_s: Input should be a finite")
    negative = compute_measurements()
    layers = [negative.layers[0], negative.layers[1].model_copy(update={"bwd": stats(-1e-3)}), *negative.layers[2:]]
    assert _fit_error(compute=negative.model_copy(update={"layers": layers})).startswith(
        "compute.json: layers.1 (l0): backward median")


def test_cli_fit_refuses_without_writing_and_allow_partial_warns(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    comm = comm_measurements()
    one = comm.model_copy(update={"cases": [c for c in comm.cases if c.size_bytes == 2**20]})
    write_json(one, tmp_path / "comm.json")
    write_json(compute_measurements(), tmp_path / "compute.json")
    args = ["calibrate", "fit", str(tmp_path / "comm.json"), str(tmp_path / "compute.json"),
            "--out", str(tmp_path / "p.json")]
    assert main(args) == 2
    assert not (tmp_path / "p.json").exists() and "all-reduce was measured" in capsys.readouterr().err
    assert main([*args, "--allow-partial"]) == 0
    out, err = capsys.readouterr()
    assert "simddp: warning: PLACEHOLDER" in err and "1 placeholder(s)" in out
    assert any(n.startswith("PLACEHOLDER") for n in load_profile(tmp_path / "p.json").notes)


def _ddp(model: str = "toy.py:build", micro_batch: int = 8, world: int = 2, median_s: float = 0.05,
         sizes: list[int] | None = None) -> DDPMeasurements:
    case = DDPCase(bucket_cap_mb=25.0, num_buckets=len(sizes or []), bucket_sizes_bytes=sizes or [],
                   stats=stats(median_s))
    return DDPMeasurements(kind="simddp-ddp", version=1, complete=True, run=run_info(world), model=model,
                           optimizer="sgd", micro_batch_size=micro_batch, cases=[case])


def test_validate_warns_when_the_setups_differ(calibration_files: dict[str, Path]) -> None:
    same = validate(calibration_files["profile"], _ddp())
    assert same.warnings == []
    other = validate(calibration_files["profile"], _ddp(model="other.py:f", micro_batch=32, world=4,
                                                        sizes=[1000, 2000]))
    joined = " | ".join(other.warnings)
    for part in ("DDP model 'other.py:f' differs", "3,000 bytes of gradients", "micro-batch 32 differs",
                 "DDP ran on 4 ranks"):
        assert part in joined
    assert "WARNING: DDP model" in other.to_text() and other.to_json_dict()["warnings"] == other.warnings


def test_validate_refuses_a_zero_step_naming_the_case(calibration_files: dict[str, Path]) -> None:
    with pytest.raises(ScenarioError, match=r"ddp.json: cases.0 \(bucket_cap_mb 25\): median step time 0.0 s"):
        validate(calibration_files["profile"], _ddp(median_s=0.0))
