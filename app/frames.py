"""Frame -> frame: split, window, step-extend, downsample and align recorded series for display.

Pure pandas/numpy (+ tsdownsample); no plotly here, so the same layer serves Streamlit, notebooks
and the HTML report. Everything is vectorised: a 10M-row recording is split with one stable radix
sort and each series is cut with ``searchsorted`` (no per-row Python).

Memory is stored change-only (a value holds until the next row of its series), so:
- a window carries in the value in effect at its start, and a series is extended to the end of
  the data while its last row is recent (``hold_s``), so steps (``line_shape="hv"``) end where
  the recording does, not at the last change;
- a NaN value is a gap (a failed read): the step before it is drawn up to the gap, then the line
  breaks; downsampling keeps those break points;
- downsampling (MinMaxLTTB, <= ``max_points`` per trace) is for display only, never storage.

>>> import numpy as np
>>> t, y = np.arange(10.0), np.array([1, 1, 1, np.nan, 2, 2, 2, 2, 2, 2], float)
>>> tt, yy = display_arrays(t, y, max_points=5000)
>>> int(np.isnan(yy).sum())
1
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collectors.model import ACCOUNTING_SOURCES

__all__ = [
    "SeriesKey",
    "SeriesRole",
    "split_series",
    "window_series",
    "extend_steps",
    "break_gaps",
    "step_edges",
    "downsample_indices",
    "display_arrays",
    "last_value",
    "align_steps",
    "devices_in",
    "physical_keys",
    "accounting_keys",
    "primary_accounting_key",
    "series_role",
    "series_label",
    "physical_label",
    "explain_backend",
    "backend_of",
    "gap_frame",
]

SeriesKey = tuple[str, str, str, "int | None"]  # (device, source, metric, pid)

# Accounting metrics in the order they are preferred as "the" accounting of a device.
_ACCOUNTING_ORDER = [
    ("torch", "allocated_bytes"), ("saver", "allocated_bytes"), ("tms", "allocated_bytes"),
    ("torch", "reserved_bytes"), ("tms", "reserved_bytes"), ("saver", "reserved_bytes"),
]
_SOURCE_TITLES = {"nvml": "NVML", "sysman": "Sysman", "host": "psutil", "torch": "torch",
                  "saver": "saver", "tms": "TMS"}


@dataclass(frozen=True)
class SeriesRole:
    """What a series means on a chart: physical truth, accounting, ceiling, or context."""

    role: str  # "physical" | "accounting" | "total" | "context"
    label: str


# -- splitting and windowing -----------------------------------------------------------------
def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values. np.unique on int64 is ~100x slower here (numpy 2.4: 2 s for 1M)."""
    a = np.sort(np.asarray(a), kind="stable")
    if len(a) < 2:
        return a
    return a[np.concatenate([[True], a[1:] != a[:-1]])]


def _codes(col: pd.Series) -> tuple[np.ndarray, list]:
    """Small integer codes (>= 0, NA -> 0) and the values they stand for; categorical columns
    and an all-NA pid column cost nothing."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy() + 1, [None, *col.cat.categories.tolist()]
    if col.isna().to_numpy().all():
        return np.zeros(len(col), dtype=np.int8), [None]
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    return codes + 1, [None, *list(uniques)]


_MASK_SPLIT_MAX = 48  # up to this many series a boolean mask per series beats sort + gather


def split_series(samples: pd.DataFrame) -> dict[SeriesKey, tuple[np.ndarray, np.ndarray]]:
    """Long frame (t, device, source, metric, pid, value; sorted by t) -> {key: (t, value)}.

    Each series stays in time order. With few series (the usual case) one sequential boolean
    compress per series is used (streaming, cache-friendly); with many, one stable sort.
    Categorical device/source/metric columns (``charts.load`` makes them) are the fast path.
    """
    if samples.empty:
        return {}
    parts = [_codes(samples[c]) for c in ("device", "source", "metric", "pid")]
    ncombo = math.prod(len(u) for _, u in parts)
    dtype = np.int32 if ncombo < 2**31 else np.int64
    combined = np.zeros(len(samples), dtype=dtype)
    for codes, uniques in parts:
        if len(uniques) > 1:  # a constant column adds nothing
            combined *= len(uniques)
            combined += codes  # in-place: no 10M-row temporary
    t_all = samples["t"].to_numpy(dtype=np.float64)
    v_all = samples["value"].to_numpy(dtype=np.float64, na_value=np.nan)
    counts = np.bincount(combined) if ncombo < 2**24 else None
    present = np.flatnonzero(counts) if counts is not None else \
        np.sort(pd.unique(combined))  # hash-based: np.unique is slow on ints here

    def key_of(combo: int) -> SeriesKey:
        values = []
        for _, uniques in reversed(parts):
            values.append(uniques[combo % len(uniques)])
            combo //= len(uniques)
        d, s, m, p = reversed(values)
        return (str(d), str(s), str(m), None if p is None or pd.isna(p) else int(p))

    out: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    if len(present) <= _MASK_SPLIT_MAX:
        for combo in present:
            mask = combined == combo
            out[key_of(int(combo))] = (np.compress(mask, t_all), np.compress(mask, v_all))
        return out
    order = np.argsort(combined, kind="stable")
    sizes = counts[present] if counts is not None else np.bincount(np.searchsorted(present, combined))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for i, combo in enumerate(present):
        rows = order[bounds[i]:bounds[i + 1]]
        out[key_of(int(combo))] = (t_all[rows], v_all[rows])
    return out


def window_series(t: np.ndarray, v: np.ndarray, start: float | None = None,
                  end: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cut a step series to [start, end], carrying in the value in effect at ``start``."""
    lo = 0 if start is None else int(np.searchsorted(t, start, side="left"))
    hi = len(t) if end is None else int(np.searchsorted(t, end, side="right"))
    tt, vv = t[lo:hi], v[lo:hi]
    if start is not None and lo > 0 and (len(tt) == 0 or tt[0] > start):
        tt = np.concatenate([[start], tt])
        vv = np.concatenate([[v[lo - 1]], vv])
    return tt, vv


def extend_steps(t: np.ndarray, v: np.ndarray, until: float | None,
                 hold_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Hold the last value up to ``until`` (the end of the data), when it is a value (not a gap)
    and recent: a series whose source stopped more than ``hold_s`` before ``until`` is not
    extended (that would draw data nobody read)."""
    if until is None or len(t) == 0 or t[-1] >= until or np.isnan(v[-1]):
        return t, v
    if hold_s is not None and until - t[-1] > hold_s:
        return t, v
    return np.append(t, until), np.append(v, v[-1])


def break_gaps(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Insert (t_gap, previous value) before each gap so the step reaches the gap, then breaks."""
    nan = np.isnan(v)
    if not nan.any():
        return t, v
    starts = np.flatnonzero(nan[1:] & ~nan[:-1]) + 1  # first NaN of each run after a value
    if len(starts) == 0:
        return t, v
    return np.insert(t, starts, t[starts]), np.insert(v, starts, v[starts - 1])


def step_edges(v: np.ndarray) -> np.ndarray:
    """Indices where a step series changes (NaN runs count as one value), plus first and last:
    drawn with ``line_shape="hv"`` they reproduce the series exactly (heartbeat rows drop out)."""
    n = len(v)
    if n <= 2:
        return np.arange(n)
    nan = np.isnan(v)
    same = (v[1:] == v[:-1]) | (nan[1:] & nan[:-1])
    return _sorted_unique(np.concatenate([[0], np.flatnonzero(~same) + 1, [n - 1]]))


def downsample_indices(t: np.ndarray, v: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to draw, about <= max_points (plus gap markers).

    First losslessly: only the step edges (exact under hv). When there are still too many (a
    noisy series), MinMaxLTTB over the edges — its per-bucket min/max keep the extremes — plus,
    around each gap, the value before, the NaN that breaks the line and the value after.
    """
    n = len(t)
    if n <= max_points:
        return np.arange(n)
    edges = step_edges(v)
    if len(edges) <= max_points:
        return edges
    nan = np.isnan(v[edges])
    valid = edges[~nan]
    keep: list[np.ndarray] = [edges[[0, -1]]]
    if len(valid) > max_points:
        keep.append(valid[_minmax_lttb(t[valid], v[valid], max(int(max_points), 4))])
    else:
        keep.append(valid)
    if nan.any():
        runs = np.flatnonzero(nan[1:] != nan[:-1]) + 1  # where NaN-ness changes, among the edges
        keep += [edges[runs], edges[runs - 1], edges[np.flatnonzero(nan[:1])]]
    return _sorted_unique(np.concatenate(keep))


def _minmax_lttb(t: np.ndarray, v: np.ndarray, n_out: int) -> np.ndarray:
    """tsdownsample's MinMaxLTTB; where it is not installed, per-bucket min and max in numpy."""
    try:
        from tsdownsample import MinMaxLTTBDownsampler
    except ImportError:
        n, buckets = len(v), max(n_out // 2, 1)
        size = -(-n // buckets)
        grid = np.concatenate([v, np.full(buckets * size - n, v[-1])]).reshape(buckets, size)
        base = np.arange(buckets) * size
        idx = np.concatenate([[0, n - 1], base + grid.argmin(axis=1), base + grid.argmax(axis=1)])
        return _sorted_unique(idx[idx < n])
    return MinMaxLTTBDownsampler().downsample(t, v, n_out=n_out).astype(np.int64)


def display_arrays(t: np.ndarray, v: np.ndarray, *, start: float | None = None,
                   end: float | None = None, until: float | None = None,
                   hold_s: float | None = None, max_points: int = 5000
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Window, extend, break gaps and downsample one step series for drawing."""
    t, v = window_series(t, v, start, end)
    t, v = extend_steps(t, v, until, hold_s)
    t, v = break_gaps(t, v)
    idx = downsample_indices(t, v, max_points)
    if len(idx) == len(t):
        return t, v
    return t[idx], v[idx]


def last_value(t: np.ndarray, v: np.ndarray) -> float | None:
    """The last value read (None when the series ends in a gap or is empty)."""
    if len(v) == 0 or np.isnan(v[-1]):
        return None
    return float(v[-1])


def align_steps(series: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> pd.DataFrame:
    """Step series on one time axis (the union of their times), each value carried forward.

    Before a series' first row its value is NaN (unknown), never 0.
    """
    if not series:
        return pd.DataFrame(index=pd.Index([], name="t", dtype="float64"))
    times = _sorted_unique(np.concatenate([t for t, _ in series.values()]))
    cols = {}
    for name, (t, v) in series.items():
        pos = np.searchsorted(t, times, side="right") - 1
        col = np.where(pos >= 0, v[np.clip(pos, 0, None)] if len(v) else np.nan, np.nan)
        cols[name] = col
    return pd.DataFrame(cols, index=pd.Index(times, name="t"))


# -- which series mean what ------------------------------------------------------------------
def devices_in(keys: Iterable[SeriesKey]) -> list[str]:
    """Devices in display order: GPUs by kind and index, host last."""
    def order(d: str) -> tuple[int, str, int]:
        kind, _, idx = d.partition(":")
        return (1 if d == "host" else 0, kind, int(idx) if idx.isdigit() else 0)

    return sorted({k[0] for k in keys}, key=order)


def physical_keys(keys: Iterable[SeriesKey], device: str, *, pid: int | None = None) -> list[SeriesKey]:
    """The physical series of a device: NVML/Sysman used_bytes on a GPU; on the host the RSS of
    each followed process when there is one (``pid`` first), else host used_bytes."""
    keys = list(keys)
    if device == "host":
        procs = sorted((k for k in keys if k[0] == "host" and k[1] == "host"
                        and k[2] == "process_used_bytes" and k[3] is not None),
                       key=lambda k: (k[3] != pid, k[3]))
        if procs:
            return procs
        return [k for k in keys if k[:3] == ("host", "host", "used_bytes")]
    out = [k for k in keys if k[0] == device and k[1] in ("nvml", "sysman") and k[2] == "used_bytes"]
    return sorted(out, key=lambda k: k[1])


def accounting_keys(keys: Iterable[SeriesKey], device: str) -> list[SeriesKey]:
    """Allocator accounting of a device (torch / saver / tms allocated and reserved), preferred first."""
    rank = {sm: i for i, sm in enumerate(_ACCOUNTING_ORDER)}
    out = [k for k in keys if k[0] == device and k[1] in ACCOUNTING_SOURCES
           and (k[1], k[2]) in rank and k[3] is None]
    return sorted(out, key=lambda k: rank[(k[1], k[2])])


def primary_accounting_key(keys: Iterable[SeriesKey], device: str) -> SeriesKey | None:
    acc = accounting_keys(keys, device)
    return acc[0] if acc else None


def backend_of(device: str) -> str:
    return "host" if device == "host" else device.partition(":")[0]


def physical_label(key: SeriesKey, device_details: Mapping[str, object] | None = None) -> str:
    """'physical used (NVML v2)', 'physical used (Sysman)', 'physical: RSS of pid 42 (psutil)'."""
    _, source, metric, pid = key
    if source == "host":
        return f"physical: RSS of pid {pid} (psutil)" if metric == "process_used_bytes" \
            else "physical: host used (psutil)"
    title = _SOURCE_TITLES.get(source, source)
    version = (device_details or {}).get("memory_info_version")
    if source == "nvml" and version:
        title += f" v{version}"
    return f"physical used ({title})"


def series_role(key: SeriesKey, device_details: Mapping[str, object] | None = None) -> SeriesRole | None:
    """How a series is drawn on the timeline, or None when it is not drawn there."""
    device, source, metric, pid = key
    if source in ("nvml", "sysman") and metric == "used_bytes" \
            or source == "host" and metric in ("used_bytes", "process_used_bytes") and device == "host":
        return SeriesRole("physical", physical_label(key, device_details))
    if metric == "total_bytes" and source in ("nvml", "sysman", "host", "torch"):
        return SeriesRole("total", f"device total ({_SOURCE_TITLES.get(source, source)})")
    if source in ACCOUNTING_SOURCES and metric in ("allocated_bytes", "reserved_bytes"):
        return SeriesRole("accounting", f"{source} {metric.removesuffix('_bytes')} (accounting)")
    if source == "torch" and metric == "used_bytes":
        return SeriesRole("context", "mem_get_info used (torch)")
    return None


def series_label(key: SeriesKey, device_details: Mapping[str, object] | None = None) -> str:
    role = series_role(key, device_details)
    return role.label if role else "/".join(str(p) for p in key if p is not None)


def explain_backend(device: str) -> str:
    """One line: why physical and accounting differ on this backend."""
    backend = backend_of(device)
    if backend == "cuda":
        return ("CUDA: NVML and mem_get_info follow a TMS release; torch's allocator "
                "(memory_allocated/reserved) does not, because TMS keeps the virtual addresses.")
    if backend == "xpu":
        return ("XPU: only Level Zero Sysman follows a release; torch.xpu memory_allocated, "
                "memory_reserved and even mem_get_info stay flat.")
    if backend == "host":
        return ("Host: the process RSS follows madvise(MADV_DONTNEED); the saver's bytes allocated "
                "do not, because the virtual addresses stay reserved.")
    return f"{device}: no known relation between physical and accounting series."


def gap_frame(physical: tuple[np.ndarray, np.ndarray], accounting: tuple[np.ndarray, np.ndarray],
              *, relative: bool = True) -> pd.DataFrame:
    """Accounting minus physical on one time axis (columns physical, accounting, gap).

    ``relative``: subtract the offset at the first moment both are known (a CUDA context, the
    Python interpreter, other processes are physical but never accounted), so the gap reads as
    "bytes the accounting claims that the device no longer holds".
    """
    df = align_steps({"physical": physical, "accounting": accounting})
    if df.empty:
        return df.assign(gap=pd.Series(dtype="float64"))
    raw = df["accounting"] - df["physical"]
    if relative:
        known = raw.dropna()
        raw = raw - (known.iloc[0] if len(known) else np.nan)
    return df.assign(gap=raw)
