"""Hostile calibration inputs: each is refused with one line naming the file and the field, or handled."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import compute_measurements, stats

from simddp.cli import main
from simddp.config import ScenarioError
from simddp.fit import fit_piecewise
from simddp.limits import MAX_COMM_SIZES, MAX_NPROC_PER_NODE
from simddp.profile import merge_measurements, write_json
from simddp_calibration.launch import main as launch_main
from simddp_calibration.launch import nproc_problem


def _edit(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return dst


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Warning" not in err, err
    return err


def _ddp_file(tmp_path: Path) -> Path:
    from test_calibration_consistency import _ddp

    path = tmp_path / "ddp.json"
    write_json(_ddp(), path)
    return path


def test_fit_search_is_not_quadratic_in_lstsq_calls() -> None:
    rng = np.random.default_rng(0)
    sizes = [1024 + 4096 * k for k in range(200)]
    times = [(60e-6 + s / 1.5e9) * (1 + 0.02 * rng.standard_normal()) for s in sizes]
    start = time.perf_counter()
    segments = fit_piecewise("all-reduce", 2, sizes, times)
    assert time.perf_counter() - start < 10  # 19 s per collective before segment fits were shared
    assert segments[0].lo == 0 and segments[-1].hi == len(sizes)


def test_too_many_message_sizes_are_refused(calibration_files: dict[str, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def many(data: dict) -> None:  # type: ignore[type-arg]
        proto = data["cases"][0]
        data["cases"] = [{**proto, "size_bytes": 1024 * (k + 1)} for k in range(MAX_COMM_SIZES + 1)]

    comm = _edit(calibration_files["comm"], tmp_path / "many.json", many)
    out = tmp_path / "p.json"
    err = _one_line_error(["calibrate", "fit", str(comm), str(calibration_files["compute"]), "--out", str(out)],
                          capsys)
    assert "many.json: all-reduce on world" in err and "MAX_COMM_SIZES" in err and not out.exists()


def test_launcher_refuses_absurd_nproc_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert nproc_problem([f"--nproc-per-node={MAX_NPROC_PER_NODE}", "-m", "x"]) is None
    assert nproc_problem(["--nproc-per-node", "gpu"]) is None
    assert launch_main(["--nproc-per-node=100000000", "--standalone", "-m", "simddp_calibration.collectives"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nproc-per-node(100,000,000) is over the limit" in err
    assert launch_main(["--nproc_per_node", "5000", "-m", "x"]) == 2


def test_predict_and_validate_accept_a_profile_without_layers(calibration_files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    prof = _edit(calibration_files["profile"], tmp_path / "p.json", lambda d: d["model"].update(layers=None))
    assert main(["calibrate", "predict", str(prof), "--ranks", "2"]) == 0
    assert main(["calibrate", "validate", str(prof), str(_ddp_file(tmp_path)), "--html",
                 str(tmp_path / "r.html")]) == 0


@pytest.mark.parametrize("median", [1e308, 1e-300])
def test_fit_refuses_out_of_range_comm_medians(calibration_files: dict[str, Path], tmp_path: Path, median: float,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    def edit(data: dict) -> None:  # type: ignore[type-arg]
        st = data["cases"][0]["stats"]
        st.update(median_s=median, times_s=[median], min_s=median, p10_s=median, p90_s=median, max_s=median)

    comm = _edit(calibration_files["comm"], tmp_path / "c.json", edit)
    err = _one_line_error(["calibrate", "fit", str(comm), str(calibration_files["compute"]), "--out",
                           str(tmp_path / "p.json")], capsys)
    assert "c.json: cases.0 (all-reduce on world, 1024 B).stats" in err and "TIMING_S" in err


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("min_s", -1.0, "stats.min_s: -1.0 s is negative"),
    ("p10_s", -1.0, "stats.p10_s: -1.0 s is negative"),
    ("times_s", [], "stats.times_s: is empty"),
    ("median_s", 1.0, "stats: median_s(1.0) > p90_s"),
    ("median_s", 1e308, "stats.median_s: 1e+308 s is over the limit"),
    ("median_s", 1e-300, "stats: p10_s"),
])
def test_validate_refuses_inconsistent_ddp_timings(calibration_files: dict[str, Path], tmp_path: Path, field: str,
                                                   value: object, expected: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ddp = _edit(_ddp_file(tmp_path), tmp_path / "bad.json", lambda d: d["cases"][0]["stats"].update({field: value}))
    html = tmp_path / "r.html"
    err = _one_line_error(["calibrate", "validate", str(calibration_files["profile"]), str(ddp), "--html",
                           str(html)], capsys)
    assert f"bad.json: cases.0 (bucket_cap_mb 25.0).{expected}" in err and not html.exists()


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("layers", 1, "fwd", "median_s"), 1e308, "layers.1 (l0).fwd.median_s: 1e+308 s is over the limit"),
    (("layers", 1, "fwd", "p10_s"), -1.0, "layers.1 (l0).fwd.p10_s: -1.0 s is negative"),
    (("host", "times_s"), [], "host.times_s: is empty"),
    (("optimizer_step", "median_s"), -1.0, "optimizer_step.median_s: -1.0 s is negative"),
])
def test_fit_refuses_inconsistent_compute_timings(calibration_files: dict[str, Path], tmp_path: Path,
                                                  path: tuple, value: object, expected: str,  # type: ignore[type-arg]
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def edit(data: dict) -> None:  # type: ignore[type-arg]
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    compute = _edit(calibration_files["compute"], tmp_path / "k.json", edit)
    out = tmp_path / "p.json"
    err = _one_line_error(["calibrate", "fit", str(calibration_files["comm"]), str(compute), "--out", str(out)],
                          capsys)
    assert f"k.json: {expected}" in err and not out.exists()


def test_a_negative_host_time_beyond_the_step_is_refused(calibration_files: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    minus = stats(-1.0).model_dump()
    compute = _edit(calibration_files["compute"], tmp_path / "k.json", lambda d: d.update(host=minus))
    err = _one_line_error(["calibrate", "fit", str(calibration_files["comm"]), str(compute), "--out",
                           str(tmp_path / "p.json")], capsys)
    assert "k.json: host.median_s: -1.0 s is more negative than the whole step" in err
    small = stats(-1e-6).model_dump()  # timer noise on a difference of times stays accepted
    compute = _edit(calibration_files["compute"], tmp_path / "k2.json", lambda d: d.update(host=small))
    assert main(["calibrate", "fit", str(calibration_files["comm"]), str(compute), "--out",
                 str(tmp_path / "p.json")]) == 0


def test_merge_refuses_the_same_run_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ddp = _ddp_file(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(ddp)
    for second in (ddp, link):
        err = _one_line_error(["calibrate", "merge", str(ddp), str(second), "--out", str(tmp_path / "m.json")],
                              capsys)
        assert "files 1 and 2 hold identical measurements" in err
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(ScenarioError, match="identical measurements"):
        merge_measurements([compute_measurements(), compute_measurements()])


def test_validate_names_the_ddp_world_size_over_the_limit(calibration_files: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ddp = _edit(_ddp_file(tmp_path), tmp_path / "d.json", lambda d: d["run"].update(world_size=10**19))
    err = _one_line_error(["calibrate", "validate", str(calibration_files["profile"]), str(ddp), "--html",
                           str(tmp_path / "r.html")], capsys)
    assert "d.json: malformed simddp-ddp: run.world_size: Input should be less than or equal to 16777216" in err
    assert "cluster" not in err


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["cases"][0].update(bucket_cap_mb=-1), "cases.0 (bucket_cap_mb -1).bucket_cap_mb: Input should be "
                                                       "greater than 0"),
    (lambda d: d["run"].update(world_size=1, ranks_per_node=2, num_nodes=1),
     "run: world_size(1) is not num_nodes(1) x ranks_per_node(2)"),
    # A cap of 10^15 MiB was refused as ddp.bucket_cap_mb, a key the user never wrote (a dashboard probe).
    (lambda d: d["cases"][0].update(bucket_cap_mb=1e15), "cases.0 (bucket_cap_mb 1000000000000000.0).bucket_cap_mb: "
                                                         "Input should be less than or equal to 1099511627776"),
])
def test_a_ddp_file_is_refused_for_what_it_says(calibration_files: dict[str, Path], tmp_path: Path, edit,
                                                message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A probe's ddp.json with a bucket cap of -1, or one rank over two per host, was refused as scenario keys the
    user never wrote (ddp.bucket_cap_mb, cluster.num_nodes: ... greater than 0), without the file."""
    ddp = _edit(_ddp_file(tmp_path), tmp_path / "d.json", edit)
    err = _one_line_error(["calibrate", "validate", str(calibration_files["profile"]), str(ddp), "--json"], capsys)
    assert f"d.json: malformed simddp-ddp: {message}" in err, err


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["comm_run"].update(ranks_per_node=10**30), "comm_run.ranks_per_node"),
    (lambda d: d["fits"][0]["fit"].update(measured_ranks=10**30), "measured_ranks"),
    (lambda d: d["fits"][0].update(num_points=10**30), "num_points"),
    (lambda d: d.update(compute_rel_sigma=1e308), "compute_rel_sigma"),
])
def test_profile_counts_and_noise_are_bounded(calibration_files: dict[str, Path], tmp_path: Path, edit, field: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A dashboard probe's profiles: counts past any cluster broke the Calibration page's widgets and tables, and
    a relative noise of 1e308 showed `inf%` and blamed the layers ("the step takes no time")."""
    prof = _edit(calibration_files["profile"], tmp_path / "p.json", edit)
    err = _one_line_error(["calibrate", "predict", str(prof), "--ranks", "2"], capsys)
    assert field in err and "less than or equal to" in err, err


def _two_hosts(noise: float):  # type: ignore[no-untyped-def]
    """comm measurements of 2 hosts x 2 ranks: the world group, the intra-node group and the inter-node group (one
    rank per host, kept for inspection), whose times alone carry ``noise``."""
    from conftest import comm_measurements

    from simddp.profile import CommMeasurements

    base = comm_measurements().model_dump()
    base["run"].update(world_size=4, num_nodes=2, ranks_per_node=2, hosts=["a", "a", "b", "b"],
                       device_names=["cpu"] * 4)
    rng = np.random.default_rng(1)
    cases = []
    for group, ranks, nodes, tier, jitter in (("world", 4, 2, "inter", 0.0), ("intra-node", 2, 1, "intra", 0.0),
                                              ("inter-node", 2, 2, "inter", noise)):
        for case in base["cases"]:
            t = case["stats"]["median_s"] * (1 + jitter * rng.random())
            cases.append({**case, "group": group, "num_ranks": ranks, "num_nodes": nodes, "tier": tier,
                          "stats": stats(t).model_dump()})
    return CommMeasurements.model_validate({**base, "cases": cases})


def test_the_band_comes_from_the_fits_the_simulator_reads() -> None:
    """On 2 hosts the inter-node group's segments share the world's (op, tier, bounds): the band took their errors
    (a probe: 11-742 ms with a noisy inter-node group, where the world fit alone gives 12-23 ms)."""
    from conftest import compute_measurements

    from simddp.fit import fit_profile
    from simddp.report import predict

    compute = compute_measurements()
    quiet, noisy = fit_profile(_two_hosts(0.0), compute), fit_profile(_two_hosts(3.0), compute)
    assert [r.fit for r in quiet.fits if r.simulated] == [r.fit for r in noisy.fits if r.simulated]
    assert any(r.group == "inter-node" and r.latency_stderr_s > 0 for r in noisy.fits)
    on = {"cluster": {"num_nodes": 2, "gpus_per_node": 2}, "parallelism": {"dp": 4}}
    a, b = predict(quiet, on), predict(noisy, on)
    assert (a.step_time_s, a.low_s, a.high_s) == (b.step_time_s, b.low_s, b.high_s)
    assert a.low_s < a.step_time_s < a.high_s


def test_what_the_calibration_did_not_measure_is_said(calibration_files: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A collector probe: a compute file without the DDP Reducer overhead (a GPU run, --no-ddp-overhead) gave a
    profile whose notes said it was measured, at 0.000 ms; `calibrate predict` at another micro-batch dropped the
    note `simulate` gives; a profile's `ddp` section was not checked when read; `--standalone` was refused."""
    from conftest import comm_measurements, compute_measurements

    from simddp.fit import fit_profile
    from simddp.profile import load_profile
    from simddp.report import predict

    compute = compute_measurements().model_copy(update={"ddp_overhead": None, "graph_search": None})
    notes = fit_profile(comm_measurements(), compute).notes
    assert any(n.startswith("not measured: the DDP Reducer overhead") for n in notes)
    assert not any(n.startswith("PLACEHOLDER") for n in notes)  # a complete GPU run measures none: not partial
    assert not any("DDP Reducer overhead without communication" in n for n in notes)
    assert any("DDP Reducer overhead without communication" in n
               for n in fit_profile(comm_measurements(), compute_measurements()).notes)

    profile = calibration_files["profile"]
    other = predict(profile, {"training": {"micro_batch_size": 64}}).notes
    assert [n for n in other if "measured at micro-batch 8 x 1 tokens and are used as they are at 64 x 1" in n]
    assert not [n for n in predict(profile).notes if "measured at micro-batch" in n]

    bad = _edit(profile, tmp_path / "p.json", lambda d: d["ddp"].update(bucket_cap_mb=-5))
    with pytest.raises(ScenarioError, match=r"p\.json: malformed simddp-profile: ddp\.bucket_cap_mb: Input should be "
                                            r"greater than 0"):
        load_profile(bad)
    assert load_profile(profile).ddp == json.loads(profile.read_text())["ddp"]  # kept as given

    from simddp.cli import _launcher_parser
    launch, rest = _launcher_parser("comm").parse_known_args(["--standalone", "--nproc-per-node", "2", "--sizes", "1K"])
    assert launch.standalone and rest == ["--sizes", "1K"]
    # with a second node or a rendezvous, torchrun would move the rendezvous to localhost without a word
    for extra in (["--nnodes", "2"], ["--rdzv-endpoint", "h:29400"]):
        err = _one_line_error(["calibrate", "collect", "comm", "--standalone", *extra, "--out",
                               str(tmp_path / "c.json")], capsys)
        assert "--standalone is one node" in err


def test_the_same_model_file_run_from_another_folder_is_the_same_model() -> None:
    """validate and merge compared the --model text: models/x.py:tiny and /abs/models/x.py:tiny were "different"."""
    from simddp.profile import model_key

    assert model_key("models/small_transformer.py:tiny") == model_key("/abs/models/small_transformer.py:tiny")
    assert model_key("a.py:tiny") != model_key("a.py:small") and model_key("toy") == "toy"
    assert model_key("st.py:tiny") != model_key("small_transformer.py:tiny")  # another file: still said
    # Merging compares the spec exactly: two folders' model.py may be two models (a review: they merged).
    from test_calibration_consistency import _ddp

    from simddp.profile import merge_measurements
    a, b = _ddp(), _ddp()
    with pytest.raises(ScenarioError, match="cannot merge DDP timings of different models"):
        merge_measurements([a.model_copy(update={"model": "exp_small/model.py:build"}),
                            b.model_copy(update={"model": "exp_big/model.py:build"})])
