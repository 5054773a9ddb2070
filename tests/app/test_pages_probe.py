"""The dashboard on values the scenario takes but the widgets did not expect: found by a probe of every page
(2026-11-29). Each case was a traceback on the page, a number that contradicted the CLI, or a choice that did
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apptest_helpers import APP, TIMEOUT_S, assert_clean, default_dict, metric, open_page, start
from calibration_data import write_all
from streamlit.testing.v1 import AppTest

import simddp
from simddp import sweeps, units
from simddp.profile import DDPMeasurements, load_profile, read_calibration_file
from simddp.report import extrapolate, predict, validate


def _fresh(data: dict, errors_allowed: bool = False):  # type: ignore[no-untyped-def]
    """The dashboard opened on ``data`` (its widgets seeded from it, as after "Load into planner")."""
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S)
    at.session_state["scenario"] = data
    at.run()
    assert_clean(at, errors_allowed)
    return at


def _on(data: dict, page: str):  # type: ignore[no-untyped-def]
    return open_page(_fresh(data), page)


def test_whatif_takes_a_network_latency_beyond_its_usual_range() -> None:
    """A gloo fit's 150 us per hop (or 500 us set on the Planner) ended What-if in StreamlitValueAboveMaxError:
    the slider stopped at 100 us."""
    data = default_dict()
    data["cluster"]["inter_node"] = {"latency_s": 500e-6}
    at = _on(data, "whatif")
    slider = at.slider(key="wi:net_latency_us")
    assert slider.value == 500.0 and slider.max >= 500.0
    assert metric(at, "Step time") == units.fmt_time(simddp.simulate(data, trace=False).step_time_s)


@pytest.mark.parametrize("run", [{"gpu_hour_cost_usd": 5000}, {"tokens": 2e15}, {"mtbf_hours": 1e10},
                                 {"mtbf_hours": 0.001}, {"restart_overhead_s": 1e7},
                                 {"storage_write_bytes_per_s": 2e15}])
def test_run_takes_what_the_run_section_takes(run: dict) -> None:
    """Values the config takes (a Compare upload, then "Load into planner") were outside the widgets' bounds."""
    data = {**default_dict(), "run": {"tokens": 300e9, **run}}  # the page's own default token count
    at = open_page(_fresh(data), "run") if run != {"mtbf_hours": 0.001} else _fresh(data)
    if run == {"mtbf_hours": 0.001}:  # a run that never finishes: the page says why, as the API does
        at.switch_page("app_pages/run.py").run()
        assert not at.exception
        with pytest.raises(simddp.ScenarioError, match="the run never finishes"):
            simddp.training_run(data)
        assert any("the run never finishes" in e.value for e in at.main.error)
        return
    expected = simddp.training_run(data)
    assert metric(at, "Cost") == f"${expected.cost:,.0f}"
    assert metric(at, "Days") == f"{expected.days:,.1f}"


def test_variability_shows_the_scenarios_own_spread() -> None:
    """Jitter above 30% and a slowdown above 3x were clamped on the sliders without a word: the page read a mean
    step of 3.889 s where `simddp tails` gives 6.537 s. A seed of 2^32 ended the page in a traceback."""
    data = default_dict()
    data["variability"] = {"jitter_cv": 0.5, "straggler_slowdown": 5.0, "num_stragglers": 1, "seed": 2**32}
    at = _on(data, "variability")
    assert at.slider(key="var_cv").value == 50.0 and at.slider(key="var_slowdown").value == 5.0
    assert at.number_input(key="var_seed").value == 2**32
    expected = simddp.tails(data, steps=200)
    assert metric(at, "Mean step") == units.fmt_time(expected.mean_s)
    assert metric(at, "p99 step") == units.fmt_time(expected.p99_s)
    data["variability"]["seed"] = 2**53  # beyond a browser's number box: used as it is, the box disabled
    at = _on(data, "variability")
    assert at.number_input(key="var_seed").disabled
    assert metric(at, "Mean step") == units.fmt_time(simddp.tails(data, steps=200).mean_s)


def test_a_variability_section_that_no_longer_fits_can_be_dropped() -> None:
    """A kept mean document of 3,000 tokens, then a sequence of 1,024 on the Planner: every page said the scenario
    was invalid and the Variability page stopped before its widgets; only "Reset to default" was left."""
    data = default_dict()
    data["variability"] = {"seq_len_distribution": "lognormal", "mean_seq_len": 3000}
    data["training"]["seq_len"] = 1024
    at = start()
    at.session_state["scenario"] = data
    at.switch_page("app_pages/variability.py").run()
    assert not at.exception and at.error
    drop = at.button(key="drop_variability")
    drop.click().run()
    assert_clean(at)
    assert "variability" not in at.session_state["scenario"]
    assert at.session_state["scenario"]["training"]["seq_len"] == 1024  # the rest is kept
    assert at.slider(key="var_cv")  # the page draws again


def test_a_null_bucket_cap_is_the_frameworks_default_not_25_mib() -> None:
    """Under DeepSpeed a null cap (5e8 elements) showed as 25 MiB on the Planner and What-if, and choosing 25 then
    changed nothing: the headline stayed at the null default's 1.326 s where 25 MiB gives 1.359 s."""
    data = default_dict()
    data["ddp"] = {**data.get("ddp", {}), "implementation": "deepspeed"}
    data["ddp"].pop("bucket_cap_mb", None)
    at = _fresh(data)
    assert at.number_input(key="w:ddp.bucket_cap_mb").value is None
    open_page(at, "whatif")
    cap = at.select_slider(key="wi:bucket_cap_mb")
    assert cap.value is None
    cap.set_value(25.0).run()
    assert_clean(at)
    at25 = simddp.simulate({**data, "ddp": {**data["ddp"], "bucket_cap_mb": 25.0}}, trace=False)
    null = simddp.simulate(data, trace=False)
    assert at25.step_time_s != null.step_time_s
    assert metric(at, "Step time") == units.fmt_time(at25.step_time_s)


def test_a_set_bucket_cap_goes_back_to_the_default() -> None:
    """Emptying the Planner's cap once a cap was typed wrote 0.0 (Streamlit refills an emptied field with its
    minimum), an invalid scenario; after applying 25 MiB on What-if, "default" was no longer offered."""
    at = _fresh(default_dict())
    cap = at.number_input(key="w:ddp.bucket_cap_mb")
    cap.set_value(10.0).run()
    assert at.session_state["scenario"]["ddp"]["bucket_cap_mb"] == 10.0
    at.number_input(key="w:ddp.bucket_cap_mb").set_value(None).run()
    assert_clean(at)
    assert at.session_state["scenario"]["ddp"]["bucket_cap_mb"] is None
    open_page(at, "whatif")
    at.select_slider(key="wi:bucket_cap_mb").set_value(25.0).run()
    at.button(key="whatif_apply").click().run()
    assert at.session_state["scenario"]["ddp"]["bucket_cap_mb"] == 25.0
    cap = at.select_slider(key="wi:bucket_cap_mb")
    assert cap.options[0] == "default" and cap.value == 25.0
    cap.set_value(None).run()
    assert_clean(at)
    assert metric(at, "Step time") == units.fmt_time(simddp.simulate(default_dict(), trace=False).step_time_s)


def test_the_planner_holds_a_cluster_beyond_its_usual_range() -> None:
    """Number of nodes stopped at 4,096 and GPUs per node at 64: a scenario beyond them (the config takes 2^24
    GPUs) ended the Planner in a traceback."""
    data = default_dict()
    data["cluster"]["num_nodes"] = 8192
    data["training"].pop("global_batch_size", None)  # a micro-batch per GPU (512 does not split over 65,536)
    assert simddp.scenario_from_dict(data).cluster.num_gpus == 65536
    at = _fresh(data, errors_allowed=True)
    nodes = at.number_input(key="w:cluster.num_nodes")
    assert nodes.value == 8192 and nodes.max == 8192


def test_hbm_shows_gib_and_takes_fractional_gib() -> None:
    """HBM (GiB) showed 7.4e-08 (the capacity divided by 2^30 twice), and 80.3 GiB was refused as a fractional
    number of bytes."""
    at = start()
    hbm = at.number_input(key="w:cluster.gpu.hbm_bytes")
    assert hbm.value == pytest.approx(simddp.load_scenario(
        str(Path(simddp.__file__).parent / "default_scenario.yaml")).cluster.gpu.hbm_bytes / units.GiB)
    hbm.set_value(80.3).run()
    assert_clean(at)
    assert at.session_state["scenario"]["cluster"]["gpu"]["hbm_bytes"] == round(80.3 * units.GiB)


def test_custom_transformer_from_a_parameter_list_model_gives_a_shape_to_edit() -> None:
    """From ResNet-50, "custom transformer" stayed selected and changed nothing (no shape, no message)."""
    at = start()
    at.selectbox(key="w:model").set_value("resnet50").run()
    at.selectbox(key="w:model").set_value("custom transformer").run()
    assert not at.exception
    model = at.session_state["scenario"]["model"]
    assert "transformer" in model and "preset" not in model
    assert at.number_input(key="w:model.transformer.num_layers").value == model["transformer"]["num_layers"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("calibration"))


def test_a_ddp_file_without_steps_is_refused_on_the_page_too(files: dict[str, Path], tmp_path: Path) -> None:
    """The CLI refused a ddp.json with no cases; the page showed "MAPE nan%"."""
    empty = tmp_path / "ddp_empty.json"
    data = json.loads(files["ddp"].read_text())
    data["cases"] = []
    empty.write_text(json.dumps(data))
    with pytest.raises(simddp.ScenarioError, match=r"ddp_empty\.json: no DDP step measured"):
        validate(files["profile"], read_calibration_file(empty, DDPMeasurements), empty)
    at = open_page(start(), "calibration")
    at.file_uploader(key="cal_profile").set_value(("profile.json", files["profile"].read_bytes(), "application/json"))
    at.file_uploader(key="cal_ddp").set_value((empty.name, empty.read_bytes(), "application/json")).run()
    assert not at.exception
    assert any("no DDP step measured" in e.value for e in at.main.error)
    assert not [m for m in at.main.metric if m.label == "MAPE"]


def test_a_band_that_takes_layer_times_to_nothing_names_the_band(files: dict[str, Path], tmp_path: Path) -> None:
    """compute_rel_sigma 0.3 at z 3.5 (or 0.49 at z 2) scaled the measured layer times to 0 (or 2%): the error
    blamed the layers ("zero FLOP") or printed "MFU 376%", not the band."""
    data = json.loads(files["profile"].read_text())
    data["compute_rel_sigma"] = 0.5
    noisy = tmp_path / "noisy.json"
    noisy.write_text(json.dumps(data))
    assert predict(noisy, z=1.0).low_s > 0  # a band that stays above zero is answered
    with pytest.raises(simddp.ScenarioError, match=r"^the fast end of the band \(z 2 x compute_rel_sigma 0.5 = 1\) "
                       r"takes the measured layer times to zero: narrow the band \(z below 2\)"):
        predict(noisy, z=2.0)  # it answered a fast end without compute: 8.1 ms against 31.5 ms
    data["compute_rel_sigma"] = 0.49
    noisy.write_text(json.dumps(data))
    with pytest.raises(simddp.ScenarioError, match=r"^the fast end of the band \(z 2 x compute_rel_sigma 0.49: "
                       r"measured layer times x 0.02\) is not a step simddp answers: .*MFU 376%.*narrow the band"):
        extrapolate(noisy, [1], 2, z=2.0)  # on one rank: compute alone, 2% of the measured layer times


def test_settings_the_model_does_not_read_say_so() -> None:
    """The bucket cap under FSDP, the overlap toggle under DeepSpeed ZeRO-0 and the link sliders over calibrated
    collectives changed nothing, without a word (the step stayed at 1.384 s with the toggle off or on)."""
    fsdp = _fresh(sweeps.with_values(default_dict(), {"parallelism.zero_stage": 3}))
    assert any("bucket cap is not read" in c.value for c in fsdp.main.caption)
    data = default_dict()
    data["ddp"] = {"implementation": "deepspeed", "overlap": True}
    data["parallelism"]["zero_stage"] = 0
    ds = _fresh(data, errors_allowed=True)  # it does not fit: the banner says so
    assert any("does not take ddp.overlap=True" in c.value for c in ds.main.caption)
    data = default_dict()
    data["ddp"] = {"implementation": "megatron"}  # without overlap: one bucket, whatever the cap
    data["parallelism"]["zero_stage"] = 0
    assert any("without overlap Megatron reduces the gradients in one bucket" in c.value
               for c in _fresh(data, errors_allowed=True).main.caption)
    plain = _fresh(default_dict())
    assert not any("does not take ddp.overlap" in c.value or "bucket cap is not read" in c.value
                   for c in plain.main.caption)


def test_whatif_says_when_calibrated_fits_answer_the_collectives(tmp_path: Path) -> None:
    files = write_all(tmp_path)
    calibrated = load_profile(files["profile"]).scenario_defaults()
    at = _on(calibrated, "whatif")
    assert any("calibrated collective fits" in c.value for c in at.main.caption)
    assert not any("calibrated collective fits" in c.value for c in _on(default_dict(), "whatif").main.caption)


def _gpt2_pp8(**variability: object) -> dict:
    return {"cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}, "model": {"preset": "gpt2"},
            "parallelism": {"pp": 8},
            "training": {"micro_batch_size": 1, "seq_len": 1024, "global_batch_size": 64},
            "variability": {"jitter_cv": 0.1, **variability}}


def test_variability_explains_a_pipeline_wait_below_zero() -> None:
    """A second probe (2026-11-29): a pipeline wait below zero showed a share of -239.7% beside 100% and a loss of
    -0.2% with no word. The page and `simddp tails` now say what it means; dp = 1 lists no data-parallel row."""
    data = _gpt2_pp8(seed=0)
    result = simddp.tails(data, steps=200)
    assert {w.key for w in result.sync_points} == {"pp", "optimizer"}  # dp = 1: nothing to wait for there
    assert any(w.wait_s < 0 for w in result.sync_points) and result.below_zero_note
    at = _on(data, "variability")
    assert any("below zero" in c.value for c in at.caption)


def test_variability_draws_the_steps_a_large_batch_allows() -> None:
    """Every choice of steps (50 at least) was refused for a 64k-sample pipeline batch, and the page showed nothing:
    it now draws as many as the limit allows, and says so."""
    data = default_dict()
    data["parallelism"] = {"pp": 8}
    data["training"]["global_batch_size"] = 65536
    data["variability"] = {"jitter_cv": 0.1}
    at = _on(data, "variability")
    assert metric(at, "Mean step")
    assert any("Monte Carlo steps, not 200" in c.value for c in at.caption)


def test_the_timeline_draws_tensor_parallel_waits_as_collectives() -> None:
    """The quiet micro-batches' TP wait, on the TP stream since 2026-11-29, was drawn as their computation, and
    per-layer TP collectives as bucket all-reduces."""
    from simddp_app.charts import _span_kind

    assert _span_kind("micro-batches 0-6 forward (no_sync): tensor-parallel collectives", "comm tp") == "tp"
    assert _span_kind("F0: tensor-parallel collectives", "comm tp 1") == "tp"
    assert _span_kind("all-reduce fwd transformer.h.0.attn", "comm tp") == "tp"
    assert _span_kind("F0", "compute 1") == "stage_forward"
