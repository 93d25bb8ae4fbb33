"""Target 1: sampling cost. Recorder CPU per sample vs a bare loop calling the same source, and a
sustained 1 kHz on 8 devices' worth of sources with missed ticks and recorder CPU per second.

    python benchmarks/sampling_cost.py [--quick] [--repeats N] [--duration S]

Baselines, measured in the same run and interleaved with the recorder runs:
- raw tight: a thread calling ``source.read()`` back to back (the cost of the read alone);
- raw paced: a thread calling ``source.read()`` on the same fixed-rate schedule as the recorder
  (read + sleep/wake-up, the least any sampler at that rate can cost).
Recorder cost = CPU time of its threads (source thread + writer, from schedstat) / ticks, with a
real SQLite file, change-only storage and the default 1 s heartbeat. Target: <= 1.5x the raw
loop at the same rate (raw paced); the ratio to raw tight is printed too: the gap between the two
raw loops is the sleep/wake-up cost every fixed-rate sampler pays (large in a VM).

Sources: ``host`` = HostSource following this process (psutil: 3 samples a read). For 8 devices
there is no GPU here: ``standin x8`` is one source thread reading 8 devices per tick the way
NvmlSource does (one kernel read + 3 samples per device; see _common.StandInDevicesSource), and
``8 x host`` is 8 real HostSource instances, one thread each (the worst case: a thread per device).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    StandInDevicesSource,
    bench_args,
    fmt_s,
    median,
    print_table,
    recorder_threads_cpu_s,
    run_in_thread,
    scratch_dir,
)

from collectors.recorder import Recorder
from collectors.sources.base import Source
from collectors.sources.host import HostSource
from collectors.store import Store

WARMUP_S = 0.3


def host_source() -> Source:
    src = HostSource(pids=[os.getpid()])
    src.discovery  # noqa: B018 - discover once, outside the timed part
    return src


def host_sources_x8() -> list[Source]:
    """8 real HostSources with distinct names (the Recorder keys stats and intervals by name)."""
    out: list[Source] = []
    for i in range(8):
        cls = type(f"HostSource{i}", (HostSource,), {"name": f"host{i}"})
        src = cls(pids=[os.getpid()])
        src.discovery  # noqa: B018
        out.append(src)
    return out


def standin_x8() -> Source:
    src = StandInDevicesSource(8)
    src.discovery  # noqa: B018
    return src


def raw_tight(src: Source, reads: int) -> dict[str, float]:
    """CPU per read of a back-to-back loop on its own thread."""
    def loop() -> dict[str, float]:
        c0, n = time.thread_time(), 0
        for _ in range(reads):
            n += len(src.read())
        cpu = time.thread_time() - c0
        return {"cpu_per_tick": cpu / reads, "samples_per_tick": n / reads}
    return run_in_thread(loop)


def raw_paced(src: Source, interval: float, duration: float) -> dict[str, float]:
    """CPU per tick of a fixed-rate loop (deadline sleep) on its own thread, plus missed ticks."""
    def loop() -> dict[str, float]:
        c0, start, k, ticks, missed = time.thread_time(), time.monotonic(), 0, 0, 0
        end = start + duration
        while True:
            src.read()
            ticks += 1
            k += 1
            nxt = start + k * interval
            t = time.monotonic()
            if t >= end:
                break
            if t > nxt:
                behind = int((t - nxt) // interval)
                missed += behind
                k += behind
                nxt = start + k * interval
            time.sleep(max(0.0, nxt - time.monotonic()))
        cpu = time.thread_time() - c0
        return {"cpu_per_tick": cpu / ticks, "missed_pct": 100 * missed / (ticks + missed)}
    return run_in_thread(loop)


def _snapshot(rec: Recorder) -> dict[str, Any]:
    cpu = recorder_threads_cpu_s()
    st = rec.stats.values()
    return {
        "t": time.monotonic(), "cpu": sum(cpu.values()), "writer": cpu.get("memsaver-writer", 0.0),
        "ticks": sum(s.ticks for s in st), "missed": sum(s.missed_ticks for s in st),
        "read": sum(s.samples_read for s in st), "stored": sum(s.samples_stored for s in st),
        "lat": [s.latencies[-1] for s in st if s.latencies],
    }


def recorder_run(sources: list[Source], interval: float, duration: float, db: Path) -> dict[str, float]:
    """Run a real Recorder on a real SQLite file; measure a window after a warm-up."""
    with Store(db) as store:
        rec = Recorder(store, sources, intervals={s.name: interval for s in sources})
        with rec:
            time.sleep(WARMUP_S)
            a = _snapshot(rec)
            time.sleep(duration)
            b = _snapshot(rec)
            lat = median(median(s.latencies) for s in rec.stats.values())
        ticks = b["ticks"] - a["ticks"]
        wall = b["t"] - a["t"]
        return {
            "cpu_per_tick": (b["cpu"] - a["cpu"]) / max(1, ticks),
            "cpu_per_s": (b["cpu"] - a["cpu"]) / wall,
            "writer_share": (b["writer"] - a["writer"]) / max(1e-12, b["cpu"] - a["cpu"]),
            "missed_pct": 100 * (b["missed"] - a["missed"]) / max(1, ticks + b["missed"] - a["missed"]),
            "ticks_per_s": ticks / wall,
            "samples_per_tick": (b["read"] - a["read"]) / max(1, ticks),
            "stored_pct": 100 * (b["stored"] - a["stored"]) / max(1, b["read"] - a["read"]),
            "read_latency": lat,
        }


def measure(label: str, make: Callable[[], Any], interval: float, duration: float, repeats: int,
            tmp: Path) -> list[Any]:
    """Interleave raw tight, raw paced and recorder runs; return one table row of medians."""
    runs: dict[str, list[dict[str, float]]] = {"tight": [], "paced": [], "rec": []}
    for r in range(repeats):
        ticks = max(50, int(duration / interval))
        order = ["tight", "paced", "rec"] if r % 2 == 0 else ["rec", "paced", "tight"]
        for what in order:
            # Fresh sources per run: the Recorder closes its sources when it stops.
            made = make()
            srcs = made if isinstance(made, list) else [made]
            if what == "tight":  # baselines read the first source (all are alike)
                runs["tight"].append(raw_tight(srcs[0], ticks))
            elif what == "paced":
                runs["paced"].append(raw_paced(srcs[0], interval, duration))
            else:
                runs["rec"].append(recorder_run(srcs, interval, duration, tmp / f"{label}-{r}.db"))
            for s in srcs:
                s.close()
    def m(kind: str, key: str) -> float:
        return median(x[key] for x in runs[kind])
    rec_tick = m("rec", "cpu_per_tick")  # for '8 x host': CPU and ticks summed over 8 threads
    tight, paced = m("tight", "cpu_per_tick"), m("paced", "cpu_per_tick")
    spt = m("rec", "samples_per_tick")
    return [
        label, f"{interval * 1e3:g} ms", f"{spt:.0f}",
        fmt_s(tight), fmt_s(paced), fmt_s(rec_tick), fmt_s(rec_tick / spt),
        f"{rec_tick / paced:.2f}x", f"{rec_tick / tight:.2f}x", f"{m('rec', 'ticks_per_s'):.0f}",
        f"{m('rec', 'missed_pct'):.2f}%", f"{m('paced', 'missed_pct'):.2f}%",
        f"{m('rec', 'cpu_per_s') * 1e3:.0f} ms/s", f"{100 * m('rec', 'writer_share'):.0f}%",
        f"{m('rec', 'stored_pct'):.1f}%",
    ]


HEADERS = ["source", "interval", "samples/tick", "raw tight cpu/tick", "raw paced cpu/tick",
           "recorder cpu/tick", "recorder cpu/sample", "ratio vs paced", "ratio vs tight",
           "ticks/s", "missed (rec)", "missed (raw paced)", "recorder cpu per s", "writer share",
           "stored"]


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--duration", type=float, default=None, help="seconds per measured run")
    args = bench_args("recorder cost per sample vs a raw read loop; sustained 1 kHz",
                      repeats=5, quick_repeats=1, extra=extra)
    duration = args.duration or (0.5 if args.quick else 3.0)
    print(f"# duration per run: {duration:g} s after a {WARMUP_S:g} s warm-up; "
          "medians over repeats; ratio = recorder cpu/tick / raw cpu/tick")
    with scratch_dir("sampling") as d:
        tmp = Path(d)
        rows = [measure("host", host_source, iv, duration, args.repeats, tmp) for iv in (0.02, 0.001)]
        print_table("cost per sample: recorder vs raw loop of the same source (target <= 1.5x raw paced)",
                    HEADERS, rows)
        rows = [measure("standin x8", standin_x8, 0.001, duration, args.repeats, tmp),
                measure("8 x host", host_sources_x8, 0.001, duration, args.repeats, tmp)]
        print_table("sustained 1 kHz on 8 devices' worth of sources (target < 1% missed ticks)",
                    HEADERS, rows)
    print("\nnotes: 'recorder cpu per s' = CPU seconds of all recorder threads per second of recording;"
          " for '8 x host' ticks, misses and cpu/tick are summed over the 8 source threads and the"
          " baselines are one HostSource.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
