"""Helpers for tests that drive real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

def wait_for(pred: Callable[[], object], timeout: float = 30.0, interval: float = 0.05) -> object:
    """Poll until pred() is truthy; fail the test with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


class AllocatorChild:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "helpers" / "allocator_child.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, cmd: str) -> int:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().split()
        assert reply[0] == "ok", reply
        return int(reply[1])

    def exit(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)


def run_cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    """Run ``python -m collectors ARGS`` as a real process."""
    return subprocess.run([sys.executable, "-m", "collectors", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", ROOT), **kw)
