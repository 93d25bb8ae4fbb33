"""Target 4: storage. Change-only storage of a 10-minute, 8-device, 1 kHz recording of step-shaped
memory vs storing every tick (>= 20x smaller), and Store.add_samples write throughput
(>= 200k samples/s) vs a raw sqlite3 executemany into the same schema.

    python benchmarks/storage.py [--quick] [--repeats N] [--minutes M] [--step-rates 0.1,1,10,50]

The path is the product's own, minus the threads: samples go through the recorder's real change
filter (``collectors.recorder._ChangeFilter``, default 1 s heartbeat) and the real
``Store.add_samples`` in batches of 200 ticks (what the writer commits every 0.2 s at 1 kHz), into
real SQLite files. A live Recorder is not used because it runs on the wall clock (10 minutes a
row); its per-tick cost is target 1 (sampling_cost.py).

The signal: per device, ``used_bytes`` that holds its value and steps by a random multiple of
2 MiB at random ticks (``--step-rates``: mean steps per second per device), seeded.
File size is measured after the store is closed (WAL checkpointed into the main file).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from _common import bench_args, fmt_bytes, median, print_table, scratch_dir

from collectors.model import Sample
from collectors.recorder import _ChangeFilter
from collectors.store import _SCHEMA, Store

HZ = 1000
DEVICES = 8
BATCH_TICKS = 200  # the recorder writer commits every 0.2 s
HEARTBEAT_S = 1.0
MIB = 2**20
T0 = 1.7e9


def step_signal(ticks: int, steps_per_s: float, seed: int) -> np.ndarray:
    """(ticks, DEVICES) int64 bytes: flat, with steps of k * 2 MiB at random ticks."""
    rng = np.random.default_rng(seed)
    steps = rng.random((ticks, DEVICES)) < steps_per_s / HZ
    deltas = rng.integers(-256, 257, size=(ticks, DEVICES)) * 2 * MIB * steps
    base = (20 * 2**30 + rng.integers(0, 1024, size=DEVICES) * 2 * MIB).astype(np.int64)
    return np.clip(base + np.cumsum(deltas, axis=0), 2**30, 80 * 2**30)


def batches(values: np.ndarray) -> Iterator[list[Sample]]:
    """Samples as the nvml source makes them, grouped like the recorder's writer batches."""
    devs = [f"cuda:{d}" for d in range(DEVICES)]
    for b in range(0, len(values), BATCH_TICKS):
        block = values[b:b + BATCH_TICKS].tolist()
        out = []
        for i, row in enumerate(block):
            t = T0 + (b + i) / HZ
            out.extend(Sample(t, dev, "nvml", "used_bytes", v) for dev, v in zip(devs, row, strict=True))
        yield out


def file_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def write_store(path: Path, values: np.ndarray, change_only: bool) -> dict[str, float]:
    """Real filter + real Store; returns rows, seconds inside add_samples, bytes on disk."""
    flt = _ChangeFilter(HEARTBEAT_S if change_only else 0.0)
    rows, write_s = 0, 0.0
    with Store(path) as store:
        for batch in batches(values):
            kept = [s for s in batch if flt.keep(s)]
            if kept:
                t = time.perf_counter()
                rows += store.add_samples(kept)
                write_s += time.perf_counter() - t
    return {"rows": rows, "write_s": write_s, "bytes": file_size(path)}


def throughput_store(path: Path, values: np.ndarray) -> float:
    """Samples/s of Store.add_samples (every tick kept: full batches)."""
    r = write_store(path, values, change_only=False)
    return r["rows"] / r["write_s"]


def throughput_raw(path: Path, values: np.ndarray) -> float:
    """Samples/s of a bare sqlite3 executemany of (t, series_id, value) into the same schema,
    same pragmas, one transaction per batch: the floor under Store.add_samples."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(_SCHEMA)
    db.execute("PRAGMA synchronous = NORMAL")
    rows, write_s = 0, 0.0
    for batch in batches(values):
        tuples = [(s.t, int(s.device[5:]) + 1, s.value) for s in batch]  # series ids, precomputed
        t = time.perf_counter()
        with db:
            db.executemany("INSERT INTO samples(t, series_id, value) VALUES (?, ?, ?)", tuples)
        write_s += time.perf_counter() - t
        rows += len(tuples)
    db.close()
    return rows / write_s


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--minutes", type=float, default=None, help="recording length (default 10)")
        p.add_argument("--step-rates", default="0.1,1,10,50",
                       help="steps per second per device, comma-separated (default 0.1,1,10,50)")
    args = bench_args("change-only storage size and Store write throughput", repeats=3,
                      quick_repeats=1, extra=extra)
    minutes = args.minutes or (0.5 if args.quick else 10.0)
    rates = [float(x) for x in args.step_rates.split(",")]
    ticks = int(minutes * 60 * HZ)
    print(f"# signal: {minutes:g} min x {HZ} Hz x {DEVICES} devices = {ticks * DEVICES:,} samples read; "
          f"heartbeat {HEARTBEAT_S:g} s; batches of {BATCH_TICKS} ticks")
    with scratch_dir("storage") as d:
        tmp = Path(d)
        full = write_store(tmp / "every_tick.db", step_signal(ticks, rates[0], 0), change_only=False)
        rows = [["every tick", "-", f"{full['rows']:,}", fmt_bytes(full["bytes"]), "1.0x", "1.0x",
                 f"{full['rows'] / full['write_s']:,.0f}"]]
        for i, rate in enumerate(rates):
            r = write_store(tmp / f"change_only_{i}.db", step_signal(ticks, rate, i), change_only=True)
            rows.append(["change-only", f"{rate:g}/s", f"{r['rows']:,}", fmt_bytes(r["bytes"]),
                         f"{full['rows'] / r['rows']:.0f}x", f"{full['bytes'] / r['bytes']:.0f}x",
                         f"{r['rows'] / r['write_s']:,.0f}"])
            os.remove(tmp / f"change_only_{i}.db")
        os.remove(tmp / "every_tick.db")
        print_table(f"storage of {minutes:g} min, {DEVICES} devices, 1 kHz (target >= 20x smaller)",
                    ["storage", "steps/device", "rows", "file size", "rows ratio", "size ratio",
                     "add_samples samples/s"], rows)

        # Throughput: interleaved Store vs raw, fresh files, every tick kept (full batches).
        tp_ticks = min(ticks, 20_000 if args.quick else 125_000)  # 1M samples a run
        values = step_signal(tp_ticks, rates[0], 99)
        store_tp, raw_tp = [], []
        for r in range(args.repeats):
            for what in (("store", "raw") if r % 2 == 0 else ("raw", "store")):
                p = tmp / f"tp-{what}-{r}.db"
                (store_tp if what == "store" else raw_tp).append(
                    (throughput_store if what == "store" else throughput_raw)(p, values))
                for f in tmp.glob(p.name + "*"):
                    f.unlink()
        s, w = median(store_tp), median(raw_tp)
        print_table("write throughput, batches of 1,600 samples (target >= 200k samples/s)",
                    ["writer", "samples/run", "samples/s (median)", "ratio to raw"],
                    [["Store.add_samples", f"{tp_ticks * DEVICES:,}", f"{s:,.0f}", f"{s / w:.2f}x"],
                     ["raw sqlite3 executemany", f"{tp_ticks * DEVICES:,}", f"{w:,.0f}", "1.00x"]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
