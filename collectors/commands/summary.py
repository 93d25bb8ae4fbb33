"""``memsaver summary``: what a recording holds, its recorder stats, events and verification."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math

import pandas as pd

from collectors.commands.record import format_stats
from collectors.store import Store
from collectors.units import format_bytes, format_duration

__all__ = ["register", "run", "summarize"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="summarise a recording: devices, series, events, verification")
    p.add_argument("file", help="recording file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _iso(t: float | None) -> str:
    if t is None:
        return "n/a"
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def summarize(store: Store) -> dict:
    from collectors.verification import verify

    meta = store.meta()
    series = store.series()
    samples = store.samples()
    last = samples.dropna(subset=["value"]).groupby(
        ["device", "source", "metric", "pid"], dropna=False)["value"].agg(["min", "max", "last"])
    ver = verify(store)
    return {
        "meta": meta, "devices": store.devices().to_dict("records"),
        "series": series.merge(last.reset_index(), how="left",
                               on=["device", "source", "metric", "pid"]).to_dict("records"),
        "events": store.events().to_dict("records"),
        "diagnostics": store.diagnostics().to_dict("records"),
        "verification": ver.to_dict("records"),
        "samples": int(len(samples)),
    }


def run(args: argparse.Namespace) -> int:
    with Store.open(args.file) as store:
        from collectors.verification import format_verification, verify

        if args.json:
            print(json.dumps(summarize(store), indent=2, default=_json_default))
            return 0
        meta = store.meta()
        start, stop = meta.get("started_at"), meta.get("stopped_at")
        print(f"recording {args.file}")
        print(f"  host {meta.get('host', 'n/a')}  tool {meta.get('tool_version', 'n/a')}  "
              f"schema v{meta.get('schema_version')}  storage {meta.get('storage')} "
              f"(heartbeat {meta.get('heartbeat_s')} s)")
        print(f"  started {_iso(start)}  "
              + (f"stopped {_iso(stop)} ({format_duration(stop - start)})" if start and stop
                 else "not stopped cleanly (recorder killed or still running)"))
        print(f"  sources {', '.join(meta.get('sources', []))}"
              + "".join(f"; skipped {k}: {v}" for k, v in (meta.get("skipped") or {}).items()))
        print("devices")
        for d in store.devices().itertuples():
            print(f"  {d.device:9s} {d.source:7s} {d.name}  total {format_bytes(d.total_bytes)}")
        print("series")
        samples = store.samples()
        for key, g in samples.groupby(["device", "source", "metric", "pid"], dropna=False, sort=False):
            device, source, metric, pid = key
            v = g["value"].dropna()
            gaps = int(g["value"].isna().sum())
            label = f"{device}/{source}/{metric}" + ("" if pd.isna(pid) else f"/pid {pid}")
            print(f"  {label:44s} rows {len(g):7d}  min {format_bytes(v.min() if len(v) else None):>10s}"
                  f"  max {format_bytes(v.max() if len(v) else None):>10s}"
                  f"  last {format_bytes(v.iloc[-1] if len(v) else None):>10s}"
                  + (f"  gaps {gaps}" if gaps else ""))
        if meta.get("stats"):
            print("recorder")
            print("  " + format_stats(meta["stats"], store.sample_count()).replace("\n", "\n  "))
        events = store.events()
        if len(events):
            print("events")
            for e in events.itertuples():
                print(f"  {_iso(e.t_start)} {e.action:7s} {','.join(e.tags) or 'all tags':24s} "
                      f"{format_duration(e.duration):>9s} {'ok' if e.ok else 'FAILED: ' + str(e.error)}"
                      f"  [{e.target}]")
            print("verification")
            print("  " + format_verification(verify(store)).replace("\n", "\n  "))
        diags = store.diagnostics()
        if len(diags):
            print("diagnostics")
            for d in diags.itertuples():
                print(f"  {_iso(d.t)} {d.source}: {d.message}")
    return 0


def _json_default(o: object) -> object:
    if o is pd.NA:
        return None
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
