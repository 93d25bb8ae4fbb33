"""``memsaver record``: poll sources into a recording file until a duration or Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from collectors.cli import CliError
from collectors.recorder import Recorder
from collectors.sources import DEFAULT_SOURCES, REGISTRY, make_source
from collectors.store import Store
from collectors.units import format_duration, parse_duration

__all__ = ["register", "run", "format_stats"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="record memory samples to a SQLite file")
    p.add_argument("--out", required=True, help="recording file to create (must not exist)")
    p.add_argument("--interval", action="append", default=[], metavar="[SOURCE=]DURATION",
                   help="sampling interval, e.g. 20ms (all sources) or sysman=200ms; repeatable. "
                        "Default: each source's own (host/nvml 20ms, torch 100ms, sysman 200ms)")
    p.add_argument("--duration", help="stop after this long, e.g. 30s (default: until Ctrl-C)")
    p.add_argument("--sources", help=f"comma-separated sources (default: those of "
                                     f"{','.join(DEFAULT_SOURCES)} that are available)")
    p.add_argument("--pid", type=int, action="append", default=[],
                   help="also record this process's RSS (host source); repeatable")
    p.add_argument("--heartbeat", default="1s", help="store an unchanged value at least this often")
    p.add_argument("--every-tick", action="store_true", help="store every sample, not only changes")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=run)


def _intervals(specs: list[str], names: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for spec in specs:
        if "=" in spec:
            name, value = spec.split("=", 1)
            if name not in names:
                raise CliError(f"--interval {spec}: {name!r} is not one of the recorded sources "
                               f"({', '.join(names)})")
            out[name] = parse_duration(value)
        else:
            value_s = parse_duration(spec)
            for name in names:
                out.setdefault(name, value_s)
    return out


def format_stats(stats: dict[str, dict], samples: int) -> str:
    lines = [f"{samples} samples stored", f"{'source':8s} {'interval':>9s} {'ticks':>8s} "
             f"{'missed':>7s} {'errors':>6s} {'read p50':>9s} {'read p99':>9s} {'stored':>8s}"]
    for name, s in stats.items():
        lines.append(
            f"{name:8s} {format_duration(s['interval_s']):>9s} {s['ticks']:>8d} {s['missed_ticks']:>7d} "
            f"{s['errors']:>6d} {format_duration(s['read_latency_p50_s']):>9s} "
            f"{format_duration(s['read_latency_p99_s']):>9s} {s['samples_stored']:>8d}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    explicit = args.sources is not None
    names = [n.strip() for n in (args.sources or ",".join(DEFAULT_SOURCES)).split(",") if n.strip()]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise CliError(f"unknown source {', '.join(unknown) or '(none)'}; known sources: "
                       f"{', '.join(REGISTRY)}", code=2)
    if args.pid and "host" not in names:
        names.append("host")
    duration = parse_duration(args.duration) if args.duration else None
    heartbeat = parse_duration(args.heartbeat)
    intervals = _intervals(args.interval, names)
    for pid in args.pid:
        if pid <= 0 or not _pid_exists(pid):
            raise CliError(f"--pid {pid}: no such process")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CliError(f"{out} exists; choose another path or pass --overwrite")
    if out.is_dir():
        raise CliError(f"{out} is a directory")

    sources = []
    for name in names:
        src = make_source(name, pids=args.pid) if name == "host" else make_source(name)
        if not src.discovery.available:
            if explicit:
                raise CliError(f"source {name} is unavailable: {src.discovery.reason}")
            print(f"skipping {name}: {src.discovery.reason}", file=sys.stderr)
            continue
        sources.append(src)
    if out.exists():
        for suffix in ("", "-wal", "-shm"):
            Path(str(out) + suffix).unlink(missing_ok=True)
    store = Store(out)
    rec = Recorder(store, sources, intervals=intervals, heartbeat=heartbeat,
                   change_only=not args.every_tick)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"recording {', '.join(s.name for s in sources)} to {out}"
          + (f" for {format_duration(duration)}" if duration else " (Ctrl-C to stop)"), file=sys.stderr)
    rec.start()
    try:
        t_end = time.monotonic() + duration if duration else None
        while not stop.is_set():
            remaining = None if t_end is None else t_end - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            stop.wait(0.5 if remaining is None else min(0.5, remaining))
    except KeyboardInterrupt:
        pass
    finally:
        rec.stop()
        signal.signal(signal.SIGTERM, previous)
    print(format_stats(rec.stats_dict(), store.sample_count()))
    for name, why in rec.skipped.items():
        print(f"skipped {name}: {why}")
    diags = store.diagnostics()
    for _, row in diags.iterrows():
        print(f"! {row['source']}: {row['message']}")
    store.close()
    return 0


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
