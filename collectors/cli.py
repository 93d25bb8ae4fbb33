"""The ``memsaver`` command line. The one place with a broad ``except``.

Each subcommand lives in ``collectors/commands/<name>.py`` with ``register(subparsers)``, which
adds its parser and ``set_defaults(func=run)``; ``run(args) -> int`` does the work. Raise
``CliError`` (or ValueError / StoreError) for a clean one-line error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from collectors import __version__

__all__ = ["CliError", "main"]

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


if __name__ == "__main__":
    sys.exit(main())
