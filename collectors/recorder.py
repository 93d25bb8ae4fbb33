"""The recorder: one thread per source, fixed-rate ticks, change-only batched writes.

>>> from collectors import Recorder, Store
>>> with Recorder(Store(":memory:"), sources=["host"], intervals={"host": 0.05}) as rec:
...     pass                                             # doctest: +SKIP
>>> rec.store.sample_count() > 0                         # doctest: +SKIP
True

Why the pieces are shaped as they are:
- A slow source (Sysman can take 100+ ms a read) must never stall a fast one: each source gets
  its own thread and interval.
- Ticks are scheduled on ``time.monotonic`` as ``start + k * interval`` so they do not drift;
  a read that overruns skips the ticks it missed and counts them.
- Memory is step-shaped: a value is stored when it changes, and at least every ``heartbeat``
  seconds while it does not (store meta says so). A failed read stores NULL (a gap).
- Source threads hand batches to one writer thread through a bounded queue; the writer commits
  every ``flush_interval``. ``kill -9`` loses at most the rows of the last uncommitted batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collectors import __version__
from collectors.model import Event, Sample, now
from collectors.sources import Source, make_source
from collectors.store import Store

__all__ = ["Recorder", "SourceStats"]

log = logging.getLogger(__name__)

_LATENCY_WINDOW = 20_000  # per-source read latencies kept for percentiles


@dataclass
class SourceStats:
    """Counters of one source thread. Latencies in seconds."""

    source: str
    interval: float
    ticks: int = 0
    missed_ticks: int = 0
    samples_read: int = 0
    samples_stored: int = 0
    errors: int = 0
    dropped_batches: int = 0
    last_error: str | None = None
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))

    def latency_percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q / 100 * len(data)))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "interval_s": self.interval, "ticks": self.ticks,
            "missed_ticks": self.missed_ticks, "samples_read": self.samples_read,
            "samples_stored": self.samples_stored, "errors": self.errors,
            "dropped_batches": self.dropped_batches, "last_error": self.last_error,
            "read_latency_p50_s": self.latency_percentile(50),
            "read_latency_p99_s": self.latency_percentile(99),
        }


class _ChangeFilter:
    """Keeps a sample when its value changed or the heartbeat is due."""

    def __init__(self, heartbeat: float) -> None:
        self.heartbeat = heartbeat
        self.last: dict[tuple[str, str, str, int | None], tuple[Any, float]] = {}

    def keep(self, s: Sample, key: tuple[str, str, str, int | None] | None = None) -> bool:
        key = s.key if key is None else key
        prev = self.last.get(key)
        if prev is not None and prev[0] == s.value and s.t - prev[1] < self.heartbeat:
            return False
        self.last[key] = (s.value, s.t)
        return True


class Recorder:
    """Polls sources on their own threads and writes what changed to a Store.

    ``sources`` are Source objects or registry names; ``intervals`` maps a source name to
    seconds (default: the source's own ``default_interval``). Unavailable sources are skipped
    and their reason is kept in ``skipped`` and the store's diagnostics.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        sources: Sequence[Source | str] = ("host",),
        *,
        intervals: Mapping[str, float] | None = None,
        heartbeat: float = 1.0,
        flush_interval: float = 0.2,
        queue_size: int = 10_000,
        change_only: bool = True,
    ) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self.heartbeat = heartbeat
        self.flush_interval = flush_interval
        self.change_only = change_only
        self._queue: queue.Queue[list[Sample]] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._writer: threading.Thread | None = None
        self._latest_lock = threading.Lock()
        self._latest: dict[tuple[str, str, str, int | None], tuple[float, Any]] = {}
        self.sources: list[Source] = []
        self.skipped: dict[str, str] = {}
        self.stats: dict[str, SourceStats] = {}
        self.write_errors = 0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._primary = True
        intervals = dict(intervals or {})
        for s in sources:
            src = make_source(s) if isinstance(s, str) else s
            if src.name in self.stats:
                raise ValueError(f"source {src.name!r} given twice; one Recorder polls each source once "
                                 "(give HostSource several pids instead)")
            interval = float(intervals.get(src.name, src.default_interval))
            if not interval > 0:
                raise ValueError(f"interval for {src.name} must be > 0 seconds, got {interval}")
            self.sources.append(src)
            self.stats[src.name] = SourceStats(src.name, interval)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.started_at is not None and self.stopped_at is None

    def start(self) -> Recorder:
        if self.started_at is not None:
            raise RuntimeError("a Recorder can be started once")
        self.started_at = now()
        active = []
        t0 = self.started_at
        for src in self.sources:
            d = src.discovery
            for msg in d.diagnostics:
                self.store.add_diagnostic(t0, src.name, msg)
            if not d.available:
                self.skipped[src.name] = d.reason or "unavailable"
                self.store.add_diagnostic(t0, src.name, f"skipped: {d.reason}")
                del self.stats[src.name]
                continue
            self.store.add_devices(d.devices)
            active.append(src)
        self.sources = active
        mine = {s.name: self.stats[s.name].interval for s in active}
        existing = self.store.meta()
        # A second recorder on the same file (an agent, the app beside `memsaver record`) adds
        # its sources instead of overwriting the first one's description of the recording.
        self._primary = "started_at" not in existing
        if self._primary:
            self.store.set_meta(
                host=platform.node(), started_at=t0, tool_version=__version__,
                sources=[s.name for s in active], skipped=self.skipped, intervals=mine,
                heartbeat_s=self.heartbeat, storage="change_only" if self.change_only else "every_tick",
                flush_interval_s=self.flush_interval, pid=os.getpid(),
            )
        else:
            self.store.set_meta(
                sources=sorted(set(existing.get("sources", [])) | set(mine)),
                intervals={**existing.get("intervals", {}), **mine},
                skipped={**existing.get("skipped", {}), **self.skipped},
            )
        self._writer = threading.Thread(target=self._write_loop, name="memsaver-writer", daemon=True)
        self._writer.start()
        for src in active:
            th = threading.Thread(target=self._poll_loop, args=(src,), name=f"memsaver-{src.name}",
                                  daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        """Stop polling, flush every queued sample, write final stats. Safe to call twice."""
        if self.started_at is None or self.stopped_at is not None:
            return
        self._stop.set()
        for th in self._threads:
            th.join()
        if self._writer is not None:
            self._writer.join()
        self._flush()  # anything put after the writer's last drain
        self.stopped_at = now()
        for src in self.sources:
            with contextlib.suppress(Exception):
                src.close()
        with contextlib.suppress(Exception):
            self._save_stats(final=True)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- events ------------------------------------------------------------------------------
    def add_event(self, event: Event) -> int:
        return self.store.add_event(event)

    @contextlib.contextmanager
    def event(self, action: str, tags: Sequence[str] = (), *, target: str = "", origin: str = "app",
              expected_bytes: int | None = None, **details: Any) -> Iterator[Event]:
        """Record what the body does as one Event; an exception marks it failed and propagates."""
        ev = Event(now(), None, action, list(tags), target, origin=origin,
                   expected_bytes=expected_bytes, details=dict(details))
        try:
            yield ev
        except BaseException as e:
            ev.ok, ev.error = False, str(e) or type(e).__name__
            raise
        finally:
            ev.t_end = now()
            self.store.add_event(ev)

    # -- live view ---------------------------------------------------------------------------
    def latest(self) -> dict[tuple[str, str, str, int | None], tuple[float, Any]]:
        """Last value read per series (not only stored ones): key -> (t, value)."""
        with self._latest_lock:
            return dict(self._latest)

    def stats_dict(self) -> dict[str, dict[str, Any]]:
        return {name: st.to_dict() for name, st in self.stats.items()}

    def _save_stats(self, final: bool) -> None:
        stats = {**(self.store.meta().get("stats") or {}), **self.stats_dict()}
        if final and self._primary:
            self.store.set_meta(stats=stats, stopped_at=self.stopped_at)
        else:
            self.store.set_meta(stats=stats)

    # -- threads -----------------------------------------------------------------------------
    def _poll_loop(self, src: Source) -> None:
        st = self.stats[src.name]
        interval = st.interval
        flt = _ChangeFilter(self.heartbeat if self.change_only else 0.0)
        start = time.monotonic()
        k = 0
        last_keys: list[tuple[str, str, str, int | None]] = []
        while not self._stop.is_set():
            t_read = time.perf_counter()
            try:
                samples = src.read()
                ok = True
            except Exception as e:  # a failing source is counted and logged, never fatal
                ok = False
                samples = [Sample(now(), d, src.name, m, None, p) for (d, _, m, p) in last_keys]
                st.errors += 1
                if st.last_error != str(e):
                    log.warning("source %s read failed: %s", src.name, e)
                    with contextlib.suppress(Exception):
                        self.store.add_diagnostic(now(), src.name, f"read failed: {e}")
                st.last_error = str(e)
            st.latencies.append(time.perf_counter() - t_read)
            st.ticks += 1
            keys = [s.key for s in samples]  # built once: it is most of the per-sample cost
            if ok:
                last_keys = keys
            for msg in src.drain_diagnostics():
                with contextlib.suppress(Exception):
                    self.store.add_diagnostic(now(), src.name, msg)
            if samples:
                st.samples_read += len(samples)
                with self._latest_lock:
                    self._latest.update(zip(keys, [(s.t, s.value) for s in samples], strict=True))
                kept = [s for s, key in zip(samples, keys, strict=True) if flt.keep(s, key)]
                if kept:
                    try:
                        self._queue.put_nowait(kept)
                        st.samples_stored += len(kept)
                    except queue.Full:
                        st.dropped_batches += 1
            k += 1
            next_t = start + k * interval
            now_m = time.monotonic()
            if now_m > next_t:
                behind = int((now_m - next_t) // interval)
                if behind:
                    st.missed_ticks += behind
                    k += behind
                    next_t = start + k * interval
            # time.sleep costs less CPU than Event.wait (measured ~10 us vs ~24 us a tick);
            # stop is checked every tick, so stop() waits at most one interval (or 50 ms).
            remaining = next_t - time.monotonic()
            if remaining > 0:
                time.sleep(min(remaining, 0.05))
                while not self._stop.is_set() and (remaining := next_t - time.monotonic()) > 0:
                    time.sleep(min(remaining, 0.05))

    def _write_loop(self) -> None:
        last_stats = time.monotonic()
        while not self._stop.wait(self.flush_interval):
            self._flush()
            if time.monotonic() - last_stats > 5.0:  # stats survive a kill -9 too, roughly
                last_stats = time.monotonic()
                with contextlib.suppress(Exception):
                    self._save_stats(final=False)
        self._flush()

    def _flush(self) -> None:
        batch: list[Sample] = []
        while True:
            try:
                batch.extend(self._queue.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return
        try:
            self.store.add_samples(batch)
        except Exception as e:  # disk full, file removed: count, log, keep recording
            self.write_errors += 1
            log.error("writing %d samples failed: %s", len(batch), e)
