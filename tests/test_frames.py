"""app/frames.py: splitting, windowing, gaps and downsampling of step-shaped series."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app import frames
from collectors.model import DeviceInfo, Sample
from collectors.store import Store

MiB = 2**20


def _hv(t_draw: np.ndarray, v_draw: np.ndarray, t: np.ndarray) -> np.ndarray:
    """What a line_shape='hv' plot of (t_draw, v_draw) shows at times t."""
    pos = np.searchsorted(t_draw, t, side="right") - 1
    return np.where(pos >= 0, v_draw[np.clip(pos, 0, None)], np.nan)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def _long_frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    keys = [("cuda:0", "nvml", "used_bytes", None), ("cuda:0", "torch", "allocated_bytes", None),
            ("host", "host", "process_used_bytes", 4242), ("host", "host", "process_used_bytes", 7),
            ("host", "saver", "allocated_bytes", None)]
    which = rng.integers(0, len(keys), n)
    return pd.DataFrame({
        "t": np.sort(rng.random(n) * 100),
        "device": [keys[i][0] for i in which], "source": [keys[i][1] for i in which],
        "metric": [keys[i][2] for i in which],
        "pid": pd.array([keys[i][3] for i in which], dtype="Int64"),
        "value": np.where(rng.random(n) < 0.01, np.nan, rng.integers(0, 1000, n) * MiB),
    })


@pytest.mark.parametrize("categorical", [False, True])
def test_split_series_matches_a_groupby(categorical: bool) -> None:
    df = _long_frame(20_000)
    if categorical:
        for c in ("device", "source", "metric"):
            df[c] = df[c].astype("category")
    got = frames.split_series(df)
    ref = {}
    for (d, s, m, p), g in df.groupby(["device", "source", "metric", "pid"], dropna=False, observed=True):
        ref[(d, s, m, None if pd.isna(p) else int(p))] = g
    assert set(got) == set(ref)
    for key, g in ref.items():
        t, v = got[key]
        assert np.array_equal(t, g["t"].to_numpy())
        assert np.all(np.diff(t) >= 0)
        assert np.array_equal(np.isnan(v), g["value"].isna().to_numpy())
        assert np.array_equal(v[~np.isnan(v)], g["value"].dropna().to_numpy())


def test_split_series_many_series_takes_the_sort_path() -> None:
    n = 5_000
    df = pd.DataFrame({"t": np.arange(n, dtype=float), "device": "host", "source": "host",
                       "metric": "process_used_bytes",
                       "pid": pd.array(np.arange(n) % 100, dtype="Int64"),
                       "value": np.arange(n, dtype=float)})
    got = frames.split_series(df)
    assert len(got) == 100 > frames._MASK_SPLIT_MAX
    t, v = got[("host", "host", "process_used_bytes", 37)]
    assert np.array_equal(t, np.arange(37, n, 100, dtype=float))
    assert np.array_equal(v, t)


def test_split_series_reads_a_real_store_frame() -> None:
    store = Store(":memory:")
    store.add_samples([Sample(1.0, "host", "host", "process_used_bytes", 10, 99),
                       Sample(1.0, "host", "saver", "allocated_bytes", 0),
                       Sample(2.0, "host", "host", "process_used_bytes", None, 99),
                       Sample(3.0, "host", "saver", "allocated_bytes", 5 * MiB)])
    got = frames.split_series(store.samples())
    t, v = got[("host", "host", "process_used_bytes", 99)]
    assert list(t) == [1.0, 2.0] and v[0] == 10 and np.isnan(v[1])
    assert list(got[("host", "saver", "allocated_bytes", None)][1]) == [0.0, 5 * MiB]
    assert frames.split_series(store.samples(start=100.0)) == {}


def test_window_carries_in_the_value_in_effect_at_start() -> None:
    t = np.array([0.0, 10.0, 20.0])
    v = np.array([1.0, 2.0, 3.0])
    tt, vv = frames.window_series(t, v, 15.0, 25.0)
    assert list(tt) == [15.0, 20.0] and list(vv) == [2.0, 3.0]
    tt, vv = frames.window_series(t, v, 10.0, 12.0)  # a row exactly at start: nothing to carry
    assert list(tt) == [10.0] and list(vv) == [2.0]
    tt, vv = frames.window_series(t, v, -5.0, 5.0)  # before the first row: nothing is known
    assert list(tt) == [0.0]
    tt, vv = frames.window_series(t, v, 30.0, None)  # after the last row: its value holds
    assert list(tt) == [30.0] and list(vv) == [3.0]


def test_extend_steps_holds_recent_values_only() -> None:
    t, v = np.array([0.0, 1.0]), np.array([5.0, 6.0])
    tt, vv = frames.extend_steps(t, v, until=2.5, hold_s=3.0)
    assert list(tt) == [0.0, 1.0, 2.5] and list(vv) == [5.0, 6.0, 6.0]
    tt, _ = frames.extend_steps(t, v, until=10.0, hold_s=3.0)  # the source went quiet: no invention
    assert list(tt) == [0.0, 1.0]
    tt, _ = frames.extend_steps(t, np.array([5.0, np.nan]), until=2.0)  # a gap stays a gap
    assert len(tt) == 2


def test_break_gaps_draws_the_step_up_to_the_gap() -> None:
    t = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    v = np.array([1.0, 1.0, np.nan, np.nan, 2.0])
    tt, vv = frames.break_gaps(t, v)
    assert list(tt) == [0.0, 1.0, 2.0, 2.0, 3.0, 4.0]
    assert vv[2] == 1.0 and np.isnan(vv[3]) and np.isnan(vv[4]) and vv[5] == 2.0
    # a series starting with a gap has nothing to extend
    tt, vv = frames.break_gaps(np.array([0.0, 1.0]), np.array([np.nan, 1.0]))
    assert len(tt) == 2


def test_step_series_are_compacted_losslessly() -> None:
    rng = np.random.default_rng(3)
    n = 400_000
    t = np.cumsum(rng.random(n) * 0.02)
    edges = np.sort(rng.choice(n, 30, replace=False))
    v = (rng.integers(1, 100, 31) * MiB)[np.searchsorted(edges, np.arange(n), side="right")].astype(float)
    v[200_000:200_050] = np.nan
    tt, vv = frames.display_arrays(t, v, max_points=2000)
    assert len(tt) <= 2 * 30 + 10
    assert _same(_hv(tt, vv, t), v).all()  # exact: every edge and the gap are kept


def test_noisy_series_are_downsampled_with_gaps_kept() -> None:
    rng = np.random.default_rng(4)
    n = 300_000
    t = np.arange(n, dtype=float) * 0.01
    v = rng.random(n) * MiB
    v[100_000:100_500] = np.nan
    v[250_000] = np.nan
    v[150_000] = 50 * MiB  # a spike MinMax must keep
    tt, vv = frames.display_arrays(t, v, max_points=1000)
    assert len(tt) <= 1000 + 10
    assert np.all(np.diff(tt) >= 0)
    assert np.nanmax(vv) == 50 * MiB
    # both gaps break the drawn line: a NaN sits inside each gap's time span
    nan_t = tt[np.isnan(vv)]
    assert ((nan_t >= t[100_000]) & (nan_t <= t[100_499])).any()
    assert (nan_t == t[250_000]).any()
    # and the line resumes at the first value after each gap
    assert t[100_500] in tt and t[250_001] in tt


def test_display_arrays_short_series_pass_through() -> None:
    t, v = np.arange(5.0), np.arange(5.0)
    tt, vv = frames.display_arrays(t, v, max_points=100)
    assert np.array_equal(tt, t) and np.array_equal(vv, v)
    tt, vv = frames.display_arrays(np.array([]), np.array([]), until=3.0)
    assert len(tt) == 0


def test_align_steps_and_gap_frame() -> None:
    phys = (np.array([0.0, 2.0, 4.0]), np.array([10.0, 4.0, 10.0]) * MiB)  # released 6 MiB at t=2
    acc = (np.array([1.0]), np.array([8.0]) * MiB)
    df = frames.align_steps({"physical": phys, "accounting": acc})
    assert list(df.index) == [0.0, 1.0, 2.0, 4.0]
    assert np.isnan(df["accounting"].iloc[0])  # unknown before its first row, not 0
    g = frames.gap_frame(phys, acc)
    assert np.isnan(g["gap"].iloc[0])
    assert list(g["gap"].iloc[1:] / MiB) == [0.0, 6.0, 0.0]
    raw = frames.gap_frame(phys, acc, relative=False)
    assert raw["gap"].iloc[2] == 4 * MiB


def test_which_series_are_physical_and_accounting() -> None:
    keys = [("cuda:0", "nvml", "used_bytes", None), ("cuda:0", "nvml", "reserved_bytes", None),
            ("cuda:0", "torch", "allocated_bytes", None), ("cuda:0", "torch", "reserved_bytes", None),
            ("cuda:0", "torch", "used_bytes", None), ("cuda:0", "nvml", "process_used_bytes", 5),
            ("host", "host", "used_bytes", None), ("host", "host", "process_used_bytes", 9),
            ("host", "host", "process_used_bytes", 3), ("host", "saver", "allocated_bytes", None),
            ("xpu:1", "sysman", "used_bytes", None)]
    assert frames.devices_in(keys) == ["cuda:0", "xpu:1", "host"]
    assert frames.physical_keys(keys, "cuda:0") == [("cuda:0", "nvml", "used_bytes", None)]
    assert frames.physical_keys(keys, "host", pid=9)[0] == ("host", "host", "process_used_bytes", 9)
    assert frames.physical_keys(keys[:7], "host") == [("host", "host", "used_bytes", None)]
    assert frames.primary_accounting_key(keys, "cuda:0") == ("cuda:0", "torch", "allocated_bytes", None)
    assert frames.primary_accounting_key(keys, "host") == ("host", "saver", "allocated_bytes", None)
    assert frames.primary_accounting_key(keys, "xpu:1") is None
    assert frames.series_role(keys[0], {"memory_info_version": 2}).label == "physical used (NVML v2)"
    assert frames.series_role(keys[10]).label == "physical used (Sysman)"
    assert frames.series_role(keys[1]) is None  # NVML's driver-reserved is not accounting
    assert frames.series_role(keys[4]).role == "context"
    assert frames.series_role(keys[7]).label == "physical: RSS of pid 9 (psutil)"
    assert "Sysman" in frames.explain_backend("xpu:0") and "RSS" in frames.explain_backend("host")
    assert "NVML" in frames.explain_backend("cuda:3")


def test_device_info_details_name_the_nvml_version() -> None:
    store = Store(":memory:")
    store.add_devices([DeviceInfo("cuda:0", "nvml", "NVIDIA H200", "GPU-1", 141 * 2**30,
                                  details={"memory_info_version": 1})])
    details = store.devices()["details"].iloc[0]
    assert frames.physical_label(("cuda:0", "nvml", "used_bytes", None), details) == "physical used (NVML v1)"


def test_downsampling_without_tsdownsample_keeps_the_extremes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine may lack tsdownsample: a numpy min/max per bucket stands in."""
    import sys

    monkeypatch.setitem(sys.modules, "tsdownsample", None)  # import fails like a missing package
    rng = np.random.default_rng(5)
    t = np.arange(50_000, dtype=float)
    v = rng.random(50_000)
    v[1234], v[40_000] = 5.0, -5.0
    tt, vv = frames.display_arrays(t, v, max_points=500)
    assert len(tt) <= 510 and np.all(np.diff(tt) > 0)
    assert vv.max() == 5.0 and vv.min() == -5.0 and tt[0] == 0 and tt[-1] == 49_999
