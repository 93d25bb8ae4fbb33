"""Recordings: open a recording (from the live page, ``memsaver record``, or another machine) and
replay it with the same numbers and charts as the live view."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path

import streamlit as st

from app import charts, sections, state
from collectors.store import StoreError
from collectors.units import format_duration

state.init_session()

RECORDINGS_DIR = Path(os.environ.get("MEMSAVER_RECORDINGS_DIR", "recordings"))
SUFFIXES = (".sqlite", ".db")

st.title("Recordings")
st.markdown(
    "Replay a recording made on the *Live* page, by `memsaver record`, or on another machine "
    "(e.g. a GPU server): the same numbers, charts and verification as live."
)


def _listed() -> list[Path]:
    if not RECORDINGS_DIR.is_dir():
        return []
    files = [p for p in RECORDINGS_DIR.iterdir() if p.suffix in SUFFIXES and p.is_file()]
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


def _uploaded_path(upload: st.runtime.uploaded_file_manager.UploadedFile) -> Path:
    """An upload saved once to a temp file (SQLite needs a path), named by its content hash."""
    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"memsaver-upload-{digest}.sqlite"
    if not path.exists():
        path.write_bytes(data)
    return path


how = st.radio("Open", ["listed", "path", "upload"], horizontal=True, key="rec_how",
               format_func={"listed": f"from {RECORDINGS_DIR}/", "path": "a path on this machine",
                            "upload": "upload a file"}.get)
path: Path | None = None
if how == "listed":
    files = _listed()
    if not files:
        st.info(f"No recordings in `{RECORDINGS_DIR}/` yet. Start one on the Live page, or run "
                "`memsaver record --out recordings/run.sqlite`.")
    else:
        path = st.selectbox(
            "Recording", files, key="rec_listed",
            format_func=lambda p: f"{p.name}  ({datetime.fromtimestamp(p.stat().st_mtime):%Y-%m-%d %H:%M}, "
                                  f"{p.stat().st_size / 2**20:.1f} MiB)")
elif how == "path":
    typed = st.text_input("Path to a .sqlite recording", key="rec_path").strip()
    path = Path(typed).expanduser() if typed else None
else:
    upload = st.file_uploader("Recording (.sqlite)", type=["sqlite", "db"], key="rec_upload")
    path = _uploaded_path(upload) if upload is not None else None

if path is None:
    st.stop()
try:
    store = state.open_recording(str(path.resolve()), path.stat().st_mtime)
    meta = store.meta()
    devices = store.devices()
except (StoreError, OSError) as e:
    st.error(str(e))
    st.stop()

samples_span = store.series()
t_min, t_max = samples_span["t_min"].min(), samples_span["t_max"].max()
events = store.events()
if not events.empty:
    t_min = min(x for x in (t_min, events["t_start"].min()) if x == x)
    t_max = max(x for x in (t_max, events["t_end"].max(), events["t_start"].max()) if x == x)
if not (t_min == t_min and t_max == t_max):  # NaN: nothing recorded
    st.warning(f"{path}: the recording holds no samples or events.")
    st.stop()

started = meta.get("started_at", t_min)
c1, c2, c3, c4 = st.columns(4)
c1.metric("Host", str(meta.get("host", "unknown")))
c2.metric("Started", time.strftime("%H:%M:%S", time.localtime(started)),
          help=time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)))
c3.metric("Length", format_duration(float(t_max - t_min)))
c4.metric("Events", f"{len(events)}")
day = time.strftime("%Y-%m-%d", time.localtime(started))
st.caption(f"`{path}` · {day} · sources: {', '.join(meta.get('sources', [])) or 'unknown'}"
           + (f" · target: {meta['target']}" if meta.get("target") else ""))

span = max(float(t_max - t_min), 0.001)
lo, hi = st.slider("Time window (seconds from the start)", 0.0, round(span, 3), (0.0, round(span, 3)),
                   key=f"rec_window_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}")
start, end = t_min + lo, t_min + hi

st.subheader("Accounting vs physical, at the end of the recording")
whole = charts.load(store)  # the whole recording at display resolution (overview when long)
sections.render_device_tiles(charts.accounting_summary(whole))
# The chosen window is read on its own: zoomed in, raw rows replace the overview.
rec = whole if (lo, hi) == (0.0, round(span, 3)) else charts.load(store, start=start, end=end)
sections.render_charts(rec, start=start, end=end, key="replay")
sections.render_verification(rec, key="replay")
sections.render_diagnostics(rec.diagnostics, meta.get("skipped") or {})
st.subheader("Download")
sections.render_downloads(store, stem=path.stem, title=f"memsaver — {path.name}", key="replay")
