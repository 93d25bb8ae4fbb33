"""Check every pause/resume event against what the physical sources really saw.

For each pause/resume Event and each physical series of the device it acted on, ``verify``
measures the value just before the call and ``settle_s`` after it ended (or just before the next
event, whichever is first), the change, and the lag from the call's start to the first sample
showing at least half of the expected change. ``expected_bytes`` is what the tags hold.

Which series: NVML/Sysman ``used_bytes`` for a GPU device; for the host, the RSS of the event's
pid (``host/host/process_used_bytes``) when recorded, else host ``used_bytes``. An event that
names its device (``details["device"]``) is checked on that device only; one that does not (a
real SGLang server) on every GPU, or on the host when no GPU was recorded.

Verdicts (E = expected bytes, C = change in the direction of the action: a pause should drop,
a resume should rise; tol = ``tolerance``):

- ``call failed``: the event itself failed (its error is the note).
- ``no data``: no sample before the call, a gap, or the recording ended before the change
  could be seen.
- ``ok``: C >= (1 - tol) * E. With E unknown (a server without a status endpoint) C must be at
  least ``UNKNOWN_SIZE_FLOOR`` (16 MiB, above allocator and RSS noise) and the note says the
  size was unknown; with E = 0 (nothing to act on) the call itself is what counts.
- ``partial``: tol * E <= C < (1 - tol) * E.
- ``no effect``: C < tol * E (about nothing, or the wrong way): e.g. TMS silently inactive
  (bad LD_PRELOAD, wrong hook mode) or a driver that frees nothing.
- ``frozen telemetry``: as ``no effect``, but the series never changed at all during the whole
  recording *and* other evidence says memory moved: another series of the same device moved by
  >= E/2 in the window (torch's ``mem_get_info``, TMS's counter, system memory), an allocate or
  free of >= E/2 on that device happened while it was recorded, or the source itself reported
  frozen counters (e.g. Sysman's free == size). A constant series without such evidence stays
  ``no effect`` with a note: it cannot tell a frozen counter from a call that did nothing.

>>> df = verify(Store.open("run.sqlite"))                      # doctest: +SKIP
>>> print(format_verification(df))                             # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from collectors.model import PHYSICAL_SOURCES
from collectors.store import Store
from collectors.units import format_bytes, format_duration

__all__ = ["COLUMNS", "UNKNOWN_SIZE_FLOOR", "VERDICTS", "verify", "format_verification"]

VERDICTS = ("ok", "partial", "no effect", "frozen telemetry", "no data", "call failed")
COLUMNS = [
    "event_id", "action", "tags", "target", "t_start", "duration_s", "device", "source", "metric",
    "pid", "expected_bytes", "before_bytes", "after_bytes", "change_bytes", "lag_s", "verdict", "note",
]
UNKNOWN_SIZE_FLOOR = 16 * 2**20
_USED_METRICS = ("used_bytes", "process_used_bytes")
_FROZEN_HINTS = ("frozen", "free == size", "never change")

Key = tuple[str, str, str, Any]


def _nan(x: Any) -> float:
    return float("nan") if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA else float(x)


def _series(store: Store) -> dict[Key, tuple[float, float, bool]]:
    """{key: (t_first, t_last, constant)} of every used-bytes series, from ``Store.series``
    (the overview when the file has one): no sample row is read here."""
    out: dict[Key, tuple[float, float, bool]] = {}
    for r in store.series().itertuples(index=False):
        if r.metric not in _USED_METRICS or not r.rows:
            continue
        pid = None if r.pid is None or (isinstance(r.pid, float) and math.isnan(r.pid)) else int(r.pid)
        values = int(r.rows) - int(r.gaps)
        constant = values >= 2 and r.v_min is not None and r.v_min == r.v_max
        out[(r.device, r.source, r.metric, pid)] = (float(r.t_min), float(r.t_max), constant)
    return out


def _physical(series: dict[Key, Any]) -> dict[Key, Any]:
    return {k: v for k, v in series.items() if k[1] in PHYSICAL_SOURCES
            and (k[2] == "used_bytes" or (k[0] == "host" and k[2] == "process_used_bytes"))}


def _pick(phys: dict[Key, Any], device: str | None, pid: int | None) -> list[Key]:
    gpu = [k for k in phys if k[0] != "host"]
    procs = {k[3]: k for k in phys if k[0] == "host" and k[2] == "process_used_bytes"}
    system = [k for k in phys if k[0] == "host" and k[2] == "used_bytes"]

    def host() -> list[Key]:
        return [procs[pid]] if pid is not None and pid in procs else system

    if device == "host":
        return host()
    if device:
        return [k for k in gpu if k[0] == device]
    return gpu or host()


def _value_at(t: np.ndarray, v: np.ndarray, when: float) -> float:
    i = int(np.searchsorted(t, when, side="right")) - 1
    return float(v[i]) if i >= 0 else float("nan")


def _window_change(t: np.ndarray, v: np.ndarray, t0: float, t1: float) -> float:
    """Value change of a step series from t0 to t1 (NaN when unknown)."""
    before = _value_at(t, v, t0)
    sel = (t > t0) & (t <= t1) & ~np.isnan(v)
    after = float(v[sel][-1]) if sel.any() else before
    return after - before


def verify(store: Store, *, settle_s: float = 2.0, tolerance: float = 0.1, start: float | None = None,
           end: float | None = None) -> pd.DataFrame:
    """One row per (pause/resume event, physical series); see the module docstring for verdicts.

    Only the events that start in [start, end] (all by default). Each event reads a few rows of
    each series around its own window (``Store.series_moments``, ``Store.first_crossing``), so
    the cost grows with the number of events, not with the length of the recording."""
    if not 0 <= tolerance < 0.5:
        raise ValueError(f"tolerance must be in [0, 0.5), got {tolerance}")
    if settle_s < 0:
        raise ValueError(f"settle_s must be >= 0, got {settle_s}")
    events = store.events()
    memory = events[events["action"].isin(["pause", "resume"])]
    if start is not None:
        memory = memory[memory["t_start"] >= start]
    if end is not None:
        memory = memory[memory["t_start"] <= end]
    if memory.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
    series = _series(store)
    phys = _physical(series)
    diags = store.diagnostics()
    frozen_sources = {s for s, m in zip(diags["source"], diags["message"], strict=False)
                      if any(h in str(m).lower() for h in _FROZEN_HINTS)}
    starts = np.sort(events["t_start"].to_numpy(float))
    allocs = events[events["action"].isin(["allocate", "free"]) & events["ok"]]

    rows: list[dict[str, Any]] = []
    for ev in memory.itertuples(index=False):
        details = ev.details if isinstance(ev.details, dict) else {}
        device, pid = details.get("device"), details.get("pid")
        pid = int(pid) if isinstance(pid, (int, np.integer)) else None
        t0 = float(ev.t_start)
        t_end = t0 if ev.t_end is None or math.isnan(ev.t_end) else float(ev.t_end)
        nxt = starts[starts > t0]
        t_after = t_end + settle_s
        if len(nxt):
            t_after = min(t_after, max(float(nxt[0]), t_end))
        expected = _nan(ev.expected_bytes)
        base = {
            "event_id": int(ev.id), "action": ev.action, "tags": ",".join(ev.tags) or "all",
            "target": ev.target, "t_start": t0,
            "duration_s": float("nan") if ev.t_end is None else _nan(ev.t_end) - t0,
            "expected_bytes": expected,
        }
        keys = _pick(phys, device, pid)
        if not keys:
            rows.append({**base, "device": device or "", "source": None, "metric": None, "pid": pid,
                         "before_bytes": np.nan, "after_bytes": np.nan, "change_bytes": np.nan,
                         "lag_s": np.nan,
                         "verdict": "call failed" if not ev.ok else "no data",
                         "note": (ev.error or "failed") if not ev.ok else
                         f"no physical series recorded for {device or 'any device'}"})
            continue
        for key in keys:
            t, v = store.series_moments(key, t0, t_after)  # a few rows, not the window's all

            def first(level: float, rising: bool, key: Key = key, t0: float = t0,
                      t_after: float = t_after) -> tuple[float, float] | None:
                return store.first_crossing(key, t0, t_after, level, rising=rising)

            t_first, t_last, constant = phys[key]
            row = {**base, "device": key[0], "source": key[1], "metric": key[2], "pid": key[3]}
            row.update(_measure(t, v, t0, t_after, ev.action, expected, tolerance, t_last > t_after,
                                first))
            if not ev.ok:
                row["verdict"], row["lag_s"] = "call failed", float("nan")
                moved = row["change_bytes"]
                extra = f"; memory moved {format_bytes(moved, signed=True)} anyway" if (
                    not math.isnan(moved) and not math.isnan(expected) and expected > 0
                    and abs(moved) >= tolerance * expected) else ""
                row["note"] = f"{ev.error or 'failed'}{extra}"
            elif row["verdict"] == "no effect" and constant:
                evidence = _evidence(store, key, series, allocs, t0, t_after, ev.action, expected,
                                     (t_first, t_last), frozen_sources)
                if evidence:
                    row["verdict"] = "frozen telemetry"
                    row["note"] = (f"{key[1]} {key[2]} never changed during the recording, "
                                   f"while {evidence}")
                else:
                    row["note"] += ("; the series never changed during the recording "
                                    "(cannot tell frozen telemetry from a call that did nothing)")
            rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("expected_bytes", "before_bytes", "after_bytes", "change_bytes", "lag_s", "duration_s"):
        df[c] = df[c].astype("float64")
    df["pid"] = df["pid"].astype("Int64")
    return df


def _measure(t: np.ndarray, v: np.ndarray, t0: float, t_after: float, action: str,
             expected: float, tol: float, more_later: bool,
             first: Callable[[float, bool], tuple[float, float] | None]) -> dict[str, Any]:
    """``t``/``v``: the series' last row at or before t0, then its last value row in
    (t0, t_after] (or a gap row when all are gaps), from ``Store.series_moments``;
    ``more_later``: the series has rows after t_after; ``first(level, rising)``: the first row
    in (t0, t_after] at or beyond ``level`` (``Store.first_crossing``)."""
    nan = float("nan")
    out: dict[str, Any] = {"before_bytes": nan, "after_bytes": nan, "change_bytes": nan, "lag_s": nan}
    i = int(np.searchsorted(t, t0, side="right")) - 1
    if i < 0:
        return {**out, "verdict": "no data", "note": "no sample before the call"}
    before = float(v[i])
    if math.isnan(before):
        return {**out, "verdict": "no data", "note": "a gap in the series at the call"}
    win = (t > t0) & (t <= t_after)
    if not win.any() and not more_later:
        return {**out, "before_bytes": before, "verdict": "no data",
                "note": "the recording ended before a change could be seen"}
    good = win & ~np.isnan(v)
    if win.any() and not good.any():
        return {**out, "before_bytes": before, "verdict": "no data",
                "note": "a gap in the series after the call"}
    after = float(v[good][-1]) if good.any() else before  # no row: the value held (change-only)
    change = after - before
    sign = -1.0 if action == "pause" else 1.0
    signed = change * sign
    out.update(before_bytes=before, after_bytes=after, change_bytes=change)
    threshold = 0.5 * expected if not math.isnan(expected) and expected > 0 else (
        0.5 * signed if signed >= UNKNOWN_SIZE_FLOOR else nan)
    if not math.isnan(threshold):  # (v - before) * sign >= threshold
        hit = first(before + sign * threshold, sign > 0)
        if hit is not None:
            out["lag_s"] = float(hit[0] - t0)
    lag = f" after {format_duration(out['lag_s'])}" if not math.isnan(out["lag_s"]) else ""
    verb = "released" if action == "pause" else "re-committed"
    if math.isnan(expected):
        if signed >= UNKNOWN_SIZE_FLOOR:
            return {**out, "verdict": "ok", "note": f"{verb} {format_bytes(signed)}{lag} (tag sizes unknown)"}
        return {**out, "verdict": "no effect",
                "note": f"changed {format_bytes(change, signed=True)} (tag sizes unknown)"}
    if expected <= 0:
        return {**out, "verdict": "ok", "note": "no tag to act on (expected 0 B); "
                f"changed {format_bytes(change, signed=True)}"}
    pct = 100.0 * signed / expected
    if signed >= (1 - tol) * expected:
        return {**out, "verdict": "ok",
                "note": f"{verb} {format_bytes(signed)} of {format_bytes(expected)} ({pct:.0f}%){lag}"}
    if signed >= tol * expected:
        return {**out, "verdict": "partial",
                "note": f"{verb} only {format_bytes(signed)} of {format_bytes(expected)} ({pct:.0f}%){lag}"}
    return {**out, "verdict": "no effect",
            "note": f"changed {format_bytes(change, signed=True)}, expected "
                    f"{'-' if sign < 0 else '+'}{format_bytes(expected)}"}


def _evidence(store: Store, key: Key, series: dict[Key, Any], allocs: pd.DataFrame, t0: float,
              t_after: float, action: str, expected: float, span: tuple[float, float],
              frozen_sources: set[str]) -> str | None:
    """Why we believe memory moved although this series did not; None when nothing says so."""
    if key[1] in frozen_sources:
        return f"the {key[1]} source reported frozen counters"
    if math.isnan(expected) or expected <= 0:
        return None
    sign = -1.0 if action == "pause" else 1.0
    for other in series:
        if other == key or other[0] != key[0]:
            continue
        change = _window_change(*store.series_moments(other, t0, t_after), t0, t_after)
        if not math.isnan(change) and change * sign >= 0.5 * expected:
            name = f"{other[1]} {other[2]}" + (f" (pid {other[3]})" if other[3] is not None else "")
            return f"{name} moved {format_bytes(change, signed=True)} at this event"
    lo, hi = span
    for a in allocs.itertuples(index=False):
        dev = (a.details or {}).get("device") if isinstance(a.details, dict) else None
        size = _nan(a.expected_bytes)
        if dev == key[0] and lo <= a.t_start <= hi and not math.isnan(size) and size >= 0.5 * expected:
            return f"{a.action} of {format_bytes(size)} on {dev} (event {a.id}) left it unchanged too"
    return None


def format_verification(df: pd.DataFrame) -> str:
    """A plain-text table of ``verify``'s frame, for ``memsaver summary`` and logs."""
    if df is None or df.empty:
        return "no pause/resume events in this recording"
    header = ["id", "action", "tags", "series", "expected", "change", "lag", "verdict", "note"]
    lines = []
    for r in df.itertuples(index=False):
        where = f"{r.device} {r.source or '-'}" + (f" pid {int(r.pid)}" if not pd.isna(r.pid) else "")
        lines.append([
            str(r.event_id), r.action, r.tags, where,
            format_bytes(None if math.isnan(r.expected_bytes) else r.expected_bytes),
            format_bytes(None if math.isnan(r.change_bytes) else r.change_bytes, signed=True),
            format_duration(None if math.isnan(r.lag_s) else r.lag_s), r.verdict, r.note or "",
        ])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(header[:-1])]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths), "-" * 4)]
    out += [fmt.format(*x) for x in lines]
    counts = df["verdict"].value_counts()
    out.append("")
    out.append("verdicts: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS if v in counts))
    return "\n".join(out)
