"""Target 5: display. Building the timeline figure for a 10-million-sample recording takes < 1 s
and the figure carries <= ~5k points per trace; the live view's work for a 1-hour recording at
20 ms takes < 200 ms.

    python benchmarks/display.py [--quick] [--repeats N] [--samples N] [--db PATH]

The recordings are real SQLite files written through ``Store.add_samples`` (``--db`` keeps the
big one for later runs; it is reused when it exists). Figures are built by ``app.charts``.
Measured per repeat, interleaved with the raw baselines:
- ``load``: ``charts.load(store)`` (``Store.samples_for_display``: the overview for a wide window,
  raw rows for a short one -> frames); raw: ``sqlite3`` fetch of every (t, series_id, value)
  into numpy, no join, no frame (what a reader without the overview has to move);
- ``verification``: ``recording.verification`` (``verify(store)``, each event's window read
  as a few rows per event and series; the timeline labels bands with its verdicts), timed apart
  and cached before the figure;
- ``figure``: ``charts.timeline(recording)`` from frames already loaded (split, window,
  MinMaxLTTB, Plotly, event bands); raw: ``tsdownsample`` MinMaxLTTB (5000 points) of each series + one
  ``go.Scatter`` per series in ``make_subplots`` rows, from arrays already split;
- ``end to end``: ``charts.timeline(store)``;
- ``live``: what the live page's fragments (app/views/live.py) compute each refresh, without
  Streamlit (so the Streamlit rerun and browser draw are not in it): ``accounting_summary`` of
  the store (the tiles), then ``load`` of the shown window ("last 2 min") + its verification +
  ``timeline``/``gap`` + ``release_latency`` + ``fig.to_json()`` of the three figures (what
  st.plotly_chart sends), per step.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import bench_args, fmt_bytes, fmt_s, median, print_table, scratch_dir

from collectors.model import DeviceInfo, Event, Sample
from collectors.store import Store

GIB = 2**30
HOUR = 3600.0
T0 = 1.75e9
MAX_POINTS = 5000


def _write_series(store: Store, keys: list[tuple[str, str, str, int | None]], ticks: int, dt: float,
                  seed: int, block: int = 20_000) -> None:
    """Every key gets a row per tick (a random walk in 2 MiB steps), in time order."""
    rng = np.random.default_rng(seed)
    level = rng.integers(8, 40, size=len(keys)).astype(np.int64) * GIB
    for b in range(0, ticks, block):
        n = min(block, ticks - b)
        steps = rng.integers(-64, 65, size=(n, len(keys))) * 2**21
        vals = np.clip(level + np.cumsum(steps, axis=0), GIB, 80 * GIB)
        level = vals[-1]
        ts = (T0 + (b + np.arange(n)) * dt).tolist()
        rows = vals.tolist()
        store.add_samples([Sample(t, d, s, m, v, p) for t, row in zip(ts, rows, strict=True)
                           for (d, s, m, p), v in zip(keys, row, strict=True)])


def _write_heartbeat(store: Store, keys: list[tuple[str, str, str, int | None]], value: int,
                     span: float) -> None:
    store.add_samples([Sample(T0 + k, d, s, m, value, p) for k in range(int(span) + 1)
                       for (d, s, m, p) in keys])


def _write_events(store: Store, span: float, target: str, nbytes: int) -> None:
    for i, t in enumerate(np.arange(15.0, span, 30.0)):
        action = "pause" if i % 2 == 0 else "resume"
        store.add_event(Event(T0 + t, T0 + t + 0.01, action, ["kv_cache"], target, origin="bench",
                              expected_bytes=nbytes))


def make_big(path: Path, samples: int) -> None:
    """8 GPUs over one hour: nvml used/reserved and torch allocated/reserved per device at a
    common tick (every row a change), nvml total every second, a pause/resume every 30 s."""
    devs = [f"cuda:{i}" for i in range(8)]
    keys = [(d, s, m, None) for d in devs for s, m in (("nvml", "used_bytes"), ("nvml", "reserved_bytes"),
                                                       ("torch", "allocated_bytes"),
                                                       ("torch", "reserved_bytes"))]
    ticks = max(1, (samples - 8 * int(HOUR)) // len(keys))
    with Store(path) as store:
        store.set_meta(heartbeat_s=1.0, sources=["nvml", "torch"], intervals={"nvml": 0.001}, pid=1)
        store.add_devices([DeviceInfo(d, "nvml", "stand-in GPU (synthetic recording)", None, 80 * GIB,
                                      details={"used_semantics": "v2"}) for d in devs])
        _write_series(store, keys, ticks, HOUR / ticks, seed=1)
        _write_heartbeat(store, [(d, "nvml", "total_bytes", None) for d in devs], 80 * GIB, HOUR)
        _write_events(store, HOUR, "tms:cuda:0", 4 * GIB)


def make_live(path: Path, span: float) -> None:
    """A live view's recording: host source at 20 ms for ``span`` s (system used changes every
    tick, this process's RSS too), saver accounting and totals every second."""
    pid = os.getpid()
    with Store(path) as store:
        store.set_meta(heartbeat_s=1.0, sources=["host", "saver"], intervals={"host": 0.02}, pid=pid)
        store.add_devices([DeviceInfo("host", "host", "host memory", None, 64 * GIB,
                                      details={"pids": [pid]})])
        _write_series(store, [("host", "host", "used_bytes", None),
                              ("host", "host", "process_used_bytes", pid)], int(span / 0.02), 0.02, seed=2)
        _write_heartbeat(store, [("host", "host", "total_bytes", None)], 64 * GIB, span)
        _write_heartbeat(store, [("host", "saver", "allocated_bytes", None)], 4 * GIB, span)
        _write_events(store, span, "host-saver", 2 * GIB)


def raw_load(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    rows = db.execute("SELECT t, series_id, value FROM samples ORDER BY t").fetchall()
    db.close()
    arr = np.array(rows, dtype=np.float64)
    sid = arr[:, 1].astype(np.int64)
    order = np.argsort(sid, kind="stable")
    bounds = np.flatnonzero(np.diff(sid[order])) + 1
    return {int(sid[g[0]]): (arr[g, 0], arr[g, 2]) for g in np.split(order, bounds)}


def sql_buckets(path: Path, buckets: int = 2500) -> int:
    """Option A to close a load gap: min/max per (series, time bucket) computed inside SQLite, so
    only ~buckets x 2 rows per series reach Python."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    t0, t1 = db.execute("SELECT min(t), max(t) FROM samples").fetchone()
    k = buckets / max(t1 - t0, 1e-9)
    rows = db.execute("SELECT series_id, CAST((t - ?) * ? AS INTEGER) AS b, min(t), max(t), min(value), "
                      "max(value) FROM samples GROUP BY series_id, b", (t0, k)).fetchall()
    db.close()
    return len(rows)


def columnar_read(path: Path) -> int:
    """Option B: a columnar copy (Parquet) of (t, series_id, value), read back with pyarrow."""
    import pyarrow.parquet as pq

    return pq.read_table(path).num_rows


def raw_figure(series: dict[int, tuple[np.ndarray, np.ndarray]], rows: int) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from tsdownsample import MinMaxLTTBDownsampler

    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True)
    ds = MinMaxLTTBDownsampler()
    for i, (t, v) in enumerate(series.values()):
        if len(t) > MAX_POINTS:
            idx = ds.downsample(t, v, n_out=MAX_POINTS)
            t, v = t[idx], v[idx]
        fig.add_trace(go.Scatter(x=t * 1000, y=v / GIB, mode="lines", line={"shape": "hv"}),
                      row=1 + i % rows, col=1)
    return fig


def _write_parquet(series: dict[int, tuple[np.ndarray, np.ndarray]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sid = np.concatenate([np.full(len(t), k, dtype=np.int32) for k, (t, _) in series.items()])
    pq.write_table(pa.table({"t": np.concatenate([t for t, _ in series.values()]), "series_id": sid,
                             "value": np.concatenate([v for _, v in series.values()])}), path)


def points_per_trace(fig: Any) -> list[int]:
    return [len(tr.x) for tr in fig.data if tr.x is not None and getattr(tr, "mode", "") == "lines"]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def live_work(store: Store, window_s: float) -> dict[str, float]:
    """The data work of the live page's two fragments each refresh (app/views/live.py:
    ``live_numbers`` and ``live_charts``), no Streamlit; seconds per step."""
    from app import charts

    out: dict[str, float] = {}
    # live_numbers: the tiles, from the whole recording at display resolution
    out["accounting_summary"], _ = timed(lambda: charts.accounting_summary(store))
    # live_charts: the shown window only (the recording is synthetic: "now" is its last row)
    end = float(store.series()["t_max"].max())
    start = end - window_s
    out["load"], rec = timed(lambda: charts.load(store, start=start))
    out["verification"], _ = timed(lambda: rec.verification)  # cached on rec for the charts
    out["timeline"], f1 = timed(lambda: charts.timeline(rec, start=start))
    out["gap"], f2 = timed(lambda: charts.gap(rec, start=start))
    out["release_latency"], f3 = timed(lambda: charts.release_latency(rec))
    out["to_json"], n = timed(lambda: sum(len(f.to_json()) for f in (f1, f2, f3)))
    out["json_bytes"] = n
    return out


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--samples", type=int, default=None, help="rows in the big recording (10M)")
        p.add_argument("--db", type=Path, default=None, help="keep/reuse the big recording here")
    args = bench_args("timeline figure for a 10M-sample recording; live view work", repeats=3,
                      quick_repeats=1, extra=extra)
    from app import charts

    n = args.samples or (300_000 if args.quick else 10_000_000)
    live_span = 120.0 if args.quick else HOUR
    with scratch_dir("display") as d:
        big = args.db or Path(d) / f"big-{n}.sqlite"
        if big.exists():
            with Store.open(big) as store:
                stale = not store.has_overview()
            if stale:  # written before Store kept an overview: not what the product writes now
                print(f"# {big} has no overview table (an older write path): writing it again")
                for f in big.parent.glob(big.name + "*"):
                    f.unlink()
        if not big.exists():
            t_make, _ = timed(lambda: make_big(big, n))
            print(f"# wrote {big} in {t_make:.1f} s")
        live = Path(d) / "live.sqlite"
        make_live(live, live_span)
        with Store.open(big) as store:
            rows_big = store.sample_count()
        print(f"# big recording: {rows_big:,} samples, {fmt_bytes(big.stat().st_size)}; "
              f"live recording: {live_span / 60:g} min at 20 ms")
        res: dict[str, list[float]] = {k: [] for k in ("load", "raw_load", "verify", "fig", "raw_fig",
                                                         "e2e", "live")}
        pts: list[int] = []
        raw_pts: list[int] = []
        json_bytes = 0
        live_steps: dict[str, list[float]] = {}
        for r in range(args.repeats):
            with Store.open(big) as store:
                product_first = r % 2 == 0
                for what in (("product", "raw") if product_first else ("raw", "product")):
                    if what == "product":
                        t, rec = timed(lambda store=store: charts.load(store))
                        res["load"].append(t)
                        t, _ = timed(lambda rec=rec: rec.verification)  # verify(store), cached on rec
                        res["verify"].append(t)
                        t, fig = timed(lambda rec=rec: charts.timeline(rec, max_points=MAX_POINTS))
                        res["fig"].append(t)
                        pts = points_per_trace(fig)
                        del rec, fig
                        t, fig = timed(lambda store=store: charts.timeline(store, max_points=MAX_POINTS))
                        res["e2e"].append(t)
                        del fig
                    else:
                        t, series = timed(lambda: raw_load(big))
                        res["raw_load"].append(t)
                        t, fig = timed(lambda series=series: raw_figure(series, 8))
                        res["raw_fig"].append(t)
                        raw_pts = points_per_trace(fig)
                        del series, fig
            with Store.open(live) as store:
                steps = live_work(store, 120.0)
            json_bytes = int(steps.pop("json_bytes"))
            res["live"].append(sum(steps.values()))
            for k, v in steps.items():
                live_steps.setdefault(k, []).append(v)
        # What would close a load gap (not the product): measured once on the same file.
        t_sql, n_sql = timed(lambda: sql_buckets(big))
        pq_path = Path(d) / "samples.parquet"
        series = raw_load(big)
        _write_parquet(series, pq_path)
        del series
        t_pq, _ = timed(lambda: columnar_read(pq_path))
        m = {k: median(v) for k, v in res.items()}
        rows = [
            ["load (SQL -> frames)", fmt_s(m["load"]), fmt_s(m["raw_load"]),
             f"{m['load'] / m['raw_load']:.2f}x", "-"],
            ["verification (a few rows per event and series)", fmt_s(m["verify"]), "-", "-", "-"],
            ["timeline figure from frames", fmt_s(m["fig"]), fmt_s(m["raw_fig"]),
             f"{m['fig'] / m['raw_fig']:.2f}x",
             f"max {max(pts, default=0)}, {len(pts)} traces (raw: max {max(raw_pts, default=0)})"],
            ["timeline(store) end to end", fmt_s(m["e2e"]), fmt_s(m["raw_load"] + m["raw_fig"]),
             f"{m['e2e'] / (m['raw_load'] + m['raw_fig']):.2f}x", "-"],
        ]
        print_table(f"timeline of a {rows_big:,}-sample recording (target < 1 s, <= ~5k points/trace)",
                    ["step", "product (median)", "raw baseline", "ratio", "points per trace"], rows)
        print_table("options to close a load gap (not the product; one run each)",
                    ["read", "time", "rows to Python"],
                    [["SQLite min/max per series per bucket (2,500 buckets)", fmt_s(t_sql), f"{n_sql:,}"],
                     ["Parquet copy of (t, series_id, value), pyarrow read", fmt_s(t_pq), f"{rows_big:,}"]])
        print_table(f"live view work for a {live_span / 60:g}-min recording at 20 ms (target < 200 ms)",
                    ["step", "product (median)"],
                    [*[[k, fmt_s(median(v))] for k, v in live_steps.items()],
                     ["total (figure JSON " + fmt_bytes(json_bytes) + ")", fmt_s(m["live"])]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
