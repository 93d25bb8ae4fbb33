"""Target 1 on the GPU machine: recorder cost per sample with the real NVML source vs a bare loop
calling the same source, at 20 ms and 1 kHz on every GPU of the machine, plus the binding alone.

    python benchmarks/gpu_nvml_cost.py [--quick] [--repeats N] [--duration S] [--processes]

Same method and columns as sampling_cost.py (which this reuses): raw tight / raw paced loops of
``NvmlSource.read()`` interleaved with a real Recorder on a real SQLite file. One more baseline:
``nvmlDeviceGetMemoryInfo`` (v2 where supported) called directly through pynvml for every GPU, the
floor under the product's source. ``--processes`` keeps NvmlSource's per-process query (every
0.2 s; off by default here so the ratio is about the memory query only).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import bench_args, fmt_s, median, print_table, run_in_thread, scratch_dir
from sampling_cost import HEADERS, WARMUP_S, measure

from collectors.sources.nvml import NvmlSource


def pynvml_tight(reads: int) -> tuple[float, int]:
    """CPU per tick of calling the binding for every GPU, back to back, on its own thread."""
    import pynvml as n

    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    try:
        n.nvmlDeviceGetMemoryInfo(handles[0], version=n.nvmlMemory_v2)
        v2 = True
    except Exception:
        v2 = False

    def loop() -> float:
        c0 = time.thread_time()
        for _ in range(reads):
            for h in handles:
                n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2) if v2 else n.nvmlDeviceGetMemoryInfo(h)
        return (time.thread_time() - c0) / reads
    try:
        return run_in_thread(loop), len(handles)
    finally:
        n.nvmlShutdown()


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--duration", type=float, default=None, help="seconds per measured run")
        p.add_argument("--processes", action="store_true", help="keep NvmlSource's process query")
    args = bench_args("recorder cost per sample with NVML vs raw loops (GPU machine)",
                      repeats=5, quick_repeats=1, extra=extra)
    probe = NvmlSource()
    if not probe.discovery.available:
        print(f"NVML unavailable: {probe.discovery.reason}")
        return 1
    ngpu = len(probe.discovery.devices)
    probe.close()
    duration = args.duration or (0.5 if args.quick else 3.0)
    print(f"# {ngpu} GPU(s); duration per run {duration:g} s after a {WARMUP_S:g} s warm-up")

    def make() -> NvmlSource:
        src = NvmlSource(processes=args.processes)
        src.discovery  # noqa: B018
        return src
    with scratch_dir("gpu-nvml") as d:
        rows = [measure(f"nvml x{ngpu}", make, iv, duration, args.repeats, Path(d)) for iv in (0.02, 0.001)]
    print_table(f"NVML: recorder vs raw loop of the same source, {ngpu} GPU(s) per tick "
                "(target <= 1.5x raw paced; < 1% missed at 1 ms)", HEADERS, rows)
    reads = 200 if args.quick else 5000
    per_tick = median(pynvml_tight(reads)[0] for _ in range(args.repeats))
    print_table("the binding alone", ["loop", "cpu per tick", "cpu per GPU query"],
                [[f"pynvml nvmlDeviceGetMemoryInfo x{ngpu}, tight", fmt_s(per_tick), fmt_s(per_tick / ngpu)]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
