"""The sidebar of every page: the scenario in use, save it for Compare, reset, and the exports."""

from __future__ import annotations

import streamlit as st

from simddp import units
from simddp.exports import frame_to_csv
from simddp_app import state


def _reset() -> None:
    state.replace_scenario(state.default_scenario_dict())


def _save() -> None:
    name = st.session_state.get("save_name", "").strip() or state.scenario_dict().get("name", "scenario")
    state.save_scenario(name, state.scenario_dict())
    st.session_state["save_name"] = ""


def sidebar() -> None:
    data = state.scenario_dict()
    with st.sidebar:
        st.markdown("### simddp what-if")
        result = state.simulate(data, show=False)
        if result is None:
            st.warning("The scenario is invalid; see the page for why.", icon=":material/warning:")
        else:
            st.caption(f"**{result.scenario}**  \n{result.model} on {result.num_gpus} GPUs ({result.cluster}), "
                       f"dp={result.dp} tp={result.tp} pp={result.pp}  \nstep {units.fmt_time(result.step_time_s)}, "
                       f"exposed comm {result.exposed_comm_fraction:.1%}")
        st.text_input("Save as", key="save_name", placeholder=data.get("name", "scenario"),
                      help="Name under which the Compare page keeps this scenario.")
        st.button("Save for Compare", on_click=_save, icon=":material/bookmark_add:", disabled=result is None,
                  width="stretch", key="save_for_compare")
        st.button("Reset to default", on_click=_reset, icon=":material/restart_alt:", width="stretch",
                  key="reset_default")
        st.markdown("**Export**")
        st.download_button("Scenario YAML", data=lambda: state.to_yaml(data), file_name="scenario.yaml",
                           mime="application/x-yaml", on_click="ignore", icon=":material/download:", width="stretch")
        if result is not None:
            st.download_button("Results CSV", data=lambda: frame_to_csv(result.summary_dataframe()),
                               file_name="results.csv", mime="text/csv", on_click="ignore",
                               icon=":material/download:", width="stretch")
            scenario_json = state.to_json(data)
            st.download_button("Perfetto trace", data=lambda: state.perfetto_json(scenario_json),
                               file_name="trace.json", mime="application/json", on_click="ignore",
                               icon=":material/download:", width="stretch",
                               help="Chrome trace-event JSON: open it in https://ui.perfetto.dev (simulated with "
                                    "every event when clicked)")
