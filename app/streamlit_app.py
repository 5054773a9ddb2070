"""simddp what-if dashboard. Start it with ``simddp app`` or ``streamlit run app/streamlit_app.py``.

This entry point is the frame around every page: navigation and the sidebar (the scenario in use, saving
it for Compare, and the exports). It opens on the embedded default scenario, so the first screen already
shows results.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("simddp_app") is None:  # `streamlit run` from a source tree that is not installed
    sys.path.insert(0, str(HERE.parent))  # for simddp
    spec = importlib.util.spec_from_file_location("simddp_app", HERE / "__init__.py",
                                                  submodule_search_locations=[str(HERE)])
    assert spec is not None and spec.loader is not None
    sys.modules["simddp_app"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["simddp_app"])

import streamlit as st  # noqa: E402

from simddp_app.sidebar import sidebar  # noqa: E402

PAGES = HERE / "app_pages"

st.set_page_config(page_title="simddp what-if", page_icon=":material/hub:", layout="wide")
page = st.navigation(
    [
        st.Page(PAGES / "planner.py", title="Planner", icon=":material/tune:", default=True),
        st.Page(PAGES / "plan.py", title="Plan", icon=":material/manage_search:"),
        st.Page(PAGES / "timeline.py", title="Timeline", icon=":material/view_timeline:"),
        st.Page(PAGES / "scaling.py", title="Scaling", icon=":material/trending_up:"),
        st.Page(PAGES / "memory.py", title="Memory", icon=":material/memory:"),
        st.Page(PAGES / "whatif.py", title="What-if", icon=":material/science:"),
        st.Page(PAGES / "variability.py", title="Variability", icon=":material/ssid_chart:"),
        st.Page(PAGES / "run.py", title="Run", icon=":material/calendar_month:"),
        st.Page(PAGES / "knobs.py", title="DDP knobs", icon=":material/toggle_on:"),
        st.Page(PAGES / "calibration.py", title="Calibration", icon=":material/straighten:"),
        st.Page(PAGES / "compare.py", title="Compare", icon=":material/compare_arrows:"),
    ]
)
sidebar()
page.run()
