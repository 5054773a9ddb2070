"""Compare: scenarios saved from the sidebar (or uploaded), side by side."""

from __future__ import annotations

from typing import Any

import streamlit as st

from simddp import ScenarioError, safeio, sweeps, units
from simddp_app import charts, state, widgets

#: Variations of the planner's scenario offered when nothing is saved yet.
EXAMPLES: dict[str, dict[str, Any]] = {
    "ZeRO-1": {"parallelism.zero_stage": 1},
    "100 MiB buckets": {"ddp.bucket_cap_mb": 100.0},
    "100 Gbit/s NICs": {"cluster.inter_node.nic_bandwidth_bytes_per_s": 100 * units.GBIT},
    "no overlap": {"ddp.overlap": False},
}


def _add_examples() -> None:
    base = state.scenario_dict()
    state.save_scenario("planner", base)
    for name, updates in EXAMPLES.items():
        state.save_scenario(name, sweeps.with_values(base, updates))


def _load(name: str) -> None:
    state.replace_scenario(state.saved_scenarios()[name])


def _clear() -> None:
    state.saved_scenarios().clear()


st.title("Compare")
st.caption("Save scenarios from the sidebar (**Save for Compare**) or upload scenario YAML files; they are "
           "simulated and shown side by side.")

with st.expander("Upload scenario YAML/JSON"):
    uploads = st.file_uploader("Scenario files", type=["yaml", "yml", "json"], accept_multiple_files=True,
                               key="compare_upload")
    seen = st.session_state.setdefault("compare_seen_uploads", set())
    for f in uploads or []:
        if f.file_id in seen:
            continue
        seen.add(f.file_id)
        try:
            data = state.parse_scenario_upload(f.name, f.getvalue())
        except ScenarioError as err:
            st.error(safeio.one_line(err), icon=":material/error:")
            continue
        name = data.get("name") or f.name
        taken = state.saved_scenarios()
        if name in taken and taken[name] != data:  # another scenario of that name: keep both, under the file's name
            base, k = f"{name} ({f.name})", 2
            name = base
            while name in taken and taken[name] != data:
                name, k = f"{base} {k}", k + 1
            st.info(f"{f.name}: a different scenario is already saved as {data.get('name') or f.name!r}; "
                    f"saved as {name!r}", icon=":material/info:")
        state.save_scenario(name, data)

saved = state.saved_scenarios()
if not saved:
    st.info("Nothing saved yet.", icon=":material/info:")
    st.button("Add the planner's scenario and four variations of it", on_click=_add_examples,
              icon=":material/library_add:", key="compare_examples")
else:
    results = {}
    memory: dict[str, float | None] = {}
    for name, data in saved.items():
        r = state.simulate(data, show=False)
        if r is None:
            state.validate(data, where=st.container())  # shows why, inline
            continue
        results[name] = r
        mem = getattr(r, "memory", None)
        memory[name] = None if mem is None else mem.total_bytes / units.GiB
    if results:
        widgets.table(charts.compare_table(results, memory))
        st.plotly_chart(charts.compare(results), key="compare_chart")
    with st.container(border=True):
        c1, c2, c3 = st.columns([2, 1, 1])
        pick = c1.selectbox("Scenario", list(saved), key="compare_pick", label_visibility="collapsed")
        c2.button("Load into planner", on_click=_load, args=(pick,), icon=":material/upload:", key="compare_load")
        c3.button("Remove all", on_click=_clear, icon=":material/delete:", key="compare_clear")
        st.download_button("Download selected as YAML", data=lambda: state.to_yaml(saved[pick]),
                           file_name=f"{pick}.yaml", mime="application/x-yaml", on_click="ignore",
                           icon=":material/download:")
