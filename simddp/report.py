"""Predictions from a calibration profile, with an uncertainty band; validation against real DDP steps.

Every prediction comes from the simulator (:func:`simddp.simulate`) on the calibrated scenario; the DDP
measurements are only compared with it, never fitted.

Uncertainty band. The step is simulated three times: with the fitted constants, and with every constant
moved by ``z`` standard errors towards a slower (high) or faster (low) step:

* each collective segment's per-step latency and 1/bus-bandwidth by ``z`` times their standard errors
  from the weighted least squares (:mod:`simddp.fit`); because the ring model multiplies the latency by
  the step count 2(n-1), this part of the band widens with the world size;
* per-layer forward/backward times, the optimizer and host times by ``z`` times the robust relative
  standard deviation of the measured step (p10..p90 / 2.56), which on a shared machine covers drift
  between runs as well as step-to-step noise;
* the interference between the 10th and 90th percentile of the benchmark's lost share (mapped to the
  simulator's factor, or to overlap off, as :func:`simddp.fit.interference_settings` does).

``z = 2`` by default (about 95% if the errors were normal and independent, which they need not be). The
band says how far the measurements themselves let the prediction move; it does not cover the model
being wrong at another scale (see docs/calibration.md, "Extrapolating").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simddp import safeio
from simddp.config import Scenario, ScenarioError, deep_merge
from simddp.fit import interference_settings
from simddp.profile import CalibrationProfile, DDPMeasurements, load_profile, model_key
from simddp.results import StepResult
from simddp.scenario_io import scenario_from_dict


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Prediction(_Result):
    """A simulated step time with its band."""

    world_size: int = Field(description="Data-parallel ranks.")
    num_nodes: int = Field(description="Nodes.")
    bucket_cap_mb: float | None = Field(description="DDP bucket cap, MiB (null = torch's default).")
    step_time_s: float = Field(description="Simulated step with the fitted constants, s.")
    low_s: float = Field(description="Simulated step with every constant z standard errors faster, s.")
    high_s: float = Field(description="Simulated step with every constant z standard errors slower, s.")
    compute_time_s: float = Field(description="Forward + backward as run (with interference), s.")
    comm_time_s: float = Field(description="Sum of the bucket all-reduces, s.")
    exposed_comm_time_s: float = Field(description="Step time not covered by compute, optimizer or host, s.")
    num_buckets: int = Field(description="DDP buckets.")
    extrapolated: bool = Field(description="World size differs from the one the collectives were measured on.")
    notes: list[str] = Field(default_factory=list, description="Caveats of this prediction.")


class ValidationCase(_Result):
    """Predicted vs measured step at one bucket cap."""

    bucket_cap_mb: float | None
    measured_s: float = Field(description="Median measured DDP step, s.")
    measured_p10_s: float
    measured_p90_s: float
    measured_num_buckets: int
    prediction: Prediction

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.prediction.step_time_s - self.measured_s) / self.measured_s


class KnobCheck(_Result):
    """A DDP option's cost: the simulator's against the measured paired differences (``--knobs``)."""

    setting: str = Field(description="What changed against plain DDP.")
    predicted_s: float = Field(description="Simulated step with it minus without, s.")
    measured_median_s: float = Field(description="Median of the measured paired differences, s.")
    measured_p25_s: float = Field(description="Their 25th percentile, s.")
    measured_p75_s: float = Field(description="Their 75th percentile, s.")
    num_pairs: int = Field(description="Paired differences measured.")

    @property
    def within_iqr(self) -> bool:
        return self.measured_p25_s <= self.predicted_s <= self.measured_p75_s


class ValidationReport(_Result):
    """Predicted vs measured DDP steps, per bucket cap, and the mean absolute percentage error."""

    profile: str
    measurements: str
    model: str
    world_size: int
    z: float
    cases: list[ValidationCase]
    warnings: list[str] = Field(
        default_factory=list,
        description="The measurements are not of the profile's setup (model, micro-batch, world size, optimizer): "
        "the MAPE compares different things.",
    )
    knobs: list[KnobCheck] = Field(default_factory=list, description="find_unused_parameters / static_graph costs.")
    notes: list[str] = Field(default_factory=list)

    @property
    def mape(self) -> float:
        """Mean absolute percentage error over the cases, as a fraction."""
        return sum(abs(c.error) for c in self.cases) / len(self.cases) if self.cases else math.nan

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame([
            {
                "bucket_cap_mb": c.bucket_cap_mb,
                "measured_ms": c.measured_s * 1e3,
                "measured_p10_ms": c.measured_p10_s * 1e3,
                "measured_p90_ms": c.measured_p90_s * 1e3,
                "predicted_ms": c.prediction.step_time_s * 1e3,
                "band_low_ms": c.prediction.low_s * 1e3,
                "band_high_ms": c.prediction.high_s * 1e3,
                "error": c.error,
                "buckets_measured": c.measured_num_buckets,
                "buckets_predicted": c.prediction.num_buckets,
            }
            for c in self.cases
        ])

    def to_text(self) -> str:
        lines = [
            f"Validation of {self.profile} against {self.measurements}",
            f"model {self.model}, {self.world_size} ranks; band: z = {self.z:g} standard errors",
            *(f"WARNING: {w}" for w in self.warnings),
            "",
            f"{'cap (MiB)':>10} {'buckets':>8} {'measured ms':>12} {'(p10..p90)':>17} {'predicted ms':>13} "
            f"{'(band)':>17} {'error':>8}",
        ]
        for c in self.cases:
            p = c.prediction
            cap = "default" if c.bucket_cap_mb is None else f"{c.bucket_cap_mb:g}"
            lines.append(
                f"{cap:>10} {c.measured_num_buckets:>3}/{p.num_buckets:<4} {c.measured_s * 1e3:>12.2f} "
                f"{f'({c.measured_p10_s * 1e3:.1f}..{c.measured_p90_s * 1e3:.1f})':>17} {p.step_time_s * 1e3:>13.2f} "
                f"{f'({p.low_s * 1e3:.1f}..{p.high_s * 1e3:.1f})':>17} {c.error:>+8.1%}"
            )
        lines += ["", f"MAPE {self.mape:.1%} over {len(self.cases)} bucket caps"]
        if self.knobs:
            lines += ["", f"{'DDP option (against plain DDP)':<46}{'predicted':>12}{'measured median':>17}"
                      f"{'(p25..p75)':>20}  pairs"]
            for k in self.knobs:
                iqr = f"({k.measured_p25_s * 1e3:.2f}..{k.measured_p75_s * 1e3:.2f})"
                lines.append(f"{k.setting:<46}{k.predicted_s * 1e3:>9.3f} ms{k.measured_median_s * 1e3:>14.3f} ms"
                             f"{iqr:>20}  {k.num_pairs}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json_dict(self) -> dict[str, Any]:
        data = self.model_dump()
        data["mape"] = self.mape
        for case, c in zip(data["cases"], self.cases, strict=True):
            case["error"] = c.error
        return data


# ------------------------------------------------------------------------------------ prediction
def _scaled_profile_keys(profile: CalibrationProfile, direction: int, z: float) -> dict[str, Any]:
    """Scenario keys with every calibrated constant moved ``z`` standard errors (+1 slower, -1 faster)."""
    keys = profile.scenario_defaults()
    if direction == 0:
        return keys
    fits = []
    # The segments the simulator reads: the inter-node group's share the world's (op, tier, bounds) on 2+ hosts, and
    # took the band from its own, noisier errors (a band of 11-742 ms where the world fit gives 12-23 ms).
    by_bounds = {(r.fit.op, r.fit.tier, r.fit.min_bytes): r for r in profile.fits if r.simulated}
    for f in keys["cluster"]["collective_fits"]:
        r = by_bounds.get((f["op"], f["tier"], f["min_bytes"]))
        if r is None:
            fits.append(f)
            continue
        lat = max(0.0, f["latency_per_step_s"] + direction * z * r.latency_stderr_s)
        inv_bw = 1.0 / f["bus_bandwidth_bytes_per_s"] + direction * z * r.inv_bandwidth_stderr_s_per_byte
        inv_bw = max(inv_bw, 1e-18)
        fits.append({**f, "latency_per_step_s": lat, "bus_bandwidth_bytes_per_s": 1.0 / inv_bw})
    keys["cluster"]["collective_fits"] = fits
    scale = max(0.0, 1.0 + direction * z * profile.compute_rel_sigma)
    for layer in keys["model"].get("layers") or []:  # a parameter-list model has no layers
        for k in ("fwd_time_s", "bwd_time_s"):
            if layer.get(k) is not None:
                layer[k] *= scale
    if keys["training"].get("optimizer_time_s") is not None:
        keys["training"]["optimizer_time_s"] *= scale
    keys["cluster"]["host_overhead_s"] *= scale
    f = profile.interference.lost_fraction_p90 if direction > 0 else profile.interference.lost_fraction_p10
    value, overlap = interference_settings(f)
    keys["cluster"]["comm_compute_interference"] = value
    keys.setdefault("ddp", {})["overlap"] = overlap
    return keys


_BAND_END = {-1: "fast", 1: "slow"}


def predict(profile: CalibrationProfile | str | Path, overrides: dict[str, Any] | None = None,
            z: float = 2.0) -> Prediction:
    """Simulate the calibrated scenario with ``overrides`` (scenario keys) and its band (``0 <= z <= 10``)."""
    from simddp.sim import simulate_step
    from simddp.sim.step import measured_elsewhere

    if not 0 <= z <= 10:
        raise ScenarioError(f"z({z}) must be between 0 and 10 standard errors")

    prof = profile if isinstance(profile, CalibrationProfile) else load_profile(profile)
    if z * prof.compute_rel_sigma >= 1:  # the fast end would time every measured layer at 0 s, or less
        raise ScenarioError(f"the fast end of the band (z {z:g} x compute_rel_sigma {prof.compute_rel_sigma:g} = "
                            f"{z * prof.compute_rel_sigma:.3g}) takes the measured layer times to zero: narrow the "
                            f"band (z below {1 / prof.compute_rel_sigma:.3g})")
    results: list[StepResult] = []
    scenarios: list[Scenario] = []
    for direction in (0, -1, 1):
        data = deep_merge(_scaled_profile_keys(prof, direction, z), overrides or {})
        data.pop("calibration", None)
        try:
            scenario = scenario_from_dict(data)
            scenarios.append(scenario)
            results.append(simulate_step(scenario, trace=False))
        except ScenarioError as err:
            if direction == 0:
                raise
            # The band's end, not the calibrated step, is what fails (a layer time scaled to 2% of the measured
            # read "MFU 376%", one scaled to 0 "every layer has zero FLOP"): say which band.
            raise ScenarioError(f"the {_BAND_END[direction]} end of the band (z {z:g} x compute_rel_sigma "
                                f"{prof.compute_rel_sigma:g}: measured layer times x "
                                f"{max(0.0, 1 + direction * z * prof.compute_rel_sigma):.2g}) is not a step simddp "
                                f"answers: {err}; narrow the band (a smaller z)") from None
    nominal, low, high = results
    sc = scenarios[0]
    measured_ranks = prof.comm_run.world_size
    notes = list(nominal.not_modelled)
    elsewhere = measured_elsewhere(sc, lambda: prof.training)  # the note simulate gives (the scenario names no
    if elsewhere is not None:  # profile file: it is popped above)
        notes.append(elsewhere)
    if sc.cluster.num_nodes > 1 and not any(f.tier == "inter" for f in sc.cluster.collective_fits):
        notes.append(
            "the profile has no inter-node fit (calibrated on one node): inter-node collectives use "
            "cluster.inter_node, which is a placeholder unless you set it (or calibrate on 2+ nodes)"
        )
    if sc.dp != measured_ranks:
        notes.append(
            f"extrapolated from {measured_ranks} measured ranks: assumes ring step counts and a constant "
            "per-step latency and bus bandwidth (see docs/calibration.md, Extrapolating)"
        )
    return Prediction(
        world_size=sc.dp,
        num_nodes=sc.cluster.num_nodes,
        bucket_cap_mb=sc.ddp.bucket_cap_mb,
        step_time_s=nominal.step_time_s,
        low_s=min(low.step_time_s, nominal.step_time_s),
        high_s=max(high.step_time_s, nominal.step_time_s),
        compute_time_s=nominal.compute_time_s,
        comm_time_s=nominal.comm_time_s,
        exposed_comm_time_s=nominal.exposed_comm_time_s,
        num_buckets=len(nominal.buckets),
        extrapolated=sc.dp != measured_ranks,
        notes=notes,
    )


def extrapolate(profile: CalibrationProfile | str | Path, world_sizes: Sequence[int],
                gpus_per_node: int | None = None, bucket_cap_mb: float | None = None,
                overrides: dict[str, Any] | None = None, z: float = 2.0) -> list[Prediction]:
    """Predictions for several data-parallel world sizes (``gpus_per_node`` per node; default: one node)."""
    prof = profile if isinstance(profile, CalibrationProfile) else load_profile(profile)
    out = []
    for n in world_sizes:
        per_node = min(gpus_per_node or n, n)
        if n % per_node:
            raise ValueError(f"world size {n} is not a multiple of gpus_per_node({per_node})")
        keys: dict[str, Any] = {
            "cluster": {"num_nodes": n // per_node, "gpus_per_node": per_node},
            "parallelism": {"dp": n},
            "ddp": {"bucket_cap_mb": bucket_cap_mb},
        }
        out.append(predict(prof, deep_merge(keys, overrides or {}), z))
    return out


# ------------------------------------------------------------------------------------ validation
def setup_differences(prof: CalibrationProfile, ddp: DDPMeasurements) -> list[str]:
    """How the measured DDP run differs from the profile's: model, gradient bytes, micro-batch, ranks, optimizer."""
    out = []
    if model_key(ddp.model) != model_key(prof.model_name):
        out.append(f"DDP model {ddp.model!r} differs from the profile's {prof.model_name!r}")
    sizes = next((c.bucket_sizes_bytes for c in ddp.cases if c.bucket_sizes_bytes), None)
    if sizes:
        from simddp.units import dtype_bytes

        grad_bytes = sum(sizes)
        params = prof.model.get("parameters") or []
        model_bytes = sum(int(p["numel"]) * dtype_bytes(str(p.get("dtype", "float32"))) for p in params)
        if model_bytes and grad_bytes != model_bytes:
            out.append(f"DDP buckets hold {grad_bytes:,} bytes of gradients, the profile's model {model_bytes:,}: "
                       "a different model")
    mb = prof.training.get("micro_batch_size")
    if mb is not None and ddp.micro_batch_size != mb:
        out.append(f"DDP micro-batch {ddp.micro_batch_size} differs from the profile's {mb}")
    if ddp.run.world_size != prof.comm_run.world_size:
        out.append(f"DDP ran on {ddp.run.world_size} ranks, collectives were measured on "
                   f"{prof.comm_run.world_size}: an extrapolation check")
    if ddp.optimizer != prof.training.get("optimizer"):
        out.append(f"DDP optimizer {ddp.optimizer} differs from the profile's {prof.training.get('optimizer')}")
    return out


def validate(profile_path: str | Path | CalibrationProfile, ddp: DDPMeasurements, ddp_path: str | Path = "ddp.json",
             z: float = 2.0) -> ValidationReport:
    """Predict every measured case with the simulator and compare; differences of setup are warnings."""
    prof = profile_path if isinstance(profile_path, CalibrationProfile) else load_profile(profile_path)
    if not ddp.cases:  # the dashboard's too (it printed "MAPE nan%"), not only the CLI's
        raise ScenarioError(f"{ddp_path}: no DDP step measured")
    for k, case in enumerate(ddp.cases):
        if not case.stats.median_s > 0:
            cap = "default" if case.bucket_cap_mb is None else f"{case.bucket_cap_mb:g}"
            raise ScenarioError(f"{ddp_path}: cases.{k} (bucket_cap_mb {cap}): median step time "
                                f"{case.stats.median_s} s; a measured step must take > 0 s")
    warnings = setup_differences(prof, ddp)
    notes = []
    if not ddp.complete:
        notes.append(f"partial DDP measurements: {ddp.error}")
    cases = []
    for case in ddp.cases:
        n = ddp.run.world_size
        per_node = ddp.run.ranks_per_node
        overrides = {
            "cluster": {"num_nodes": n // per_node, "gpus_per_node": per_node},
            "parallelism": {"dp": n},
            "ddp": {"bucket_cap_mb": case.bucket_cap_mb},
        }
        pred = predict(prof, overrides, z)
        cases.append(ValidationCase(
            bucket_cap_mb=case.bucket_cap_mb, measured_s=case.stats.median_s, measured_p10_s=case.stats.p10_s,
            measured_p90_s=case.stats.p90_s, measured_num_buckets=case.num_buckets, prediction=pred,
        ))
    name = "profile" if isinstance(profile_path, CalibrationProfile) else str(profile_path)
    return ValidationReport(profile=name, measurements=str(ddp_path), model=ddp.model,
                            world_size=ddp.run.world_size, z=z, cases=cases, warnings=warnings,
                            knobs=knob_checks(prof, ddp), notes=notes)


def _paired(base: Sequence[float], other: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(base, other, strict=False)]


def knob_checks(prof: CalibrationProfile, ddp: DDPMeasurements) -> list[KnobCheck]:
    """Simulated costs of find_unused_parameters / static_graph against the paired measured differences."""
    import numpy as np

    from simddp.sim import simulate_step

    plain = next((k for k in ddp.knob_cases if not k.find_unused_parameters and not k.static_graph), None)
    if plain is None:
        return []
    n, per_node = ddp.run.world_size, ddp.run.ranks_per_node
    base_keys: dict[str, Any] = {
        "cluster": {"num_nodes": n // per_node, "gpus_per_node": per_node},
        "parallelism": {"dp": n},
        "ddp": {"bucket_cap_mb": plain.bucket_cap_mb},
    }
    if ddp.num_autograd_nodes is not None:
        base_keys["model"] = {"num_autograd_nodes": ddp.num_autograd_nodes}

    def scenario(options: dict[str, Any]) -> Scenario:
        data = deep_merge(deep_merge(_scaled_profile_keys(prof, 0, 0.0), base_keys), {"ddp": options})
        data.pop("calibration", None)
        return scenario_from_dict(data)

    def check(setting: str, predicted: float, diffs: Sequence[float]) -> KnobCheck:
        p25, med, p75 = (float(v) for v in np.percentile(diffs, [25, 50, 75]))
        return KnobCheck(setting=setting, predicted_s=predicted, measured_median_s=med, measured_p25_s=p25,
                         measured_p75_s=p75, num_pairs=len(diffs))

    base_step = simulate_step(scenario({}), trace=False).step_time_s
    out = []
    for case in ddp.knob_cases:
        if case is plain:
            continue
        options = {"find_unused_parameters": case.find_unused_parameters, "static_graph": case.static_graph}
        label = " + ".join(k for k, v in options.items() if v)
        predicted = simulate_step(scenario(options), trace=False).step_time_s - base_step
        out.append(check(label, predicted, _paired(plain.stats.times_s, case.stats.times_s)))
    return out


def write_html(report: ValidationReport, path: str | Path, extrapolation: Sequence[Prediction] = (),
               inputs: Iterable[str | Path] = ()) -> Path:
    """A plotly HTML page: measured vs predicted per bucket cap (with bands), and any extrapolation.

    Written with :func:`simddp.safeio.write_text`: never over one of ``inputs``, a device or a FIFO."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = 2 if extrapolation else 1
    titles = [f"DDP step: measured vs predicted (MAPE {report.mape:.1%})"]
    if extrapolation:
        titles.append("Extrapolation with uncertainty band")
    fig = make_subplots(rows=rows, cols=1, subplot_titles=titles, vertical_spacing=0.15)
    labels = ["default" if c.bucket_cap_mb is None else f"{c.bucket_cap_mb:g} MiB" for c in report.cases]
    ms = [c.measured_s * 1e3 for c in report.cases]
    fig.add_trace(go.Bar(
        name="measured (median, p10..p90)", x=labels, y=ms,
        error_y={"type": "data", "symmetric": False,
                 "array": [c.measured_p90_s * 1e3 - m for c, m in zip(report.cases, ms, strict=True)],
                 "arrayminus": [m - c.measured_p10_s * 1e3 for c, m in zip(report.cases, ms, strict=True)]},
    ), row=1, col=1)
    ps = [c.prediction.step_time_s * 1e3 for c in report.cases]
    fig.add_trace(go.Bar(
        name="predicted (simulator, band)", x=labels, y=ps,
        error_y={"type": "data", "symmetric": False,
                 "array": [c.prediction.high_s * 1e3 - p for c, p in zip(report.cases, ps, strict=True)],
                 "arrayminus": [p - c.prediction.low_s * 1e3 for c, p in zip(report.cases, ps, strict=True)]},
        text=[f"{c.error:+.1%}" for c in report.cases], textposition="outside",
    ), row=1, col=1)
    fig.update_yaxes(title_text="step time (ms)", row=1, col=1)
    fig.update_xaxes(title_text="bucket_cap_mb", row=1, col=1)
    if extrapolation:
        xs = [p.world_size for p in extrapolation]
        fig.add_trace(go.Scatter(x=xs, y=[p.high_s * 1e3 for p in extrapolation], mode="lines",
                                 line={"width": 0}, showlegend=False, hoverinfo="skip"), row=2, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[p.low_s * 1e3 for p in extrapolation], mode="lines", fill="tonexty",
                                 line={"width": 0}, name="band"), row=2, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[p.step_time_s * 1e3 for p in extrapolation], mode="lines+markers",
                                 name="predicted step"), row=2, col=1)
        fig.update_xaxes(type="log", title_text="data-parallel ranks", row=2, col=1)
        fig.update_yaxes(title_text="step time (ms)", row=2, col=1)
    fig.update_layout(barmode="group", height=450 * rows, title=f"simddp calibration: {report.model}")
    table = report.to_text().replace("&", "&amp;").replace("<", "&lt;")
    html = safeio.titled_html(fig.to_html(include_plotlyjs=True, full_html=True), f"simddp calibration: {report.model}")
    html = html.replace("</body>", f"<pre style='font-size:13px'>{table}</pre></body>")
    return safeio.write_text(path, html, inputs, "--html")


__all__ = [
    "Prediction",
    "ValidationCase",
    "ValidationReport",
    "extrapolate",
    "predict",
    "setup_differences",
    "validate",
    "write_html",
]
