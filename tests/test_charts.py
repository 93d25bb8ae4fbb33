"""app/charts.py on real recordings (host saver + psutil through the Recorder) and on synthetic
multi-device stores (the shape of a CUDA/XPU recording, which cannot run here)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from app import charts
from collectors.controls.host_saver import HostSaver
from collectors.model import DeviceInfo, Event, Sample
from collectors.recorder import Recorder
from collectors.scenario import run_scenario
from collectors.sources.host import HostSource
from collectors.store import Store, StoreError

MiB, GiB = 2**20, 2**30
WEIGHTS, KV = 32 * MiB, 64 * MiB


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real recording: the host scenario (HostSaver + HostSource RSS + saver accounting)."""
    out = tmp_path_factory.mktemp("charts")
    return run_scenario(device="host", weights=WEIGHTS, kv_cache=KV, out_dir=out, settle_s=0.6, narrate=None)


def _events(path: Path):
    with Store.open(path) as s:
        return s.events()


def _trace(fig: go.Figure, prefix: str) -> go.Scatter:
    found = [t for t in fig.data if (t.name or "").startswith(prefix)]
    assert found, f"no trace named {prefix!r}: {[t.name for t in fig.data]}"
    return found[0]


def test_load_accepts_path_store_recorder_and_recording(demo: Path) -> None:
    rec = charts.load(demo)
    assert len(rec.samples) > 0 and len(rec.events) == 5
    assert str(rec.samples["device"].dtype) == "category"
    assert charts.load(rec) is rec
    with Store.open(demo) as store:
        assert len(charts.load(store).samples) == len(rec.samples)
    with pytest.raises(StoreError):
        charts.load(demo.with_name("missing.sqlite"))
    with pytest.raises(TypeError):
        charts.load(42)  # type: ignore[arg-type]


def test_timeline_shows_the_release_in_physical_but_not_in_accounting(demo: Path) -> None:
    fig = charts.timeline(demo)
    pid = charts.load(demo).meta["pid"]
    phys = _trace(fig, f"physical: RSS of pid {pid}")
    acc = _trace(fig, "saver allocated")
    assert phys.line.shape == "hv" and acc.line.shape == "hv"
    assert fig.layout.yaxis.title.text == "MiB"
    ev = _events(demo)
    pause_kv, pause_w, resume = (ev[ev.action == "pause"].iloc[0], ev[ev.action == "pause"].iloc[1],
                                 ev[ev.action == "resume"].iloc[0])
    # a window while both tags are released: physical is down by both, accounting is not
    both_paused = charts.timeline(demo, start=pause_w.t_end + 0.2, end=resume.t_start - 0.01)
    before = charts.timeline(demo, start=pause_kv.t_start - 0.3, end=pause_kv.t_start - 0.01)
    p_hi = np.nanmin(_trace(before, "physical").y)
    p_lo = np.nanmax(_trace(both_paused, "physical").y)
    assert p_hi - p_lo >= 0.9 * (WEIGHTS + KV) / MiB
    a_lo = _trace(both_paused, "saver allocated").y
    assert np.allclose(a_lo, (WEIGHTS + KV) / MiB)  # the accounting stays flat
    # the window starts where it was asked to (the value in effect then is carried in)
    x0 = _trace(both_paused, "physical").x[0]
    offset = time.localtime(pause_w.t_end).tm_gmtoff
    assert x0 == pytest.approx((pause_w.t_end + 0.2 + offset) * 1000, abs=1)


def test_timeline_event_bands_carry_tags_duration_and_verdict(demo: Path) -> None:
    fig = charts.timeline(demo)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == 5
    texts = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("pause kv_cache · ") and t.endswith(" · ok") for t in texts), texts
    assert any(t.startswith("resume weights, kv_cache · ") and t.endswith(" · ok") for t in texts), texts
    assert any(t.startswith("allocate weights · ") for t in texts)
    markers = _trace(fig, "events")
    assert len(markers.x) == 5 and "pause weights" in " ".join(markers.text)


def test_gap_rises_by_what_a_pause_releases(demo: Path) -> None:
    fig = charts.gap(demo)
    (trace,) = [t for t in fig.data]
    assert trace.name.startswith("host: saver allocated − physical: RSS")
    assert np.nanmax(trace.y) == pytest.approx((WEIGHTS + KV) / MiB, rel=0.15)
    assert abs(trace.y[-1]) < 0.15 * (WEIGHTS + KV) / MiB  # back after the resume


def test_accounting_summary(demo: Path) -> None:
    df = charts.accounting_summary(demo)
    assert list(df.columns) == ["device", "name", "physical_bytes", "physical_source", "accounting_bytes",
                                "accounting_source", "released_bytes", "explanation"]
    (row,) = df.itertuples(index=False)
    assert row.device == "host" and "RSS of pid" in row.physical_source
    assert row.accounting_bytes == WEIGHTS + KV and row.accounting_source.startswith("saver allocated")
    assert abs(row.released_bytes) < 0.15 * (WEIGHTS + KV)
    assert "madvise" in row.explanation
    ev = _events(demo)
    resume = ev[ev.action == "resume"].iloc[0]
    during = charts.accounting_summary(demo, end=resume.t_start - 0.01).iloc[0]
    assert during.released_bytes == pytest.approx(WEIGHTS + KV, rel=0.15)


def test_verification_table_and_latency(demo: Path) -> None:
    fig = charts.verification(demo)
    table = fig.data[0]
    assert isinstance(table, go.Table)
    header = [h.replace("<b>", "").replace("</b>", "") for h in table.header.values]
    cells = dict(zip(header, table.cells.values, strict=True))
    assert list(cells["verdict"]) == ["ok", "ok", "ok"]
    assert list(cells["action"]) == ["pause", "pause", "resume"]
    lat = charts.release_latency(demo)
    assert [t.name for t in lat.data] == ["call duration", "physical change visible after"]
    ev = _events(demo)
    durations = ev[ev.action.isin(["pause", "resume"])]["duration"].to_numpy() * 1e3
    assert np.allclose(lat.data[0].y, durations)
    assert np.all(np.asarray(lat.data[1].y) > 0)


def test_charts_of_a_running_recorder(tmp_path: Path) -> None:
    store = Store(tmp_path / "live.sqlite")
    saver = HostSaver(store)
    rec = Recorder(store, sources=[HostSource(pids=[os.getpid()]), saver.accounting_source()],
                   intervals={"host": 0.02, "saver": 0.02})
    try:
        rec.start()
        saver.allocate("weights", 16 * MiB)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fig = charts.timeline(rec)
            acc = [t for t in fig.data if (t.name or "").startswith("saver allocated")]
            if acc and np.nanmax(acc[0].y) == 16:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the saver's 16 MiB never showed on the live timeline")
        assert charts.accounting_summary(rec).iloc[0].accounting_bytes == 16 * MiB
    finally:
        rec.stop()
        saver.close()
        store.close()


def _synthetic_gpu_store() -> Store:
    """The shape of a CUDA recording: NVML v2 + torch accounting on two GPUs, a read gap, a failed call."""
    s = Store(":memory:")
    s.add_devices([DeviceInfo("cuda:0", "nvml", "NVIDIA H200", "GPU-0", 141 * GiB,
                              details={"memory_info_version": 2, "driver_version": "575.57"}),
                   DeviceInfo("cuda:1", "nvml", "NVIDIA H200", "GPU-1", 141 * GiB,
                              details={"memory_info_version": 2}),
                   DeviceInfo("cuda:0", "torch", "NVIDIA H200", None, 141 * GiB)])
    s.set_meta(heartbeat_s=1.0, pid=1234, host="gpu-box")
    t0 = 1_700_000_000.0
    rows = []
    for i in range(200):
        t = t0 + i * 0.1
        used = 23 * GiB if not (50 <= i < 120) else 1 * GiB  # released 22 GiB between 5 s and 12 s
        rows += [Sample(t, "cuda:0", "nvml", "used_bytes", None if 150 <= i < 160 else used),
                 Sample(t, "cuda:0", "nvml", "total_bytes", 141 * GiB),
                 Sample(t, "cuda:0", "torch", "allocated_bytes", 22 * GiB),
                 Sample(t, "cuda:0", "torch", "reserved_bytes", 22 * GiB + 512 * MiB),
                 Sample(t, "cuda:1", "nvml", "used_bytes", 2 * GiB)]
    s.add_samples(rows)
    s.add_event(Event(t0 + 5.0, t0 + 5.007, "pause", ["weights", "kv_cache"], "tms:cuda:0",
                      expected_bytes=22 * GiB, details={"device": "cuda:0"}))
    s.add_event(Event(t0 + 12.0, t0 + 12.2, "resume", ["weights", "kv_cache"], "tms:cuda:0",
                      expected_bytes=22 * GiB, details={"device": "cuda:0"}))
    s.add_event(Event(t0 + 15.0, t0 + 15.001, "resume", ["cuda_graph"], "tms:cuda:0", ok=False,
                      error="tag 'cuda_graph' was never released", details={"device": "cuda:0"}))
    return s


def test_timeline_of_a_multi_gpu_recording() -> None:
    store = _synthetic_gpu_store()
    fig = charts.timeline(store)
    titles = [a.text for a in fig.layout.annotations if a.text and "—" in a.text]
    assert titles == ["cuda:0 — NVIDIA H200", "cuda:1 — NVIDIA H200"]
    names = [t.name for t in fig.data]
    assert "cuda:0: physical used (NVML v2)" in names
    assert "cuda:0: torch allocated (accounting)" in names and "cuda:1: physical used (NVML v2)" in names
    assert fig.layout.yaxis.title.text == "GiB"
    phys = _trace(fig, "cuda:0: physical used")
    assert np.isnan(phys.y).any()  # the failed reads break the line
    assert np.nanmin(phys.y) == 1.0 and np.nanmax(phys.y) == 23.0
    total = _trace(fig, "cuda:0: device total")
    assert total.visible == "legendonly"  # 141 GiB would flatten 23 GiB
    assert phys.yaxis == "y" and _trace(fig, "cuda:1: physical").yaxis == "y2"
    texts = [a.text for a in fig.layout.annotations]
    assert any("FAILED: tag 'cuda_graph' was never released" in t for t in texts)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == 3  # one band per event, spanning every row
    assert {(s.xref, s.yref, s.y0, s.y1) for s in bands} == {("x", "paper", 0, 1)}
    fig.to_json()  # serialisable: what Jupyter, VS Code and Streamlit render


def test_gap_and_summary_of_a_gpu_recording() -> None:
    store = _synthetic_gpu_store()
    (trace,) = charts.gap(store).data
    assert trace.name == "cuda:0: torch allocated − physical used (NVML v2)"
    assert np.nanmax(trace.y) == pytest.approx(22.0)
    df = charts.accounting_summary(store, end=1_700_000_000.0 + 8.0).set_index("device")
    assert df.loc["cuda:0", "released_bytes"] == 22 * GiB
    assert df.loc["cuda:0", "physical_source"] == "physical used (NVML v2)"
    assert df.loc["cuda:0", "accounting_bytes"] == 22 * GiB
    assert "mem_get_info" in df.loc["cuda:0", "explanation"]
    assert df.loc["cuda:1", "accounting_bytes"] is pd_na() and df.loc["cuda:1", "released_bytes"] is pd_na()


def pd_na():
    import pandas as pd

    return pd.NA


def test_large_recordings_are_downsampled_for_display_only() -> None:
    store = Store(":memory:")
    rng = np.random.default_rng(0)
    n = 60_000
    t = 1_700_000_000.0 + np.arange(n) * 0.01
    vals = (rng.integers(0, 1000, n) * MiB).tolist()
    store.add_samples(Sample(float(a), "cuda:0", "nvml", "used_bytes", int(b))
                      for a, b in zip(t, vals, strict=True))
    fig = charts.timeline(store, max_points=500)
    phys = _trace(fig, "physical used")
    assert 400 <= len(phys.x) <= 520
    assert fig.layout.yaxis.title.text == "MiB"
    assert np.nanmax(phys.y) * MiB == max(vals) and np.nanmin(phys.y) * MiB == min(vals)  # extremes survive
    assert store.sample_count() == n  # storage untouched


def test_empty_recordings_say_so() -> None:
    store = Store(":memory:")
    for fig, words in ((charts.timeline(store), "No samples recorded yet"),
                       (charts.gap(store), "Needs a physical and an accounting series"),
                       (charts.verification(store), "No pause or resume"),
                       (charts.release_latency(store), "No pause or resume")):
        assert isinstance(fig, go.Figure)
        assert any(words in (a.text or "") for a in fig.layout.annotations), words
    assert charts.accounting_summary(store).empty
