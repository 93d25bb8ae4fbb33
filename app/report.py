"""A standalone HTML report of a recording: one file, plotly.js inlined, opens offline.

Charts (timeline, gap, release latency), the verification table, what happened in words, the
events, and the environment (host, tool version, devices, driver, which source measured physical
memory, recording settings), so it can be emailed to someone without Python.

>>> from app.report import write_report
>>> write_report("recording.sqlite", "report.html")        # doctest: +SKIP
PosixPath('report.html')
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app import charts, frames
from app.charts import as_number
from collectors import __version__
from collectors.units import format_bytes, format_duration

__all__ = ["write_report", "render_report", "environment_rows", "narrative"]

_CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1200px;color:#222;padding:0 16px}
h1{margin-bottom:4px} h2{margin-top:36px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin-top:0} table{border-collapse:collapse;margin:8px 0;font-size:14px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-weight:600;border-radius:3px;padding:1px 6px;color:#fff}
ul.story li{margin:4px 0} .note{color:#666;font-size:13px}
"""
_ENV_ID = "environment"


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _time(t: Any) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(t)).astimezone().isoformat(timespec="milliseconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "n/a"


def _table(headers: list[str], rows: list[list[Any]], *, table_id: str | None = None,
           raw_cols: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if i in raw_cols else _e(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows)
    ident = f' id="{table_id}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict_badge(v: str) -> str:
    color = charts.VERDICT_COLORS.get(v, "#7f7f7f")
    return f'<span class="verdict" style="background:{color}">{_e(v)}</span>'


def environment_rows(rec: charts.Recording) -> list[list[Any]]:
    """(item, value) rows: host, tool versions, recording settings, sources, devices, driver,
    which source measured physical memory, and any ``environment`` the recorder stored in meta."""
    meta = rec.meta
    rows: list[list[Any]] = [
        ["host", meta.get("host")],
        ["tool version (recording)", f"memsaver-dashboard {meta.get('tool_version', 'n/a')}"],
        ["tool version (report)", f"memsaver-dashboard {__version__}"],
        ["recording file", rec.path or getattr(rec.store, "path", None)],
        ["schema version", meta.get("schema_version")],
        ["started", _time(meta.get("started_at"))],
        ["stopped", _time(meta.get("stopped_at")) if meta.get("stopped_at") else "still recording"],
        ["recorder pid", meta.get("pid")],
        ["storage", f"{meta.get('storage', 'n/a')} (heartbeat {meta.get('heartbeat_s', 'n/a')} s)"],
        ["sources", ", ".join(meta.get("sources") or []) or "n/a"],
        ["poll intervals", ", ".join(f"{k} {format_duration(v)}" for k, v in
                                     (meta.get("intervals") or {}).items()) or "n/a"],
    ]
    for name, reason in (meta.get("skipped") or {}).items():
        rows.append([f"source {name} skipped", reason])
    env = meta.get("environment") or {}
    for k, v in env.items() if isinstance(env, dict) else ():
        rows.append([k, v if isinstance(v, str) else json.dumps(v, default=str)])
    for k, v in meta.items():  # anything else a scenario or agent stored (e.g. the target)
        if k in {"host", "tool_version", "schema_version", "started_at", "stopped_at", "pid", "storage",
                 "heartbeat_s", "sources", "intervals", "skipped", "environment", "stats",
                 "flush_interval_s"}:
            continue
        rows.append([k, v if isinstance(v, str) else json.dumps(v, default=str)])
    return rows


def _device_rows(rec: charts.Recording) -> list[list[Any]]:
    series = rec.series
    rows = []
    for d in rec.devices.itertuples(index=False):
        details = d.details or {}
        phys = frames.physical_keys(series, d.device, pid=rec.meta.get("pid"))
        measured = frames.series_label(phys[0], rec.device_details(d.device)) if phys else "n/a"
        rows.append([d.device, d.source, d.name, d.uuid or "", format_bytes(as_number(d.total_bytes)),
                     details.get("driver_version", ""), details.get("used_semantics", ""), measured])
    return rows


def _stats_rows(meta: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for name, st in (meta.get("stats") or {}).items():
        rows.append([name, format_duration(as_number(st.get("interval_s"))), st.get("ticks"),
                     st.get("missed_ticks"), st.get("samples_stored"), st.get("errors"),
                     format_duration(as_number(st.get("read_latency_p50_s"))),
                     format_duration(as_number(st.get("read_latency_p99_s")))])
    return rows


def _accounting_change(rec: charts.Recording, device: str, t0: float, t1: float) -> tuple[str, float] | None:
    """(label, bytes moved) of the device's primary accounting series between t0 and t1."""
    key = frames.primary_accounting_key(rec.series, device)
    if key is None:
        return None
    t, v = rec.series[key]
    before = frames.window_series(t, v, None, t0)[1]
    after = frames.window_series(t, v, None, t1)[1]
    if not len(before) or not len(after) or before[-1] != before[-1] or after[-1] != after[-1]:
        return None
    return frames.series_label(key).removesuffix(" (accounting)"), float(after[-1]) - float(before[-1])


def narrative(rec: charts.Recording, *, settle_s: float = 1.0) -> list[str]:
    """One plain sentence per verified pause/resume (what a stakeholder reads first), with what
    the allocator's accounting did meanwhile (the point: it stays flat)."""
    ver = rec.verification
    if ver is None:
        return [f"Verification could not run: {rec.verification_error}."]
    if ver.empty:
        return ["No pause or resume was recorded."]
    out = []
    for r in ver.itertuples(index=False):
        tags = charts.tags_text(r.tags)
        verb = "released" if r.action == "pause" else "re-committed"
        what = f"{r.action.capitalize()} of {tags} on {r.device} (measured by {r.source}/{r.metric})"
        if r.verdict == "call failed":
            out.append(f"{what}: the call failed — {r.note}.")
            continue
        lag = as_number(r.lag_s)
        shown = f", visible after {format_duration(lag)}" if lag is not None else ""
        sentence = (f"{what}: expected {format_bytes(as_number(r.expected_bytes))} {verb}, measured "
                    f"{format_bytes(as_number(r.change_bytes), signed=True)} (call took "
                    f"{format_duration(as_number(r.duration_s))}{shown}) — {r.verdict}.")
        t1 = float(r.t_start) + (as_number(r.duration_s) or 0.0) + settle_s
        acc = _accounting_change(rec, r.device, float(r.t_start), t1)
        if acc is not None:
            label, moved = acc
            sentence += (f" Meanwhile {label} moved {format_bytes(moved, signed=True)}"
                         + (" (flat, as expected)." if abs(moved) < 1 else "."))
        out.append(sentence)
    return out


def _figure_html(fig: go.Figure, first: bool, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=True if first else False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def render_report(source: Any, *, title: str = "memsaver report: physical memory vs accounting") -> str:
    """The report as one HTML string (see :func:`write_report`)."""
    rec = charts.load(source)
    summary = charts.accounting_summary(rec)
    figs = [("timeline", "Memory over time", charts.timeline(rec, title=None)),
            ("gap", "Accounting minus physical", charts.gap(rec, title=None)),
            ("latency", "Release / resume latency", charts.release_latency(rec, title=None))]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{_e(title)}</h1>"]
    meta = rec.meta
    duration = (meta.get("stopped_at") or rec.t_last or 0) - (meta.get("started_at") or 0)
    parts.append(f"<p class='sub'>Recorded on {_e(meta.get('host'))}, {_e(_time(meta.get('started_at')))}"
                 f" for {_e(format_duration(duration if meta.get('started_at') else None))}; "
                 f"{len(rec.samples):,} samples, {len(rec.events)} events.</p>")
    parts.append("<h2>What happened</h2><ul class='story'>"
                 + "".join(f"<li>{_e(s)}</li>" for s in narrative(rec)) + "</ul>")
    if not summary.empty:
        rows = [[r.device, r.name, format_bytes(as_number(r.physical_bytes)), r.physical_source,
                 format_bytes(as_number(r.accounting_bytes)), r.accounting_source,
                 format_bytes(as_number(r.released_bytes)), r.explanation]
                for r in summary.itertuples(index=False)]
        parts.append("<h2>At the end of the recording</h2>" + _table(
            ["device", "name", "physical", "measured by", "accounting", "accounting source",
             "accounted but not held", "why they differ"], rows, table_id="summary"))
    for i, (ident, heading, fig) in enumerate(figs):
        parts.append(f"<h2>{_e(heading)}</h2>")
        if i == 1:
            parts.append("<p class='note'>Relative to the first moment both series were read: it "
                         "rises by what a pause releases and falls back on resume.</p>")
        parts.append(_figure_html(fig, i == 0, f"chart-{ident}"))
    parts.append("<h2>Verification</h2>")
    ver = rec.verification
    if ver is None:
        parts.append(f"<p>{_e(rec.verification_error)}</p>")
    elif ver.empty:
        parts.append("<p>No pause or resume to verify.</p>")
    else:
        cols = ["event", "action", "tags", "target", "device", "measured by", "expected", "before",
                "after", "measured change", "call took", "visible after", "verdict", "note"]
        table = charts.verification_table(ver)[cols]
        table["verdict"] = table["verdict"].map(_verdict_badge)
        parts.append(_table(["change" if c == "measured change" else c for c in cols],
                            table.values.tolist(), table_id="verification", raw_cols={12}))
    if not rec.events.empty:
        rows = [[f"#{int(e.id)}", _time(e.t_start), e.action, charts.tags_text(e.tags), e.target, e.origin,
                 format_duration(as_number(e.duration)), "ok" if e.ok else f"failed: {e.error}",
                 format_bytes(as_number(e.expected_bytes))] for e in rec.events.itertuples(index=False)]
        parts.append("<h2>Events</h2>" + _table(
            ["event", "start", "action", "tags", "target", "origin", "took", "result", "expected bytes"],
            rows, table_id="events"))
    parts.append("<h2>Environment</h2>" + _table(["item", "value"], environment_rows(rec), table_id=_ENV_ID))
    dev_rows = _device_rows(rec)
    if dev_rows:
        parts.append("<h3>Devices</h3>" + _table(
            ["device", "source", "name", "uuid", "total", "driver", "used semantics",
             "physical memory measured by"], dev_rows, table_id="devices"))
    stats = _stats_rows(meta)
    if stats:
        parts.append("<h3>Recorder</h3>" + _table(
            ["source", "interval", "ticks", "missed ticks", "samples stored", "errors", "read p50",
             "read p99"], stats, table_id="recorder"))
    if not rec.diagnostics.empty:
        parts.append("<h3>Diagnostics</h3>" + _table(
            ["time", "source", "message"],
            [[_time(d.t), d.source, d.message] for d in rec.diagnostics.itertuples(index=False)],
            table_id="diagnostics"))
    parts.append(f"<p class='note'>Generated {_e(_time(pd.Timestamp.now().timestamp()))} by "
                 f"memsaver-dashboard {__version__}. Bytes in binary units (MiB, GiB); times local.</p>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(source: Any, path: str | os.PathLike[str], *,
                 title: str = "memsaver report: physical memory vs accounting") -> Path:
    """Write :func:`render_report` to ``path`` (parent directory must exist); returns the path."""
    out = Path(path)
    if not out.parent.exists():
        raise ValueError(f"{out.parent}: directory does not exist")
    if out.exists() and out.is_dir():
        raise ValueError(f"{out}: is a directory")
    text = render_report(source, title=title)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)  # never leave half a report behind
    return out
