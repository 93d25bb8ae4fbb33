"""Target 3: sharpness. The lag between a release call returning and the recorded physical drop
is at most one sampling interval plus the source's read latency (host saver here; TMS + NVML on
the GPU machine with gpu_sharpness.py, which reuses this module).

    python benchmarks/sharpness.py [--quick] [--repeats N] [--cycles N] [--interval S] [--size MiB]

In this process: a HostSaver holds one tag (real anonymous mmap; pause = madvise(MADV_DONTNEED)),
a real Recorder at 20 ms follows this process's RSS with HostSource and writes to a real SQLite
file. Each cycle waits a random part of an interval (so calls land at any phase of the tick),
pauses, waits until the drop is seen, resumes, waits until the rise is seen.
lag = t of the first recorded sample showing >= half the expected change - the call's t_end
(a sample's t is stamped as its read starts).

Baselines in the same run (phases interleaved with the recorder's):
- raw read: one read of the same source right after the call returns; its lag is the time until
  that read has finished (the kernel's side: the RSS is already down when madvise returns);
- raw sampler: a bare thread reading the same source at the same interval, storing nothing (what
  any sampler at this rate can do; the recorder should add nothing to it).
Also printed: ``collectors.verification.verify``'s lag_s for the recorder phase (the product's
own figure, measured from the call's *start*). The bound is interval + median read latency.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import bench_args, fmt_s, median, print_table, scratch_dir

from collectors.model import Event, now
from collectors.recorder import Recorder
from collectors.sources.base import Source
from collectors.store import Store

MIB = 2**20
TAG = "kv_cache"
SEEN_TIMEOUT_S = 5.0

Key = tuple[str, str, str, Any]
Lags = list[tuple[str, float, float]]  # (action, lag, call duration)


@dataclass
class Setup:
    """What is paused, and the physical series that must show it."""

    control: Any  # a Control holding TAG (HostSaver, TmsWorkload)
    make_source: Callable[[], Source]  # a fresh source reading the physical series
    key: Key  # (device, source, metric, pid) of that series
    label: str  # e.g. "host RSS", "NVML used"


def _pid(x: Any) -> int | None:
    """Sample.pid or a frame's Int64 pid (<NA>) as int | None."""
    try:
        return None if x is None or x != x else int(x)
    except TypeError:  # pandas.NA: its comparisons are NA, not bool
        return None


def values_of(samples: list[Any], key: Key) -> list[tuple[float, float]]:
    """(t, value) of one series from Samples or frame rows, gaps left out."""
    out = []
    for s in samples:
        if (s.device, s.source, s.metric) == key[:3] and _pid(s.pid) == key[3] \
                and s.value is not None and s.value == s.value:
            out.append((float(s.t), float(s.value)))
    return out


def first_showing(series: list[tuple[float, float]], ev: Event) -> float | None:
    """t of the first sample after the call started showing >= half the expected change."""
    before = [v for t, v in series if t < ev.t_start]
    if not before or ev.expected_bytes is None:
        return None
    base, half = before[-1], ev.expected_bytes / 2
    for t, v in series:
        if t >= ev.t_start and ((v <= base - half) if ev.action == "pause" else (v >= base + half)):
            return t
    return None


def wait_until(cond: Callable[[], bool], timeout: float = SEEN_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.001)
    return False


def cycle(setup: Setup, interval: float, seen: Callable[[Event], bool], raw_lags: Lags) -> list[Event]:
    """pause -> seen -> resume -> seen; a direct read right after each call (raw read)."""
    probe = setup.make_source()
    probe.discovery  # noqa: B018
    events = []
    for action in ("pause", "resume"):
        before = values_of(probe.read(), setup.key)
        time.sleep(random.uniform(0, interval))
        ev = setup.control.pause([TAG]) if action == "pause" else setup.control.resume([TAG])
        if not ev.ok:
            raise SystemExit(f"{action} failed: {ev.error}")
        after = values_of(probe.read(), setup.key)
        t_done = now()
        changed = bool(before and after and ev.expected_bytes and
                       abs(after[-1][1] - before[-1][1]) >= ev.expected_bytes / 2)
        raw_lags.append((action, (t_done - ev.t_end) if changed else float("inf"), ev.duration or 0.0))
        events.append(ev)
        wait_until(lambda ev=ev: seen(ev))
    probe.close()
    return events


def _lags(series: list[tuple[float, float]], events: list[Event]) -> Lags:
    out = []
    for ev in events:
        t = first_showing(series, ev)
        out.append((ev.action, float("inf") if t is None else t - ev.t_end,  # type: ignore[operator]
                    ev.duration or 0.0))
    return out


def recorder_phase(setup: Setup, db: Path, interval: float, cycles: int,
                   raw_lags: Lags) -> tuple[Lags, float, list[float]]:
    """Lags of a real Recorder; its median read latency; verify()'s lag_s per event."""
    from collectors.verification import verify

    with Store(db) as store:
        setup.control.store = store
        src = setup.make_source()
        rec = Recorder(store, [src], intervals={src.name: interval})
        events: list[Event] = []
        with rec:
            time.sleep(max(0.1, 3 * interval))

            def seen(ev: Event) -> bool:
                t, v = rec.latest().get(setup.key, (0.0, None))
                return v is not None and t > ev.t_end  # type: ignore[operator]
            for _ in range(cycles):
                events += cycle(setup, interval, seen, raw_lags)
            time.sleep(max(0.1, 3 * interval))
            latency = rec.stats[src.name].latency_percentile(50) or float("nan")
        setup.control.store = None
        df = store.samples(devices=[setup.key[0]], sources=[setup.key[1]], metrics=[setup.key[2]])
        series = values_of(list(df.itertuples(index=False)), setup.key)
        try:
            v = verify(store)
            v = v[(v["source"] == setup.key[1]) & (v["metric"] == setup.key[2])]
            verify_lags = [float(x) for x in v["lag_s"]]
        except Exception as e:  # the benchmark still reports its own figures
            print(f"# verify() failed: {type(e).__name__}: {e}")
            verify_lags = []
    return _lags(series, events), latency, verify_lags


def raw_sampler_phase(setup: Setup, interval: float, cycles: int, raw_lags: Lags) -> Lags:
    src = setup.make_source()
    src.discovery  # noqa: B018
    got: list = []
    stop = threading.Event()

    def loop() -> None:
        start, k = time.monotonic(), 0
        while not stop.is_set():
            got.extend(src.read())
            k += 1
            time.sleep(max(0.0, start + k * interval - time.monotonic()))

    th = threading.Thread(target=loop, name="bench-raw-sampler", daemon=True)
    th.start()
    time.sleep(max(0.1, 3 * interval))

    def seen(ev: Event) -> bool:
        return bool(got) and got[-1].t > ev.t_end  # type: ignore[operator]
    events: list[Event] = []
    for _ in range(cycles):
        events += cycle(setup, interval, seen, raw_lags)
    stop.set()
    th.join()
    src.close()
    return _lags(values_of(got, setup.key), events)


def pct(values: list[float], q: float) -> float:
    vals = sorted(values)
    return vals[min(len(vals) - 1, int(q / 100 * len(vals)))] if vals else float("nan")


def run(setup: Setup, *, interval: float, cycles: int, repeats: int) -> None:
    """Interleave recorder and raw-sampler phases; print the lag table."""
    rec_lags: Lags = []
    raw_sampler_lags: Lags = []
    raw_read_lags: Lags = []
    latencies: list[float] = []
    verify_lags: list[float] = []
    with scratch_dir("sharpness") as d:
        for r in range(repeats):
            for ph in (["rec", "raw"] if r % 2 == 0 else ["raw", "rec"]):
                if ph == "rec":
                    lags, lat, vl = recorder_phase(setup, Path(d) / f"sharp-{r}.db", interval, cycles,
                                                   raw_read_lags)
                    rec_lags += lags
                    latencies.append(lat)
                    verify_lags += vl
                else:
                    raw_sampler_lags += raw_sampler_phase(setup, interval, cycles, raw_read_lags)
    lat = median(latencies)
    bound = interval + lat

    def row(name: str, action: str, lags: Lags) -> list[str]:
        mine = [lag for a, lag, _ in lags if a == action]
        finite = [x for x in mine if x != float("inf")]
        within = sum(1 for x in mine if x <= bound)
        return [name, action, str(len(mine)), fmt_s(median(d for a, _, d in lags if a == action)),
                fmt_s(median(finite)), fmt_s(pct(finite, 90)),
                fmt_s(max(finite) if finite else float("nan")),
                f"{100 * within / max(1, len(mine)):.0f}%", str(len(mine) - len(finite))]
    ms = f"{interval * 1e3:g} ms"
    rows = [row(name, action, lags) for action in ("pause", "resume")
            for name, lags in ((f"recorder {ms}", rec_lags), (f"raw sampler {ms}", raw_sampler_lags),
                               ("raw read after the call", raw_read_lags))]
    print_table(f"lag from the call returning to the recorded change in {setup.label} (bound = "
                f"{fmt_s(interval)} interval + {fmt_s(lat)} read latency = {fmt_s(bound)})",
                ["sampler", "call", "calls", "call duration", "lag median", "lag p90", "lag max",
                 "within bound", "never seen"], rows)
    finite = [x for x in verify_lags if x == x]
    print(f"\nverify() lag_s (from the call's start), recorder phases: median {fmt_s(median(finite))}, "
          f"max {fmt_s(max(finite) if finite else float('nan'))}, {len(verify_lags) - len(finite)} of "
          f"{len(verify_lags)} NaN")
    print("notes: lag < 0 = the change was recorded before the call returned (a sample stamped while"
          " the call ran, e.g. a resume re-committing page by page); 'never seen' = no recorded"
          " sample showed half the expected change.")


def host_setup(size: int) -> Setup:
    from collectors.controls.host_saver import HostSaver
    from collectors.sources.host import HostSource

    saver = HostSaver()
    saver.allocate(TAG, size)
    pid = os.getpid()
    return Setup(saver, lambda: HostSource(pids=[pid]), ("host", "host", "process_used_bytes", pid),
                 "this process's RSS (host saver)")


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cycles", type=int, default=None, help="pause+resume cycles per phase")
        p.add_argument("--interval", type=float, default=0.02, help="sampling interval (s)")
        p.add_argument("--size", type=int, default=None, help="tag size in MiB")
    args = bench_args("lag from a host-saver release returning to the recorded RSS drop",
                      repeats=3, quick_repeats=1, extra=extra)
    cycles = args.cycles or (3 if args.quick else 15)
    size = (args.size or (32 if args.quick else 256)) * MIB
    print(f"# tag {size // MIB} MiB, interval {args.interval * 1e3:g} ms, {cycles} pause+resume "
          "cycles per phase")
    setup = host_setup(size)
    try:
        run(setup, interval=args.interval, cycles=cycles, repeats=args.repeats)
    finally:
        setup.control.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
