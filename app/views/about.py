"""About & diagnostics: what the dashboard shows, why the numbers differ per backend, who can
press its buttons, and what each memory source found on this machine."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import state
from collectors.sources import DEFAULT_SOURCES, make_source
from collectors.units import format_bytes

state.init_session()

st.title("About this dashboard")
st.markdown("""
**What it shows.** `torch_memory_saver` lets an inference engine (e.g. SGLang) give GPU memory back
between jobs: *pause* a tag such as `weights` or `kv_cache` and the physical pages are released while
the virtual addresses stay, so *resume* puts everything back where it was. The allocator is never
told, so its accounting stays flat. This dashboard puts the two side by side: what the allocator
**says**, what the device **physically holds** (from the driver), and the difference — what was
**released**. Every pause and resume is an event on the chart, with a verdict: did the memory really
go, how much, and how fast did the telemetry show it.

**Why the numbers differ, per backend.**
- **NVIDIA CUDA**: `torch.cuda.memory_allocated()` / `memory_reserved()` stay flat; NVML's *used*
  and `torch.cuda.mem_get_info()` follow the release on the next poll. NVML v2 *used* excludes
  memory the driver reserves, v1 includes it: the chart says which one it shows.
- **Intel XPU**: even `torch.xpu.mem_get_info()` stays flat; only Level Zero Sysman
  (`zesMemoryGetState`) follows. Sysman needs root or `CAP_PERFMON`, otherwise it reports the
  memory as free forever — shown below as a diagnostic when detected.
- **Host saver** (no GPU): the same mechanism on host memory — anonymous `mmap` released with
  `madvise(MADV_DONTNEED)`. The process RSS (physical) drops; the bytes allocated (accounting) stay.

**Who can press the buttons.** *Pause* and *Resume* change what a running process holds. The
shipped `.streamlit/config.toml` binds the server to `127.0.0.1`, so only this machine can reach
it. To look at it from elsewhere, prefer an SSH tunnel (`ssh -L 8501:127.0.0.1:8501 host`). If you
expose it on purpose (`streamlit run app/main.py --server.address 0.0.0.0`), the charts work for
everyone but the controls stay disabled unless the server also runs with
`MEMSAVER_ALLOW_REMOTE_CONTROL=1`. Engine URLs typed here are checked (http/https, host, port)
before any request is sent, and every request has a timeout.
""")

allowed, why_not = state.controls_allowed()
address = st.get_option("server.address") or "every interface"
if allowed:
    st.success(f"Controls enabled: this server listens on {address}.")
else:
    st.warning(why_not)

st.header("Diagnostics")
kind, device, why = state.detected_backend()
st.markdown(f"**In-process target:** {why}.")


@st.cache_data(ttl=30, show_spinner="Looking for memory sources…")
def discovered() -> pd.DataFrame:
    rows = []
    for name in DEFAULT_SOURCES:
        try:
            src = make_source(name)
            d = src.discovery
        except Exception as e:  # a broken source module must not hide the others
            rows.append({"source": name, "available": False, "devices": "",
                         "notes": f"failed to load: {type(e).__name__}: {e}"})
            continue
        rows.append({
            "source": name,
            "available": d.available,
            "devices": ", ".join(f"{x.device} ({x.name}, {format_bytes(x.total_bytes)})" for x in d.devices),
            "notes": "; ".join([d.reason or "", *d.diagnostics]).strip("; "),
        })
        src.close()
    return pd.DataFrame(rows)


found = discovered()
st.dataframe(found, hide_index=True, key="about_sources")
for row in found.itertuples(index=False):
    if row.available and row.notes:
        st.warning(f"{row.source}: {row.notes}", icon="⚠️")
st.caption("Physical sources the recorder polls by default. torch's accounting is read in-process "
           "by the Live page when it drives torch_memory_saver itself.")
