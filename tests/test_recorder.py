"""Recorder with real sources, a real child process and real SQLite files."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from collectors import Recorder, Sample, Store
from collectors.model import Discovery, now
from collectors.sources import Source
from collectors.sources.host import HostSource
from tests.helpers.proc import wait_for

MiB = 2**20


def _rss_series(store: Store, pid: int) -> pd.DataFrame:
    df = store.samples(metrics=["process_used_bytes"])
    return df[df["pid"] == pid]


def test_records_rss_steps_of_a_child_that_allocates_and_frees(tmp_path, allocator_child):
    store = Store(tmp_path / "rss.db")
    rec = Recorder(store, [HostSource(pids=[allocator_child.pid])], intervals={"host": 0.02})
    with rec:
        base = allocator_child.send("alloc 0")
        time.sleep(0.3)
        t_alloc = now()
        high = allocator_child.send(f"alloc {256 * MiB}")
        wait_for(lambda: (rec.latest().get(("host", "host", "process_used_bytes", allocator_child.pid),
                                           (0, 0))[1] or 0) > base + 200 * MiB)
        time.sleep(0.3)
        t_free = now()
        allocator_child.send("free")
        wait_for(lambda: (rec.latest()[("host", "host", "process_used_bytes", allocator_child.pid)][1]
                          < base + 50 * MiB))
        time.sleep(0.3)
    s = _rss_series(store, allocator_child.pid)
    before = s[s.t < t_alloc]["value"]
    during = s[(s.t > t_alloc) & (s.t < t_free)]["value"]
    after = s[s.t > t_free]["value"]
    assert high - base >= 250 * MiB
    assert during.max() - before.min() >= 250 * MiB  # the step up was recorded
    assert during.max() - after.iloc[-1] >= 250 * MiB  # and the step down
    # change-only: far fewer rows than ticks, but every tick was read
    st = rec.stats_dict()["host"]
    assert st["ticks"] > len(s) and st["samples_stored"] < st["samples_read"]
    assert store.meta()["storage"] == "change_only"


def test_heartbeat_stores_unchanged_values(tmp_path):
    class Constant(Source):
        name = "host"

        def discover(self) -> Discovery:
            return Discovery("host", True, [])

        def read(self) -> list[Sample]:
            return [Sample(now(), "host", "host", "used_bytes", 7)]

    store = Store(tmp_path / "hb.db")
    with Recorder(store, [Constant()], intervals={"host": 0.01}, heartbeat=0.1) as rec:
        wait_for(lambda: rec.stats["host"].ticks >= 100)
    rows = store.samples()
    ticks = rec.stats["host"].ticks
    # one row at least every heartbeat, far fewer than ticks; values intact
    assert 2 <= len(rows) < ticks / 3
    assert set(rows["value"]) == {7}
    assert rows["t"].diff().max() < 0.1 + 0.5  # heartbeat (plus scheduling slack on a busy host)


def test_failing_source_records_gaps_and_keeps_others_going(tmp_path):
    class Flaky(Source):
        name = "nvml"

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def discover(self) -> Discovery:
            return Discovery("nvml", True, [])

        def read(self) -> list[Sample]:
            self.calls += 1
            if 5 <= self.calls < 15:
                raise RuntimeError("GPU is lost")
            return [Sample(now(), "cuda:0", "nvml", "used_bytes", 1000 + (self.calls >= 15))]

    store = Store(tmp_path / "flaky.db")
    flaky = Flaky()
    with Recorder(store, [flaky, HostSource()], intervals={"nvml": 0.01, "host": 0.01}) as rec:
        wait_for(lambda: flaky.calls >= 25)
    vals = store.samples(sources=["nvml"])["value"]
    assert vals.isna().any()  # the failure is a recorded gap, not a 0
    assert (vals.dropna() == 1001).any()  # and recording resumed after it
    assert 0 not in set(vals.dropna())
    assert rec.stats["nvml"].errors == 10
    assert "GPU is lost" in " ".join(store.diagnostics()["message"])
    assert rec.stats["host"].errors == 0 and rec.stats["host"].ticks > 10


def test_pid_exit_is_a_gap_and_a_diagnostic(tmp_path, allocator_child):
    store = Store(tmp_path / "exit.db")
    with Recorder(store, [HostSource(pids=[allocator_child.pid])], intervals={"host": 0.02}) as rec:
        wait_for(lambda: rec.stats["host"].ticks > 3)
        allocator_child.exit()
        wait_for(lambda: len(store.diagnostics()) > 0)
    s = _rss_series(store, allocator_child.pid)
    assert s["value"].iloc[-1] != s["value"].iloc[-1]  # NaN: the last row is the gap
    assert "stopped being readable" in store.diagnostics()["message"].iloc[-1]
    assert rec.stats["host"].errors == 0  # the system series kept going


def test_stop_flushes_everything_and_event_context(tmp_path):
    store = Store(tmp_path / "flush.db")
    rec = Recorder(store, ["host"], intervals={"host": 0.005}, flush_interval=60.0)
    rec.start()
    wait_for(lambda: rec.stats["host"].samples_stored > 0)
    with pytest.raises(RuntimeError), rec.event("pause", ["kv_cache"], target="t"):
        raise RuntimeError("engine busy")
    with rec.event("resume", ["kv_cache"], target="t") as ev:
        ev.details["note"] = "fine"
    rec.stop()
    rec.stop()  # twice is fine
    assert store.sample_count() == rec.stats["host"].samples_stored  # nothing left in the queue
    ev = store.events()
    assert ev["ok"].tolist() == [False, True] and ev["error"].iloc[0] == "engine busy"
    assert ev["details"].iloc[1] == {"note": "fine"}
    assert store.meta()["stats"]["host"]["ticks"] == rec.stats["host"].ticks


def test_unavailable_source_is_skipped_with_reason(tmp_path):
    store = Store(tmp_path / "skip.db")
    with Recorder(store, ["host", "nvml"], intervals={"host": 0.02}) as rec:
        wait_for(lambda: rec.stats["host"].ticks > 2)
    assert "nvml" in rec.skipped and "NVML" in rec.skipped["nvml"]
    assert store.meta()["skipped"]["nvml"] == rec.skipped["nvml"]


def test_bad_interval_is_rejected():
    with pytest.raises(ValueError, match="must be > 0"):
        Recorder(Store(), ["host"], intervals={"host": 0})


def test_ticks_do_not_drift_and_overruns_count_missed(tmp_path):
    class Slow(Source):
        name = "host"

        def discover(self) -> Discovery:
            return Discovery("host", True, [])

        def read(self) -> list[Sample]:
            time.sleep(0.035)  # overruns a 10 ms interval: ~3 ticks missed per read
            return [Sample(now(), "host", "host", "used_bytes", 1)]

    with Recorder(Store(), [Slow()], intervals={"host": 0.01}) as rec:
        wait_for(lambda: rec.stats["host"].ticks >= 10)
    st = rec.stats["host"]
    assert st.missed_ticks >= 2 * st.ticks - 3  # counted, not silently absorbed
    assert st.latency_percentile(50) >= 0.035


def test_second_recorder_on_same_file_merges_meta(tmp_path):
    path = tmp_path / "two.db"
    first = Recorder(Store(path), ["host"], intervals={"host": 0.02}).start()
    started = Store.open(path).meta()["started_at"]

    class Other(Source):
        name = "torch"

        def discover(self) -> Discovery:
            return Discovery("torch", True, [])

        def read(self) -> list[Sample]:
            return [Sample(now(), "cuda:0", "torch", "allocated_bytes", 5)]

    second = Recorder(Store(path), [Other()], intervals={"torch": 0.05}).start()
    wait_for(lambda: second.stats["torch"].ticks > 2)
    second.stop()
    meta = Store.open(path).meta()
    assert meta["started_at"] == started and "stopped_at" not in meta
    assert set(meta["sources"]) == {"host", "torch"} and set(meta["stats"]) == {"torch"}
    first.stop()
    meta = Store.open(path).meta()
    assert set(meta["stats"]) == {"host", "torch"} and meta["stopped_at"] >= started


def test_same_source_twice_is_refused():
    with pytest.raises(ValueError, match="given twice"):
        Recorder(Store(), [HostSource(), HostSource()])
