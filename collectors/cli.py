"""The ``memsaver`` command line. The one place with a broad ``except``.

Each subcommand lives in ``collectors/commands/<name>.py`` with ``register(subparsers)``, which
adds its parser and ``set_defaults(func=run)``; ``run(args) -> int`` does the work. Raise
``CliError`` (or ValueError / StoreError) for a clean one-line error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from collectors import __version__

__all__ = ["CliError", "entry", "exit_process", "main"]

# Subcommand modules, imported only to register their parsers (none imports a vendor binding).
COMMANDS = [
    "collectors.commands.devices",
    "collectors.commands.record",
    "collectors.commands.export",
    "collectors.commands.summary",
    "collectors.commands.demo_engine",
    "collectors.commands.demo",
]


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1 (2 for usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memsaver",
        description="Record and inspect physical GPU/host memory while torch_memory_saver "
                    "releases and resumes tagged memory.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from collectors.store import StoreError

    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"memsaver {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except (ValueError, StoreError, OSError) as e:
        if args.debug:
            raise
        print(f"memsaver {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the CLI edge: one line, traceback only with --debug
        if args.debug:
            raise
        print(f"memsaver {args.command}: unexpected error: {type(e).__name__}: {e} "
              "(run with --debug for the traceback)", file=sys.stderr)
        return 1


def exit_process(code: int) -> NoReturn:
    """End a ``memsaver`` process with ``code``.

    A process that used torch_memory_saver on CUDA (0.0.10) dies in interpreter teardown with
    "only support interesting region ... tms_torch_free" and status 1 (measured on an H200, even
    after its tensors were freed): its memory pools outlive its native state. Our work is
    flushed and closed by then, so such a process skips teardown and keeps its real status.
    """
    if "torch_memory_saver" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def entry() -> NoReturn:
    """The console script and ``python -m collectors``."""
    exit_process(main())


if __name__ == "__main__":
    entry()
