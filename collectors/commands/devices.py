"""``memsaver devices``: every source, its devices, or why it is unavailable."""

from __future__ import annotations

import argparse
import json

from collectors.sources import REGISTRY, make_source
from collectors.units import format_bytes

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="list every source and its devices (or why unavailable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--sources", default=",".join(REGISTRY),
                   help=f"comma-separated sources to probe (default: {','.join(REGISTRY)})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.sources.split(",") if n.strip()]
    results = []
    for name in names:
        src = make_source(name)  # ValueError for an unknown name -> one-line error
        results.append(src.discovery)
        src.close()
    if args.json:
        print(json.dumps([d.to_dict() for d in results], indent=2, default=str))
        return 0
    for d in results:
        if not d.available:
            print(f"{d.source:7s} unavailable: {d.reason}")
        else:
            print(f"{d.source:7s} {len(d.devices)} device(s)")
            for dev in d.devices:
                extra = ", ".join(f"{k}={v}" for k, v in dev.details.items()
                                  if k in ("used_semantics", "pci_bus_id", "driver_version", "mapping"))
                print(f"  {dev.device:9s} {dev.name}  total {format_bytes(dev.total_bytes)}"
                      + (f"  uuid {dev.uuid}" if dev.uuid else "") + (f"  ({extra})" if extra else ""))
        for msg in d.diagnostics:
            print(f"  ! {msg}")
    return 0
