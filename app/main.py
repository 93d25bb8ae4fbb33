"""The dashboard's front door: ``streamlit run app/main.py`` (from the repository root, so that
.streamlit/config.toml binds it to 127.0.0.1).

A frame only: page config, navigation, run the chosen page. The pages live in app/views/, not
app/pages/: Streamlit treats a ``pages/`` folder next to the entry script as a v1 multipage app
and would run a page directly (without this frame) when its URL is opened.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run app/main.py` puts app/ (not the repository) on sys.path.
_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import streamlit as st

st.set_page_config(page_title="memsaver dashboard", page_icon=":material/memory:", layout="wide")

page = st.navigation([
    st.Page("views/live.py", title="Live", icon=":material/monitoring:", default=True),
    st.Page("views/recordings.py", title="Recordings", icon=":material/history:"),
    st.Page("views/about.py", title="About & diagnostics", icon=":material/info:"),
])
page.run()
