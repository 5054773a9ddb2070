"""Calibration: upload a profile (or the measurements to fit one) and real DDP steps; measured vs model."""

from __future__ import annotations

import streamlit as st

from simddp import ScenarioError
from simddp.exports import frame_to_csv
from simddp_app import charts, state, widgets

HOW = """Measure on the machines you want to model (needs torch), then upload the files here:

```bash
simddp calibrate collect comm --nproc-per-node 8 --out comm.json            # collective times
simddp calibrate collect compute --model calibration/models/small_transformer.py:build --out compute.json
simddp calibrate fit comm.json compute.json --out profile.json               # alpha-beta fits, layer times
simddp calibrate collect ddp --nproc-per-node 8 --model ... --out ddp.json   # real DDP steps (validation)
```
`profile.json` alone is enough to predict; `ddp.json` adds the measured-vs-model validation. The
measurements never enter the prediction they are compared with. Uploads are read in memory and never
stored on the server; a profile can only be used by uploading it here."""


def _use_in_planner(profile) -> None:  # type: ignore[no-untyped-def]
    data = profile.scenario_defaults()
    state.replace_scenario(data)


st.title("Calibration")
st.caption("A calibration replaces the spec-sheet cluster and roofline compute with measured collective fits and "
           "layer times; validation compares the simulator with real DDP steps.")

c1, c2 = st.columns(2)
profile_file = c1.file_uploader("Calibration profile (profile.json)", type=["json"], key="cal_profile",
                                help="Written by `simddp calibrate fit` (a simddp-profile file).")
ddp_file = c2.file_uploader("DDP measurements (ddp.json), to validate", type=["json"], key="cal_ddp",
                            help="Written by `simddp calibrate collect ddp` (a simddp-ddp file).")
with st.expander("No profile yet? Fit one from comm.json + compute.json"):
    f1, f2 = st.columns(2)
    comm_file = f1.file_uploader("comm.json", type=["json"], key="cal_comm")
    compute_file = f2.file_uploader("compute.json", type=["json"], key="cal_compute")

profile, profile_name, profile_bytes = None, "", b""
try:
    if profile_file is not None:
        profile_name, profile_bytes = profile_file.name, profile_file.getvalue()
        profile = state.load_profile(profile_name, profile_bytes)
    elif comm_file is not None and compute_file is not None:
        profile = state.fit_profile(comm_file.name, comm_file.getvalue(), compute_file.name, compute_file.getvalue())
        profile_name, profile_bytes = "profile.json (fitted here)", profile.model_dump_json().encode()
except (ScenarioError, ValueError) as err:
    st.error(f"Cannot use this calibration: {err}", icon=":material/error:")

if profile is None:
    st.info("Upload a calibration profile (or comm.json and compute.json) to see its fits.", icon=":material/info:")
    st.markdown(HOW)
else:
    run = profile.comm_run
    c = st.columns(4)
    c[0].metric("Model", profile.model_name.rsplit("/", 1)[-1], help=profile.model_name, border=True)
    c[1].metric("Measured on", f"{run.world_size} ranks", help=f"{run.num_nodes} node(s), {run.backend} on "
                f"{run.device}, torch {run.torch_version}", border=True)
    c[2].metric("Interference", f"{profile.interference.value:.3f}", help=profile.interference.note, border=True)
    c[3].metric("Step noise (rel. sigma)", f"{profile.compute_rel_sigma:.1%}", border=True)
    st.plotly_chart(charts.collective_fits(profile), key="cal_fits_chart")
    widgets.table(charts.fit_table(profile))
    st.download_button("Download profile.json", data=profile_bytes, file_name="profile.json",
                       mime="application/json", on_click="ignore", icon=":material/download:")
    st.button("Use this calibration in the planner", on_click=_use_in_planner, args=(profile,),
              icon=":material/upload:", key="cal_use",
              help="Replaces the planner's scenario with the calibrated cluster, model and training keys.")
    with st.expander("What is measured and what is assumed"):
        for note in profile.notes:
            st.markdown(f"- {note}")

    z = st.slider("Band width (standard errors)", 0.0, 4.0, 2.0, 0.5, key="cal_z",
                  help="The uncertainty band moves every fitted constant by this many standard errors.")
    if ddp_file is not None:
        st.subheader("Validation against real DDP steps")
        try:
            report = state.validate_profile(profile_name, profile_bytes, ddp_file.name, ddp_file.getvalue(), z)
        except (ScenarioError, ValueError) as err:
            st.error(f"Cannot validate: {err}", icon=":material/error:")
        else:
            for warning in report.warnings:  # the measured setup is not the profile's: the errors compare unlike runs
                st.warning(warning, icon=":material/warning:")
            st.metric("MAPE", f"{report.mape:.1%}", help=f"Mean absolute percentage error over {len(report.cases)} "
                      "bucket caps (simddp.report.ValidationReport.mape)", border=True, width="content")
            st.plotly_chart(charts.validation(report), key="cal_validation_chart")
            widgets.table(charts.validation_table(report))
            if report.knobs:  # DDP options measured as paired differences (`simddp calibrate validate` prints them)
                widgets.table(charts.knob_checks_table(report))
            for note in report.notes:
                st.info(note, icon=":material/info:")
            st.download_button("Validation CSV", data=lambda: frame_to_csv(report.to_dataframe()),
                               file_name="validation.csv", mime="text/csv", on_click="ignore",
                               icon=":material/download:")

    st.subheader("Extrapolation")
    per_node = st.number_input("Ranks per node", min_value=1, value=run.ranks_per_node, step=1, key="cal_per_node",
                               help="Ranks per node of the extrapolated runs (the profile's own by default).")
    max_ranks = st.select_slider("Up to ranks", [8, 16, 32, 64, 128, 256, 512, 1024], value=64, key="cal_max")
    sizes = tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
                  if n <= max_ranks and (n < per_node or n % per_node == 0))
    try:
        preds = state.extrapolate_profile(profile_name, profile_bytes, sizes, int(per_node), z)
    except (ScenarioError, ValueError) as err:
        st.error(f"Cannot extrapolate: {err}", icon=":material/error:")
    else:
        st.plotly_chart(charts.extrapolation(preds, run.world_size), key="cal_extrapolation_chart")
        notes = sorted({n for p in preds for n in p.notes})
        for note in notes:
            st.caption(f"note: {note}")
