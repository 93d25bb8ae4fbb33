"""``memsaver export``: a recording's samples (and events) as CSV or Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path

from collectors.cli import CliError
from collectors.store import Store

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a recording to CSV or Parquet")
    p.add_argument("file", help="recording file")
    p.add_argument("--format", choices=["csv", "parquet"], required=True)
    p.add_argument("--out", required=True, help="output path (events go to <out stem>.events.<ext>)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CliError(f"{out} exists; choose another path or pass --overwrite")
    with Store.open(args.file) as store:
        store.export(out, args.format)
        n = store.sample_count()
    print(f"wrote {n} samples to {out}")
    return 0
