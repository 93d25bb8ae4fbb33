"""One SQLite file per recording. All SQL of the product lives here.

Schema (version 1):
  meta(key, value)                 JSON values: schema_version, host, started_at, sources,
                                   intervals, heartbeat_s, storage, tool_version, stats, ...
  series(id, device, source, metric, pid)
  samples(t, series_id, value)     change-only: a row is written when the value changes and at
                                   least every heartbeat_s while it does not. The value holds until
                                   the next row of its series (step-shaped). value NULL = a gap
                                   (the read failed); bytes are stored as integers.
  events(id, t_start, t_end, action, tags, target, ok, error, origin, expected_bytes, details)
  devices(device, source, name, uuid, total_bytes, details)
  diagnostics(t, source, message)

WAL mode: a reader in another process sees committed rows while a recorder writes. A crash or
``kill -9`` of the writer loses only rows not yet committed (at most one recorder batch).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from collectors.model import DeviceInfo, Event, Sample

__all__ = ["SCHEMA_VERSION", "Store", "StoreError"]

SCHEMA_VERSION = 1
APPLICATION_ID = 0x4D534442  # "MSDB": marks a file as a memsaver recording

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL, source TEXT NOT NULL, metric TEXT NOT NULL, pid INTEGER,
    UNIQUE (device, source, metric, pid)
);
CREATE TABLE IF NOT EXISTS samples (t REAL NOT NULL, series_id INTEGER NOT NULL, value);
CREATE INDEX IF NOT EXISTS samples_t ON samples (t);
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
            self.set_meta(schema_version=SCHEMA_VERSION, storage="change_only")
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
        """Write samples in one transaction; returns how many."""
        self._check_writable()
        with self._lock, self._db:
            rows = [(s.t, self._series_id(s.key), s.value) for s in samples]
            self._db.executemany("INSERT INTO samples(t, series_id, value) VALUES (?, ?, ?)", rows)
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
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot read ({e})") from None

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._query("SELECT key, value FROM meta")}

    def samples(self, *, start: float | None = None, end: float | None = None,
                devices: Sequence[str] | None = None, sources: Sequence[str] | None = None,
                metrics: Sequence[str] | None = None) -> pd.DataFrame:
        """Long frame: t, device, source, metric, pid, value (value NaN = gap), sorted by t."""
        where, params = ["1"], []
        if start is not None:
            where.append("s.t >= ?")
            params.append(start)
        if end is not None:
            where.append("s.t <= ?")
            params.append(end)
        for col, vals in (("device", devices), ("source", sources), ("metric", metrics)):
            if vals is not None:
                where.append(f"r.{col} IN ({', '.join('?' * len(vals))})")
                params.extend(vals)
        rows = self._query(
            "SELECT s.t, r.device, r.source, r.metric, r.pid, s.value FROM samples s "
            f"JOIN series r ON r.id = s.series_id WHERE {' AND '.join(where)} ORDER BY s.t, s.rowid",
            params,
        )
        df = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
        df["t"] = df["t"].astype("float64")
        df["pid"] = df["pid"].astype("Int64")
        df["value"] = pd.to_numeric(df["value"], errors="coerce").astype("float64")
        return df

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
        rows = self._query(
            "SELECT r.device, r.source, r.metric, r.pid, count(s.rowid), min(s.t), max(s.t) "
            "FROM series r LEFT JOIN samples s ON s.series_id = r.id GROUP BY r.id ORDER BY r.id"
        )
        return pd.DataFrame(rows, columns=["device", "source", "metric", "pid", "rows", "t_min", "t_max"])

    def sample_count(self) -> int:
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

