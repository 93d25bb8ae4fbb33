"""Store overview: kept by add_samples across batches, gaps, old files without it, and the
display read drawn from it (real values only, every extreme kept, gaps kept)."""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import pandas as pd
import pytest

from collectors import Sample, Store
from collectors.store import APPLICATION_ID, OVERVIEW_FACTOR, OVERVIEW_LEVELS
from collectors.verification import verify

KEY = ("cuda:0", "nvml", "used_bytes", None)


def _signal(n: int, seed: int, span: float = 600.0, gap_p: float = 0.02) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    t = 1_700_000_000.0 + np.sort(rng.uniform(0, span, n))
    v: list = rng.integers(0, 10_000, n).tolist()
    for i in np.flatnonzero(rng.random(n) < gap_p):
        v[i] = None
    return t, v


def _write(store: Store, t: np.ndarray, v: list, seed: int, key=KEY, batches: int = 40) -> None:
    """In random batches, and the batches in a shuffled order: merging must not depend on it."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, len(t)), size=min(batches, len(t) - 1), replace=False))
    batches = np.split(np.arange(len(t)), cuts)
    rng.shuffle(batches)
    for b in batches:
        store.add_samples([Sample(float(t[i]), *key[:3], v[i], key[3]) for i in b])


def _expected(t: np.ndarray, v: list, level: int) -> dict[int, tuple]:
    """The overview rows of one series, computed the slow way from every sample."""
    base = np.floor(t / 1.0).astype(np.int64)
    out: dict[int, tuple] = {}
    for b in np.unique(base >> (2 * level)):
        idx = np.flatnonzero((base >> (2 * level)) == b)
        idx = idx[np.argsort(t[idx], kind="stable")]
        vals = [(t[i], v[i]) for i in idx if v[i] is not None]
        gaps = [t[i] for i in idx if v[i] is None]
        lo = min(vals, key=lambda x: (x[1], x[0])) if vals else (None, None)
        hi = max(vals, key=lambda x: (x[1], -x[0])) if vals else (None, None)
        out[int(b)] = (len(idx), len(gaps), t[idx[0]], v[idx[0]], t[idx[-1]], v[idx[-1]],
                       lo[1], lo[0], hi[1], hi[0], min(gaps) if gaps else None)
    return out


def _overview(path, level: int) -> dict[int, tuple]:
    db = sqlite3.connect(path)
    rows = db.execute("SELECT bucket, n, gaps, t_first, v_first, t_last, v_last, vmin, t_min, vmax, t_max, "
                      "t_gap FROM overview WHERE level = ? ORDER BY bucket", (level,)).fetchall()
    db.close()
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.mark.parametrize("batches", [3, 40, 400])  # large batches (numpy) and small ones (a loop)
def test_overview_merges_batches_in_any_order_at_every_level(tmp_path, batches) -> None:
    path = tmp_path / "r.sqlite"
    t, v = _signal(5000, seed=1)
    with Store(path) as s:
        _write(s, t, v, seed=2, batches=batches)
        assert s.sample_count() == len(t)
    for level in range(OVERVIEW_LEVELS):
        got, want = _overview(path, level), _expected(t, v, level)
        assert got.keys() == want.keys()
        for b in want:
            assert got[b] == pytest.approx(want[b], nan_ok=True), (level, b)
    # the values are the recorded integers, not floats made of them
    db = sqlite3.connect(path)
    types = {r[0] for r in db.execute("SELECT DISTINCT typeof(vmin) FROM overview")}
    assert types <= {"integer", "null"}
    db.close()


def test_gaps_are_counted_and_an_all_gap_bucket_has_no_min_or_max(tmp_path) -> None:
    path = tmp_path / "g.sqlite"
    t0 = 1_700_000_000.0
    with Store(path) as s:
        s.add_samples([Sample(t0 + 0.1, *KEY[:3], None), Sample(t0 + 0.5, *KEY[:3], 7)])
        s.add_samples([Sample(t0 + 0.9, *KEY[:3], None), Sample(t0 + 1.2, *KEY[:3], None)])
    rows = _overview(path, 0)
    # bucket of t0 + 0.x: first row a gap, last row a gap, one value between
    n, gaps, t_first, v_first, t_last, v_last, vmin, t_min, vmax, t_max, t_gap = rows[math.floor(t0)]
    assert (n, gaps, v_first, v_last, vmin, vmax) == (3, 2, None, None, 7, 7)
    assert t_gap == pytest.approx(t0 + 0.1) and t_min == pytest.approx(t0 + 0.5)
    only_gap = rows[math.floor(t0) + 1]
    assert only_gap[:2] == (1, 1) and only_gap[6] is None and only_gap[8] is None
    with Store(path) as s:
        s.add_samples([Sample(t0 + 2 + k / 10, *KEY[:3], 9 + k) for k in range(5)])
        df = s.samples_for_display(max_points=1)  # 9 rows > 4 x 1: the overview
        assert df.attrs["display"]["overview_series"] == 1
        assert df["value"].isna().any() and 7.0 in df["value"].tolist()


def _old_file(path) -> None:
    """A recording as files were written before the overview: old schema, no overview table."""
    db = sqlite3.connect(path)
    db.executescript(f"""
        PRAGMA application_id = {APPLICATION_ID};
        PRAGMA user_version = 1;
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE series (id INTEGER PRIMARY KEY, device TEXT NOT NULL, source TEXT NOT NULL,
            metric TEXT NOT NULL, pid INTEGER, UNIQUE (device, source, metric, pid));
        CREATE TABLE samples (t REAL NOT NULL, series_id INTEGER NOT NULL, value);
        CREATE INDEX samples_t ON samples (t);
        CREATE TABLE events (id INTEGER PRIMARY KEY, t_start REAL NOT NULL, t_end REAL,
            action TEXT NOT NULL, tags TEXT NOT NULL, target TEXT NOT NULL, ok INTEGER NOT NULL,
            error TEXT, origin TEXT NOT NULL, expected_bytes INTEGER, details TEXT NOT NULL);
        CREATE TABLE devices (device TEXT NOT NULL, source TEXT NOT NULL, name TEXT NOT NULL,
            uuid TEXT, total_bytes INTEGER, details TEXT NOT NULL, PRIMARY KEY (device, source));
        CREATE TABLE diagnostics (t REAL NOT NULL, source TEXT NOT NULL, message TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1'), ('heartbeat_s', '1.0');
        INSERT INTO series VALUES (1, 'cuda:0', 'nvml', 'used_bytes', NULL);
        INSERT INTO events VALUES (1, 10.0, 10.01, 'pause', '["kv_cache"]', 'tms:cuda:0', 1, NULL,
            'app', 1000, '{{}}');
    """)
    db.executemany("INSERT INTO samples VALUES (?, 1, ?)",
                   [(float(k), 5000 if k < 10.5 else 4000) for k in range(1, 30)] + [(30.0, None)])
    db.commit()
    db.close()


def test_old_files_without_overview_open_read_and_verify(tmp_path) -> None:
    path = tmp_path / "old.sqlite"
    _old_file(path)
    with Store.open(path) as s:
        assert not s.has_overview()
        assert s.sample_count() == 30
        full = s.samples()
        shown = s.samples_for_display(max_points=4)  # raw rows: there is nothing else
        assert shown.attrs["display"]["raw_series"] == 1
        pd.testing.assert_frame_equal(shown.reset_index(drop=True), full, check_dtype=False,
                                      check_categorical=False)
        win = s.samples_for_display(12.5, 20.0)
        assert win["t"].tolist()[0] == 12.0  # the row in effect at the start, carried in
        stats = s.series().iloc[0]
        assert (stats["rows"], stats["gaps"], stats["v_min"], stats["v_max"]) == (30, 1, 4000, 5000)
        ver = verify(s)
        assert ver["verdict"].tolist() == ["ok"] and ver["change_bytes"].iloc[0] == -1000
    with Store(path) as s:  # appending to an old file keeps it as it was: raw rows only
        s.add_samples([Sample(31.0, *KEY[:3], 4000)])
        assert not s.has_overview() and s.sample_count() == 31


@pytest.mark.parametrize("window", [(None, None), (100.3, 450.7), (200.0, 200.5), (590.0, None)])
def test_display_read_is_faithful(tmp_path, window) -> None:
    path = tmp_path / "d.sqlite"
    t, v = _signal(40_000, seed=3)
    with Store(path) as s:
        _write(s, t, v, seed=4)
    t0 = 1_700_000_000.0
    start, end = (None if w is None else t0 + w for w in window)
    with Store.open(path) as s:
        shown = s.samples_for_display(start, end, max_points=200)
        raw = s.samples(start=start, end=end)
    info = shown.attrs["display"]
    lo = -math.inf if start is None else start
    inside = shown[(shown["t"] >= lo) & (shown["t"] <= (math.inf if end is None else end))]
    # every point drawn inside the window is a recorded row: same time, same value (or gap)
    pairs = set(zip(raw["t"], raw["value"].fillna(-1.0), strict=True))
    assert set(zip(inside["t"], inside["value"].fillna(-1.0), strict=True)) <= pairs
    # every extreme survives: per display bucket when drawn from the overview, else every row
    width = info["overview_bucket_s"]
    if width is None:
        assert len(inside) == len(raw)
    else:
        assert info["overview_series"] == 1 and len(inside) < len(raw) / 10
        rb, sb = np.floor(raw["t"] / width), np.floor(inside["t"] / width)
        for b, g in raw.groupby(rb):
            got = inside["value"][sb == b]
            if g["value"].notna().any():
                assert g["value"].min() in got.tolist() and g["value"].max() in got.tolist()
            assert got.isna().any() == g["value"].isna().any(), b  # a gap stays a gap
    if start is not None and start > t[0]:  # the value in effect at the start comes along
        before = shown[shown["t"] < start]
        assert len(before) == 1 and before["t"].iloc[0] == t[t < start].max()
    assert shown["t"].is_monotonic_increasing


def test_display_read_mixes_raw_and_overview_series(tmp_path) -> None:
    path = tmp_path / "m.sqlite"
    t, v = _signal(30_000, seed=5, gap_p=0)
    with Store(path) as s:
        _write(s, t, v, seed=6)
        total = ("cuda:0", "nvml", "total_bytes", None)
        s.add_samples([Sample(1_700_000_000.0 + k, *total[:3], 80) for k in range(0, 600, 1)])
        df = s.samples_for_display(max_points=500)
    assert df.attrs["display"]["raw_series"] == 1 and df.attrs["display"]["overview_series"] == 1
    assert (df["metric"] == "total_bytes").sum() == 600  # sparse: every row
    assert (df["metric"] == "used_bytes").sum() <= 4 * 250


def test_overview_levels_cover_long_recordings() -> None:
    assert OVERVIEW_FACTOR ** (OVERVIEW_LEVELS - 1) >= 1024  # a week at 1,250 buckets or fewer per series x 5
