"""One SQLite file per recording. All SQL of the product lives here.

Schema (version 1):
  meta(key, value)                 JSON values: schema_version, host, started_at, sources,
                                   intervals, heartbeat_s, storage, tool_version, stats, ...
  series(id, device, source, metric, pid)
  samples(t, series_id, value)     change-only: a row is written when the value changes and at
                                   least every heartbeat_s while it does not. The value holds until
                                   the next row of its series (step-shaped). value NULL = a gap
                                   (the read failed); bytes are stored as integers. Indexed on t
                                   (an index on (series_id, t) cost 17% of write throughput).
  overview(level, series_id, bucket, n, gaps, t_first, v_first, t_last, v_last,
           vmin, t_min, vmax, t_max, t_gap)
                                   per series per time bucket, kept by ``add_samples`` in the same
                                   transaction as the rows (so every writer keeps it): row count
                                   ``n``, NULL count ``gaps``, first and last row (time, value),
                                   smallest and largest value with the time each was read, the time
                                   of the first NULL. Level L buckets are OVERVIEW_FACTOR**L base
                                   buckets of ``meta.overview_s`` s: bucket = floor(t / overview_s)
                                   >> 2L. Wide windows are drawn from it (``samples_for_display``)
                                   and verification takes whole-series min/max from it. Files
                                   written before it existed have no such table: reads fall back
                                   to raw rows.
  events(id, t_start, t_end, action, tags, target, ok, error, origin, expected_bytes, details)
  devices(device, source, name, uuid, total_bytes, details)
  diagnostics(t, source, message)

WAL mode: a reader in another process sees committed rows while a recorder writes. A crash or
``kill -9`` of the writer loses only rows not yet committed (at most one recorder batch).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.model import DeviceInfo, Event, Sample

__all__ = ["OVERVIEW_FACTOR", "OVERVIEW_LEVELS", "SCHEMA_VERSION", "Store", "StoreError"]

SCHEMA_VERSION = 1
APPLICATION_ID = 0x4D534442  # "MSDB": marks a file as a memsaver recording
OVERVIEW_S = 1.0  # base bucket of the overview (meta.overview_s)
OVERVIEW_FACTOR = 4  # each level's bucket holds 4 of the level below: 1, 4, 16, ... 1024 s
OVERVIEW_LEVELS = 6
_LEVEL_SHIFT = 2  # log2(OVERVIEW_FACTOR): level L bucket = base bucket >> (2 * L)
RAW_FACTOR = 4  # samples_for_display reads raw rows for a series with <= 4 x max_points rows
RAW_SCAN_ROWS = 100_000  # ... when the window holds at most this many rows of all series

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL, source TEXT NOT NULL, metric TEXT NOT NULL, pid INTEGER,
    UNIQUE (device, source, metric, pid)
);
CREATE TABLE IF NOT EXISTS samples (t REAL NOT NULL, series_id INTEGER NOT NULL, value);
CREATE INDEX IF NOT EXISTS samples_t ON samples (t);
CREATE TABLE IF NOT EXISTS overview (
    level INTEGER NOT NULL, series_id INTEGER NOT NULL, bucket INTEGER NOT NULL,
    n INTEGER NOT NULL, gaps INTEGER NOT NULL,
    t_first REAL NOT NULL, v_first, t_last REAL NOT NULL, v_last,
    vmin, t_min REAL, vmax, t_max REAL, t_gap REAL,
    PRIMARY KEY (level, series_id, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    t_start REAL NOT NULL, t_end REAL, action TEXT NOT NULL, tags TEXT NOT NULL,
    target TEXT NOT NULL, ok INTEGER NOT NULL, error TEXT, origin TEXT NOT NULL,
    expected_bytes INTEGER, details TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    device TEXT NOT NULL, source TEXT NOT NULL, name TEXT NOT NULL, uuid TEXT,
    total_bytes INTEGER, details TEXT NOT NULL, PRIMARY KEY (device, source)
);
CREATE TABLE IF NOT EXISTS diagnostics (t REAL NOT NULL, source TEXT NOT NULL, message TEXT NOT NULL);
"""

_OVERVIEW_UPSERT = """
INSERT INTO overview VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (level, series_id, bucket) DO UPDATE SET
    n = n + excluded.n,
    gaps = gaps + excluded.gaps,
    v_first = CASE WHEN excluded.t_first < t_first THEN excluded.v_first ELSE v_first END,
    t_first = min(t_first, excluded.t_first),
    v_last = CASE WHEN excluded.t_last >= t_last THEN excluded.v_last ELSE v_last END,
    t_last = max(t_last, excluded.t_last),
    t_min = CASE WHEN vmin IS NULL OR excluded.vmin < vmin
                      OR (excluded.vmin = vmin AND excluded.t_min < t_min) THEN excluded.t_min ELSE t_min END,
    vmin = CASE WHEN vmin IS NULL OR excluded.vmin < vmin THEN excluded.vmin ELSE vmin END,
    t_max = CASE WHEN vmax IS NULL OR excluded.vmax > vmax
                      OR (excluded.vmax = vmax AND excluded.t_max < t_max) THEN excluded.t_max ELSE t_max END,
    vmax = CASE WHEN vmax IS NULL OR excluded.vmax > vmax THEN excluded.vmax ELSE vmax END,
    t_gap = CASE WHEN t_gap IS NULL OR excluded.t_gap < t_gap THEN excluded.t_gap ELSE t_gap END
"""  # SQLite evaluates every SET expression on the row as it was; ties of min/max keep the earliest

SAMPLE_COLUMNS = ["t", "device", "source", "metric", "pid", "value"]
EVENT_COLUMNS = [
    "id", "t_start", "t_end", "action", "tags", "target", "ok", "error", "origin",
    "expected_bytes", "details",
]


class StoreError(RuntimeError):
    """A recording cannot be opened or written; the message says why in one line."""


class Store:
    """A recording. ``Store(path)`` creates or appends; ``Store.open(path)`` reads an existing one.

    ``Store(":memory:")`` keeps everything in memory (notebooks). One connection guarded by a
    lock, so the recorder's writer thread, controls and readers in one process can share it.

    >>> s = Store(":memory:")
    >>> s.add_samples([Sample(1.0, "host", "host", "used_bytes", 42)])
    >>> int(s.samples()["value"].iloc[0])
    42
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:", *, readonly: bool = False,
                 create: bool = True) -> None:
        self.path = str(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._series: dict[tuple[str, str, str, int | None], int] = {}
        in_memory = self.path == ":memory:"
        if not in_memory:
            p = Path(self.path)
            if not p.exists() and (readonly or not create):
                raise StoreError(f"{self.path}: no such recording")
            if p.exists() and p.is_dir():
                raise StoreError(f"{self.path}: is a directory, not a recording")
            if not p.exists() and not os.access(p.parent if str(p.parent) else ".", os.W_OK):
                raise StoreError(f"{self.path}: cannot create (directory not writable or missing)")
        try:
            if readonly and not in_memory:
                uri = Path(self.path).resolve().as_uri() + "?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=10)
            else:
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            self._init(fresh=not in_memory and not readonly)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a memsaver recording or damaged ({e})") from None

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, readonly: bool = True) -> Store:
        """Open an existing recording (read-only by default)."""
        return cls(path, readonly=readonly, create=False)

    # -- setup -------------------------------------------------------------------------------
    def _init(self, fresh: bool) -> None:
        db = self._db
        db.execute("PRAGMA busy_timeout = 10000")
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and app_id != APPLICATION_ID:
            raise StoreError(f"{self.path}: a SQLite file, but not a memsaver recording")
        if not tables:
            if self.readonly:
                raise StoreError(f"{self.path}: empty file, not a memsaver recording")
            db.execute("PRAGMA journal_mode = WAL") if self.path != ":memory:" else None
            with db:
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.executescript(_SCHEMA)
            self.set_meta(schema_version=SCHEMA_VERSION, storage="change_only",
                          overview_s=OVERVIEW_S, overview_levels=OVERVIEW_LEVELS)
            tables.add("overview")
        else:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: recording schema v{version} is newer than this tool "
                    f"(v{SCHEMA_VERSION}); upgrade memsaver-dashboard"
                )
            # A quick structural check: truncated files fail here rather than mid-chart.
            db.execute("SELECT count(*) FROM series").fetchone()
            db.execute("SELECT max(rowid) FROM samples").fetchone()
        # The overview exists only in files created with it; older files read raw rows.
        self._overview: tuple[float, int] | None = None
        if "overview" in tables:
            meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN "
                                   "('overview_s', 'overview_levels')").fetchall())
            if "overview_s" in meta:
                self._overview = (float(json.loads(meta["overview_s"])),
                                  int(json.loads(meta.get("overview_levels", str(OVERVIEW_LEVELS)))))
        if not self.readonly:
            db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across process crash
        for sid, device, source, metric, pid in db.execute(
            "SELECT id, device, source, metric, pid FROM series"
        ):
            self._series[(device, source, metric, pid)] = sid

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")

    def set_meta(self, **items: Any) -> None:
        self._check_writable()
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(k, json.dumps(v, default=str)) for k, v in items.items()],
            )

    def _series_id(self, key: tuple[str, str, str, int | None]) -> int:
        sid = self._series.get(key)
        if sid is None:
            row = self._db.execute(
                "SELECT id FROM series WHERE device=? AND source=? AND metric=? AND pid IS ?", key
            ).fetchone()
            if row is None:
                cur = self._db.execute(
                    "INSERT INTO series(device, source, metric, pid) VALUES (?, ?, ?, ?)", key
                )
                sid = int(cur.lastrowid)  # type: ignore[arg-type]
            else:
                sid = int(row[0])
            self._series[key] = sid
        return sid

    def add_samples(self, samples: Iterable[Sample]) -> int:
        """Write samples in one transaction, with their overview rows; returns how many."""
        self._check_writable()
        with self._lock, self._db:
            known, new_id = self._series.get, self._series_id
            rows = [(s.t, known(k) or new_id(k), s.value) for s in samples for k in (s.key,)]
            self._db.executemany("INSERT INTO samples(t, series_id, value) VALUES (?, ?, ?)", rows)
            if rows and self._overview is not None:
                self._db.executemany(_OVERVIEW_UPSERT, _overview_rows(rows, *self._overview))
        return len(rows)

    def add_event(self, event: Event) -> int:
        """Insert (or update, when ``event.id`` is set) an event; returns its id."""
        self._check_writable()
        row = event.to_row()
        with self._lock, self._db:
            if event.id is None:
                row.pop("id")
                cur = self._db.execute(
                    f"INSERT INTO events({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
                event.id = int(cur.lastrowid)  # type: ignore[arg-type]
            else:
                eid = row.pop("id")
                self._db.execute(
                    f"UPDATE events SET {', '.join(f'{k}=?' for k in row)} WHERE id=?",
                    [*row.values(), eid],
                )
        return int(event.id)

    def add_devices(self, devices: Iterable[DeviceInfo]) -> None:
        self._check_writable()
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?, ?, ?)",
                [(d.device, d.source, d.name, d.uuid, d.total_bytes, json.dumps(d.details, default=str))
                 for d in devices],
            )

    def add_diagnostic(self, t: float, source: str, message: str) -> None:
        self._check_writable()
        with self._lock, self._db:
            self._db.execute("INSERT INTO diagnostics VALUES (?, ?, ?)", (t, source, message))

    # -- reading -----------------------------------------------------------------------------
    def _query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot read ({e})") from None

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._query("SELECT key, value FROM meta")}

    def series_keys(self, *, devices: Sequence[str] | None = None, sources: Sequence[str] | None = None,
                    metrics: Sequence[str] | None = None) -> dict[int, tuple[str, str, str, int | None]]:
        """{series id: (device, source, metric, pid)} of the series matching the filters."""
        out = {}
        for sid, device, source, metric, pid in self._query(
                "SELECT id, device, source, metric, pid FROM series ORDER BY id"):
            if (devices is None or device in devices) and (sources is None or source in sources) \
                    and (metrics is None or metric in metrics):
                out[int(sid)] = (device, source, metric, None if pid is None else int(pid))
        return out

    def _frame(self, t: np.ndarray, sid: np.ndarray, value: np.ndarray,
               keys: dict[int, tuple[str, str, str, int | None]], *,
               categorical: bool = False) -> pd.DataFrame:
        """Long frame from (t, series id, value) arrays already in order; ``categorical``:
        device/source/metric as categories (built from codes: no string per row)."""
        ids = np.array(sorted(keys), dtype=np.int64)
        pos = np.searchsorted(ids, sid) if len(ids) else np.zeros(len(sid), np.int64)
        cols = list(zip(*(keys[int(i)] for i in ids), strict=True)) if len(ids) else [(), (), (), ()]
        if categorical:
            device, source, metric = (_categorical(c, pos) for c in cols[:3])
        else:
            device, source, metric = (np.array(c, dtype=object)[pos] if len(c) else np.array([], object)
                                      for c in cols[:3])
        pid = pd.array([None if p is None else p for p in cols[3]], dtype="Int64")
        return pd.DataFrame({"t": t.astype(np.float64), "device": device, "source": source,
                             "metric": metric, "pid": pid.take(pos) if len(ids) else pid,
                             "value": value.astype(np.float64)}, columns=SAMPLE_COLUMNS)

    def _rows(self, keys: dict[int, Any], start: float | None, end: float | None,
              every: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, series id, value) of raw rows, in time order (equal times: write order)."""
        where, params = [], []
        if not every:
            where.append(f"series_id IN ({', '.join(str(int(i)) for i in keys)})")
        if start is not None:
            where.append("t >= ?")
            params.append(start)
        if end is not None:
            where.append("t <= ?")
            params.append(end)
        rows = self._query(f"SELECT t, series_id, value FROM samples WHERE {' AND '.join(where) or '1'} "
                           "ORDER BY t, rowid", params)
        return _columns(rows)

    def samples(self, *, start: float | None = None, end: float | None = None,
                devices: Sequence[str] | None = None, sources: Sequence[str] | None = None,
                metrics: Sequence[str] | None = None) -> pd.DataFrame:
        """Long frame: t, device, source, metric, pid, value (value NaN = gap), sorted by t."""
        keys = self.series_keys(devices=devices, sources=sources, metrics=metrics)
        every = devices is None and sources is None and metrics is None
        if not keys:
            return self._frame(*(np.array([]),) * 3, {})
        t, sid, v = self._rows(keys, start, end, every and start is None and end is None)
        return self._frame(t, sid, v, keys)

    def series_samples(self, key: tuple[str, str, str, int | None], start: float, end: float
                       ) -> tuple[np.ndarray, np.ndarray]:
        """One series around a moment: its last row at or before ``start`` (the value in effect
        then), then every row in (start, end]; (t, value) arrays, NaN = gap. Through the time index."""
        sid = self._sid(key)
        if sid is None:
            return np.array([]), np.array([])
        before = self._query("SELECT t, value FROM samples WHERE series_id = ? AND t <= ? "
                             "ORDER BY t DESC, rowid DESC LIMIT 1", (sid, start))
        rows = before + self._query("SELECT t, value FROM samples WHERE series_id = ? AND t > ? "
                                    "AND t <= ? ORDER BY t, rowid", (sid, start, end))
        if not rows:
            return np.array([]), np.array([])
        arr = np.array(rows, dtype=np.float64)
        return arr[:, 0], arr[:, 1]

    def series_moments(self, key: tuple[str, str, str, int | None], start: float, end: float
                       ) -> tuple[np.ndarray, np.ndarray]:
        """A few rows of one series that say what it did over (start, end], whatever its rate:
        its last row at or before ``start``, its last value (non-NULL) row in (start, end], and,
        when every row in (start, end] is a gap, one of them. (t, value) arrays in time order.
        One statement of short walks along the time index (``first_crossing`` adds the row
        where a change showed)."""
        sid = self._sid(key)
        if sid is None:
            return np.array([]), np.array([])
        one = "FROM samples WHERE series_id = :s AND t {} ORDER BY t {}, rowid {} LIMIT 1"
        before = one.format("<= :a", "DESC", "DESC")
        last = one.format("> :a AND t <= :b AND value IS NOT NULL", "DESC", "DESC")
        gap = one.format("> :a AND t <= :b", "DESC", "DESC")
        params = {"s": sid, "a": start, "b": end}
        row = self._query(f"SELECT (SELECT t {before}), (SELECT value {before}), (SELECT t {last}), "
                          f"(SELECT value {last})", params)[0]
        rows = [(row[0], row[1])] if row[0] is not None else []
        if row[2] is not None:
            rows.append((row[2], row[3]))
        else:  # no value in the window: is there a gap row in it?
            rows += [(t, None) for (t,) in self._query(f"SELECT t {gap}", params)]
        arr = np.array(rows, dtype=np.float64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def first_crossing(self, key: tuple[str, str, str, int | None], start: float, end: float,
                       level: float, *, rising: bool) -> tuple[float, float] | None:
        """The first row in (start, end] whose value is >= ``level`` (``rising``) or <= it;
        (t, value), or None. One index range scan inside SQLite."""
        sid = self._sid(key)
        if sid is None:
            return None
        if self._overview is not None:  # the buckets around the window say whether it can cross
            ov_s = self._overview[0]
            reach = self._query(f"SELECT {'max(vmax)' if rising else 'min(vmin)'} FROM overview "
                                "WHERE level = 0 AND series_id = ? AND bucket BETWEEN ? AND ?",
                                (sid, math.floor(start / ov_s), math.floor(end / ov_s)))[0][0]
            if reach is None or (reach < level if rising else reach > level):
                return None
        rows = self._query(f"SELECT t, value FROM samples WHERE series_id = ? AND t > ? AND t <= ? "
                           f"AND value {'>=' if rising else '<='} ? ORDER BY t, rowid LIMIT 1",
                           (sid, start, end, level))
        return (float(rows[0][0]), float(rows[0][1])) if rows else None

    def _sid(self, key: tuple[str, str, str, int | None]) -> int | None:
        sid = self._series.get(key)
        if sid is None:  # a series another process (the recorder) added since we opened
            sid = next((i for i, k in self.series_keys().items() if k == key), None)
            if sid is not None:
                self._series[key] = sid
        return sid

    def has_overview(self) -> bool:
        """True when this file keeps the overview table (files written before it do not)."""
        return self._overview is not None

    def samples_for_display(self, start: float | None = None, end: float | None = None, *,
                            max_points: int = 5000, devices: Sequence[str] | None = None,
                            sources: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                            carry_s: float | None = None) -> pd.DataFrame:
        """What a chart of [start, end] needs, in ``samples()``'s frame, read in about the same
        time whatever the length of the recording.

        Per series: the raw rows when the window holds at most ``RAW_FACTOR * max_points`` of
        them (counted on the overview), else the overview at the finest level that gives at most
        ``max_points / 2`` buckets, drawn as a step trace through each bucket's first, smallest,
        largest and last row at the times they were read (real values only), with a NaN at the
        first gap in a bucket. Plus, with ``start``, each series' last row before ``start``
        (within ``carry_s`` when given), so steps enter the window at the right value.
        ``df.attrs["display"]`` says what was read. Files without an overview: raw rows.
        """
        keys = self.series_keys(devices=devices, sources=sources, metrics=metrics)
        info: dict[str, Any] = {"raw_series": 0, "overview_series": 0, "overview_bucket_s": None}
        if not keys:
            df = self._frame(*(np.array([]),) * 3, {})
            df.attrs["display"] = info
            return df
        raw_ids, ov_ids, level, span = list(keys), [], 0, (start, end)
        if self._overview is not None:
            raw_ids, ov_ids, level, span = self._display_plan(keys, start, end, max_points)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        lo, hi = span
        if raw_ids:
            parts.append(self._rows({i: keys[i] for i in raw_ids}, lo, hi, False))
        if ov_ids:
            parts.append(self._overview_trace(ov_ids, level, lo, hi))
            info["overview_bucket_s"] = self._overview[0] * OVERVIEW_FACTOR ** level  # type: ignore[index]
        if start is not None:
            parts.append(self._carry_in(list(keys), start, carry_s))
        t, sid, v = (np.concatenate(c) for c in zip(*parts, strict=True)) if parts else \
            (np.array([]),) * 3
        order = np.argsort(t, kind="stable")
        df = self._frame(t[order], sid[order], v[order], keys, categorical=True)
        info.update(raw_series=len(raw_ids), overview_series=len(ov_ids))
        df.attrs["display"] = info
        return df

    def _display_plan(self, keys: dict[int, Any], start: float | None, end: float | None,
                      max_points: int) -> tuple[list[int], list[int], int, tuple[float, float]]:
        """Which series to read raw, which from the overview and at which level; the window."""
        ov_s, levels = self._overview  # type: ignore[misc]
        top = levels - 1
        ids = ", ".join(str(int(i)) for i in keys)
        lo, hi = start, end
        if lo is None or hi is None:
            t0, t1 = self._query(f"SELECT min(t_first), max(t_last) FROM overview WHERE level = {top} "
                                 f"AND series_id IN ({ids})")[0]
            lo = t0 if lo is None else lo
            hi = t1 if hi is None else hi
        if lo is None or hi is None or hi < lo:
            return list(keys), [], 0, (start, end)
        base_lo, base_hi = math.floor(lo / ov_s), math.floor(hi / ov_s)
        width = max(base_hi - base_lo + 1, 1)  # base buckets the window touches

        def level_for(max_buckets: float) -> int:
            lv = 0
            while lv < top and width / OVERVIEW_FACTOR ** lv > max_buckets:
                lv += 1
            return lv

        est = level_for(64)  # a few buckets per series are enough to count rows
        sh = _LEVEL_SHIFT * est
        counts = dict(self._query(
            "SELECT series_id, sum(n) FROM overview WHERE level = ? AND bucket BETWEEN ? AND ? "
            "GROUP BY series_id", (est, base_lo >> sh, base_hi >> sh)))
        limit = RAW_FACTOR * max_points
        # Raw rows come through the time index: reading a few series still walks every series'
        # rows of the window, so a window holding many rows overall is drawn from the overview.
        scan_ok = sum(counts.values()) <= RAW_SCAN_ROWS
        raw = [i for i in keys if scan_ok and counts.get(i, 0) <= limit]
        dense = [i for i in keys if i not in raw]
        # A bucket gives 1-4 points (first, min, max, last): up to max_points / 2 buckets keeps
        # at least about max_points / 2 points; the chart layer trims any excess (MinMaxLTTB).
        return raw, dense, level_for(max(max_points / 2, 1)), (lo, hi)

    def _overview_trace(self, ids: list[int], level: int, lo: float, hi: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Overview buckets of [lo, hi] as step points (t, series id, value); a bucket cut by
        the window's edge is read raw instead, so nothing outside the window is drawn."""
        ov_s = self._overview[0]  # type: ignore[index]
        sh = _LEVEL_SHIFT * level
        b_lo, b_hi = math.floor(lo / ov_s) >> sh, math.floor(hi / ov_s) >> sh
        id_list = ", ".join(str(int(i)) for i in ids)
        rows = self._query(
            "SELECT series_id, t_first, v_first, t_last, v_last, t_min, vmin, t_max, vmax, t_gap "
            f"FROM overview WHERE level = ? AND series_id IN ({id_list}) AND bucket BETWEEN ? AND ?",
            (level, b_lo, b_hi))
        if not rows:
            return np.array([]), np.array([]), np.array([])
        a = np.array(rows, dtype=np.float64)  # None -> NaN
        a = np.insert(a, 1, np.floor(a[:, 1] / ov_s).astype(np.int64) >> sh, axis=1)  # the bucket
        bucket = a[:, 1].astype(np.int64)
        # Edge buckets: inside only when the data they hold lies in [lo, hi]
        cut = ((bucket == b_lo) & (a[:, 2] < lo)) | ((bucket == b_hi) & (a[:, 4] > hi))
        keep = a[~cut]
        n = len(keep)
        tt = np.stack([keep[:, 2], keep[:, 6], keep[:, 8], keep[:, 10], keep[:, 4]], axis=1)
        vv = np.stack([keep[:, 3], keep[:, 7], keep[:, 9], np.full(n, np.nan), keep[:, 5]], axis=1)
        ss = np.repeat(keep[:, 0], 5).reshape(n, 5)
        ok = ~np.isnan(tt)  # no min/max in an all-gap bucket, no gap time in a gap-free one
        order = np.argsort(np.where(ok, tt, np.inf), axis=1, kind="stable")
        tt, vv, ok = (np.take_along_axis(x, order, axis=1) for x in (tt, vv, ok))
        # One point per time: first/min/max/last are often the same row
        dup = np.zeros_like(ok)
        dup[:, 1:] = (tt[:, 1:] == tt[:, :-1]) & (vv[:, 1:] == vv[:, :-1])
        take = (ok & ~dup).ravel()
        t, s, v = tt.ravel()[take], ss.ravel()[take], vv.ravel()[take]
        if cut.any():  # the cut edge buckets, from raw rows
            for sid_e, b_e in a[cut][:, :2].astype(np.int64).tolist():
                b_t0, b_t1 = (b_e << sh) * ov_s, ((b_e + 1) << sh) * ov_s  # +- rounding: filtered below
                et, es, ev = self._rows({sid_e: None}, max(lo, b_t0 - ov_s), min(hi, b_t1 + ov_s), False)
                inb = (np.floor(et / ov_s).astype(np.int64) >> sh) == b_e
                t, s, v = np.append(t, et[inb]), np.append(s, es[inb]), np.append(v, ev[inb])
        return t, s, v

    def _carry_in(self, ids: list[int], start: float, carry_s: float | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each series' last row before ``start`` (not older than ``carry_s``): one index look-up each."""
        rows = []
        for sid in ids:
            sql = "SELECT t, series_id, value FROM samples WHERE series_id = ? AND t < ?"
            params: list[Any] = [sid, start]
            if carry_s is not None:
                sql += " AND t >= ?"
                params.append(start - carry_s)
            rows += self._query(sql + " ORDER BY t DESC, rowid DESC LIMIT 1", params)
        return _columns(rows)

    def wide(self, **filters: Any) -> pd.DataFrame:
        """One row per timestamp, one column per series ``device/source/metric[/pid]``,
        values carried forward (memory is step-shaped; a gap stays NaN until the next value)."""
        df = self.samples(**filters)
        if df.empty:
            return pd.DataFrame(index=pd.Index([], name="t"))
        pid = df["pid"].astype("string").fillna("")
        col = df["device"] + "/" + df["source"] + "/" + df["metric"] + ("/" + pid).where(pid != "", "")
        # A gap (NULL) must not be carried forward: mark it, fill, then unmark.
        marked = df.assign(series=col, value=df["value"].fillna(float("-inf")))
        wide = marked.pivot_table(index="t", columns="series", values="value", aggfunc="last")
        wide = wide.ffill().replace(float("-inf"), float("nan"))
        wide.columns.name = None
        return wide

    def events(self, *, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        where, params = ["1"], []
        if start is not None:
            where.append("coalesce(t_end, t_start) >= ?")
            params.append(start)
        if end is not None:
            where.append("t_start <= ?")
            params.append(end)
        rows = self._query(
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM events WHERE {' AND '.join(where)} "
            "ORDER BY t_start, id",
            params,
        )
        df = pd.DataFrame(rows, columns=EVENT_COLUMNS)
        df["tags"] = df["tags"].map(json.loads)
        df["details"] = df["details"].map(json.loads)
        df["ok"] = df["ok"].astype(bool)
        df["duration"] = df["t_end"] - df["t_start"]
        return df

    def devices(self) -> pd.DataFrame:
        rows = self._query("SELECT device, source, name, uuid, total_bytes, details FROM devices")
        df = pd.DataFrame(rows, columns=["device", "source", "name", "uuid", "total_bytes", "details"])
        df["details"] = df["details"].map(json.loads)
        return df

    def diagnostics(self) -> pd.DataFrame:
        rows = self._query("SELECT t, source, message FROM diagnostics ORDER BY t")
        return pd.DataFrame(rows, columns=["t", "source", "message"])

    def series(self) -> pd.DataFrame:
        """Per series: rows, gaps (NULL rows), t_min, t_max, v_min, v_max (over the recording).
        From the overview's top level when the file has one, else a scan of every row."""
        cols = ["device", "source", "metric", "pid", "rows", "t_min", "t_max", "gaps", "v_min", "v_max"]
        if self._overview is not None:
            sql = ("SELECT r.device, r.source, r.metric, r.pid, coalesce(sum(o.n), 0), min(o.t_first), "
                   "max(o.t_last), coalesce(sum(o.gaps), 0), min(o.vmin), max(o.vmax) FROM series r "
                   f"LEFT JOIN overview o ON o.series_id = r.id AND o.level = {self._overview[1] - 1} "
                   "GROUP BY r.id ORDER BY r.id")
        else:
            sql = ("SELECT r.device, r.source, r.metric, r.pid, count(s.rowid), min(s.t), max(s.t), "
                   "coalesce(sum(s.value IS NULL), 0), min(s.value), max(s.value) FROM series r "
                   "LEFT JOIN samples s ON s.series_id = r.id GROUP BY r.id ORDER BY r.id")
        return pd.DataFrame(self._query(sql), columns=cols)

    def sample_count(self) -> int:
        if self._overview is not None:  # exact: kept in the same transaction as the rows
            top = self._overview[1] - 1
            return int(self._query(f"SELECT coalesce(sum(n), 0) FROM overview WHERE level = {top}")[0][0])
        return int(self._query("SELECT count(*) FROM samples")[0][0])

    # -- export ------------------------------------------------------------------------------
    def export(self, out: str | os.PathLike[str], fmt: str) -> Path:
        """Write samples to CSV or Parquet (events beside them as ``<out>.events.<ext>``)."""
        if fmt not in ("csv", "parquet"):
            raise StoreError(f"unknown export format {fmt!r}; use csv or parquet")
        out = Path(out)
        if not out.parent.exists():
            raise StoreError(f"{out.parent}: directory does not exist")
        samples, events = self.samples(), self.events()
        events_out = out.with_name(out.stem + ".events" + out.suffix)
        events["tags"] = events["tags"].map(json.dumps)
        events["details"] = events["details"].map(json.dumps)
        if fmt == "csv":
            samples.to_csv(out, index=False)
            events.to_csv(events_out, index=False)
        else:
            samples.to_parquet(out, index=False)
            events.to_parquet(events_out, index=False)
        return out



def _categorical(per_series: Sequence[str], pos: np.ndarray) -> pd.Categorical:
    cats = sorted(set(per_series))
    code = np.array([cats.index(x) for x in per_series], dtype=np.int32)
    return pd.Categorical.from_codes(code[pos] if len(code) else pos, categories=cats)


def _columns(rows: list[tuple[Any, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, series id, value) rows -> three float arrays (None -> NaN)."""
    if not rows:
        return np.array([]), np.array([]), np.array([])
    a = np.array(rows, dtype=np.float64)
    return a[:, 0], a[:, 1], a[:, 2]


# -- overview --------------------------------------------------------------------------------
def _reduce(sid: np.ndarray, bucket: np.ndarray, f: dict[str, np.ndarray]) -> tuple[
        np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Merge runs of equal (series, bucket), already sorted by series, bucket, then time."""
    new = np.empty(len(sid), dtype=bool)
    new[0] = True
    np.not_equal(sid[1:], sid[:-1], out=new[1:])
    new[1:] |= bucket[1:] != bucket[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(sid)) - 1
    gid = np.cumsum(new) - 1
    out = {"n": np.add.reduceat(f["n"], starts), "gaps": np.add.reduceat(f["gaps"], starts),
           "t_first": f["t_first"][starts], "i_first": f["i_first"][starts],
           "t_last": f["t_last"][ends], "i_last": f["i_last"][ends],
           "t_gap": np.fmin.reduceat(f["t_gap"], starts)}
    for ext, fn in (("min", np.minimum), ("max", np.maximum)):
        best = fn.reduceat(f["v" + ext], starts)
        cand = np.flatnonzero(f["v" + ext] == best[gid])  # every group has one: its own best
        first = cand[np.append(True, gid[cand][1:] != gid[cand][:-1])]  # earliest per group
        out["v" + ext], out["t_" + ext], out["i_" + ext] = best, f["t_" + ext][first], f["i_" + ext][first]
    return sid[starts], bucket[starts], out


def _merge(m: list[Any], g: Sequence[Any]) -> None:
    """Merge overview fields ``g`` into ``m`` (both [sid, bucket, n, gaps, t_first, v_first,
    t_last, v_last, vmin, t_min, vmax, t_max, t_gap]); the same rules as _OVERVIEW_UPSERT."""
    m[2] += g[2]
    m[3] += g[3]
    if g[4] < m[4]:
        m[4], m[5] = g[4], g[5]
    if g[6] >= m[6]:
        m[6], m[7] = g[6], g[7]
    if g[8] is not None and (m[8] is None or g[8] < m[8] or (g[8] == m[8] and g[9] < m[9])):
        m[8], m[9] = g[8], g[9]
    if g[10] is not None and (m[10] is None or g[10] > m[10] or (g[10] == m[10] and g[11] < m[11])):
        m[10], m[11] = g[10], g[11]
    if g[12] is not None and (m[12] is None or g[12] < m[12]):
        m[12] = g[12]


def _level0_python(rows: list[tuple[float, int, Any]], overview_s: float) -> list[list[Any]]:
    """Base buckets of a small batch: a plain loop beats numpy's fixed costs here."""
    out: dict[tuple[int, int], list[Any]] = {}
    for t, sid, v in rows:
        if v is not None and v != v:  # NaN is stored as NULL
            v = None
        k = (sid, math.floor(t / overview_s))
        g = [sid, k[1], 1, int(v is None), t, v, t, v, v, None if v is None else t, v,
             None if v is None else t, t if v is None else None]
        m = out.get(k)
        if m is None:
            out[k] = g
        else:
            _merge(m, g)
    return [out[k] for k in sorted(out)]


def _level0_numpy(rows: list[tuple[float, int, Any]], overview_s: float) -> list[list[Any]]:
    """Base buckets of a batch: one sort, then reduce per (series, bucket). Values are picked
    from the batch by index, so they are the recorded ones (an integer stays an integer)."""
    n = len(rows)
    t = np.array([r[0] for r in rows], dtype=np.float64)
    sid = np.array([r[1] for r in rows], dtype=np.int64)
    vals = [r[2] for r in rows]
    v = np.array(vals, dtype=np.float64)  # None -> NaN
    base = np.floor(t / overview_s).astype(np.int64)
    order = np.lexsort((t, base, sid))  # stable: equal times keep their write order
    t, sid, base, v = t[order], sid[order], base[order], v[order]
    null = np.isnan(v)
    fields = {"n": np.ones(n, np.int64), "gaps": null.astype(np.int64), "t_first": t, "i_first": order,
              "t_last": t, "i_last": order, "t_gap": np.where(null, t, np.nan),
              "vmin": np.where(null, np.inf, v), "t_min": t, "i_min": order,
              "vmax": np.where(null, -np.inf, v), "t_max": t, "i_max": order}
    sid, bucket, fields = _reduce(sid, base, fields)
    f = {k: a.tolist() for k, a in fields.items()}  # Python ints/floats: sqlite3 binds those
    has = np.isfinite(fields["vmin"]).tolist()
    out = []
    for j, (s, b) in enumerate(zip(sid.tolist(), bucket.tolist(), strict=True)):
        tg = f["t_gap"][j]
        vf, vl = vals[f["i_first"][j]], vals[f["i_last"][j]]
        out.append([s, b, f["n"][j], f["gaps"][j], f["t_first"][j], None if vf != vf else vf,
                    f["t_last"][j], None if vl != vl else vl,
                    vals[f["i_min"][j]] if has[j] else None, f["t_min"][j] if has[j] else None,
                    vals[f["i_max"][j]] if has[j] else None, f["t_max"][j] if has[j] else None,
                    None if tg != tg else tg])
    return out


def _overview_rows(rows: list[tuple[float, int, Any]], overview_s: float,
                   levels: int) -> list[tuple[Any, ...]]:
    """Overview rows of one batch, every level, to be merged into the table by _OVERVIEW_UPSERT.
    Level 0 from the rows; each level above from the few groups of the level below."""
    groups = _level0_numpy(rows, overview_s) if len(rows) > 64 else _level0_python(rows, overview_s)
    out = [(0, *g) for g in groups]
    for level in range(1, levels):
        merged: dict[tuple[int, int], list[Any]] = {}
        for g in groups:
            k = (g[0], g[1] >> _LEVEL_SHIFT)
            m = merged.get(k)
            if m is None:
                merged[k] = [k[0], k[1], *g[2:]]
            else:
                _merge(m, g)
        groups = list(merged.values())
        out += [(level, *g) for g in groups]
    return out
