"""Page sections shared by the live view and the replay of a recording: the same numbers, charts,
verification, diagnostics and downloads, whatever the data comes from.

Each function draws with ``st.*`` and reads through ``app.charts`` / Store methods only.
"""

from __future__ import annotations

import io
import math
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import streamlit as st

from app import charts
from collectors.store import Store
from collectors.units import format_bytes

__all__ = [
    "export_zip",
    "html_report",
    "render_charts",
    "render_device_tiles",
    "render_diagnostics",
    "render_downloads",
    "render_verification",
    "verification_frame",
    "summary_sentence",
]

def _missing(x: object) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def _value(row: pd.Series, col: str) -> float | None:
    v = row.get(col)
    return None if _missing(v) else float(v)  # type: ignore[arg-type]


def _who_says(accounting_source: object) -> str:
    """'torch allocated (accounting)' -> 'torch'; 'saver allocated (accounting)' -> 'the saver'."""
    if _missing(accounting_source):
        return "the allocator"
    who = str(accounting_source).split()[0]
    return {"saver": "the saver", "tms": "torch_memory_saver"}.get(who, who)


def _physical_name(physical_source: object) -> str:
    """'physical used (NVML v2)' -> 'used (NVML v2)'; 'physical: RSS of pid 4' -> 'RSS of pid 4'."""
    if _missing(physical_source):
        return "not measured"
    return str(physical_source).removeprefix("physical").lstrip(": ") or str(physical_source)


def summary_sentence(row: pd.Series) -> str:
    """'torch says 22.00 GiB · device holds 1.20 GiB · 20.80 GiB released'."""
    holder = "the process holds" if row.get("device") == "host" else "the device holds"
    holds = f"{holder} {format_bytes(_value(row, 'physical_bytes'))}"
    if _missing(row.get("accounting_source")):  # e.g. an engine: its allocator is in another process
        return f"{holds[0].upper()}{holds[1:]} · the allocator's accounting is not visible from here"
    released = _value(row, "released_bytes")
    return (f"{_who_says(row.get('accounting_source'))} says {format_bytes(_value(row, 'accounting_bytes'))}"
            f" · {holds}"
            f" · {format_bytes(max(released, 0.0)) if released is not None else 'n/a'} released")


def render_device_tiles(summary: pd.DataFrame) -> None:
    """Big numbers per device: accounting, physical, released, and why they differ."""
    if summary.empty:
        st.info("No memory readings yet: they appear within a second of the recorder starting.")
        return
    for _, row in summary.iterrows():
        device = str(row["device"])
        name = row.get("name")
        title = f"{device} — {name}" if not _missing(name) and name else device
        acc_src, phys_src = row.get("accounting_source"), row.get("physical_source")
        with st.container(border=True, key=f"tiles_{device.replace(':', '_')}"):
            st.markdown(f"#### {summary_sentence(row)}")
            c1, c2, c3 = st.columns(3)
            c1.metric("Accounting — not visible from here" if _missing(acc_src)
                      else f"Accounting — {_who_says(acc_src)} says",
                      format_bytes(_value(row, "accounting_bytes")),
                      help="what the allocator believes it holds: "
                           + ("its allocator runs in another process (torch accounting is read "
                              "in-process only)" if _missing(acc_src) else str(acc_src)))
            c2.metric(f"Physical — {_physical_name(phys_src)}",
                      format_bytes(_value(row, "physical_bytes")),
                      help="what the driver / OS says is really held: "
                           + ("none" if _missing(phys_src) else str(phys_src)))
            released = _value(row, "released_bytes")
            shown, why = format_bytes(released), ""
            if released is not None and released < 0:
                # Physical grew by more than the accounting (interpreter, caches): nothing released.
                shown, why = "none", f" (measured {format_bytes(released)}: more held than accounted for)"
            c3.metric("Released — claimed but not held", shown,
                      help="accounting minus physical, relative to when both were first read: what "
                           "the allocator thinks it holds but the device (or process) does not" + why)
            explanation = row.get("explanation")
            st.caption(f"{title}. " + (str(explanation) if not _missing(explanation) else ""))


def render_charts(source: charts.Recording, *, start: float | None, end: float | None, key: str) -> None:
    """Timeline, accounting-minus-physical gap and release latency, in tabs."""
    tab_timeline, tab_gap, tab_latency = st.tabs(
        ["Memory over time", "Accounting minus physical", "Release / resume latency"])
    with tab_timeline:
        st.plotly_chart(charts.timeline(source, start=start, end=end), key=f"{key}_timeline")
    with tab_gap:
        st.plotly_chart(charts.gap(source, start=start, end=end), key=f"{key}_gap")
    with tab_latency:
        st.plotly_chart(charts.release_latency(source), key=f"{key}_latency")


def verification_frame(rec: charts.Recording) -> pd.DataFrame:
    """collectors.verification.verify for a recording, formatted for reading, newest first."""
    df = rec.verification
    if df is None or df.empty:
        return pd.DataFrame()
    out = charts.verification_table(df)[["verdict", "action", "tags", "device", "measured by", "expected",
                                         "measured change", "call took", "visible after", "note"]]
    out["measured by"] = df["source"] + "/" + df["metric"]  # the tiles already name the pid
    return out.iloc[::-1].reset_index(drop=True)


def render_verification(rec: charts.Recording, *, key: str) -> None:
    st.markdown("**Did it really release?** One row per pause/resume and physical series, newest first.")
    if rec.verification is None:
        st.warning(rec.verification_error or "verification unavailable")
        return
    frame = verification_frame(rec)
    if frame.empty:
        st.caption("No pause or resume yet.")
        return
    # Colour, not emoji: a verdict must read the same in every browser and font.
    styled = frame.style.map(
        lambda v: f"background-color: {charts.VERDICT_COLORS.get(v, '#7f7f7f')}33; font-weight: 600",
        subset=["verdict"])
    st.dataframe(styled, hide_index=True, key=f"{key}_verification")


def render_diagnostics(diag: pd.DataFrame, skipped: dict[str, str] | None = None) -> None:
    """Warnings from the sources where a user looks (e.g. Sysman needs CAP_PERFMON)."""
    seen: set[str] = set()
    for name, reason in (skipped or {}).items():
        msg = f"{name}: not recorded — {reason}"
        seen.add(msg)
        st.warning(msg, icon="⚠️")
    for row in diag.itertuples(index=False):
        msg = f"{row.source}: {row.message}"
        if msg in seen or str(row.message).startswith("skipped:"):
            continue
        seen.add(msg)
        st.warning(msg, icon="⚠️")


def export_zip(store: Store, fmt: str) -> bytes:
    """Samples and events as two files in one zip (Store.export writes them side by side)."""
    with tempfile.TemporaryDirectory(prefix="memsaver-export-") as tmp:
        out = store.export(Path(tmp) / f"samples.{fmt}", fmt)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(out.parent.iterdir()):
                zf.write(f, f.name)
        return buf.getvalue()


def html_report(store: Store, title: str) -> bytes:
    from app.report import write_report

    with tempfile.TemporaryDirectory(prefix="memsaver-report-") as tmp:
        return write_report(store, Path(tmp) / "report.html", title=title).read_bytes()


def render_downloads(store: Store, *, stem: str, title: str, key: str) -> None:
    """CSV / Parquet (samples + events) and a standalone HTML chart, generated on click."""
    c1, c2, c3, c4 = st.columns(4)
    c1.download_button("CSV (.zip)", lambda: export_zip(store, "csv"), file_name=f"{stem}-csv.zip",
                       mime="application/zip", key=f"{key}_csv", on_click="ignore",
                       help="samples.csv and samples.events.csv")
    c2.download_button("Parquet (.zip)", lambda: export_zip(store, "parquet"),
                       file_name=f"{stem}-parquet.zip", mime="application/zip", key=f"{key}_parquet",
                       on_click="ignore", help="samples.parquet and samples.events.parquet")
    c3.download_button("Chart (standalone HTML)", lambda: html_report(store, title),
                       file_name=f"{stem}.html", mime="text/html", key=f"{key}_html",
                       on_click="ignore", help="one file with plotly.js inlined; opens offline")
    path = Path(store.path)
    if store.path != ":memory:" and path.is_file():
        c4.download_button("Recording (.sqlite)", lambda: path.read_bytes(), file_name=path.name,
                           mime="application/vnd.sqlite3", key=f"{key}_sqlite", on_click="ignore",
                           help="the recording itself: open it on the Recordings page")
