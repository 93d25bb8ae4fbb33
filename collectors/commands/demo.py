"""``memsaver demo``: run the narrated release/resume scenario and write a standalone HTML report.

    memsaver demo                                  # TMS on a GPU if there is one, else the host saver
    memsaver demo --device cuda --out /tmp/demo    # real TMS + NVML
    memsaver demo --engine http://127.0.0.1:30000  # an SGLang-compatible server
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="narrated demo: allocate, release KV cache, release weights, resume; HTML report",
        description="Allocate weights and a KV cache, release the KV cache, release the weights, "
                    "resume both, while recording physical memory and the allocator's accounting; "
                    "then write a standalone HTML report (charts, verification, environment).",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "xpu", "host"],
                   help="where to run: auto = TMS on a GPU when torch + torch_memory_saver see one, "
                        "else the host saver (default: auto)")
    p.add_argument("--engine", metavar="URL", default=None,
                   help="drive an SGLang-compatible engine at URL instead (no allocation step)")
    p.add_argument("--weights", default="256MiB", help="size of the weights tag (default: 256MiB)")
    p.add_argument("--kv-cache", default="512MiB", help="size of the kv_cache tag (default: 512MiB)")
    p.add_argument("--settle", default="1.5s", help="pause between steps (default: 1.5s)")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="directory for the recording and the report (default: .)")
    p.add_argument("--report", default=None, metavar="PATH",
                   help="report path (default: DIR/<recording name>.html); 'none' to skip it")
    p.add_argument("--quiet", action="store_true", help="no narration, only the paths")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collectors.cli import CliError
    from collectors.controls.base import ControlError
    from collectors.scenario import ScenarioError, run_scenario
    from collectors.units import parse_bytes, parse_duration

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out}: not a directory")
    if not out.exists() and not out.parent.is_dir():  # one new level is fine, a typo'd tree is not
        raise CliError(f"--out {out}: directory does not exist")
    report = None if str(args.report).lower() == "none" else args.report
    if report is not None and not Path(report).parent.is_dir():
        raise CliError(f"--report {report}: directory does not exist")
    try:  # check everything before anything is allocated or recorded
        weights, kv_cache = parse_bytes(args.weights), parse_bytes(args.kv_cache)
        settle = parse_duration(args.settle, allow_zero=True)
    except ValueError as e:
        raise CliError(str(e), code=2) from None
    out.mkdir(exist_ok=True)
    try:
        path = run_scenario(device=args.device, engine=args.engine, weights=weights, kv_cache=kv_cache,
                            out_dir=out, settle_s=settle, narrate=None if args.quiet else print)
    except (ScenarioError, ControlError) as e:
        raise CliError(str(e)) from None
    if args.report is None:
        report = out / (path.stem + ".html")
    if report is not None:
        from app.report import write_report  # the CLI edge may draw; collectors/ itself never does

        written = write_report(path, report, title=f"memsaver demo: {path.stem}")
        print(f"report: {written}")
    if args.quiet:
        print(f"recording: {path}")
    return 0
