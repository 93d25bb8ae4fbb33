"""Check memsaver's Sysman source on a real Intel GPU (XPU) and report what it sees.

    python examples/check_xpu.py                  # discovery + read latency
    python examples/check_xpu.py --alloc 2GiB     # also allocate/free with torch (xpu:0)
    python examples/check_xpu.py --alloc 2GiB --tms   # and pause/resume with torch_memory_saver

Run it once as your normal user and once as root (or with CAP_PERFMON): without the capability
i915 Sysman reports free == size and every "moved" line below says 0. Please send the output
with a bug report; nothing in memsaver has been verified on Intel hardware yet (docs/XPU.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

from collectors.sources.sysman import SysmanSource
from collectors.units import format_bytes, parse_bytes


def used(src: SysmanSource, device: str) -> int | None:
    return next((s.value for s in src.read() if s.device == device and s.metric == "used_bytes"), None)


def settle(src: SysmanSource, device: str, seconds: float = 1.0) -> int | None:
    """The last reading after ``seconds`` (Sysman can lag a release by a few reads)."""
    value, end = None, time.monotonic() + seconds
    while time.monotonic() < end:
        value = used(src, device)
        time.sleep(0.1)
    return value


def moved(label: str, before: int | None, after: int | None, expected: int) -> None:
    if before is None or after is None:
        print(f"  {label}: no reading")
        return
    delta = after - before
    verdict = "ok" if abs(abs(delta) - expected) <= 0.1 * expected else "NOT as expected"
    print(f"  {label}: Sysman used {format_bytes(before)} -> {format_bytes(after)} "
          f"(moved {format_bytes(delta)}, expected {format_bytes(expected)}): {verdict}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alloc", help="allocate this much on xpu:0 with torch, e.g. 2GiB")
    ap.add_argument("--tms", action="store_true", help="also pause/resume it with torch_memory_saver")
    ap.add_argument("--reads", type=int, default=20, help="reads for the latency figure")
    args = ap.parse_args()

    torch = None
    if args.alloc:
        import torch  # imported first so Sysman devices are matched to torch's xpu:N by UUID

        if not torch.xpu.is_available():
            print("torch has no XPU device; leave out --alloc")
            return 1
    src = SysmanSource()
    d = src.discovery
    print(f"sysman available: {d.available}" + ("" if d.available else f" -- {d.reason}"))
    print(f"loader: {d.details.get('loader')}, mapping: {d.details.get('mapping')}")
    for dev in d.devices:
        print(f"  {dev.device:8s} {dev.name}  total {format_bytes(dev.total_bytes)}  uuid {dev.uuid}  "
              f"pci {dev.details.get('pci_bus_id')}")
    for msg in d.diagnostics:
        print(f"  ! {msg}")
    if not d.available:
        return 1

    lat = []
    for _ in range(args.reads):
        t = time.perf_counter()
        samples = src.read()
        lat.append(time.perf_counter() - t)
    print(f"read latency over {len(lat)} reads: median {statistics.median(lat) * 1e3:.1f} ms, "
          f"max {max(lat) * 1e3:.1f} ms")
    for s in samples:
        if s.metric in ("used_bytes", "process_used_bytes"):
            print(f"  {s.device:8s} {s.metric:20s} pid={s.pid}  {format_bytes(s.value)}")

    if torch is not None:
        n = parse_bytes(args.alloc)
        device = "xpu:0"
        print(f"torch allocation of {format_bytes(n)} on {device}:")
        before = settle(src, device)
        x = torch.ones(n, dtype=torch.uint8, device=device)  # ones: pages really committed
        torch.xpu.synchronize()
        allocated = settle(src, device)
        moved("allocate", before, allocated, n)
        del x
        torch.xpu.empty_cache()
        moved("free + empty_cache", allocated, settle(src, device), n)
        if args.tms:
            from torch_memory_saver import torch_memory_saver as tms

            tms.hook_mode = "torch"  # XPU supports the torch hook mode only
            with tms.region(tag="check"):
                y = torch.ones(n, dtype=torch.uint8, device=device)
            torch.xpu.synchronize()
            held = settle(src, device)
            tms.pause("check")
            paused = settle(src, device)
            moved("TMS pause", held, paused, n)
            tms.resume("check")
            moved("TMS resume", paused, settle(src, device), n)
            print(f"  torch.xpu.memory_allocated stayed at {format_bytes(torch.xpu.memory_allocated())} "
                  "(the allocator never sees a pause)")
            del y
    for msg in src.drain_diagnostics():
        print(f"  ! {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
