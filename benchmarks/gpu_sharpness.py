"""Target 3 on the GPU machine: lag from a TMS release returning to the recorded NVML drop, vs one
sampling interval + NVML's read latency, next to a raw NVML read and a raw sampler.

    python benchmarks/gpu_sharpness.py [--quick] [--repeats N] [--cycles N] [--interval S]
                                       [--size GiB] [--device cuda:0]

The method is sharpness.py's (this reuses it): a TmsWorkload (torch_memory_saver, hook_mode
"torch") holds one tag; a real Recorder follows ``cuda:N/nvml/used_bytes`` (NvmlSource for that
GPU, process query off) into a real SQLite file; recorder phases are interleaved with a raw
sampler thread at the same interval. Assumes NVML index N is CUDA device N (no
CUDA_VISIBLE_DEVICES remapping).
"""

from __future__ import annotations

import argparse

from _common import bench_args
from sharpness import TAG, Setup, run

from collectors.sources.nvml import NvmlSource

GIB = 2**30


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cycles", type=int, default=None, help="pause+resume cycles per phase")
        p.add_argument("--interval", type=float, default=0.02, help="sampling interval (s)")
        p.add_argument("--size", type=float, default=4.0, help="tag size in GiB")
        p.add_argument("--device", default="cuda:0")
    args = bench_args("lag from a TMS release returning to the recorded NVML drop (GPU machine)",
                      repeats=3, quick_repeats=1, extra=extra)
    from collectors.controls.base import ControlError
    from collectors.controls.tms_workload import TmsWorkload

    index = int(args.device.split(":")[1])
    workload = TmsWorkload(device=args.device, origin="bench")
    try:
        workload.allocate(TAG, int(args.size * GIB))
    except ControlError as e:
        print(f"cannot run here: {e}")
        return 1
    cycles = args.cycles or (3 if args.quick else 15)
    print(f"# tag {args.size:g} GiB on {args.device}, interval {args.interval * 1e3:g} ms, {cycles} "
          "pause+resume cycles per phase")
    setup = Setup(workload, lambda: NvmlSource(processes=False, indices=[index]),
                  (f"cuda:{index}", "nvml", "used_bytes", None), f"NVML used of cuda:{index} (TMS)")
    try:
        run(setup, interval=args.interval, cycles=cycles, repeats=args.repeats)
    finally:
        workload.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
