"""Verdict rules of collectors.verification on recordings written to real SQLite files.

Each recording is built from samples and events as the recorder and the controls write them
(change-only rows plus heartbeats), so every rule is checked on the storage format it reads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collectors.model import Event, Sample
from collectors.store import Store
from collectors.verification import COLUMNS, VERDICTS, format_verification, verify

GiB = 2**30
T0 = 1_700_000_000.0


def series(store, device, source, values, *, metric="used_bytes", pid=None, step=0.02, t0=T0):
    """values: list of (t_offset, value); stored as given (the recorder's change-only rows)."""
    store.add_samples([Sample(t0 + dt, device, source, metric, v, pid) for dt, v in values])


def steps(before, after, t_change, *, end=4.0, heartbeat=1.0, start=0.0):
    """A step from `before` to `after` at t_change, with heartbeat rows like the recorder's."""
    out = [(t, before) for t in np.arange(start, t_change, heartbeat)]
    out.append((t_change, after))
    out += [(t, after) for t in np.arange(t_change + heartbeat, end, heartbeat)]
    return out


def event(store, action, tags, *, t=1.0, dur=0.01, expected=GiB, ok=True, error=None, device="cuda:0",
          pid=None):
    details = {"device": device} if device else {}
    if pid is not None:
        details["pid"] = pid
    ev = Event(T0 + t, T0 + t + dur, action, tags, "test", ok=ok, error=error, origin="test",
               expected_bytes=expected, details=details)
    store.add_event(ev)
    return ev


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "rec.sqlite")
    yield s
    s.close()


def one(store, **kw):
    df = verify(store, **kw)
    assert list(df.columns) == COLUMNS and set(df["verdict"]) <= set(VERDICTS)
    assert len(df) == 1, df
    return df.iloc[0]


def test_ok_with_lag(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 4 * GiB, 1.05))
    event(store, "pause", ["kv_cache"])
    r = one(store)
    assert r.verdict == "ok" and r.change_bytes == -GiB and r.before_bytes == 5 * GiB
    assert math.isclose(r.lag_s, 0.05, abs_tol=1e-6) and r.tags == "kv_cache" and r.source == "nvml"


def test_resume_must_rise(store):
    series(store, "cuda:0", "nvml", steps(4 * GiB, 5 * GiB, 1.02))
    event(store, "resume", [])
    r = one(store)
    assert r.verdict == "ok" and r.tags == "all" and r.change_bytes == GiB


def test_partial(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 4.5 * GiB, 1.05))
    event(store, "pause", ["weights"])
    r = one(store)
    assert r.verdict == "partial" and "50%" in r.note


def test_no_effect_when_nothing_moved_and_other_evidence_absent(store):
    series(store, "cuda:0", "nvml", [(0, 5 * GiB), (0.5, 5 * GiB + 4096), (1.5, 5 * GiB), (3, 5 * GiB)])
    event(store, "pause", ["weights"])
    r = one(store)
    assert r.verdict == "no effect" and math.isnan(r.lag_s)


def test_wrong_direction_is_no_effect(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 6 * GiB, 1.05))
    event(store, "pause", ["weights"])
    assert one(store).verdict == "no effect"


def test_constant_series_without_evidence_stays_no_effect_with_a_note(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 5 * GiB, 1.05))
    event(store, "pause", ["weights"])
    r = one(store)
    assert r.verdict == "no effect" and "cannot tell frozen telemetry" in r.note


def test_frozen_telemetry_when_another_series_saw_the_release(store):
    series(store, "xpu:0", "sysman", steps(5 * GiB, 5 * GiB, 1.05))     # frozen free counter
    series(store, "xpu:0", "tms", steps(3 * GiB, 2 * GiB, 1.03))        # TMS's own counter moved
    event(store, "pause", ["kv_cache"], device="xpu:0")
    r = one(store)
    assert r.verdict == "frozen telemetry" and r.source == "sysman" and "tms used_bytes moved" in r.note


def test_frozen_telemetry_when_an_allocation_left_it_unchanged(store):
    series(store, "xpu:0", "sysman", steps(5 * GiB, 5 * GiB, 0.5, end=6))
    event(store, "allocate", ["kv_cache"], t=0.2, device="xpu:0")
    event(store, "pause", ["kv_cache"], t=3.0, device="xpu:0")
    df = verify(store)
    assert df["verdict"].tolist() == ["frozen telemetry"] and "allocate of 1.00 GiB" in df["note"].iloc[0]


def test_frozen_telemetry_when_the_source_said_so(store):
    series(store, "xpu:0", "sysman", steps(5 * GiB, 5 * GiB, 1.05))
    store.add_diagnostic(T0, "sysman", "xpu:0: Sysman reports free == size: needs root or CAP_PERFMON")
    event(store, "pause", ["kv_cache"], device="xpu:0")
    assert one(store).verdict == "frozen telemetry"


def test_no_data_cases(store, tmp_path):
    # no sample before the call
    series(store, "cuda:0", "nvml", [(2.0, 4 * GiB), (3.0, 4 * GiB)])
    event(store, "pause", ["weights"])
    assert one(store).note == "no sample before the call"
    # a gap (NULL) at the call
    s2 = Store(tmp_path / "gap.sqlite")
    series(s2, "cuda:0", "nvml", [(0.0, 5 * GiB), (0.5, None), (2.0, 4 * GiB)])
    event(s2, "pause", ["weights"])
    assert one(s2).verdict == "no data"
    # the recording ended before any change could show
    s3 = Store(tmp_path / "ended.sqlite")
    series(s3, "cuda:0", "nvml", [(0.0, 5 * GiB), (0.9, 5 * GiB)])
    event(s3, "pause", ["weights"])
    r = one(s3)
    assert r.verdict == "no data" and "ended" in r.note
    # no physical series for the event's device at all
    s4 = Store(tmp_path / "none.sqlite")
    series(s4, "cuda:1", "nvml", steps(5 * GiB, 4 * GiB, 1.05))
    event(s4, "pause", ["weights"], device="cuda:0")
    r = one(s4)
    assert r.verdict == "no data" and "no physical series recorded for cuda:0" in r.note


def test_value_that_held_counts_as_no_change_when_recording_went_on(store):
    # change-only storage: no row inside the window, but a later heartbeat proves it held
    series(store, "cuda:0", "nvml", [(0.0, 5 * GiB), (0.9, 5 + 0 * GiB), (5.0, 5 * GiB)])
    event(store, "pause", ["weights"])
    assert one(store, settle_s=2.0).verdict == "no effect"


def test_call_failed_keeps_the_error_and_says_if_memory_moved(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 4.5 * GiB, 1.05))
    event(store, "pause", ["weights"], ok=False, error="engine refused: busy")
    r = one(store)
    assert r.verdict == "call failed" and r.note.startswith("engine refused: busy")
    assert "moved -512.00 MiB anyway" in r.note and math.isnan(r.lag_s)


def test_unknown_expected_size(store, tmp_path):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 4 * GiB, 1.05))
    event(store, "pause", ["weights"], expected=None, device=None)  # a plain SGLang server
    r = one(store)
    assert r.verdict == "ok" and "sizes unknown" in r.note and math.isclose(r.lag_s, 0.05, abs_tol=1e-6)
    s2 = Store(tmp_path / "noise.sqlite")
    series(s2, "cuda:0", "nvml", steps(5 * GiB, 5 * GiB - 2**20, 1.05))  # 1 MiB: noise, not a release
    event(s2, "pause", ["weights"], expected=None, device=None)
    assert one(s2).verdict == "no effect"


def test_window_stops_at_the_next_event(store):
    series(store, "cuda:0", "nvml", [(0, 5 * GiB), (1.05, 4 * GiB), (1.25, 5 * GiB), (3, 5 * GiB)])
    event(store, "pause", ["weights"], t=1.0)
    event(store, "resume", ["weights"], t=1.2)
    df = verify(store, settle_s=2.0)
    assert df["verdict"].tolist() == ["ok", "ok"] and df["change_bytes"].tolist() == [-GiB, GiB]


def test_host_events_use_the_pid_rss_else_system_memory(store):
    series(store, "host", "host", steps(10 * GiB, 10 * GiB - 2**28, 1.05),
           metric="process_used_bytes", pid=42)
    series(store, "host", "host", steps(20 * GiB, 20 * GiB - 2**28, 1.05))
    event(store, "pause", ["kv_cache"], device="host", pid=42, expected=2**28)
    event(store, "pause", ["kv_cache"], device="host", pid=7, expected=2**28)  # same start: no bound
    df = verify(store, settle_s=0.5)
    assert df["metric"].tolist() == ["process_used_bytes", "used_bytes"]
    assert df["pid"].tolist()[0] == 42 and df["verdict"].tolist() == ["ok", "ok"]


def test_event_without_device_is_checked_on_every_gpu(store):
    for d in ("cuda:0", "cuda:1"):
        series(store, d, "nvml", steps(5 * GiB, 4 * GiB, 1.05))
    series(store, "host", "host", steps(20 * GiB, 20 * GiB, 1.05))
    event(store, "pause", ["weights"], device=None)
    df = verify(store)
    assert df["device"].tolist() == ["cuda:0", "cuda:1"]


def test_no_events_and_bad_arguments(store):
    df = verify(store)
    assert df.empty and list(df.columns) == COLUMNS
    assert format_verification(df) == "no pause/resume events in this recording"
    with pytest.raises(ValueError):
        verify(store, tolerance=0.7)
    with pytest.raises(ValueError):
        verify(store, settle_s=-1)


def test_format_verification_table(store):
    series(store, "cuda:0", "nvml", steps(5 * GiB, 4 * GiB, 1.05))
    event(store, "pause", ["kv_cache"])
    text = format_verification(verify(store))
    lines = text.splitlines()
    assert lines[0].split() == ["id", "action", "tags", "series", "expected", "change", "lag", "verdict",
                                "note"]
    assert "kv_cache" in lines[2] and "-1.00 GiB" in lines[2] and "50.0 ms" in lines[2] and " ok " in lines[2]
    assert lines[-1] == "verdicts: 1 ok"
