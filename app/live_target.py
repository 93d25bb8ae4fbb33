"""A live target: one control, the recorder that watches what it changes, an optional file recording.

No Streamlit here (the app caches these with ``st.cache_resource``, tests build them directly).
Every method is thread-safe: one Streamlit server shares a target between all its browser sessions,
and two clicks at once must not interleave a pause with a resume.

>>> from app.live_target import LiveTarget, TargetSpec
>>> target = LiveTarget.build(TargetSpec("host"))                          # doctest: +SKIP
>>> target.allocate("kv_cache", 512 * 2**20)                               # doctest: +SKIP
>>> target.pause(["kv_cache"]).ok                                          # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from collectors.controls.base import Control, ControlError, TagState
from collectors.model import Event
from collectors.recorder import Recorder
from collectors.sources import Source, make_source
from collectors.store import Store, StoreError
from collectors.units import GiB, MiB

__all__ = [
    "DEFAULT_ENGINE_URL",
    "DEFAULT_TAG_SIZES",
    "GPU_DEMO_TAG_SIZES",
    "LiveTarget",
    "Outcome",
    "TargetSpec",
    "in_process_backend",
    "validate_engine_url",
]

DEFAULT_ENGINE_URL = "http://127.0.0.1:30000"
# What the "Allocate demo tags" button makes: small enough for a laptop's RAM, big enough to see;
# on a GPU, big enough to stand out next to an 80-141 GiB device total.
DEFAULT_TAG_SIZES = {"weights": 256 * MiB, "kv_cache": 512 * MiB}
GPU_DEMO_TAG_SIZES = {"weights": 2 * GiB, "kv_cache": 4 * GiB}
# Tags an SGLang server holds in a plain (non-speculative) setup.
SGLANG_TAGS = ("weights", "kv_cache", "cuda_graph")
# Seconds between reads in the live view (the host source is cheap; RSS moves on the next read).
LIVE_INTERVALS = {"host": 0.05, "saver": 0.05, "nvml": 0.02, "sysman": 0.2, "torch": 0.1}


@dataclass(frozen=True)
class TargetSpec:
    """What a user picked: ``kind`` "host" (host saver), "tms" (torch_memory_saver on ``device``)
    or "engine" (an SGLang-compatible server at ``url``)."""

    kind: str
    url: str = ""
    device: str = ""

    @property
    def label(self) -> str:
        if self.kind == "host":
            return "This process — host saver (embedded default)"
        if self.kind == "tms":
            return f"This process — torch_memory_saver on {self.device or 'cuda:0'}"
        return f"Engine at {self.url}"


@dataclass(frozen=True)
class Outcome:
    """What a click did, for the page to show: ``ok`` and a one-line message."""

    ok: bool
    message: str

    @classmethod
    def of(cls, event: Event, what: str) -> Outcome:
        if event.ok:
            took = f" in {event.duration * 1e3:.0f} ms" if event.duration is not None else ""
            return cls(True, f"{what}: done{took}.")
        return cls(False, f"{what} failed: {event.error}")


def validate_engine_url(text: str) -> str:
    """Check a user-typed engine URL; returns it normalised (no trailing slash).

    Raises ValueError with a one-line message saying what to fix.

    >>> validate_engine_url(" http://127.0.0.1:30000/ ")
    'http://127.0.0.1:30000'
    """
    raw = (text or "").strip()
    example = f"e.g. {DEFAULT_ENGINE_URL}"
    if not raw:
        raise ValueError(f"enter the engine's URL, {example}")
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as e:  # urlsplit rejects a non-numeric or out-of-range port here
        raise ValueError(f"{raw!r} is not a valid URL ({e}); {example}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{raw!r}: the URL must start with http:// or https://, {example}")
    if not parts.hostname:
        raise ValueError(f"{raw!r}: the URL has no host, {example}")
    if port is None:
        raise ValueError(f"{raw!r}: add the port the engine listens on, {example}")
    if port == 0:
        raise ValueError(f"{raw!r}: port 0 is not a port an engine listens on, {example}")
    if parts.username or parts.password:
        raise ValueError(f"{raw!r}: credentials in the URL are not supported")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"{raw!r}: give only scheme, host and port (no path), {example}")
    return f"{parts.scheme}://{parts.netloc}"


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def in_process_backend() -> tuple[str, str, str]:
    """What the in-process target can be here: ("tms", device, why) when torch sees a GPU and
    torch_memory_saver is installed, else ("host", "host", why).

    torch is imported only when torch_memory_saver is installed: importing it costs seconds and
    hundreds of MiB of RSS, which would blur the host demo's physical line for nothing.
    """
    if importlib.util.find_spec("torch_memory_saver") is None:
        return "host", "host", "torch_memory_saver is not installed: using the host saver"
    try:
        import torch
    except Exception as e:  # a broken torch install must not stop the app
        return "host", "host", f"torch failed to import ({e}): using the host saver"
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        with contextlib.suppress(Exception):
            if backend is not None and backend.is_available() and backend.device_count() > 0:
                return "tms", f"{kind}:0", f"torch_memory_saver on {kind}:0"
    return "host", "host", "torch sees no CUDA or XPU device: using the host saver"


class LiveTarget:
    """A control and a recorder whose sources see what the control changes.

    The live store is in memory; ``start_recording(path)`` adds a second recorder writing the
    same sources to a file, and every event of the control is copied there as well.
    """

    def __init__(self, spec: TargetSpec, control: Control, make_sources: Callable[[], list[Source]],
                 store: Store | None = None, *, intervals: dict[str, float] | None = None) -> None:
        self.spec = spec
        self.control = control
        self.store = store if store is not None else Store(":memory:")
        self.control.store = self.store
        # A factory, not a list: a second recorder (file) needs its own source objects.
        self._make_sources = make_sources
        self._intervals = {**LIVE_INTERVALS, **(intervals or {})}
        self.recorder = Recorder(self.store, sources=make_sources(), intervals=self._intervals)
        self.recorder.start()
        self._lock = threading.RLock()
        self._file: Recorder | None = None
        self._file_copied_event_ids: set[int] = set()
        self.closed = False

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def build(cls, spec: TargetSpec, *, timeout: float = 10.0) -> LiveTarget:
        """Make the control for ``spec`` and the sources that show its physical effect.

        Raises ControlError / ValueError with a user-facing message (e.g. engine unreachable).
        """
        from collectors.controls import make_control

        if spec.kind == "host":
            control = make_control("host")
            pid = os.getpid()

            def make_sources() -> list[Source]:
                # system=False: the whole machine's used memory would bury a 512 MiB step.
                return [make_source("host", pids=[pid], system=False),
                        control.accounting_source()]  # type: ignore[attr-defined]
        elif spec.kind == "tms":
            control = make_control("tms", device=spec.device or "cuda:0")

            def make_sources() -> list[Source]:
                return [*_gpu_physical_sources(), control.accounting_source()]  # type: ignore[attr-defined]
        elif spec.kind == "engine":
            url = validate_engine_url(spec.url)
            control = make_control("engine", url=url, timeout=timeout)
            try:
                control.state()  # fail now, with the client's message, rather than on first click
            except ControlError:
                control.close()  # type: ignore[attr-defined]
                raise
            pid = _engine_pid(control)

            def make_sources() -> list[Source]:
                return _engine_sources(url, pid)
        else:
            raise ValueError(f"unknown target kind {spec.kind!r}; expected host, tms or engine")
        return cls(spec, control, make_sources)

    # -- state -------------------------------------------------------------------------------
    def tags(self) -> dict[str, TagState]:
        """Per tag: bytes, paused, backup. Raises ControlError when the target cannot say.

        A real SGLang server does not list its tags (no status endpoint): its usual ones are
        offered as resident, sizes unknown, so each can still be paused on its own."""
        with self._lock:
            held = self.control.state()
            if self.spec.kind == "engine" and all(ts.bytes is None for ts in held.values()):
                status = getattr(self.control, "status", None)
                if callable(status) and status() is None:
                    for tag in SGLANG_TAGS:
                        held.setdefault(tag, TagState(tag, None, False, False))
            return held

    @contextlib.contextmanager
    def acting(self) -> Iterator[dict[str, TagState] | None]:
        """Hold the action lock and yield the tags as they are now (None when the target cannot
        say), so a caller can check that an action still means something and do it with no other
        action in between."""
        with self._lock:
            try:
                held: dict[str, TagState] | None = self.tags()
            except ControlError:
                held = None
            yield held

    def would_act(self, action: str, tags: Sequence[str] | None,
                  held: dict[str, TagState] | None) -> bool:
        """Whether ``action`` on ``tags`` changes anything in state ``held``: the one rule behind
        the page's enabled buttons and the check made again when a click's callback runs (a
        real browser ran one Allocate click's callback twice; the second run must not report a
        failure of an action nobody asked for). None (state unknown) always acts."""
        if held is None:
            return True
        if action == "allocate_demo":
            return not any(t in held for t in self.demo_sizes)
        if action == "free":
            return bool(tags) and all(t in held for t in tags or [])
        if action in ("pause", "resume"):
            paused = action == "resume"  # the state a tag must be in for the action to act
            if tags:
                return all(t in held and held[t].paused == paused for t in tags)
            # "all": meaningful when some tag can take it; an engine that lists no tags still can
            return not (held or self.can_allocate) or any(ts.paused == paused for ts in held.values())
        return True

    @property
    def demo_sizes(self) -> dict[str, int]:
        """Tags and sizes of the one-click demo allocation for this target."""
        return GPU_DEMO_TAG_SIZES if self.spec.kind == "tms" else DEFAULT_TAG_SIZES

    @property
    def can_allocate(self) -> bool:
        return hasattr(self.control, "allocate")

    # -- actions (each one becomes an event on the chart) ------------------------------------
    def allocate(self, tag: str, nbytes: int, backup: bool = False) -> Outcome:
        tag = (tag or "").strip()
        if not tag:
            return Outcome(False, "Allocate failed: give the tag a name, e.g. weights")
        if not self.can_allocate:
            return Outcome(False, f"{self.spec.label} allocates its own memory; it cannot be asked to")
        with self._lock:
            try:
                self.control.allocate(tag, int(nbytes), backup=backup)  # type: ignore[attr-defined]
            except (ControlError, ValueError, OSError, RuntimeError) as e:
                return self._done(Outcome(False, f"Allocate {tag} failed: {e}"))
        return self._done(Outcome(True, f"Allocated {tag}."))

    def free(self, tag: str) -> Outcome:
        with self._lock:
            try:
                self.control.free(tag)  # type: ignore[attr-defined]
            except (ControlError, ValueError, KeyError, OSError, RuntimeError) as e:
                return self._done(Outcome(False, f"Free {tag} failed: {e}"))
        return self._done(Outcome(True, f"Freed {tag}."))

    def pause(self, tags: Sequence[str] | None = None) -> Outcome:
        with self._lock:
            ev = self.control.pause(list(tags or []))
        return self._done(Outcome.of(ev, f"Pause {', '.join(tags) if tags else 'all tags'}"))

    def resume(self, tags: Sequence[str] | None = None) -> Outcome:
        with self._lock:
            ev = self.control.resume(list(tags or []))
        return self._done(Outcome.of(ev, f"Resume {', '.join(tags) if tags else 'all tags'}"))

    def _done(self, outcome: Outcome) -> Outcome:
        self._copy_events_to_file()
        return outcome

    # -- recording to a file -----------------------------------------------------------------
    @property
    def recording_path(self) -> Path | None:
        with self._lock:
            return Path(self._file.store.path) if self._file is not None else None

    def start_recording(self, path: str | os.PathLike[str]) -> Path:
        """Record the same sources to a new file from now on. Raises StoreError/ValueError."""
        p = Path(path).expanduser()
        with self._lock:
            if self._file is not None:
                raise ValueError(f"already recording to {self._file.store.path}; stop it first")
            if p.suffix not in (".sqlite", ".db"):
                raise ValueError(f"{p}: use a .sqlite file name")
            if p.exists():
                raise StoreError(f"{p}: exists already; choose a new file name")
            p.parent.mkdir(parents=True, exist_ok=True)
            store = Store(p)
            store.set_meta(target=self.spec.label, recorded_by="memsaver dashboard")
            sources = self._make_sources()
            self._file = Recorder(store, sources=sources, intervals=self._intervals).start()
            # Events from before the file started stay in the live view only.
            self._file_copied_event_ids = set(self.store.events()["id"].astype(int))
            return p

    def stop_recording(self) -> Path | None:
        with self._lock:
            rec, self._file = self._file, None
        if rec is None:
            return None
        self._copy_events_to(rec.store)
        rec.stop()
        rec.store.close()
        return Path(rec.store.path)

    def _copy_events_to_file(self) -> None:
        with self._lock:
            if self._file is not None:
                self._copy_events_to(self._file.store)

    def _copy_events_to(self, store: Store) -> None:
        events = self.store.events()
        for row in events.itertuples(index=False):
            if int(row.id) in self._file_copied_event_ids:
                continue
            self._file_copied_event_ids.add(int(row.id))
            store.add_event(Event(
                t_start=row.t_start, t_end=None if row.t_end != row.t_end else row.t_end,
                action=row.action, tags=list(row.tags), target=row.target, ok=bool(row.ok),
                error=row.error, origin=row.origin,
                expected_bytes=None if row.expected_bytes != row.expected_bytes else int(row.expected_bytes),
                details=dict(row.details),
            ))

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop recorders, resume nothing, free what the control holds. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.stop_recording()
        self.recorder.stop()
        with contextlib.suppress(Exception):
            self.control.close()  # type: ignore[attr-defined]


def _gpu_physical_sources() -> list[Source]:
    out: list[Source] = []
    for name in ("nvml", "sysman"):
        with contextlib.suppress(Exception):
            src = make_source(name)
            if src.discovery.available:
                out.append(src)
    return out


def _engine_pid(control: Control) -> int | None:
    """The engine's pid when it says it (the demo engine's /memsaver/status does)."""
    status = getattr(control, "status", None)
    try:
        info = status() if callable(status) else None
    except ControlError:
        return None
    pid = (info or {}).get("pid")
    return pid if isinstance(pid, int) else None


def _engine_sources(url: str, pid: int | None) -> list[Source]:
    """Physical sources for an engine: the GPUs this machine sees, and the engine's RSS when it
    runs on this machine (a host-device demo engine)."""
    sources = _gpu_physical_sources()
    if pid is not None and is_loopback_host(urlsplit(url).hostname or ""):
        sources.append(make_source("host", pids=[pid], system=not sources))
    elif not sources:
        sources.append(make_source("host"))
    return sources
