"""Recorded frames -> Plotly figures, shared by the Streamlit app, notebooks and the HTML report.

Every builder takes ``source``: a :class:`~collectors.store.Store`, a
:class:`~collectors.recorder.Recorder` (its store), a path to a recording, or a
:class:`Recording` already loaded (load once, draw many). Figures are plain ``go.Figure``, so
they display inline in JupyterLab, VS Code and Streamlit.

>>> from collectors import Store
>>> from app import charts
>>> fig = charts.timeline(Store(":memory:"))          # doctest: +SKIP
>>> fig.show()                                        # doctest: +SKIP

Times are drawn as wall-clock (local time; plotly date axes take milliseconds since the epoch),
bytes as MiB or GiB (chosen per figure). Memory lines are steps (``line_shape="hv"``) because the
store is change-only: a value holds until the next row.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import frames
from app.frames import SeriesKey
from collectors.recorder import Recorder
from collectors.store import Store
from collectors.units import GiB, MiB, format_bytes, format_duration

__all__ = [
    "Recording",
    "load",
    "timeline",
    "gap",
    "accounting_summary",
    "verification",
    "release_latency",
    "verification_table",
    "event_label",
    "tags_text",
    "as_number",
    "VERDICT_COLORS",
]

VERDICT_COLORS = {"ok": "#2ca02c", "partial": "#ff7f0e", "no effect": "#d62728",
                  "frozen telemetry": "#17becf", "no data": "#7f7f7f", "call failed": "#d62728"}
_ACTION_COLORS = {"pause": "#ff7f0e", "resume": "#2ca02c", "allocate": "#9467bd",
                  "free": "#8c564b", "mark": "#7f7f7f"}
_PHYSICAL_COLORS = ["#1f77b4", "#17becf", "#393b79", "#6baed6"]
_ACCOUNTING_STYLE = {  # (source, metric) -> (color, dash)
    ("torch", "allocated_bytes"): ("#d62728", "dash"), ("torch", "reserved_bytes"): ("#ff9896", "dot"),
    ("saver", "allocated_bytes"): ("#d62728", "dash"), ("saver", "reserved_bytes"): ("#ff9896", "dot"),
    ("tms", "allocated_bytes"): ("#e377c2", "dash"), ("tms", "reserved_bytes"): ("#f7b6d2", "dot"),
}
_MAX_EVENT_LABELS = 40  # beyond this, bands keep their hover marker but lose their text


@dataclass
class Recording:
    """One recording (or a window of it) in memory: the frames every chart is built from.

    ``samples``: t, device, source, metric, pid, value (device/source/metric categorical);
    ``events``, ``devices``, ``diagnostics``: the store's frames; ``meta``: the store's meta.
    ``verification`` (collectors.verification.verify) is computed on first use, for the
    events in the window, and shared with every re-windowed copy (``load(rec, start, end)``).
    ``start``/``end`` bound what is drawn; samples may start earlier (the value in effect at
    ``start`` is carried in). Samples come from ``Store.samples_for_display``: raw rows for a
    short window, the store's overview (real first/min/max/last per bucket) for a long one.
    """

    samples: pd.DataFrame
    events: pd.DataFrame
    devices: pd.DataFrame
    meta: dict[str, Any]
    diagnostics: pd.DataFrame
    start: float | None = None
    end: float | None = None
    path: str | None = None
    store: Store | None = field(default=None, repr=False)
    _series: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] | None = field(default=None, repr=False)
    _verification: pd.DataFrame | None = field(default=None, repr=False)
    verification_error: str | None = None
    # verify() results by (start, end), shared by the copies load() makes when re-windowing
    _verified: dict[tuple[float | None, float | None], pd.DataFrame] = field(default_factory=dict,
                                                                            repr=False)

    @property
    def series(self) -> dict[SeriesKey, tuple[np.ndarray, np.ndarray]]:
        """{(device, source, metric, pid): (t, value)} — split once, shared by every chart."""
        if self._series is None:
            self._series = frames.split_series(self.samples)
        return self._series

    @property
    def t_last(self) -> float | None:
        """The last time anything was read (in the window): where steps end."""
        if self.samples.empty:
            return None
        t = float(self.samples["t"].iloc[-1])
        return t if self.end is None else min(t, self.end)

    @property
    def hold_s(self) -> float:
        """How long a step may be extended past its last row: 3 heartbeats."""
        return 3.0 * float(self.meta.get("heartbeat_s") or 1.0)

    @property
    def verification(self) -> pd.DataFrame | None:
        """collectors.verification.verify on this recording's store, rows in the window only;
        None (with ``verification_error`` saying why) when it cannot run."""
        if self._verification is None and self.verification_error is None:
            self._verification = self._verify()
        return self._verification

    def _verify(self) -> pd.DataFrame | None:
        if self.store is None:
            self.verification_error = "no store to verify"
            return None
        try:
            from collectors.verification import verify
        except ImportError as e:
            self.verification_error = f"verification unavailable ({e})"
            return None
        full = self._verified.get((None, None))
        if full is not None:  # the whole recording is verified already: keep the window's rows
            t = full["t_start"]
            keep = (t >= (self.start if self.start is not None else -math.inf)) & \
                   (t <= (self.end if self.end is not None else math.inf))
            return full[keep].reset_index(drop=True)
        window = (self.start, self.end)
        if window in self._verified:
            return self._verified[window]
        try:  # only the events of the window: each reads its own few rows
            df = verify(self.store, start=self.start, end=self.end)
        except Exception as e:  # a chart must still draw when verification breaks
            self.verification_error = f"verification failed: {type(e).__name__}: {e}"
            return None
        self._verified[window] = df
        return df

    def device_details(self, device: str) -> dict[str, Any]:
        """Details of a device from every source that saw it (NVML's win on conflicts)."""
        out: dict[str, Any] = {}
        rows = self.devices[self.devices["device"] == device] if not self.devices.empty else self.devices
        for row in sorted(rows.itertuples(index=False), key=lambda r: r.source in ("nvml", "sysman")):
            out.update(row.details or {})
        return out

    def device_name(self, device: str) -> str | None:
        if self.devices.empty:
            return None
        rows = self.devices[self.devices["device"] == device]
        phys = rows[rows["source"].isin(["nvml", "sysman", "host"])]
        rows = phys if not phys.empty else rows
        return None if rows.empty else str(rows["name"].iloc[0])

    def device_total(self, device: str) -> int | None:
        if self.devices.empty:
            return None
        tot = self.devices.loc[self.devices["device"] == device, "total_bytes"].dropna()
        return int(tot.iloc[0]) if len(tot) else None

    def close(self) -> None:
        """Close a store this Recording opened itself (from a path)."""
        if self.store is not None and self.path is not None:
            self.store.close()


def load(source: Store | Recorder | Recording | str | os.PathLike[str], start: float | None = None,
         end: float | None = None, *, max_points: int = 5000) -> Recording:
    """Read a recording (or a window of it) into frames, at display resolution: at most about
    ``max_points`` per series (see ``Store.samples_for_display``). A Recording passes through
    (re-windowed when ``start``/``end`` are given, keeping what it verified); a path is opened
    read-only."""
    if isinstance(source, Recording):
        if (start is None and end is None) or (start, end) == (source.start, source.end):
            return source
        return Recording(source.samples, source.events, source.devices, source.meta, source.diagnostics,
                         start=start, end=end, path=source.path, store=source.store,
                         _series=source._series, _verified=source._verified)
    path = None
    if isinstance(source, Recorder):
        store = source.store
    elif isinstance(source, Store):
        store = source
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        store = Store.open(path)
    else:
        raise TypeError(f"expected a Store, Recorder, Recording or path, got {type(source).__name__}")
    meta = store.meta()
    carry = 3.0 * float(meta.get("heartbeat_s") or 1.0)
    samples = store.samples_for_display(start, end, max_points=max_points,
                                        carry_s=None if start is None else carry)
    for col in ("device", "source", "metric"):
        samples[col] = samples[col].astype("category")
    return Recording(samples=samples, events=store.events(start=start, end=end), devices=store.devices(),
                     meta=meta, diagnostics=store.diagnostics(), start=start, end=end, path=path,
                     store=store)


# -- helpers ---------------------------------------------------------------------------------
def _tz_offset_s(t: float) -> float:
    """Local UTC offset at ``t``: plotly date axes show numbers (ms since epoch) as UTC."""
    lt = time.localtime(t)
    return float(lt.tm_gmtoff or 0)


def _x(t: np.ndarray | float, offset: float) -> np.ndarray | float:
    return (np.asarray(t, dtype=np.float64) + offset) * 1000.0 if isinstance(t, np.ndarray) \
        else (float(t) + offset) * 1000.0


def _unit(peak: float) -> tuple[float, str]:
    return (GiB, "GiB") if peak >= GiB else (MiB, "MiB")


def _lean_template() -> str:
    """plotly_white cut to what these charts use, registered once as ``memsaver_white``.

    Plotly deep-copies a template into every figure: the full plotly_white (colour scales, 3-D,
    geo, ...) costs 10-20 ms a figure here, and the live page builds three a refresh."""
    import plotly.io as pio

    name = "memsaver_white"
    if name not in pio.templates:
        full = pio.templates["plotly_white"].to_plotly_json()
        keep = ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor",
                "plot_bgcolor", "xaxis", "yaxis", "shapedefaults", "annotationdefaults", "title")
        pio.templates[name] = go.layout.Template(
            layout={k: v for k, v in full["layout"].items() if k in keep},
            data={k: v for k, v in full["data"].items() if k in ("scatter", "bar", "table")})
    return name


def _figure(data: Any = None) -> go.Figure:
    """A figure with the (lean) white template, set at construction (cheaper than after)."""
    return go.Figure(data=data, layout={"template": _lean_template()})


def _empty(title: str, message: str, height: int = 320) -> go.Figure:
    fig = _figure()
    fig.update_layout(title=title, height=height,
                      xaxis={"visible": False}, yaxis={"visible": False})
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"size": 14, "color": "#555"})
    return fig


def _verdicts_by_event(rec: Recording) -> dict[tuple[int, str], str]:
    """(event_id, device) -> verdict (several physical series on one device: joined, unique)."""
    ver = rec.verification
    out: dict[tuple[int, str], list[str]] = {}
    if ver is None or ver.empty:
        return {}
    for eid, dev, verdict in zip(ver["event_id"], ver["device"], ver["verdict"], strict=False):
        out.setdefault((int(eid), str(dev)), [])
        if verdict not in out[(int(eid), str(dev))]:
            out[(int(eid), str(dev))].append(str(verdict))
    return {k: " / ".join(v) for k, v in out.items()}


def event_label(ev: Any, verdict: str | None = None) -> str:
    """'pause kv_cache · 7.1 ms · ok' (failed calls: 'pause weights · FAILED: <error>')."""
    tags = tags_text(ev.tags)
    if ev.action == "mark":
        tags = str((ev.details or {}).get("label", tags)) if isinstance(ev.details, dict) else tags
    text = f"{ev.action} {tags}"
    dur = ev.duration if ev.duration == ev.duration else None  # NaN while running
    if not ev.ok:
        return f"{text} · FAILED: {str(ev.error or '')[:60]}"
    text += f" · {format_duration(dur)}" if dur is not None else " · running"
    return f"{text} · {verdict}" if verdict else text


def _event_decor(rec: Recording, devices: Sequence[str], offset: float, span_s: float,
                 peaks: dict[str, float], scale: float) -> tuple[list[dict], list[dict], list[go.Scatter]]:
    """Bands (shapes), labels (annotations) and hover markers for events.

    One band per event spanning every row (``yref="paper"`` on the shared x axis: Plotly
    validates each shape, so one per event per row cost 0.64 s for 120 events x 8 GPUs against
    0.07 s); labels and hover markers per row, since verdicts are per device."""
    ev = rec.events
    if ev.empty:
        return [], [], []
    ev = ev[ev["action"].isin(["pause", "resume", "allocate", "free", "mark"])]
    verdicts = _verdicts_by_event(rec)
    min_w = max(span_s * 0.004, 1e-3)  # a 7 ms pause must still be visible on a 60 s chart
    shapes: list[dict] = []
    notes: list[dict] = []
    markers: list[go.Scatter] = []
    label_text = len(ev) <= _MAX_EVENT_LABELS
    rows = list(ev.itertuples(index=False))
    colors = [(_ACTION_COLORS.get(e.action, "#7f7f7f") if e.ok else "#d62728") for e in rows]
    for e, color in zip(rows, colors, strict=True):
        t0 = float(e.t_start)
        t1 = float(e.t_end) if e.t_end == e.t_end and e.t_end is not None else (rec.t_last or t0)
        shapes.append({"type": "rect", "xref": "x", "yref": "paper",
                       "x0": _x(t0, offset), "x1": _x(max(t1, t0 + min_w), offset), "y0": 0, "y1": 1,
                       "fillcolor": color, "opacity": 0.18 if e.action in ("pause", "resume") else 0.1,
                       "line": {"width": 0}, "layer": "below"})
    xs = np.asarray([_x(float(e.t_start), offset) for e in rows])
    for row, dev in enumerate(devices, start=1):
        axis = "" if row == 1 else str(row)
        texts = []
        for k, (e, color) in enumerate(zip(rows, colors, strict=True)):
            verdict = verdicts.get((int(e.id), dev)) if e.action in ("pause", "resume") else None
            label = event_label(e, verdict)
            if label_text:
                notes.append({"xref": f"x{axis}", "yref": f"y{axis} domain", "x": xs[k],
                              "y": 0.98 - 0.09 * (k % 4), "xanchor": "left", "yanchor": "top",
                              "text": label, "showarrow": False,
                              "font": {"size": 10, "color": VERDICT_COLORS.get(verdict or "", color)},
                              "bgcolor": "rgba(255,255,255,0.7)"})
            texts.append(label)
        top = peaks.get(dev, 0.0) / scale * 1.04
        markers.append(go.Scatter(
            x=xs, y=np.full(len(xs), top), mode="markers", name="events",
            legendgroup="events", showlegend=row == 1, marker={"symbol": "triangle-down", "size": 9,
                                                               "color": colors},
            text=texts, hovertemplate="%{text}<br>%{x|%H:%M:%S.%L}<extra></extra>",
            xaxis=f"x{axis}", yaxis=f"y{axis}"))
    return shapes, notes, markers


# -- figures ---------------------------------------------------------------------------------
def timeline(source: Any, *, start: float | None = None, end: float | None = None,
             devices: Sequence[str] | None = None, max_points: int = 5000,
             title: str | None = "Physical memory vs allocator accounting",
             height: int | None = None) -> go.Figure:
    """Per device: physical used (named by its source), accounting (torch/saver/tms allocated
    and reserved), mem_get_info, the device total as a ceiling, and events as shaded bands
    labelled with tags, call duration and verdict.

    >>> fig = timeline("recording.sqlite")              # doctest: +SKIP
    """
    rec = load(source, start, end, max_points=max_points)
    series = rec.series
    devs = [d for d in frames.devices_in(series) if devices is None or d in devices]
    devs = [d for d in devs if any(frames.series_role(k) for k in series if k[0] == d)]
    if not devs:
        return _empty(title or "", "No samples recorded yet." if rec.samples.empty
                      else "No memory series for the chosen devices.")
    my_pid = rec.meta.get("pid")
    until = rec.t_last
    draw: list[tuple[int, str, SeriesKey, frames.SeriesRole, np.ndarray, np.ndarray]] = []
    peaks: dict[str, float] = {}
    for row, dev in enumerate(devs, start=1):
        details = rec.device_details(dev)
        phys = frames.physical_keys(series, dev, pid=my_pid)
        others = [k for k in series if k[0] == dev and k not in phys]
        for key in [*phys, *others]:
            role = frames.series_role(key, details)
            if role is None or (role.role == "physical" and key not in phys):
                continue
            t, v = frames.display_arrays(*series[key], start=rec.start, end=rec.end, until=until,
                                         hold_s=rec.hold_s, max_points=max_points)
            if len(t) == 0:
                continue
            draw.append((row, dev, key, role, t, v))
            if role.role != "total" and np.isfinite(v).any():
                peaks[dev] = max(peaks.get(dev, 0.0), float(np.nanmax(v)))
    if not draw:
        return _empty(title or "", "No samples in this window.")
    scale, unit = _unit(max(peaks.values(), default=0.0))
    offset = _tz_offset_s(float(draw[0][4][0]))
    names = [rec.device_name(d) for d in devs]
    fig = make_subplots(rows=len(devs), cols=1, shared_xaxes=True, vertical_spacing=0.08, figure=_figure(),
                        subplot_titles=[f"{d} — {n}" if n else d for d, n in zip(devs, names, strict=True)])
    multi = len(devs) > 1
    n_phys: dict[str, int] = {}
    for row, dev, key, role, t, v in draw:
        name = f"{dev}: {role.label}" if multi else role.label
        line: dict[str, Any] = {"shape": "hv"}
        visible: bool | str = True
        if role.role == "physical":
            i = n_phys.get(dev, 0)
            n_phys[dev] = i + 1
            line.update(color=_PHYSICAL_COLORS[i % len(_PHYSICAL_COLORS)], width=2.5)
        elif role.role == "accounting":
            color, dash = _ACCOUNTING_STYLE.get((key[1], key[2]), ("#d62728", "dash"))
            line.update(color=color, dash=dash, width=2)
        elif role.role == "context":
            line.update(color="#2ca02c", dash="dot", width=1.5)
        else:  # total: a ceiling; hidden (legend only) when it would flatten everything else
            line.update(color="#7f7f7f", dash="dashdot", width=1)
            if np.nanmax(v) > 4 * peaks.get(dev, 0.0):
                visible = "legendonly"
        fig.add_trace(go.Scatter(
            x=_x(t, offset), y=v / scale, mode="lines", name=name, line=line, visible=visible,
            legendgroup=f"{dev}/{role.role}", connectgaps=False,
            hovertemplate=f"%{{y:.3f}} {unit}<br>%{{x|%H:%M:%S.%L}}<extra>{name}</extra>",
        ), row=row, col=1)
    for row in range(1, len(devs) + 1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
        fig.update_xaxes(type="date", row=row, col=1)
    t_first = min(float(d[4][0]) for d in draw)
    t_end = max(float(d[4][-1]) for d in draw)
    shapes, notes, markers = _event_decor(rec, devs, offset, max(t_end - t_first, 1e-3), peaks, scale)
    for m in markers:
        fig.add_trace(m)
    fig.update_layout(
        title=title, height=height or 260 + 260 * len(devs),
        hovermode="x unified", uirevision="timeline", legend={"orientation": "h", "y": -0.12},
        margin={"t": 70, "b": 40, "l": 60, "r": 20},
        # as plain dicts: re-assigning plotly objects (the subplot titles) re-validates them slowly
        shapes=shapes, annotations=[a.to_plotly_json() for a in fig.layout.annotations] + notes,
    )
    return fig


def _gap_frames(rec: Recording) -> dict[str, tuple[pd.DataFrame, str, str]]:
    """device -> (frame of physical, accounting, gap; physical label; accounting label)."""
    out = {}
    series = rec.series
    for dev in frames.devices_in(series):
        acc = frames.primary_accounting_key(series, dev)
        phys = frames.physical_keys(series, dev, pid=rec.meta.get("pid"))
        if acc is None or not phys:
            continue
        details = rec.device_details(dev)
        p = frames.window_series(*series[phys[0]], rec.start, rec.end)
        a = frames.window_series(*series[acc], rec.start, rec.end)
        df = frames.gap_frame(p, a)
        out[dev] = (df, frames.series_label(phys[0], details), frames.series_label(acc, details))
    return out


def gap(source: Any, *, start: float | None = None, end: float | None = None, max_points: int = 5000,
        title: str | None = "Accounting minus physical (what the allocator claims but the device "
                            "no longer holds)") -> go.Figure:
    """Per device: accounting minus physical over time, relative to the first moment both were
    read (the CUDA context, the interpreter, other processes are physical but never accounted).
    It rises by what a pause releases and falls back on resume."""
    rec = load(source, start, end, max_points=max_points)
    gaps = _gap_frames(rec)
    if not gaps:
        return _empty(title or "", "Needs a physical and an accounting series on one device "
                      "(e.g. NVML + torch, or host RSS + saver).")
    peak = max((float(np.nanmax(np.abs(df["gap"]))) for df, _, _ in gaps.values()
                if df["gap"].notna().any()), default=0.0)
    scale, unit = _unit(peak)
    fig = _figure()
    offset = None
    until = rec.t_last
    for dev, (df, plabel, alabel) in gaps.items():
        t = df.index.to_numpy(dtype=np.float64)
        v = df["gap"].to_numpy(dtype=np.float64)
        t, v = frames.display_arrays(t, v, until=until, hold_s=rec.hold_s, max_points=max_points)
        if len(t) == 0:
            continue
        offset = _tz_offset_s(float(t[0])) if offset is None else offset
        name = f"{dev}: {alabel.removesuffix(' (accounting)')} − {plabel}"
        fig.add_trace(go.Scatter(x=_x(t, offset), y=v / scale, mode="lines", name=name,
                                 line={"shape": "hv", "width": 2}, fill="tozeroy", connectgaps=False,
                                 hovertemplate=f"%{{y:.3f}} {unit}<br>%{{x|%H:%M:%S.%L}}"
                                               f"<extra>{dev}</extra>"))
    if offset is not None and not rec.events.empty:
        span = max(float((until or 0) - rec.samples["t"].iloc[0]), 1e-3)
        shapes, _, _ = _event_decor(rec, ["_"], offset, span, {}, 1.0)
        fig.update_layout(shapes=shapes)
    fig.update_layout(title=title, height=380, hovermode="x unified",
                      uirevision="gap", yaxis_title=f"{unit} (relative to start)",
                      xaxis={"type": "date"},
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 60, "b": 40, "l": 60, "r": 20})
    return fig


def accounting_summary(source: Any, *, start: float | None = None, end: float | None = None) -> pd.DataFrame:
    """Per device, now (the end of the window): physical_bytes and its source, accounting_bytes
    and its source, released_bytes (accounting minus physical relative to the start: what the
    allocator claims but the device no longer holds) and a one-line explanation."""
    rec = load(source, start, end)
    series = rec.series
    gaps = _gap_frames(rec)
    rows = []
    for dev in frames.devices_in(series):
        details = rec.device_details(dev)
        phys = frames.physical_keys(series, dev, pid=rec.meta.get("pid"))
        acc = frames.primary_accounting_key(series, dev)
        if not phys and acc is None:
            continue

        def last(key: SeriesKey | None) -> int | None:
            if key is None:
                return None
            v = frames.last_value(*frames.window_series(*series[key], rec.start, rec.end))
            return None if v is None else int(v)

        released = None
        if dev in gaps:
            g = gaps[dev][0]["gap"]
            released = None if g.empty or pd.isna(g.iloc[-1]) else int(g.iloc[-1])
        rows.append({
            "device": dev, "name": rec.device_name(dev),
            "physical_bytes": last(phys[0]) if phys else None,
            "physical_source": frames.series_label(phys[0], details) if phys else None,
            "accounting_bytes": last(acc),
            "accounting_source": frames.series_label(acc, details) if acc else None,
            "released_bytes": released,
            "explanation": frames.explain_backend(dev),
        })
    cols = ["device", "name", "physical_bytes", "physical_source", "accounting_bytes",
            "accounting_source", "released_bytes", "explanation"]
    df = pd.DataFrame(rows, columns=cols)
    for c in ("physical_bytes", "accounting_bytes", "released_bytes"):
        df[c] = df[c].astype("Int64")
    return df


def verification(source: Any, *, start: float | None = None, end: float | None = None,
                 title: str | None = "Did it really release? (per pause/resume and physical series)"
                 ) -> go.Figure:
    """collectors.verification.verify as a table: expected vs measured change, lag, verdict."""
    rec = load(source, start, end)
    ver = rec.verification
    if ver is None:
        return _empty(title or "", rec.verification_error or "verification unavailable", height=240)
    if ver.empty:
        return _empty(title or "", "No pause or resume to verify yet.", height=240)
    table = verification_table(ver)
    cols = {c: table[c].tolist() for c in FIGURE_VERIFICATION_COLUMNS}
    colors = [VERDICT_COLORS.get(v, "#7f7f7f") for v in cols["verdict"]]
    fill = [["white"] * len(colors)] * (len(cols) - 2) + [[c + "33" for c in colors], ["white"] * len(colors)]
    fig = _figure(go.Table(
        columnwidth=[40, 55, 90, 55, 120, 75, 90, 65, 70, 80, 260],
        header={"values": [f"<b>{c}</b>" for c in cols], "fill_color": "#f0f0f0", "align": "left"},
        cells={"values": list(cols.values()), "align": "left", "fill_color": fill, "height": 24},
    ))
    fig.update_layout(title=title, height=min(160 + 30 * len(ver), 900),
                      margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


# What the verification figure shows, in order (the report and the app pick their own).
FIGURE_VERIFICATION_COLUMNS = ["event", "action", "tags", "device", "measured by", "expected",
                               "measured change", "call took", "visible after", "verdict", "note"]


def verification_table(ver: pd.DataFrame) -> pd.DataFrame:
    """collectors.verification.verify rows formatted for reading: the one formatter behind the
    verification figure, the HTML report and the app's table."""
    return pd.DataFrame({
        "event": [f"#{int(i)}" for i in ver["event_id"]],
        "action": ver["action"].astype(str).tolist(),
        "tags": [tags_text(t) for t in ver["tags"]],
        "target": ver["target"].astype(str).tolist(),
        "device": ver["device"].astype(str).tolist(),
        "measured by": [f"{s}/{m}" + (f" pid {int(p)}" if as_number(p) is not None else "")
                        for s, m, p in zip(ver["source"], ver["metric"], ver["pid"], strict=False)],
        "expected": [format_bytes(as_number(v)) for v in ver["expected_bytes"]],
        "before": [format_bytes(as_number(v)) for v in ver["before_bytes"]],
        "after": [format_bytes(as_number(v)) for v in ver["after_bytes"]],
        "measured change": [format_bytes(as_number(v), signed=True) for v in ver["change_bytes"]],
        "call took": [format_duration(as_number(v)) for v in ver["duration_s"]],
        "visible after": [format_duration(as_number(v)) for v in ver["lag_s"]],
        "verdict": ver["verdict"].astype(str).tolist(),
        "note": ver["note"].astype(str).tolist(),
    }, index=ver.index)


def tags_text(tags: Any) -> str:
    """Tags as one string: lists (events) and comma strings (verification) alike; empty = all."""
    if isinstance(tags, (list, tuple, np.ndarray)):
        tags = ", ".join(str(t) for t in tags)
    text = "" if tags is None or (isinstance(tags, float) and math.isnan(tags)) else str(tags)
    return text.replace(",", ", ").replace(",  ", ", ") if text else "all tags"


def as_number(v: Any) -> float | None:
    """A float, or None for None/NaN/pd.NA/non-numbers (missing stays missing, never 0)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def release_latency(source: Any, *, start: float | None = None, end: float | None = None,
                    title: str | None = "Release / resume latency: the call vs when the physical "
                                        "change showed") -> go.Figure:
    """Per pause/resume: how long the call took, and when the physical change first showed
    (lag from the call's start to the first sample with >= half the expected change)."""
    rec = load(source, start, end)
    ver = rec.verification
    if ver is None:
        return _empty(title or "", rec.verification_error or "verification unavailable", height=300)
    if ver.empty:
        return _empty(title or "", "No pause or resume yet.", height=300)
    labels = [f"#{int(i)} {a} {tags_text(t)}"
              for i, a, t in zip(ver["event_id"], ver["action"], ver["tags"], strict=False)]
    multi_dev = ver["device"].nunique() > 1
    if multi_dev:
        labels = [f"{lab} · {d}" for lab, d in zip(labels, ver["device"], strict=False)]
    dur_ms = ver["duration_s"].astype("float64").to_numpy() * 1e3
    lag_ms = ver["lag_s"].astype("float64").to_numpy() * 1e3
    fig = _figure()
    fig.add_trace(go.Bar(x=labels, y=dur_ms, name="call duration", marker_color="#7f7f7f",
                         text=[format_duration(as_number(v / 1e3)) for v in dur_ms], textposition="outside",
                         hovertemplate="%{x}<br>call took %{y:.1f} ms<extra></extra>"))
    lag_colors = [VERDICT_COLORS.get(str(v), "#1f77b4") for v in ver["verdict"]]
    lag_text = [format_duration(as_number(v / 1e3)) if v == v else f"never ({verdict})"
                for v, verdict in zip(lag_ms, ver["verdict"], strict=False)]
    fig.add_trace(go.Bar(x=labels, y=np.nan_to_num(lag_ms, nan=0.0), name="physical change visible after",
                         marker_color=lag_colors, text=lag_text, textposition="outside",
                         customdata=np.asarray(ver["verdict"].astype(str)),
                         hovertemplate="%{x}<br>visible after %{text}<br>verdict %{customdata}"
                                       "<extra></extra>"))
    finite = np.concatenate([dur_ms[np.isfinite(dur_ms) & (dur_ms > 0)],
                             lag_ms[np.isfinite(lag_ms) & (lag_ms > 0)]])
    log = len(finite) > 1 and finite.max() / max(finite.min(), 1e-3) > 100
    fig.update_layout(title=title, barmode="group", height=420,
                      yaxis={"title": "milliseconds" + (" (log)" if log else ""),
                             "type": "log" if log else "linear"},
                      legend={"orientation": "h", "y": -0.35}, margin={"t": 60, "b": 40, "l": 60, "r": 20})
    return fig
