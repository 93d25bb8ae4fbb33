"""Live: pause and resume tagged memory and watch what is physically held, next to what the
allocator's accounting claims.

Top to bottom: target (sidebar) -> the numbers now (auto-refreshing fragment) -> controls ->
charts, verification and diagnostics (a second auto-refreshing fragment) -> recording and downloads.
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from app import charts, sections, state
from app.live_target import (
    LiveTarget,
    Outcome,
    TargetSpec,
    validate_engine_url,
)
from collectors.controls.base import ControlError, TagState
from collectors.model import now
from collectors.store import StoreError
from collectors.units import MiB, format_bytes

state.init_session()

# What each backend does when paused, in one line, for someone who never heard of it.
BACKEND_EXPLANATIONS = {
    "host": (
        "**Host saver** (no GPU needed): tagged memory is anonymous `mmap`. *Pause* calls "
        "`madvise(MADV_DONTNEED)`: the pages really go back to the OS, so this process's RSS (physical) "
        "drops while the bytes allocated (accounting) stay. It is the mechanism torch_memory_saver "
        "uses on a GPU, shown on host memory."
    ),
    "tms": (
        "**torch_memory_saver** on a GPU: *Pause* releases the physical pages behind tagged tensors "
        "and keeps their virtual addresses. What the device holds (NVML) drops; torch's own "
        "accounting (`memory_allocated`) stays flat — which is why people think it did not work."
    ),
    "engine": (
        "**Engine over HTTP** (SGLang or the demo engine): *Pause* is `POST /release_memory_occupation`, "
        "*Resume* is `POST /resume_memory_occupation` with the tags. The engine must be idle; resuming "
        "a tag that was never released fails, and the engine's message is shown here."
    ),
}

st.title("GPU memory released — measured")
st.markdown(
    "Inference engines free GPU memory between jobs by *pausing* tagged memory "
    "(`weights`, `kv_cache`, …) with **torch_memory_saver**. The allocator's accounting does not "
    "notice, so this page shows both: what the allocator **says** and what the device **physically "
    "holds**. Click *Pause* and watch the physical line drop while the accounting stays flat."
)

# -- target (sidebar) ----------------------------------------------------------------------------
backend_kind, backend_device, backend_why = state.detected_backend()
in_process = TargetSpec(backend_kind, device=backend_device)

with st.sidebar:
    st.header("Target")
    choice = st.radio(
        "What to control", ["in_process", "engine"], key="target_choice",
        format_func=lambda c: in_process.label if c == "in_process" else "An engine at a URL",
        help=backend_why,
    )
    if choice == "engine":
        st.text_input("Engine URL", key="engine_url",
                      help="SGLang or `memsaver demo-engine`, e.g. http://127.0.0.1:30000")
        if st.button("Connect", key="engine_connect", type="primary"):
            try:
                st.session_state["engine_connected"] = validate_engine_url(st.session_state["engine_url"])
            except ValueError as e:
                st.session_state["engine_connected"] = ""
                st.error(str(e))
    st.header("View")
    st.selectbox("Time window", list(state.TIME_WINDOWS), key="window")
    st.select_slider("Refresh every (s)", options=[0.5, 1.0, 2.0, 5.0], key="refresh_s")


def _open_target() -> LiveTarget | None:
    if choice == "in_process":
        try:
            return state.live_target(in_process.kind, "", in_process.device)
        except (ControlError, ValueError, OSError, RuntimeError) as e:
            st.error(f"Cannot start {in_process.label}: {e}")
            return None
    url = st.session_state["engine_connected"]
    if not url:
        st.info("Enter the engine's URL in the sidebar and press **Connect**. To try it without a GPU: "
                "`memsaver demo-engine --port 30000 --weights 512MiB --kv-cache 1GiB`.")
        return None
    try:
        return state.live_target("engine", url, "")
    except (ControlError, ValueError, OSError) as e:
        st.error(str(e))
        return None


target = _open_target()
if target is None:
    st.stop()
assert target is not None

st.info(BACKEND_EXPLANATIONS[target.spec.kind])

# -- the numbers, right now: refresh on their own, without redrawing the page --------------------
refresh_s = float(st.session_state["refresh_s"])


@st.fragment(run_every=refresh_s)
def live_numbers() -> None:
    assert target is not None
    sections.render_device_tiles(charts.accounting_summary(target.store))


live_numbers()

# -- controls ------------------------------------------------------------------------------------
allowed, not_allowed_why = state.controls_allowed()


def _act(action: str, tags: list[str] | None = None) -> None:
    """Button callback: runs before the rerun, so the page then shows the new state."""
    assert target is not None
    with target.acting() as held:
        # The enabled-button rule, checked again: a callback that runs a second time for one
        # click (seen in a real browser) finds nothing to do and leaves the first outcome shown.
        if target.would_act(action, tags, held):
            _do(action, tags)


def _do(action: str, tags: list[str] | None) -> None:
    assert target is not None
    if action == "pause":
        outcome = target.pause(tags)
    elif action == "resume":
        outcome = target.resume(tags)
    elif action == "free":
        outcome = target.free(tags[0] if tags else "")
    elif action == "allocate_demo":
        results = [target.allocate(tag, size) for tag, size in target.demo_sizes.items()]
        failed = [r.message for r in results if not r.ok]
        made = ", ".join(f"{t} {format_bytes(b)}" for t, b in target.demo_sizes.items())
        outcome = Outcome(not failed, " ".join(failed) or f"Allocated {made}. Now pause a tag.")
    else:  # allocate from the form
        outcome = target.allocate(st.session_state["alloc_tag"],
                                  int(st.session_state["alloc_mib"] * MiB),
                                  bool(st.session_state["alloc_backup"]))
    state.remember(outcome)


st.subheader("Controls")
if not allowed:
    st.warning(not_allowed_why)
outcome = state.pop_outcome()
if outcome is not None:
    (st.success if outcome.ok else st.error)(outcome.message)

try:
    tags: dict[str, TagState] = target.tags()
except ControlError as e:
    st.error(f"Cannot read the tags of {target.spec.label}: {e}")
    tags = {}

if target.can_allocate:
    with st.container(border=True):
        st.markdown("**1. Allocate tagged memory** — the stand-in for a model's weights and KV cache.")
        st.button(
            "Allocate demo tags (" + ", ".join(f"{t} {format_bytes(b)}" for t, b in target.demo_sizes.items())
            + ")",
            key="allocate_demo", type="primary",
            disabled=not allowed or not target.would_act("allocate_demo", None, tags),
            on_click=_act, args=("allocate_demo",),
        )
        with st.expander("Allocate a tag of your own"):
            c1, c2, c3 = st.columns([2, 2, 1], vertical_alignment="bottom")
            c1.text_input("Tag", value="weights_drafter", key="alloc_tag")
            c2.number_input("Size (MiB)", min_value=1, max_value=1024 * 1024, value=128, step=64,
                            key="alloc_mib")
            c3.checkbox("CPU backup", key="alloc_backup",
                        help="keep a copy so the content survives pause/resume (slower pause)")
            st.button("Allocate", key="allocate_custom", disabled=not allowed,
                      on_click=_act, args=("allocate",))

with st.container(border=True):
    st.markdown("**2. Pause and resume tags** — every click becomes an event on the chart below.")
    if not tags:
        st.caption("No tags yet." + (" Allocate some above." if target.can_allocate else ""))
    for tag, ts in tags.items():
        c_name, c_state, c_pause, c_resume, c_free = st.columns([3, 2, 1, 1, 1], vertical_alignment="center")
        size = format_bytes(ts.bytes) if ts.bytes is not None else "size not reported"
        c_name.markdown(f"`{tag}` · {size}" + (" · CPU backup" if ts.backup else ""))
        c_state.markdown(":orange[**paused**] — released" if ts.paused else ":green[**resident**]")
        c_pause.button("Pause", key=f"pause_{tag}",
                       disabled=not allowed or not target.would_act("pause", [tag], tags),
                       on_click=_act, args=("pause", [tag]))
        c_resume.button("Resume", key=f"resume_{tag}",
                        disabled=not allowed or not target.would_act("resume", [tag], tags),
                        on_click=_act, args=("resume", [tag]))
        if target.can_allocate:
            c_free.button("Free", key=f"free_{tag}", disabled=not allowed,
                          on_click=_act, args=("free", [tag]))
    c_all_pause, c_all_resume, _ = st.columns([1, 1, 4])
    c_all_pause.button("Pause all", key="pause_all",
                       disabled=not allowed or not target.would_act("pause", None, tags),
                       on_click=_act, args=("pause", None))
    c_all_resume.button("Resume all", key="resume_all",
                        disabled=not allowed or not target.would_act("resume", None, tags),
                        on_click=_act, args=("resume", None))

# -- the charts: refresh on their own too --------------------------------------------------------
st.subheader("What the memory did")


@st.fragment(run_every=refresh_s)
def live_charts() -> None:
    assert target is not None
    seconds = state.TIME_WINDOWS[st.session_state["window"]]
    start = None if seconds is None else now() - seconds
    # Only the shown window (plus each series' value at its start) and the events in it: the
    # cost of a refresh does not grow with how long the target has run.
    rec = charts.load(target.store, start=start)  # read once, draw many
    sections.render_charts(rec, start=start, end=None, key="live")
    sections.render_verification(rec, key="live")
    sections.render_diagnostics(rec.diagnostics, target.recorder.skipped)
    st.caption(f"Updated {time.strftime('%H:%M:%S')} · {target.store.sample_count():,} samples in the "
               "live view (change-only: a value is stored when it changes, and every second otherwise)")


live_charts()

# -- recording to a file, downloads ------------------------------------------------------------
st.subheader("Record and download")


def _start_recording() -> None:
    assert target is not None
    name = st.session_state["recording_name"].strip() or _default_recording_name()
    try:
        path = target.start_recording(name)
        state.remember(Outcome(True, f"Recording to {path}."))
    except (ValueError, OSError, StoreError) as e:
        state.remember(Outcome(False, f"Cannot start recording: {e}"))


def _stop_recording() -> None:
    assert target is not None
    path = target.stop_recording()
    state.remember(Outcome(True, f"Saved {path}. Open it on the Recordings page to replay it."))


def _default_recording_name() -> str:
    return str(Path("recordings") / f"{time.strftime('%Y%m%d-%H%M%S')}-{target.spec.kind}.sqlite")


recording = target.recording_path
c_file, c_start, c_stop = st.columns([4, 1, 1], vertical_alignment="bottom")
c_file.text_input("Record to file", key="recording_name", placeholder=_default_recording_name(),
                  disabled=recording is not None,
                  help="a new .sqlite file; it can be replayed on the Recordings page or with "
                       "`memsaver summary FILE`")
c_start.button("Start recording", key="recording_start", disabled=recording is not None,
               on_click=_start_recording)
c_stop.button("Stop recording", key="recording_stop", disabled=recording is None, on_click=_stop_recording)
if recording is not None:
    st.markdown(f":red[●] Recording to `{recording}` — every sample and event from now on.")

st.caption("Download what the live view holds since this target started:")
sections.render_downloads(target.store, stem=f"memsaver-live-{target.spec.kind}",
                          title=f"memsaver — {target.spec.label}", key="live")
