"""``memsaver demo-engine``: an SGLang-compatible engine holding tagged memory (see collectors.demo_engine).

    memsaver demo-engine --port 30000 --weights 2GiB --kv-cache 8GiB --device cuda
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    from collectors.demo_engine import add_arguments

    p = subparsers.add_parser(
        "demo-engine",
        help="serve SGLang's release/resume endpoints over tagged memory (host saver or TMS)",
        description="A small HTTP server that holds tagged memory (host saver with no GPU, "
                    "torch_memory_saver on cuda/xpu) and speaks SGLang's POST "
                    "/release_memory_occupation and /resume_memory_occupation, plus "
                    "GET /memsaver/status. Binds 127.0.0.1 by default.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collectors.cli import CliError
    from collectors.demo_engine import run as run_engine

    try:
        return run_engine(args)
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from None
