"""Target 6 on the GPU machine: pause/resume latency and effective GB/s per tag size (1, 4, 16,
64 GiB), with and without CPU backup, as the product measures them (TmsWorkload events checked by
``collectors.verification.verify`` on a recording of NVML) next to a raw TMS loop in the same run.

    python benchmarks/gpu_pause_resume.py [--quick] [--repeats N] [--sizes 1,4,16,64]
                                          [--device cuda:0] [--interval S]

Raw: ``torch_memory_saver.region(tag, enable_cpu_backup)`` + ``torch.empty`` + fill, then
``pause(tag)`` / ``resume(tag)`` timed with perf_counter (each followed by a device synchronize),
NVML read directly before and after to show the physical change. Product: the same through
``TmsWorkload`` (a synchronize before pause; after a backed-up resume it also compares the content
on the device, which counts in its call time) with a Recorder on NVML at ``--interval``;
``verify()`` gives duration, change, lag (from call start) and verdict. Raw and product runs
alternate per repeat; medians are printed. GB/s = tag bytes / call time (GiB-based: 2**30).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _common import bench_args, fmt_s, median, print_table, scratch_dir
from sharpness import wait_until

from collectors.recorder import Recorder
from collectors.sources.nvml import NvmlSource
from collectors.store import Store

GIB = 2**30


def nvml_used(index: int) -> int:
    from collectors.sources import _nvml

    _nvml.init()
    h = _nvml.handle(index)
    return int(_nvml.memory_info(h, _nvml.probe_memory_version(h)).used)


def raw_cycle(torch: Any, tms: Any, index: int, size: int, backup: bool, n: int) -> dict[str, float]:
    """One raw TMS allocate / pause / resume / free; seconds and NVML bytes."""
    tag = f"raw{n}"
    dev = f"cuda:{index}"
    with torch.cuda.device(index), tms.region(tag=tag, enable_cpu_backup=backup):
        x = torch.empty(size, dtype=torch.uint8, device=dev)
    x.fill_(7)
    torch.cuda.synchronize(index)
    u0 = nvml_used(index)
    t = time.perf_counter()
    tms.pause(tag)
    torch.cuda.synchronize(index)
    pause_s = time.perf_counter() - t
    u1 = nvml_used(index)
    t = time.perf_counter()
    tms.resume(tag)
    torch.cuda.synchronize(index)
    resume_s = time.perf_counter() - t
    u2 = nvml_used(index)
    del x
    torch.cuda.empty_cache()
    return {"pause_s": pause_s, "resume_s": resume_s, "released": u0 - u1, "recommitted": u2 - u1}


def product_cycle(index: int, size: int, backup: bool, interval: float, db: Path) -> dict[str, Any]:
    """TmsWorkload + Recorder(NVML) + verify(): the product's own figures for one pause/resume."""
    from collectors.controls.tms_workload import TmsWorkload
    from collectors.verification import verify

    key = (f"cuda:{index}", "nvml", "used_bytes", None)
    with Store(db) as store:
        rec = Recorder(store, [NvmlSource(processes=False, indices=[index])], intervals={"nvml": interval})
        wl = TmsWorkload(store, device=f"cuda:{index}", origin="bench")
        with rec:
            wait_until(lambda: key in rec.latest())
            wl.allocate("kv_cache", size, backup=backup)
            time.sleep(0.2)
            out: dict[str, Any] = {}
            for action in ("pause", "resume"):
                ev = wl.pause(["kv_cache"]) if action == "pause" else wl.resume(["kv_cache"])
                if not ev.ok:
                    raise RuntimeError(f"{action} failed: {ev.error}")
                wait_until(lambda ev=ev: rec.latest()[key][0] > ev.t_end + 0.2)
            wl.free("kv_cache")
            time.sleep(0.1)
        wl.close()
        df = verify(store)
    df = df[(df["source"] == "nvml") & df["action"].isin(["pause", "resume"])]
    for row in df.itertuples(index=False):
        out[f"{row.action}_s"] = row.duration_s
        out[f"{row.action}_lag"] = row.lag_s
        out[f"{row.action}_change"] = row.change_bytes
        out[f"{row.action}_verdict"] = row.verdict
    return out


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sizes", default=None, help="GiB, comma-separated (default 1,4,16,64)")
        p.add_argument("--device", default="cuda:0")
        p.add_argument("--interval", type=float, default=0.005, help="recorder interval for verify (s)")
    args = bench_args("TMS pause/resume latency and GB/s: product (verify) vs raw TMS (GPU machine)",
                      repeats=3, quick_repeats=1, extra=extra)
    import torch

    from collectors.controls.tms_workload import load_tms, release_tms_pools

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    index = int(args.device.split(":")[1])
    tms = load_tms("torch")
    sizes = [float(s) for s in (args.sizes or ("1" if args.quick else "1,4,16,64")).split(",")]
    print(f"# {torch.cuda.get_device_name(index)}; recorder interval {args.interval * 1e3:g} ms")
    rows = []
    n = 0
    with scratch_dir("gpu-pr") as d:
        for gib in sizes:
            size = int(gib * GIB)
            for backup in (False, True):
                raw: list[dict[str, float]] = []
                prod: list[dict[str, Any]] = []
                error = ""
                try:
                    for r in range(args.repeats):
                        for what in (("raw", "product") if r % 2 == 0 else ("product", "raw")):
                            n += 1
                            if what == "raw":
                                raw.append(raw_cycle(torch, tms, index, size, backup, n))
                            else:
                                prod.append(product_cycle(index, size, backup, args.interval,
                                                          Path(d) / f"pr-{n}.db"))
                            # freed TMS blocks stay in its pool: let them go before the next size
                            release_tms_pools(tms)
                except Exception as e:  # e.g. out of host memory for a 64 GiB backup
                    error = f"{type(e).__name__}: {e}"[:120]
                    torch.cuda.empty_cache()
                for action in ("pause", "resume"):
                    rs = median(x[f"{action}_s"] for x in raw)
                    ps = median(x.get(f"{action}_s") for x in prod)
                    verdicts = sorted({str(x.get(f"{action}_verdict")) for x in prod})
                    change = median(x.get(f"{action}_change") for x in prod)
                    raw_change = median(x["released" if action == "pause" else "recommitted"] for x in raw)
                    rows.append([
                        f"{gib:g} GiB", "yes" if backup else "no", action,
                        fmt_s(rs), f"{size / GIB / rs:.1f}" if rs == rs else "n/a",
                        fmt_s(ps), f"{size / GIB / ps:.1f}" if ps == ps else "n/a",
                        f"{ps / rs:.2f}x" if rs == rs and ps == ps else "n/a",
                        fmt_s(median(x.get(f"{action}_lag") for x in prod)),
                        f"{raw_change / GIB:+.2f}" if raw_change == raw_change else "n/a",
                        f"{change / GIB:+.2f}" if change == change else "n/a",
                        ",".join(verdicts) if prod else "-", error or "",
                    ])
                    print("  row:", " | ".join(map(str, rows[-1])), flush=True)  # survives a crash
    print_table("pause/resume per tag size: raw TMS vs the product's verify() (medians)",
                ["size", "cpu backup", "call", "raw TMS time", "raw GiB/s", "product call time",
                 "product GiB/s", "product/raw", "verify lag (from start)", "raw NVML change GiB",
                 "verify change GiB", "verdicts", "error"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
