"""The agent: record torch_memory_saver's pause/resume calls of *this* process.

``install(store_or_path)`` wraps ``pause`` and ``resume`` of the TMS singleton
(``torch_memory_saver.torch_memory_saver``) so that every call becomes an Event (start, end,
tag, ok/error, ``origin="agent:<pid>"``, ``details`` with pid and device) in the shared
recording, and samples torch's accounting (``TorchSource``) and, on XPU builds that export it,
TMS's own ``tms_xpu_committed_bytes`` counter (``tms/used_bytes``) into the same file. A
recorder in another process (``memsaver record``) adds the physical truth (NVML, Sysman, host).

The wrapped call does no I/O: it reads the clock twice and puts a tuple on a queue; a
background thread writes events and samples. ``uninstall()`` flushes and restores the original
methods.

The size a tag holds (the event's ``expected_bytes``) comes from ``tag_bytes=`` when given,
else from watching ``region(tag=...)``: torch's reserved bytes on the device before and after
each region body (TMS memory is torch-allocator memory, so reserved grows by what the tag maps).

>>> import collectors.agent as agent
>>> agent.install("run.sqlite")                                 # doctest: +SKIP
>>> torch_memory_saver.pause("kv_cache")   # recorded            # doctest: +SKIP
>>> agent.uninstall()                                           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from collectors.model import DeviceInfo, Discovery, Event, Sample, now
from collectors.sources.base import Source
from collectors.store import Store

__all__ = ["Agent", "TmsCounterSource", "install", "installed", "uninstall"]

log = logging.getLogger(__name__)

_WRAPPED = ("pause", "resume")
_current: Agent | None = None
_install_lock = threading.Lock()


class TmsCounterSource(Source):
    """TMS's own committed-bytes counter on XPU builds (``tms_xpu_committed_bytes``).

    ``cdll`` is found lazily on the saver (it exists once TMS initialised); unavailable on
    CUDA builds, which do not export the counter.
    """

    name = "tms"
    default_interval = 0.1
    physical = False

    def __init__(self, saver: Any, devices: Sequence[str]) -> None:
        super().__init__()
        self.saver = saver
        self.devices = [d for d in devices if d.startswith("xpu:")]

    def cdll(self) -> Any:
        impl = getattr(self.saver, "_impl", None)
        cdll = getattr(getattr(impl, "_binary_wrapper", None), "cdll", None)
        return cdll if cdll is not None and hasattr(cdll, "tms_xpu_committed_bytes") else None

    def discover(self) -> Discovery:
        if not self.devices:
            return Discovery.unavailable(self.name, "TMS's committed-bytes counter exists on XPU only")
        impl = getattr(self.saver, "_impl", None)
        if impl is not None and self.cdll() is None:
            return Discovery.unavailable(self.name, "this torch_memory_saver build has no "
                                         "tms_xpu_committed_bytes counter")
        return Discovery(self.name, True, [DeviceInfo(d, self.name, "TMS committed bytes")
                                           for d in self.devices])

    def read(self) -> list[Sample]:
        cdll, t = self.cdll(), now()
        out = []
        for d in self.devices:
            value = None
            if cdll is not None:
                try:
                    value = int(cdll.tms_xpu_committed_bytes(int(d.split(":")[1])))
                except Exception as e:
                    self.pending_diagnostics.append(f"{d}: tms_xpu_committed_bytes failed ({e})")
            out.append(Sample(t, d, self.name, "used_bytes", value))
        return out


def _default_saver() -> Any:
    try:
        import torch_memory_saver
    except ImportError as e:
        raise RuntimeError(f"torch_memory_saver is not installed ({e}); pip install "
                           "torch_memory_saver, or pass saver= an object with pause/resume") from None
    return torch_memory_saver.torch_memory_saver


def _default_device() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        try:
            if backend is not None and backend.is_available():
                return f"{kind}:{backend.current_device()}"
        except Exception:
            continue
    return None


def _reserved_probe(device: str | None) -> Callable[[], int | None] | None:
    if not device:
        return None
    kind, _, index = device.partition(":")
    torch = sys.modules.get("torch")
    backend = getattr(torch, kind, None) if torch is not None else None
    if backend is None or not hasattr(backend, "memory_reserved"):
        return None

    def probe() -> int | None:
        try:
            return int(backend.memory_reserved(int(index or 0)))
        except Exception:
            return None

    return probe


class Agent:
    """What ``install`` returns: the wrapping, the event queue and the sampling thread."""

    def __init__(self, store: Store, saver: Any, *, device: str | None, sources: Sequence[Source],
                 interval: float, heartbeat: float, tag_bytes: dict[str, int] | None,
                 probe: Callable[[], int | None] | None, owns_store: bool) -> None:
        self.store = store
        self.saver = saver
        self.device = device
        self.sources = list(sources)
        self.interval = interval
        self.heartbeat = heartbeat
        self.tag_bytes = dict(tag_bytes or {})
        self.region_bytes: dict[str, int] = defaultdict(int)
        self.paused: set[str] = set()
        self.pid = os.getpid()
        self.origin = f"agent:{self.pid}"
        self.target = f"tms:{device}" if device else "tms"
        self.events_written = 0
        self.write_errors = 0
        self._probe = probe
        self._owns_store = owns_store
        # (action, tag, t_start, t_end, error or None); ("flush", ..., threading.Event) marks a flush
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._originals: dict[str, tuple[Any, bool]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[tuple[str, str, str, int | None], tuple[Any, float]] = {}

    # -- wrapping ----------------------------------------------------------------------------
    def _wrap(self) -> None:
        for name in _WRAPPED:
            orig = getattr(self.saver, name, None)
            if not callable(orig):
                raise TypeError(f"{type(self.saver).__name__} has no callable {name}()")
        for name in _WRAPPED:
            had_own = name in getattr(self.saver, "__dict__", {})
            orig = getattr(self.saver, name)
            self._originals[name] = (self.saver.__dict__[name] if had_own else orig, had_own)
            setattr(self.saver, name, self._wrapper(name, orig))
        if self._probe is not None and callable(getattr(self.saver, "region", None)):
            had_own = "region" in getattr(self.saver, "__dict__", {})
            orig = self.saver.region
            self._originals["region"] = (self.saver.__dict__["region"] if had_own else orig, had_own)
            self.saver.region = self._region_wrapper(orig)

    def _wrapper(self, action: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        put = self._queue.put

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tag = kwargs.get("tag", args[0] if args else None)
            t0 = now()
            try:
                result = orig(*args, **kwargs)
            except BaseException as e:
                put((action, tag, t0, now(), f"{type(e).__name__}: {e}"))
                raise
            put((action, tag, t0, now(), None))
            return result

        wrapper.__memsaver_agent__ = True  # type: ignore[attr-defined]
        return wrapper

    def _region_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        probe = self._probe
        assert probe is not None

        @functools.wraps(orig)
        @contextlib.contextmanager
        def region(*args: Any, **kwargs: Any) -> Iterator[Any]:
            tag = kwargs.get("tag", args[0] if args else "default")
            before = probe()
            with orig(*args, **kwargs) as value:
                yield value
            after = probe()
            if before is not None and after is not None and after > before:
                self.region_bytes[tag] += after - before

        return region

    def _unwrap(self) -> None:
        for name, (orig, had_own) in self._originals.items():
            if had_own:
                setattr(self.saver, name, orig)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(self.saver, name)
        self._originals.clear()

    # -- background thread -------------------------------------------------------------------
    def start(self) -> Agent:
        t = now()
        active = []
        for src in self.sources:
            try:
                d = src.discovery
            except Exception as e:
                self.store.add_diagnostic(t, src.name, f"agent: {src.name} failed to start: {e}")
                continue
            if not d.available:
                self.store.add_diagnostic(t, src.name, f"agent: {src.name} skipped: {d.reason}")
                continue
            self.store.add_devices(d.devices)
            active.append(src)
        self.sources = active
        self._wrap()
        self._thread = threading.Thread(target=self._loop, name="memsaver-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Restore the originals, write what is queued, stop sampling. Safe to call twice."""
        self._unwrap()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._drain()
        for src in self.sources:
            with contextlib.suppress(Exception):
                src.close()
        if self._owns_store:
            self.store.close()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event queued so far is written; True when done within ``timeout``."""
        if self._thread is None:
            self._drain()
            return True
        done = threading.Event()
        self._queue.put(("flush", None, 0.0, 0.0, done))  # FIFO: written after all before it
        return done.wait(timeout)

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self._drain()
            if time.monotonic() >= next_tick:
                self._sample()
                next_tick = time.monotonic() + self.interval
            try:
                item = self._queue.get(timeout=max(0.0, min(0.5, next_tick - time.monotonic())))
            except queue.Empty:
                continue
            self._write_event(item)

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._write_event(item)

    def _expected(self, action: str, tag: str | None) -> int | None:
        sizes = {**self.region_bytes, **self.tag_bytes}
        if tag is not None:
            return sizes.get(tag)
        chosen = [t for t in sizes if (t in self.paused) == (action == "resume")]
        return sum(sizes[t] for t in chosen) if sizes else None

    def _write_event(self, item: tuple[Any, ...]) -> None:
        action, tag, t0, t1, error = item
        if action == "flush":
            error.set()
            return
        ev = Event(t0, t1, action, [] if tag is None else [str(tag)], self.target, ok=error is None,
                   error=error, origin=self.origin, expected_bytes=self._expected(action, tag),
                   details={"pid": self.pid, "device": self.device, "via": "agent"})
        if error is None:
            known = set(self.region_bytes) | set(self.tag_bytes) | self.paused
            tags = {tag} if tag is not None else known
            if action == "pause":
                self.paused |= tags
            else:
                self.paused -= tags
        try:
            self.store.add_event(ev)
            self.events_written += 1
        except Exception as e:  # a full disk must not break the user's process
            self.write_errors += 1
            log.error("agent: writing an event failed: %s", e)

    def _sample(self) -> None:
        batch: list[Sample] = []
        for src in self.sources:
            try:
                samples = src.read()
            except Exception as e:
                log.debug("agent: %s read failed: %s", src.name, e)
                continue
            for s in samples:
                prev = self._last.get(s.key)
                if prev is None or prev[0] != s.value or s.t - prev[1] >= self.heartbeat:
                    self._last[s.key] = (s.value, s.t)
                    batch.append(s)
            for msg in src.drain_diagnostics():
                with contextlib.suppress(Exception):
                    self.store.add_diagnostic(now(), src.name, msg)
        if batch:
            try:
                self.store.add_samples(batch)
            except Exception as e:
                self.write_errors += 1
                log.error("agent: writing %d samples failed: %s", len(batch), e)


def install(store_or_path: Any, *, saver: Any = None, device: str | None = None, sample: bool = True,
            interval: float = 0.1, heartbeat: float = 1.0, sources: Sequence[Source] = (),
            tag_bytes: dict[str, int] | None = None,
            probe: Callable[[], int | None] | None = None) -> Agent:
    """Start recording this process's TMS pause/resume calls into ``store_or_path``.

    ``store_or_path``: a Store, a Recorder (its store) or a recording path (created or appended).
    ``saver``: the object whose ``pause``/``resume`` to wrap (default: the TMS singleton).
    ``device``: e.g. "cuda:0" (default: torch's current CUDA/XPU device, if any).
    ``sample``: also sample torch accounting (and TMS's XPU counter) every ``interval`` s.
    ``sources``: more in-process sources to sample (e.g. ``HostSaver.accounting_source()``).
    ``tag_bytes``: bytes per tag, when known (else learned from ``region`` via ``probe``).
    Raises RuntimeError when an agent is already installed.
    """
    global _current
    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval}")
    with _install_lock:
        if _current is not None:
            raise RuntimeError("a memsaver agent is already installed in this process; uninstall() first")
        owns = False
        if isinstance(store_or_path, Store):
            store = store_or_path
        elif isinstance(getattr(store_or_path, "store", None), Store):
            store = store_or_path.store
        else:
            store, owns = Store(store_or_path), True
        try:
            target = saver if saver is not None else _default_saver()
            dev = device if device is not None else (_default_device() if saver is None else None)
            srcs: list[Source] = list(sources)
            if sample and dev:
                from collectors.sources.torch_source import TorchSource

                srcs.append(TorchSource(devices=[dev]))
                if dev.startswith("xpu:"):
                    srcs.append(TmsCounterSource(target, [dev]))
            agent = Agent(store, target, device=dev, sources=srcs, interval=interval, heartbeat=heartbeat,
                          tag_bytes=tag_bytes, probe=probe if probe is not None else _reserved_probe(dev),
                          owns_store=owns)
            agent.start()
        except BaseException:
            if owns:
                store.close()
            raise
        _current = agent
        return agent


def uninstall() -> None:
    """Restore the original pause/resume, write every queued event, stop sampling."""
    global _current
    with _install_lock:
        agent, _current = _current, None
    if agent is not None:
        agent.stop()


def installed() -> Agent | None:
    """The installed agent, or None."""
    return _current
