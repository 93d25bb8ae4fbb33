"""Shared helpers of the benchmark scripts: CPU time per thread, medians, tables, arguments.

Every script compares the product against a raw baseline measured in the same run, in
interleaved repeats, and prints medians. Nothing here asserts a speed: scripts print figures.

Thread CPU time comes from ``/proc/self/task/<tid>/schedstat`` (nanoseconds, any thread of this
process, readable from outside that thread); elsewhere it falls back to psutil's per-thread
user+system times (10 ms resolution).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # scripts run as `python benchmarks/x.py` from a checkout
    sys.path.insert(0, str(ROOT))

from collectors.model import DeviceInfo, Discovery, Sample, now  # noqa: E402
from collectors.sources.base import Source  # noqa: E402

__all__ = [
    "ROOT",
    "StandInDevicesSource",
    "bench_args",
    "fmt_bytes",
    "fmt_s",
    "machine",
    "median",
    "print_table",
    "recorder_threads_cpu_s",
    "run_in_thread",
    "scratch_dir",
    "thread_cpu_s",
]


def thread_cpu_s(native_id: int) -> float | None:
    """CPU seconds used so far by one thread of this process (None once it has exited)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        for th in psutil.Process().threads():
            if th.id == native_id:
                return th.user_time + th.system_time
    except Exception:
        return None
    return None


def recorder_threads_cpu_s(prefix: str = "memsaver-") -> dict[str, float]:
    """CPU seconds per live recorder thread (the Recorder names them ``memsaver-<source>`` and
    ``memsaver-writer``); sum the values for the recorder's total."""
    out: dict[str, float] = {}
    for th in threading.enumerate():
        if th.name.startswith(prefix) and th.native_id is not None:
            out[th.name] = out.get(th.name, 0.0) + (thread_cpu_s(th.native_id) or 0.0)
    return out


def run_in_thread(fn: Callable[[], Any], name: str = "bench-raw") -> Any:
    """Run ``fn`` on its own thread (like a recorder source thread) and return its result."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    th = threading.Thread(target=target, name=name, daemon=True)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def median(values: Iterable[float | None]) -> float:
    vals = [v for v in values if v is not None and v == v]
    return statistics.median(vals) if vals else float("nan")


def fmt_s(seconds: float) -> str:
    """A duration with a unit that keeps 3 significant digits."""
    if seconds != seconds:
        return "n/a"
    a = abs(seconds)
    if a < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if a < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table (what the README rows are copied from)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    print(f"\n## {title}")
    for i, r in enumerate(cells):
        padded = (c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True)))
        print("  ".join(padded))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
            f"python {platform.python_version()}, load avg {load[0]:.2f} "
            f"({time.strftime('%Y-%m-%d %H:%M')})")


def bench_args(description: str, *, repeats: int, quick_repeats: int,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """``--quick`` (a smoke run: fewer, shorter repeats) and ``--repeats N``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a short smoke run (figures are rough)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (median reported)")
    if extra is not None:
        extra(p)
    args = p.parse_args()
    if args.repeats is None:
        args.repeats = quick_repeats if args.quick else repeats
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    print(f"# {Path(sys.argv[0]).name}: {description}")
    print(f"# machine: {machine()}")
    print(f"# repeats: {args.repeats}{' (quick)' if args.quick else ''}")
    return args


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for real SQLite files (removed afterwards)."""
    return tempfile.TemporaryDirectory(prefix=f"memsaver-bench-{prefix}-")


class StandInDevicesSource(Source):
    """Stands in for an 8-GPU NVML source on a machine with no GPU.

    One ``read()`` does what ``NvmlSource.read()`` does per device on an 8-GPU box: one real
    kernel read per device (``pread`` of ``/proc/self/statm``, ~2 us; an NVML memory query is
    ~5 us) and three samples per device (used, total, reserved) on device names ``gpu:N``. The
    values are real (this process's resident and virtual pages), so they change like memory does.
    """

    name = "standin"
    default_interval = 0.001
    physical = True

    def __init__(self, devices: int = 8) -> None:
        super().__init__()
        self.n = devices
        self._fd: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def discover(self) -> Discovery:
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError as e:
            return Discovery.unavailable(self.name, f"/proc/self/statm unreadable: {e}")
        devs = [DeviceInfo(f"gpu:{i}", self.name, "stand-in device (procfs read)", total_bytes=None)
                for i in range(self.n)]
        return Discovery(self.name, True, devs)

    def read(self) -> list[Sample]:
        assert self._fd is not None
        t = now()
        out: list[Sample] = []
        for i in range(self.n):
            fields = os.pread(self._fd, 128, 0).split()
            size, rss = int(fields[0]) * self._page, int(fields[1]) * self._page
            dev = f"gpu:{i}"
            out.append(Sample(t, dev, self.name, "used_bytes", rss))
            out.append(Sample(t, dev, self.name, "total_bytes", size))
            out.append(Sample(t, dev, self.name, "reserved_bytes", size - rss))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
