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
    assert rc == 2 and out == "" and "training.seq_len: an integer of 24 digits is over the limit of 2^53" in err
    rc, out, err = run(capsys, "simulate", "--json", *GPT2, "--set", "training.seq_len=1000000000000000")
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


SMALL_YAML = """name: small
cluster: {preset: dgx-a100-80gb, num_nodes: 1}
model:
  transformer: {num_layers: 4, hidden_size: 1024, num_heads: 16, ffn_hidden_size: 4096, vocab_size: 32000}
training: {global_batch_size: 32, seq_len: 512, micro_batch_size: 1}
"""


def test_hostile_plan_and_sweep_inputs_of_the_twentieth_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile-input probe of plan and sweep: each of these hung, misread a number, echoed a terminal escape or
    named nothing."""
    import time

    from simddp import safeio

    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    # A peak of 1e-300 FLOP/s made every kernel infinite; FSDP with tp 2 then looped forever in the fluid engine
    # (its clock at NaN), and plan with it. Refused now before any engine runs, as the default layout was.
    start = time.perf_counter()
    rc, _, err = run(capsys, "simulate", str(small), "--set", "cluster.gpu.peak_bf16_flop_per_s=1e-300",
                     "--set", "parallelism.tp=2", "--set", "parallelism.zero_stage=2")
    assert rc == 2 and "the step would take inf s, beyond the 1e+09 s" in err
    rc, _, err = run(capsys, "plan", str(small), "--gpus", "8", "--set", "cluster.gpu.peak_bf16_flop_per_s=1e-300")
    assert rc == 2 and "cannot be timed" in err and time.perf_counter() - start < 60
    # When no layout can be timed, the planner stops at the first whose lower bound is over the range (it simulated
    # every fitting layout: 36 s for a peak of 1 FLOP/s).
    rc, _, err = run(capsys, "plan", str(small), "--gpus", "8", "--set", "cluster.gpu.peak_bf16_flop_per_s=1")
    assert rc == 2 and "even the fastest layout's step would take" in err
    # Numbers as YAML 1.2 reads them: 0100 is 100 (not octal 64), 1:10 is not the base-60 number 70.
    assert safeio.parse_yaml("0100", "x") == 100 and safeio.parse_yaml("1:10", "x") == "1:10"
    assert safeio.parse_yaml("0x10", "x") == 16 and safeio.parse_yaml("1_000", "x") == 1000
    assert safeio.parse_yaml(".inf", "x") == math.inf and safeio.parse_yaml("1.5e+3", "x") == 1500.0
    rc, out, err = run(capsys, "sweep", str(small), "--vary", "training.seq_len=1:10", "--json")
    # its one point invalid: the JSON still printed with the reason, and exit 2 (nothing answered)
    assert rc == 2 and "valid integer" in _strict(out)["points"][0]["error"] and "every point" in err
    rc, out, _ = run(capsys, "simulate", str(small), "--set", "training.seq_len=0100", "--json")
    assert rc == 0 and _strict(out)["tokens_per_s"] == pytest.approx(100 * _strict(out)["samples_per_s"])
    # An output's name is shown with its control characters escaped.
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "training.seq_len=128", "--csv", "\x1b[31mred.csv")
    assert rc == 0 and "written: \\x1b[31mred.csv" in out and "\x1b" not in out
    # A number for a key under a mapping is not "a list".
    rc, _, err = run(capsys, "sweep", str(small), "--vary", "model.transformer.0=1,2")
    assert rc == 2 and "0 is not a key of model.transformer" in err


def test_hostile_plan_and_sweep_inputs_of_the_thirtieth_pass(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A probe of plan and sweep: an internal error, a boolean taken for a number, and errors that named the
    wrong thing or nothing."""
    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    # An invalid point keeps the value typed: an infinity, which strict JSON cannot hold, ended `--json` with an
    # internal error (exit 70); it is its text now, the other point answered.
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "ddp.bucket_cap_mb=1e400,25", "--json")
    points = _strict(out)["points"]
    assert rc == 0 and points[0]["ddp.bucket_cap_mb"] == "inf" and "finite" in points[0]["error"]
    assert points[1]["ddp.bucket_cap_mb"] == 25 and points[1]["error"] is None
    # A section equal to the base's was reused, and True == 1: micro-batch `true` ran as 1 (`--set` refuses it).
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "training.micro_batch_size=true,2", "--json")
    points = _strict(out)["points"]
    assert rc == 0 and "expected a number, not a boolean" in points[0]["error"] and points[1]["error"] is None
    # A boolean where text or a choice goes was called "not a number".
    rc, _, err = run(capsys, "simulate", str(small), "--set", "name=yes")
    assert rc == 2 and "name: expected text (quote it: 'yes'), not a boolean" in err
    rc, _, err = run(capsys, "simulate", str(small), "--set", "training.recompute=true")
    assert rc == 2 and "training.recompute: expected one of 'none', 'selective'" in err
    # An empty scenario path read the embedded default without a word.
    for command in ("plan", "simulate", "memory"):
        rc, out, err = run(capsys, command, "")
        assert (rc, out) == (2, "") and "scenario '': empty path" in err, command
    # --gpus 3 on 8-GPU nodes: 1, 2 and 4 are taken as part of a node, so "not a whole number of nodes" was half.
    rc, _, err = run(capsys, "plan", str(small), "--gpus", "3")
    assert rc == 2 and "neither a whole number of 8-GPU nodes nor a part of one node that divides its GPUs" in err
    # A batch no layout splits named a dp and a micro-batch the user never set.
    rc, _, err = run(capsys, "plan", str(small), "--gpus", "2048")  # tp 8 x pp 4 at most: dp 64 over 32 samples
    assert rc == 2 and err.startswith("simddp: error: training.global_batch_size(32): no layout splits it over "
                                      "2,048 GPUs")


def test_hostile_inputs_to_the_other_commands_of_the_thirtieth_pass(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A probe of simulate, memory, schema and calibrate: internal errors, absurd figures printed as answers, a
    comment eaten from a value, a raw pydantic error, a negative time."""
    import sys

    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    # An integer no float holds ended simulate with an internal error (exit 70; a float 1e310 was refused).
    huge = str(10**310)
    for key in ("training.seq_len", "model.transformer.hidden_size", "model.transformer.vocab_size"):
        rc, _, err = run(capsys, "simulate", str(small), "--set", f"{key}={huge}")
        assert rc == 2 and f"{key}: an integer of 311 digits is over the limit of 2^53" in err, key
    rc, _, err = run(capsys, "simulate", str(small), "--set", "training.seq_len=9007199254740993")
    assert rc == 2 and "training.seq_len: an integer of 16 digits is over the limit of 2^53" in err
    # A key that takes a float takes a larger integer as the float it is (a 20 PFLOP/s peak written in digits).
    rc, out, _ = run(capsys, "simulate", str(small), "--set", "cluster.gpu.peak_bf16_flop_per_s=20000000000000000",
                     "--json")
    assert rc == 0 and _strict(out)["step_time_s"] > 0
    rc, _, err = run(capsys, "simulate", str(small), "--set", f"cluster.gpu.peak_bf16_flop_per_s={huge}")
    assert rc == 2 and "an integer of 311 digits is over what a float holds" in err
    # memory printed a vocabulary of 2^53 as 10^24 GiB; simulate blamed the links for the messages it makes.
    wide = f"model.transformer={{num_layers: 4, hidden_size: {2**52}, num_heads: 16, vocab_size: {2**52}, " \
           f"ffn_hidden_size: 4096}}"
    rc, _, err = run(capsys, "memory", str(small), "--set", wide)
    assert rc == 2 and "beyond the 2^64 B (16 EiB) a 64-bit address space holds: the model's sizes" in err
    rc, _, err = run(capsys, "simulate", str(small), "--set", wide)
    assert rc == 2 and "the model's sizes are out of range" in err and "a link latency" not in err
    # YAML took ' #' on for a comment: the run was named 'run'.
    rc, out, _ = run(capsys, "simulate", str(small), "--set", "name=run #1", "--json")
    assert rc == 0 and _strict(out)["scenario"] == "run #1"
    rc, _, err = run(capsys, "schema", "")
    assert rc == 2 and "schema '': empty key path" in err
    # A part zero in exact arithmetic came out at -6e-19 s.
    rc, out, _ = run(capsys, "simulate", str(small), "--set", "ddp.overlap=false", "--json")
    assert rc == 0 and all(v >= 0 for k, v in _strict(out).items() if k.endswith("_time_s"))
    # Layer times measured at micro-batch 8, run at 10^8: MFU 55,564,455% printed as an answer. Refused beyond
    # twice the peak, and said in a note below it.
    sys.path.insert(0, str(Path(__file__).parent / "app"))
    from calibration_data import write_all

    files = write_all(tmp_path / "cal")
    cal = tmp_path / "cal.yaml"
    cal.write_text(f"calibration: {files['profile']}\nparallelism: {{dp: 2}}\n")
    rc, _, err = run(capsys, "simulate", str(cal), "--set", "training.micro_batch_size=100000000")
    assert rc == 2 and "the model FLOP/s its 2 GPUs peak at" in err and "measured times hold at" in err
    rc, out, _ = run(capsys, "simulate", str(cal), "--json")
    measured = _strict(out)
    assert rc == 0 and not any("measured at micro-batch" in n for n in measured["not_modelled"])
    rc, out, _ = run(capsys, "simulate", str(cal), "--set", "training.micro_batch_size=16", "--json")
    doubled = _strict(out)
    assert rc == 0 and any("measured at micro-batch 8" in n and "not scaled" in n for n in doubled["not_modelled"])
    # '2,,8' read as 2,8 and an empty --extrapolate as none; a cap given twice took the --set one without a word.
    for sizes in ("2,,8", "2,8,"):
        rc, _, err = run(capsys, "calibrate", "predict", str(files["profile"]), "--ranks", sizes)
        assert rc == 2 and "an empty size" in err, sizes
    rc, _, err = run(capsys, "calibrate", "validate", str(files["profile"]), str(files["ddp"]), "--extrapolate", "",
                     "--json")
    assert rc == 2 and "world sizes ''" in err
    rc, _, err = run(capsys, "calibrate", "predict", str(files["profile"]), "--ranks", "2", "--bucket-cap-mb", "7",
                     "--set", "ddp.bucket_cap_mb=5")
    assert rc == 2 and "give the bucket cap once" in err
    rc, out, _ = run(capsys, "calibrate", "predict", str(files["profile"]), "--ranks", "2, 8", "--json")
    assert rc == 0 and [p["world_size"] for p in _strict(out)] == [2, 8]
    # A compute file's unknown dtype came out of calibrate fit as pydantic's raw multi-line error, no file named.
    compute = json.loads(files["compute"].read_text())
    compute["parameters"][0]["dtype"] = "1"
    bad = tmp_path / "bad_compute.json"
    bad.write_text(json.dumps(compute))
    rc, _, err = run(capsys, "calibrate", "fit", str(files["comm"]), str(bad), "--out", str(tmp_path / "p.json"))
    assert rc == 2 and "bad_compute.json: malformed simddp-compute: parameters.0" in err
    assert "unknown dtype '1'" in err and "pydantic" not in err and len(err.strip().splitlines()) == 1


def test_a_full_standard_output_is_named() -> None:
    """`> /dev/full`: 'No space left on device' named nothing; it names standard output now."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "simddp.cli", "presets"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "simddp: error: [Errno 28] No space left on device: 'standard output'"]


def test_ctrl_c_stops_a_parallel_plan_at_once(tmp_path: Path) -> None:
    """`plan --jobs 2` interrupted hung for good in 2 of 5 runs (a worker waiting on a lock, the parent on the
    worker); the workers now ignore Ctrl-C and the parent stops them (simddp.limits.worker_pool)."""
    import signal
    import subprocess
    import sys
    import time

    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    for _ in range(2):
        # Ctrl-C as a terminal sends it: to a process that takes it (a shell running this in the background, as
        # CI may, leaves SIGINT ignored in its children, and Python then never raises KeyboardInterrupt).
        proc = subprocess.Popen([sys.executable, "-m", "simddp.cli", "plan", str(small), "--gpus", "8", "--jobs", "2",
                                 "--set", "model.transformer.num_layers=2000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(3)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 130 and time.perf_counter() - sent < 30
        assert not err.strip(), err  # no traceback from the pool's threads either


def test_a_plan_beyond_what_the_planner_searches_is_refused_at_once(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """16,384 layers on 1,024 GPUs ran past 10 minutes (a probe); the planner's search is bounded by layers x
    layout groups (simddp.limits.MAX_PLAN_LAYER_GROUPS) and says so in one line."""
    import time

    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    start = time.perf_counter()
    rc, _, err = run(capsys, "plan", str(small), "--gpus", "1024", "--set", "model.transformer.num_layers=16384",
                     "--set", "training.global_batch_size=1024")
    assert rc == 2 and "more than the planner searches (500,000 layers x groups" in err
    assert len(err.strip().splitlines()) == 1 and time.perf_counter() - start < 30


def test_review_of_the_hostile_input_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A review of this pass's fixes: a failed write to a named output kept its own message (it was blamed on
    standard output), an in-process caller's stdout is left alone, DataParallel's simpy run is refused like the
    others, and YAML simddp writes reads back (a name '08' was written bare and read back as the number 8)."""
    import resource
    import sys

    from simddp import safeio

    # A named output over the file size limit: its own error, not "standard output".
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    before = sys.stdout
    import signal

    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, hard))
        rc, _, err = run(capsys, "simulate", str(small), "--trace", str(tmp_path / "t.json"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert rc == 2 and "File too large" in err and "standard output" not in err
    assert sys.stdout is before  # main() restores the caller's stream
    rc, out, _ = run(capsys, "presets")
    assert rc == 0 and "dgx-a100-80gb" in out
    # DataParallel with infinite kernels: refused at once (its simpy run never ended).
    rc, _, err = run(capsys, "simulate", str(small), "--set", "cluster.gpu.peak_bf16_flop_per_s=1e-300",
                     "--set", "ddp.wrapper=dataparallel", "--set", "parallelism.zero_stage=0")
    assert rc == 2 and "would take inf s" in err
    # YAML round trips: strings that read as numbers are quoted; 1e3 is a number.
    for value in ("08", "0189", "1e3", "0o17", "2.13.0", "1:30", 8, 1.5, 1e20):
        assert safeio.parse_yaml(safeio.dump_yaml({"name": value}), "x") == {"name": value}
    assert safeio.parse_yaml("1e3", "x") == 1000.0 and safeio.parse_yaml("+.5", "x") == 0.5
    rc, _, err = run(capsys, "simulate", str(small), "--set", "name=08")
    assert rc == 2 and "name" in err  # a number where a name goes, as `--set name=8` is


def test_plan_and_sweep_probe_of_the_thirty_third_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A consistency probe of plan and sweep: a dp varied beside the cluster size was dropped (every point ran the
    derived dp and was labelled null), and plan called an invalid batch one no layout splits."""
    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "parallelism.dp=8,16,7", "--vary", "cluster.num_nodes=1,2",
                     "--json")
    points = _strict(out)["points"]
    assert rc == 0 and [p["parallelism.dp"] for p in points] == [8, 8, 16, 16, 7, 7]
    assert [p["error"] is None for p in points] == [True, False, False, True, False, False]
    assert "dp(7)" in points[-1]["error"] and "does not match 16 GPUs" in points[-1]["error"]
    for batch, why in (("-5", "Input should be greater than 0"), ("1.5", "fractional part"),
                       ("true", "not a boolean"), ("9007199254740993", "over the limit of 2^53")):
        rc, _, err = run(capsys, "plan", str(small), "--gpus", "8", "--set", f"training.global_batch_size={batch}")
        assert rc == 2 and err.startswith("simddp: error: training.global_batch_size: ") and why in err, batch


def test_sweep_and_simulate_outputs_of_the_thirty_fourth_pass(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A hostile-input probe of the outputs: two internal errors of sweep, a pipeline that --csv refused, exports
    whose parts did not add up, and a dangling link blamed as "File exists"."""
    small = tmp_path / "s.yaml"
    small.write_text(SMALL_YAML)
    # A list or mapping as the second key's value: the report grouped its lines by the raw value (unhashable).
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "ddp.bucket_cap_mb=25,50", "--vary",
                     "cluster.collective_fits=[]", "--html", str(tmp_path / "h.html"))
    assert rc == 0 and (tmp_path / "h.html").read_text().count("cluster.collective_fits=[]") >= 1
    # A non-finite number inside a varied mapping or list: --json ended with an internal error, after --csv was
    # written; now it is text, and a failing JSON would leave no file behind.
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "ddp.bucket_cap_mb=25", "--vary",
                     "cluster.collective_fits=[.inf]", "--json", "--csv", str(tmp_path / "both.csv"))
    assert rc == 2 and _strict(out)["points"][0]["cluster.collective_fits"] == ["inf"]
    assert (tmp_path / "both.csv").exists()
    # A pipeline the fast engine answers: --csv ran the event simulation (layers.csv reads no times from it at
    # pp > 1) and was refused for its micro-batches; --trace needs that simulation and now says so.
    big = ["--set", "parallelism.pp=4", "--set", "training.global_batch_size=80000"]
    rc, out, err = run(capsys, "simulate", str(small), *big, "--csv", str(tmp_path / "c"))
    assert rc == 0 and (tmp_path / "c" / "layers.csv").exists(), err
    rc, _, err = run(capsys, "simulate", str(small), *big, "--trace", str(tmp_path / "t.json"))
    assert rc == 2 and err.startswith("simddp: error: --trace: a trace comes from the event-by-event simulation")
    assert "without --trace the fast engine answers" in err and not (tmp_path / "t.json").exists()
    # summary.csv has every part of the step (gradient clipping and DDP's host time had no row), adding up.
    rc, _, _ = run(capsys, "simulate", str(small), "--set", "training.grad_clip_norm=1", "--csv", str(tmp_path / "s"))
    rows = dict(line.split(",", 1) for line in (tmp_path / "s" / "summary.csv").read_text().splitlines()[1:])
    parts = [float(v) for k, v in rows.items() if k.startswith("breakdown.")]
    assert rc == 0 and float(rows["breakdown.grad_clip"]) > 0 and len(parts) == 12
    assert sum(parts) == pytest.approx(float(rows["step_time_s"]), rel=1e-9)
    # A sweep's points carry every part too (a pipeline point left its bubble, sends and TP waits out).
    rc, out, _ = run(capsys, "sweep", str(small), "--vary", "parallelism.pp=2,4", "--json")
    for p in _strict(out)["points"]:
        total = sum(p[k] for k in ("compute_time_s", "interference_time_s", "tp_comm_time_s", "exposed_comm_time_s",
                                   "pipeline_bubble_time_s", "stage_imbalance_time_s", "pipeline_p2p_time_s",
                                   "ddp_host_time_s", "grad_clip_time_s", "optimizer_time_s", "host_overhead_s"))
        assert p["pipeline_bubble_time_s"] > 0 and total == pytest.approx(p["step_time_s"], rel=1e-9)
    # An output directory that is a dangling symbolic link: "cannot write here (File exists)".
    (tmp_path / "gone").symlink_to(tmp_path / "missing" / "dir")
    rc, _, err = run(capsys, "simulate", str(small), "--csv", str(tmp_path / "gone"))
    assert rc == 2 and "gone: is a symbolic link to" in err and "which does not exist" in err
    # An empty --bytes ran the whole size sweep (exit 0); it is a size like any other now.
    rc, out, err = run(capsys, "collective", "all-reduce", "--bytes", "")
    assert rc == 2 and out == "" and "--bytes '': expected a number" in err
