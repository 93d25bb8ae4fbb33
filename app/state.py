"""Streamlit glue: the live targets every browser session shares, and per-session defaults.

``st.cache_resource`` objects are shared by all sessions of the server, so the LiveTarget they
hold is thread-safe and its recorder threads never call ``st.*``; the page reads what they
stored. What one user typed or clicked last lives in ``st.session_state``.
"""

from __future__ import annotations

import os
from typing import Any

import streamlit as st

from app.live_target import DEFAULT_ENGINE_URL, LiveTarget, Outcome, TargetSpec, in_process_backend
from collectors.store import Store

__all__ = [
    "REMOTE_CONTROL_ENV",
    "TIME_WINDOWS",
    "controls_allowed",
    "detected_backend",
    "init_session",
    "live_target",
    "open_recording",
    "pop_outcome",
    "remember",
]

# Set to 1 to allow Pause/Resume from other machines when the server is exposed on purpose.
REMOTE_CONTROL_ENV = "MEMSAVER_ALLOW_REMOTE_CONTROL"
_LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")
# Live view: label -> seconds back from now (None = everything since the target started).
TIME_WINDOWS: dict[str, float | None] = {
    "last 30 s": 30.0, "last 2 min": 120.0, "last 10 min": 600.0, "last hour": 3600.0,
    "since start": None,
}

_DEFAULTS: dict[str, Any] = {
    "target_choice": "in_process",
    "engine_url": DEFAULT_ENGINE_URL,
    "engine_connected": "",  # the URL the user connected to, "" for none
    "outcome": None,
    "window": "last 2 min",
    "refresh_s": 1.0,
    "recording_name": "",
}


def init_session() -> None:
    for key, value in _DEFAULTS.items():
        st.session_state.setdefault(key, value)


def _release(target: LiveTarget) -> None:
    target.close()


@st.cache_resource(show_spinner=False)
def detected_backend() -> tuple[str, str, str]:
    """("tms", "cuda:0", why) or ("host", "host", why): see ``in_process_backend``."""
    return in_process_backend()


@st.cache_resource(show_spinner="Connecting…", max_entries=8, on_release=_release)
def live_target(kind: str, url: str = "", device: str = "") -> LiveTarget:
    """One LiveTarget per (kind, url, device) for the whole server. Raises on failure (not cached)."""
    return LiveTarget.build(TargetSpec(kind, url, device))


def _close_store(store: Store) -> None:
    store.close()


@st.cache_resource(show_spinner=False, max_entries=4, on_release=_close_store)
def open_recording(path: str, mtime: float) -> Store:
    """A recording opened read-only, shared by sessions (deferred downloads read it after the
    script run ends). ``mtime`` in the key reopens a file that changed. Raises StoreError."""
    del mtime
    return Store.open(path)


def controls_allowed() -> tuple[bool, str]:
    """Pause/Resume change a live process's memory: only offered when the server listens on
    loopback (the shipped .streamlit/config.toml), unless the operator opts in explicitly."""
    if os.environ.get(REMOTE_CONTROL_ENV) == "1":
        return True, ""
    address = st.get_option("server.address")
    if address in _LOOPBACK_ADDRESSES:
        return True, ""
    return False, (
        f"Controls are disabled: this server listens on {address or 'every interface'}, so anyone "
        f"who can reach it could pause memory. Run with --server.address 127.0.0.1 (the default in "
        f".streamlit/config.toml), or set {REMOTE_CONTROL_ENV}=1 if exposing the controls is intended."
    )


def remember(outcome: Outcome) -> None:
    """Keep a click's outcome to show after the rerun it triggers."""
    st.session_state["outcome"] = outcome


def pop_outcome() -> Outcome | None:
    return st.session_state.pop("outcome", None)
