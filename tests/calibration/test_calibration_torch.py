"""The collectors for real: 2 gloo ranks under torchrun, tiny sizes and the tiny model (CI's short run).

Checks the files, the fit and that the simulator's prediction of the DDP steps is sane; the accuracy
itself is the acceptance run's job (docs/calibration.md), not CI's (shared runners are noisy).
Also: a rank that hangs or dies ends the collector within its timeout, keeping partial results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT / 'calibration' / 'models' / 'small_transformer.py'}:tiny"


def torchrun(*args: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env, check=False)


def simddp_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simddp.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120, check=False)


def test_short_collection_fit_and_prediction(tmp_path: Path) -> None:
    comm, compute, ddp = tmp_path / "comm.json", tmp_path / "compute.json", tmp_path / "ddp.json"
    r = simddp_cli("calibrate", "collect", "comm", "--nproc-per-node", "2", "--backend", "gloo", "--threads", "1",
                   "--out", str(comm), "--sizes", "4K,64K,1M", "--repeats", "3", "--warmup", "1",
                   "--interference-sizes", "256K")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "comm.partial.json").exists()  # removed once the result is complete
    data = json.loads(comm.read_text())
    assert data["complete"] and data["run"]["world_size"] == 2 and data["run"]["backend"] == "gloo"
    assert {c["op"] for c in data["cases"]} == {"all-reduce", "reduce-scatter", "all-gather", "broadcast"}
    assert all(len(c["stats"]["times_s"]) == 3 for c in data["cases"])
    assert len(data["interference"]) == 1
    assert "[12/13" in r.stderr  # rank 0's progress

    r = torchrun("-m", "simddp_calibration.compute", "--model", TINY, "--device", "cpu", "--threads", "1",
                 "--out", str(compute), "--repeats", "5", "--warmup", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(compute.read_text())
    assert data["complete"] and data["micro_batch_size"] == 2
    assert sorted(data["grad_ready_order"]) == list(range(len(data["parameters"])))
    covered = sorted(i for la in data["layers"] for i in la["param_indices"])
    assert covered == list(range(len(data["parameters"])))
    assert sum(la["bwd"]["median_s"] for la in data["layers"]) == pytest.approx(data["backward"]["median_s"],
                                                                                  rel=1e-6)
    assert data["ddp_overhead"] is not None and data["peak"]["matmul_flop_per_s"] > 0

    r = torchrun("-m", "simddp_calibration.ddp_step", "--model", TINY, "--backend", "gloo", "--threads", "1",
                 "--bucket-cap-mb", "0.01", "1", "--rounds", "2", "--repeats", "2", "--warmup", "2", "--out", str(ddp))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(ddp.read_text())
    assert [c["bucket_cap_mb"] for c in data["cases"]] == [0.01, 1.0]
    assert all(len(c["stats"]["times_s"]) == 4 for c in data["cases"])
    assert data["cases"][0]["num_buckets"] > data["cases"][1]["num_buckets"] >= 1

    r = simddp_cli("calibrate", "fit", str(comm), str(compute), "--out", str(tmp_path / "profile.json"))
    assert r.returncode == 0, r.stderr
    r = simddp_cli("calibrate", "validate", str(tmp_path / "profile.json"), str(ddp), "--json",
                   "--html", str(tmp_path / "report.html"))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    for case in report["cases"]:
        predicted, measured = case["prediction"]["step_time_s"], case["measured_s"]
        assert 0 < predicted < 10 * measured and measured < 10 * predicted
        assert case["prediction"]["num_buckets"] == case["measured_num_buckets"]  # simddp's buckets = torch's
    assert (tmp_path / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize("fault", ["hang", "exit"])
def test_failed_rank_ends_the_collector_with_partial_results(tmp_path: Path, fault: str) -> None:
    out = tmp_path / "comm.json"
    start = time.monotonic()
    r = torchrun("-m", "simddp_calibration.collectives", "--out", str(out), "--sizes", "1K:64K", "--repeats", "2",
                 "--timeout", "6", "--interference-sizes", "none", env={"SIMDDP_CALIBRATION_FAULT": f"{fault}:1:3"},
                 timeout=90)
    elapsed = time.monotonic() - start
    assert r.returncode != 0
    assert elapsed < 60
    assert not out.exists()  # the final file appears only when complete
    data = json.loads((tmp_path / "comm.partial.json").read_text())
    assert data["complete"] is False and data["error"]
    assert len(data["cases"]) >= 3
    assert f"partial results in {tmp_path / 'comm.partial.json'}" in r.stderr


def test_a_failed_rerun_keeps_the_complete_result(tmp_path: Path) -> None:
    """Through `simddp calibrate collect`: exit 3, one error line, the old complete comm.json untouched."""
    out = tmp_path / "comm.json"
    out.write_text('{"complete": true}')
    r = subprocess.run([sys.executable, "-m", "simddp.cli", "calibrate", "collect", "comm", "--out", str(out),
                        "--sizes", "1K,4K,16K", "--repeats", "2", "--warmup", "0", "--interference-sizes", "none",
                        "--timeout", "20"], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
                       env=dict(os.environ, OMP_NUM_THREADS="1", SIMDDP_CALIBRATION_FAULT="exit:1:1"))
    assert r.returncode == 3, r.stderr[-3000:]
    assert out.read_text() == '{"complete": true}'
    partial = json.loads((tmp_path / "comm.partial.json").read_text())
    assert partial["complete"] is False and len(partial["cases"]) >= 1
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "partial results in" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr


def test_a_rerun_keeps_the_earlier_runs_partial_results(tmp_path: Path) -> None:
    """The partial file of a stopped run (which the docs ask to send back) was replaced by the next run's at its
    first measurement: 22 measurements became 1. It is moved aside, once a run starts."""
    out = tmp_path / "comm.json"
    earlier = '{"complete": false, "cases": ["22 of them"]}'
    (tmp_path / "comm.partial.json").write_text(earlier)
    r = torchrun("-m", "simddp_calibration.collectives", "--out", str(out), "--sizes", "1K,4K", "--repeats", "2",
                 "--warmup", "0", "--interference-sizes", "none", timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    previous = tmp_path / "comm.partial.previous.json"
    assert previous.read_text() == earlier
    assert f"an earlier run's partial results moved to {previous}" in r.stderr
    assert json.loads(out.read_text())["complete"] is True and not (tmp_path / "comm.partial.json").exists()


@pytest.mark.parametrize("out", ["/proc/simddp-test/comm.json", "."])
def test_an_unwritable_out_stops_every_rank_before_measuring(tmp_path: Path, out: str) -> None:
    """Direct torchrun: rank 0 checks --out, every rank exits 2, one message (rank 0's)."""
    r = torchrun("-m", "simddp_calibration.collectives", "--out", out, "--sizes", "1K", "--repeats", "1",
                 timeout=90)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if "simddp_calibration.collectives: error" in line]
    assert len(lines) == 1, r.stderr[-3000:]
    assert "cannot write here" in lines[0] or "is a directory" in lines[0]
    assert "[1/" not in r.stderr  # nothing was measured


def test_collect_checks_out_before_launching(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("x = 1\n")
    for args, message in [(["comm", "--out", "/proc/simddp-test/comm.json"], "cannot write here"),
                          (["compute", "--model", f"{model}:build", "--out", str(model)], "is also an input"),
                          (["ddp", "--model", f"{TINY}"], "--out FILE is required")]:
        start = time.monotonic()
        r = simddp_cli("calibrate", "collect", *args)
        assert r.returncode == 2 and time.monotonic() - start < 10
        assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert model.read_text() == "x = 1\n"


def test_import_model_writes_a_scenario_simddp_reads(tmp_path: Path) -> None:
    out = tmp_path / "model.yaml"
    r = subprocess.run([sys.executable, "-m", "simddp_calibration.import_model", TINY, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       check=False)
    assert r.returncode == 0, r.stderr
    r = simddp_cli("buckets", str(out), "--set", "ddp.bucket_cap_mb=0.01", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["buckets"]) > 1


def test_bad_model_spec_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "simddp_calibration.compute", "--model", "nope.py:f", "--out",
                        str(tmp_path / "c.json")], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    assert r.returncode == 2
    assert "nope.py does not exist" in r.stderr and "Traceback" not in r.stderr


def test_ddp_knobs_measured_against_the_model(tmp_path: Path) -> None:
    """find_unused_parameters / static_graph: simulated step differences against paired CPU measurements.

    gloo on 2 shared cores wakes up late at random (~4 ms ticks beside ~9 ms steps), so the paired differences
    spread widely; the check is that the simulated difference lies inside their spread (the interquartile range
    widened by itself), and that static_graph costs nothing in the steady state (simulated exactly 0)."""
    comm, compute, ddp = tmp_path / "comm.json", tmp_path / "compute.json", tmp_path / "ddp.json"
    r = simddp_cli("calibrate", "collect", "comm", "--nproc-per-node", "2", "--backend", "gloo", "--threads", "1",
                   "--out", str(comm), "--sizes", "1K,16K,256K", "--repeats", "5", "--warmup", "1",
                   "--interference-sizes", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    r = torchrun("-m", "simddp_calibration.compute", "--model", TINY, "--device", "cpu", "--threads", "1",
                 "--out", str(compute), "--repeats", "20", "--warmup", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(compute.read_text())
    assert data["num_autograd_nodes"] == 116 and len(data["rank_step_times_s"]) == 2
    assert len(data["graph_search"]["times_s"]) == 20
    r = torchrun("-m", "simddp_calibration.ddp_step", "--model", TINY, "--backend", "gloo", "--threads", "1",
                 "--rounds", "40", "--repeats", "3", "--warmup", "2", "--knobs", "--out", str(ddp), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = simddp_cli("calibrate", "fit", str(comm), str(compute), "--out", str(tmp_path / "profile.json"),
                   "--allow-partial")
    assert r.returncode == 0, r.stderr
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["jitter"]["cv"] > 0 and profile["jitter"]["num_samples"] == 40
    assert profile["cluster"]["autograd_node_traversal_s"] > 0
    r = simddp_cli("calibrate", "validate", str(tmp_path / "profile.json"), str(ddp), "--json",
                   "--html", str(tmp_path / "report.html"))
    assert r.returncode == 0, r.stderr
    knobs = {k["setting"]: k for k in json.loads(r.stdout)["knobs"]}
    assert set(knobs) == {"find_unused_parameters", "static_graph", "find_unused_parameters + static_graph"}
    assert knobs["find_unused_parameters"]["predicted_s"] > 0
    assert knobs["static_graph"]["predicted_s"] == 0 and knobs["find_unused_parameters + static_graph"][
        "predicted_s"] == 0
    for k in knobs.values():
        assert k["num_pairs"] == 120
        # Inside the measured spread: the interquartile range widened by itself on each side (Tukey's inner
        # fences). The plain IQR held in most runs but not in every CI run on 2 shared cores (the search
        # prediction 2.70 ms against a p75 of 2.50 ms once); docs/ddp_knobs.md has the measured figures.
        iqr = k["measured_p75_s"] - k["measured_p25_s"]
        assert k["measured_p25_s"] - iqr <= k["predicted_s"] <= k["measured_p75_s"] + iqr, k


def test_graph_search_counts_the_autograd_nodes_ddp_visits() -> None:
    """The search's cost is nodes x cluster.autograd_node_traversal_s: the collectors' node count is exact on
    the fit model and the held-out one (their timings, which depend on the host and its load, are compared in
    benchmarks/bench_graph_search.py, not here)."""
    from simddp_calibration.common import count_autograd_nodes, load_factory

    def model(file: str, factory: str = "factory") -> Any:
        return load_factory(f"{ROOT / 'calibration' / 'models' / file}:{factory}")()

    torch.manual_seed(0)
    fit_model, fit_inputs = model("small_transformer.py")
    tiny_model, tiny_inputs = model("small_transformer.py", "tiny")
    held_model, held_inputs = model("deep_mlp.py")
    assert count_autograd_nodes(tiny_model, tiny_inputs) == 116
    assert count_autograd_nodes(fit_model, fit_inputs) == 340
    assert count_autograd_nodes(held_model, held_inputs) == 2001


def test_nccl_with_more_ranks_than_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two NCCL ranks on a one-GPU node stop before NCCL starts (seen on an H100 machine: NCCL itself fails
    there with a CUDA traceback)."""
    from simddp_calibration.common import CollectorError, Dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(CollectorError, match=r"2 ranks on this node but 1 visible GPU\(s\); NCCL needs one GPU per "
                                             r"rank: launch at most 1 rank\(s\) per node"):
        Dist("nccl", 10.0)


@pytest.mark.parametrize(("sig", "to"), [("SIGINT", "group"), ("SIGTERM", "group"), ("SIGINT", "simddp"),
                                         ("SIGTERM", "simddp")])
def test_a_stopped_collection_ends_in_one_line_and_keeps_why(tmp_path: Path, sig: str, to: str) -> None:
    """Ctrl-C (SIGINT to the terminal's group) ended in 116-169 lines of torchrun traceback, exit 1, and a partial
    file whose error was null; SIGTERM to the group (timeout, scancel) ended `simddp` at once, exit 143, no word.
    A signal to the `simddp` process alone is passed to the launcher (a SIGINT to it alone was ignored and the run
    went on to the end)."""
    import signal

    out = tmp_path / "comm.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "simddp.cli", "calibrate", "collect", "comm", "--out", str(out), "--sizes", "1K:16M",
         "--repeats", "3", "--interference-sizes", "none", "--timeout", "60"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                   PYTHONPATH=str(ROOT)), start_new_session=True)
    partial = tmp_path / "comm.partial.json"
    deadline = time.monotonic() + 90
    while not partial.exists() and time.monotonic() < deadline:  # a measurement is kept: then stop the run
        time.sleep(0.2)
    (os.killpg if to == "group" else os.kill)(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    assert f"simddp calibrate collect: stopped by {sig}; what was measured is in {partial}" in err
    data = json.loads(partial.read_text())
    assert data["complete"] is False and f"stopped by signal {sig}" in data["error"]
    assert not out.exists()


def test_a_collection_stopped_before_its_ranks_start_says_nothing_was_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM while the launcher still imported torch ended it with 143 and no word; a little later, the line
    claimed a partial file that did not exist."""
    from simddp_calibration.launch import _say_stopped

    assert _say_stopped(15, ["--standalone", "-m", "x", "--out", str(tmp_path / "c.json")]) == 3
    assert capsys.readouterr().err == "simddp calibrate collect: stopped by SIGTERM; nothing was measured\n"
    (tmp_path / "c.partial.json").write_text("{}")
    assert _say_stopped(2, ["-m", "x", f"--out={tmp_path / 'c.json'}"]) == 3
    assert capsys.readouterr().err.startswith("simddp calibrate collect: stopped by SIGINT; what was measured is in ")


def test_collector_arguments_that_measure_nothing_are_refused(tmp_path: Path) -> None:
    """--sizes 4K:1K wrote a "complete" file of no cases, --sizes '' ran the whole default sweep, --iters 0 and
    --matmul-n 0 meant the default, --rounds -1 measured nothing, --bucket-cap-mb inf died mid-run, a cap listed
    twice was measured and scored twice; a bad argument exited 3 ("stopped early") about half the time."""
    from simddp_calibration import collectives, ddp_step
    from simddp_calibration.common import CollectorError
    from simddp_calibration.launch import worker_status

    for text, why in (("4K:1K", "a range runs from the smaller size to the larger"), ("", "no size given"),
                      (" , ", "no size given")):
        with pytest.raises(CollectorError, match=why):
            collectives.parse_sizes(text)
    assert collectives.parse_sizes("1K:4K") == [1024, 2048, 4096]
    for cap in ("inf", "nan", "0", "2e12"):
        with pytest.raises(CollectorError, match="must be > 0 and at most"):
            ddp_step.parse_cap(cap)
    for parser, flag, rest in ((collectives.build_parser(), "--iters", []),
                               (collectives.build_parser(), "--matmul-n", []),
                               (ddp_step.build_parser(), "--rounds", ["--model", "m.py:f"])):
        assert getattr(parser.parse_args([flag, "3", "--out", "x.json", *rest]), flag[2:].replace("-", "_")) == 3
        with pytest.raises(SystemExit):
            parser.parse_args([flag, "0", "--out", "x.json", *rest])
    assert ddp_step.main(["--model", TINY, "--bucket-cap-mb", "1", "1", "--out", str(tmp_path / "d.json")]) == 2
    assert worker_status([2, -15]) == worker_status([-15, 2]) == 2  # torchrun stopped the other rank
    assert worker_status([-15, -15]) == worker_status([17, -15]) == worker_status([2, 3]) == 3
