"""The CLI's robustness contract: one-line errors (argparse included), strict JSON, sanity-checked results
(a failed check is an internal-error report, exit 70, never output), safe outputs, and `simddp app`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from simddp import cli, sanity
from simddp.errors import INTERNAL_ERROR_EXIT, InternalError, ScenarioError

GPT2 = ["--set", "model.preset=gpt2", "--set", "cluster.num_nodes=2", "--set", "parallelism.dp=null",
        "--set", "training.global_batch_size=null", "--set", "training.seq_len=1024"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exit_:
        rc = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(token)
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("argv, message", [
    (["frobnicate"], "simddp: error: argument command: invalid choice: 'frobnicate'"),
    ([], "simddp: error: the following arguments are required: command"),
    (["app", "--port", "-5"], "simddp app: error: argument --port: -5 must be >= 1"),
    (["app", "--port", "70000"], "simddp app: error: argument --port: 70000 must be <= 65535"),
    (["app", "--port", "http"], "simddp app: error: argument --port: 'http' is not an integer"),
    (["app", "--host", "a b"], "simddp app: error: argument --host: 'a b' is not a host name or address"),
    (["calibrate", "validate", "p.json", "d.json", "--z", "nan"], "argument --z: 'nan' is not a finite number"),
    (["calibrate", "predict", "p.json", "--z", "11"], "argument --z: 11 must be <= 10 standard errors"),
    (["calibrate", "predict", "p.json", "--bucket-cap-mb", "inf"], "argument --bucket-cap-mb: 'inf' is not a finite"),
    (["memory", "--stage", "-1"], "argument --stage: -1 must be >= 0"),
    (["memory", "--num-gpus", "0"], "argument --num-gpus: 0 must be > 0"),
    (["calibrate", "predict", "p.json", "--bucket-cap-mb", "1e308"], "'1e308' is above 1,099,511,627,776 MiB"),
])
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.rstrip().endswith("--help)"), err


def test_simulate_json_is_strict_and_sane(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "simulate", "--json", *GPT2)
    assert rc == 0
    data = _strict(out)
    assert data["exposed_comm_time_s"] <= data["step_time_s"]


def test_a_result_that_fails_its_checks_is_an_internal_error(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from simddp.sim import step

    real = step.simulate_step

    def broken(scenario: Any, trace: bool = True, **kwargs: Any) -> Any:
        result = real(scenario, trace=trace, **kwargs)
        return result.model_copy(update={"exposed_comm_time_s": result.step_time_s * 2})

    monkeypatch.setattr("simddp.sim.simulate_step", broken)
    rc, out, err = run(capsys, "simulate", "--json", *GPT2)
    assert rc == INTERNAL_ERROR_EXIT and out == ""
    assert err.startswith("simddp: internal error: step result: exposed communication") and err.count("\n") == 1

    def nan(scenario: Any, trace: bool = True, **kwargs: Any) -> Any:
        return real(scenario, trace=trace, **kwargs).model_copy(update={"mfu": math.nan})

    monkeypatch.setattr("simddp.sim.simulate_step", nan)
    rc, out, err = run(capsys, "simulate", *GPT2)
    assert rc == INTERNAL_ERROR_EXIT and out == "" and "mfu is nan, not a finite number" in err


def test_an_unexpected_exception_is_one_line_unless_debugging(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: Any) -> int:
        raise KeyError("oops")

    monkeypatch.setattr(cli, "cmd_presets", boom)
    rc, _, err = run(capsys, "presets")
    assert rc == INTERNAL_ERROR_EXIT and "internal error: KeyError: 'oops'" in err and err.count("\n") == 1
    monkeypatch.setenv("SIMDDP_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["presets"])


def test_out_of_range_inputs_are_the_users_not_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "simulate", "--json", *GPT2, "--set", "training.seq_len=100000000000000000000000")
    assert rc == 2 and out == "" and "beyond the 1e+09 s the model answers for" in err
    rc, out, err = run(capsys, "simulate", *GPT2, "--set", "cluster.gpu.peak_bf16_flop_per_s=1.0e-300")
    assert rc == 2 and "out of range" in err


def test_sanity_unit_checks() -> None:
    with pytest.raises(ScenarioError):
        sanity.check_range(math.inf)
    sanity.check_range(10.0)
    with pytest.raises(InternalError, match=r"x: a\.0 is nan"):
        sanity.check_finite({"a": [math.nan]}, "x")


def test_trace_never_replaces_the_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sc = tmp_path / "sc.yaml"
    sc.write_text("cluster: {preset: dgx-a100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n")
    before = sc.read_text()
    rc, _, err = run(capsys, "simulate", str(sc), "--trace", str(sc))
    assert rc == 2 and "is also an input of this command" in err and sc.read_text() == before
    os.mkfifo(tmp_path / "fifo")
    rc, _, err = run(capsys, "simulate", str(sc), "--trace", str(tmp_path / "fifo"))
    assert rc == 2 and "is a FIFO" in err
    rc, _, _ = run(capsys, "simulate", str(sc), "--trace", str(tmp_path / "t.json"))
    assert rc == 0 and "traceEvents" in _strict((tmp_path / "t.json").read_text())


def test_app_binds_loopback_with_the_shipped_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.append(argv))
    assert cli.main(["app", "--headless"]) == 0
    argv = calls[-1]
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4].endswith("streamlit_app.py")
    flags = argv[5:]
    for flag in ("--server.address=127.0.0.1", "--server.port=8501", "--browser.gatherUsageStats=false",
                 "--browser.serverAddress=localhost", "--server.headless=true", "--server.maxUploadSize=20"):
        assert flag in flags, flags
    cli.main(["app", "--host", "0.0.0.0", "--port", "9000"])
    flags = calls[-1][5:]
    assert "--server.address=0.0.0.0" in flags and "--server.port=9000" in flags
    assert not any(f.startswith("--browser.serverAddress=0.0.0.0") for f in flags)  # no IP lookup either way


def test_the_shipped_streamlit_config() -> None:
    import tomllib

    folder = cli.dashboard_folder()
    config = tomllib.loads((folder / ".streamlit" / "config.toml").read_text())
    assert config["browser"]["gatherUsageStats"] is False
    assert config["server"]["address"] == "127.0.0.1"
    root = Path(__file__).resolve().parents[1]
    assert (root / ".streamlit" / "config.toml").read_text() == (folder / ".streamlit" / "config.toml").read_text()


def test_collect_needs_torch_and_an_out(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    rc, _, err = run(capsys, "calibrate", "collect", "comm", "--out", "comm.json")
    assert rc == 2 and "the collectors need torch" in err
    monkeypatch.setattr(importlib.util, "find_spec", real)
    rc, _, err = run(capsys, "calibrate", "collect", "ddp", "--model", "m.py:f")
    assert rc == 2 and "--out FILE is required" in err


def test_launcher_status() -> None:
    from simddp_calibration.launch import worker_status

    assert worker_status([2, 2]) == 2
    assert worker_status([17]) == 3 and worker_status([3, -15]) == 3 and worker_status([2, 3]) == 3


@pytest.mark.parametrize("argv, message", [
    (["buckets", "--set", "ddp.bucket_cap_mb=1e308"], "ddp.bucket_cap_mb: Input should be less than or equal to"),
    (["collective", "all-reduce", "--num-nodes", "100000000", "--bytes", "8"],
     "--num-nodes(100000000) x --gpus-per-node(8) = 800,000,000 GPUs is over the limit"),
    (["collective", "all-to-all", "--algorithm", "tree", "--bytes", "8"], "--algorithm/--protocol: NCCL runs"),
    (["buckets", "--csv", "--json"], "--json and --csv: choose one"),
    (["calibrate", "validate", "p.json", "d.json", "--gpus-per-node", "8"], "--gpus-per-node shapes --extrapolate"),
])
def test_refused_flag_values_and_combinations(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              message: str) -> None:
    """Values that overflowed (a bucket cap of 1e308 MiB: an internal error), sizes past the caps the scenario
    keeps, and flags that were silently ignored: one line each, exit 2."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_presets_json_flag_before_show(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "presets", "--json", "show", "gpt2")
    assert rc == 0 and "transformer" in _strict(out)["model"]


@pytest.mark.parametrize(("cluster", "tp", "why"), [
    ("dgx-a100-80gb", 1, "nvls needs an intra-node link with nvls_algbw_bytes_per_s"),  # no NVSwitch SHARP
    ("dgx-h100-80gb", 8, "nvls needs >= 2 ranks per node (group has 1)"),  # one data-parallel rank per node
])
def test_an_algorithm_the_group_cannot_run_names_ddp_algorithm(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                cluster: str, tp: int, why: str) -> None:
    """ddp.algorithm nvls where NCCL could not run it: a ScenarioError naming the field from the API (a bare
    ValueError from the collective model before), one line from the CLI."""
    import simddp

    data = {"cluster": {"preset": cluster, "num_nodes": 2}, "model": {"preset": "llama2-7b"},
            "parallelism": {"tp": tp}, "ddp": {"algorithm": "nvls"}, "training": {"seq_len": 512}}
    with pytest.raises(ScenarioError, match=r"^ddp\.algorithm: nvls cannot run the data-parallel all-reduce here: "
                       + why.replace("(", r"\(").replace(")", r"\)")):
        simddp.simulate(data, trace=False)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    code, out, err = run(capsys, "simulate", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "ddp.algorithm: nvls" in err


def test_a_refused_command_leaves_no_output_directory(tmp_path, capsys) -> None:
    """`simulate --csv c5 --trace c5/summary.csv` was refused (two outputs, one file) after the output check had
    created c5: the empty directory stayed. A command that fails now removes the directories it created while
    they are empty; one that wrote into them keeps them."""
    from simddp.cli import main

    out = tmp_path / "c5" / "deeper"
    assert main(["simulate", "--csv", str(out), "--trace", str(out / "summary.csv")]) == 2
    assert "the same file as" in capsys.readouterr().err
    assert not (tmp_path / "c5").exists()
    assert main(["simulate", "--csv", str(out)]) == 0
    assert (out / "summary.csv").exists()
