"""Store: real SQLite files, WAL visibility across processes, damaged files, export."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pandas as pd
import pytest

from collectors import Event, Sample, Store, StoreError
from collectors.model import DeviceInfo


def _fill(store: Store) -> None:
    store.add_samples([
        Sample(1.0, "cuda:0", "nvml", "used_bytes", 10 * 2**30),
        Sample(1.0, "cuda:0", "torch", "allocated_bytes", 8 * 2**30),
        Sample(2.0, "cuda:0", "nvml", "used_bytes", None),  # a gap
        Sample(3.0, "cuda:0", "nvml", "used_bytes", 2 * 2**30),
        Sample(3.0, "host", "host", "process_used_bytes", 123, pid=42),
    ])
    store.add_event(Event(2.5, 2.6, "pause", ["kv_cache"], "tms:cuda:0", origin="app",
                          expected_bytes=8 * 2**30))
    store.add_devices([DeviceInfo("cuda:0", "nvml", "NVIDIA H200", "GPU-1", 141 * 2**30)])


def test_roundtrip_keeps_integers_gaps_and_pids(tmp_path):
    path = tmp_path / "r.db"
    with Store(path) as s:
        _fill(s)
    with Store.open(path) as s:
        df = s.samples()
        assert list(df.columns) == ["t", "device", "source", "metric", "pid", "value"]
        used = df[(df.metric == "used_bytes")]
        assert used["value"].isna().tolist() == [False, True, False]
        assert used["value"].iloc[2] == 2 * 2**30
        assert df[df.metric == "process_used_bytes"]["pid"].iloc[0] == 42
        # bytes are stored as SQLite integers, not floats
        raw = sqlite3.connect(path).execute("SELECT typeof(value) FROM samples").fetchall()
        assert {r[0] for r in raw} == {"integer", "null"}
        ev = s.events()
        assert ev.loc[0, "tags"] == ["kv_cache"] and ev.loc[0, "expected_bytes"] == 8 * 2**30
        assert s.devices().loc[0, "name"] == "NVIDIA H200"
        assert s.meta()["schema_version"] == 1


def test_wide_carries_values_forward_but_not_through_gaps():
    s = Store(":memory:")
    _fill(s)
    w = s.wide(devices=["cuda:0"])
    col = "cuda:0/nvml/used_bytes"
    assert w.loc[1.0, col] == 10 * 2**30
    assert pd.isna(w.loc[2.0, col])  # gap stays a gap
    assert pd.isna(w.loc[2.5, col]) if 2.5 in w.index else True
    assert w.loc[3.0, col] == 2 * 2**30
    assert w.loc[3.0, "cuda:0/torch/allocated_bytes"] == 8 * 2**30  # carried forward


def test_filters_by_time_and_source(tmp_path):
    s = Store(tmp_path / "f.db")
    _fill(s)
    assert set(s.samples(start=2.5)["t"]) == {3.0}
    assert set(s.samples(sources=["torch"])["source"]) == {"torch"}
    assert len(s.events(start=2.7)) == 0 and len(s.events(end=2.5)) == 1


def test_reader_in_another_process_sees_rows_while_writer_holds_file(tmp_path):
    path = tmp_path / "wal.db"
    writer = Store(path)
    writer.add_samples([Sample(1.0, "host", "host", "used_bytes", 1)])
    code = ("import sys; from collectors import Store; "
            "print(Store.open(sys.argv[1]).sample_count())")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "1"
    writer.add_samples([Sample(2.0, "host", "host", "used_bytes", 2)])
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "2"
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("content", [b"hello, this is not a database" * 10, b""])
def test_not_a_recording_gives_clear_error(tmp_path, content):
    p = tmp_path / "x.db"
    p.write_bytes(content)
    with pytest.raises(StoreError, match="not a memsaver recording"):
        Store.open(p)


def test_other_sqlite_database_is_rejected(tmp_path):
    p = tmp_path / "other.db"
    sqlite3.connect(p).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(StoreError, match="not a memsaver recording"):
        Store.open(p)


def test_truncated_recording_gives_clear_error(tmp_path):
    p = tmp_path / "t.db"
    with Store(p) as s:
        s.add_samples([Sample(float(i), "host", "host", "used_bytes", i) for i in range(20000)])
    with sqlite3.connect(p) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(StoreError) as e:
        s2 = Store.open(p)
        s2.samples()
    assert str(p) in str(e.value)


def test_missing_file_and_readonly_writes(tmp_path):
    with pytest.raises(StoreError, match="no such recording"):
        Store.open(tmp_path / "missing.db")
    Store(tmp_path / "ro.db").close()
    ro = Store.open(tmp_path / "ro.db")
    with pytest.raises(StoreError, match="read-only"):
        ro.add_samples([Sample(1.0, "host", "host", "used_bytes", 1)])


def test_newer_schema_is_refused(tmp_path):
    p = tmp_path / "new.db"
    Store(p).close()
    with sqlite3.connect(p) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer than this tool"):
        Store.open(p)


def test_event_update_and_bad_action():
    s = Store()
    ev = Event(1.0, None, "resume", ["weights"])
    eid = s.add_event(ev)
    ev.t_end, ev.ok, ev.error = 2.0, False, "out of memory"
    assert s.add_event(ev) == eid
    row = s.events().iloc[0]
    assert row["error"] == "out of memory" and not row["ok"] and row["duration"] == 1.0
    with pytest.raises(ValueError, match="unknown event action"):
        Event(1.0, None, "explode")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export(tmp_path, fmt):
    s = Store(tmp_path / "e.db")
    _fill(s)
    out = s.export(tmp_path / f"out.{fmt}", fmt)
    df = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
    assert len(df) == 5 and df["value"].isna().sum() == 1
    ev_path = tmp_path / f"out.events.{fmt}"
    ev = pd.read_csv(ev_path) if fmt == "csv" else pd.read_parquet(ev_path)
    assert ev.loc[0, "action"] == "pause"
    with pytest.raises(StoreError, match="unknown export format"):
        s.export(tmp_path / "x.xlsx", "xlsx")
