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
import json
import os
import subprocess
import sys
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


def measure_config(args: argparse.Namespace, gib: float, backup: bool,
                   kinds: tuple[str, ...] = ("raw", "product")) -> dict[str, Any]:
    """Raw and/or product cycles of one (size, backup), interleaved; medians per action."""
    import torch

    from collectors.controls.tms_workload import load_tms

    index = int(args.device.split(":")[1])
    tms = load_tms("torch")
    size = int(gib * GIB)
    raw: list[dict[str, float]] = []
    prod: list[dict[str, Any]] = []
    error = ""
    n = 0
    with scratch_dir("gpu-pr") as d:
        try:
            for r in range(args.repeats):
                for what in (kinds if r % 2 == 0 else kinds[::-1]):
                    n += 1
                    if what == "raw":
                        raw.append(raw_cycle(torch, tms, index, size, backup, n))
                    else:
                        prod.append(product_cycle(index, size, backup, args.interval, Path(d) / f"pr-{n}.db"))
        except Exception as e:  # e.g. out of host memory for a 64 GiB backup
            error = f"{type(e).__name__}: {e}"[:120]
    out: dict[str, Any] = {"error": error}
    for action in ("pause", "resume"):
        out[action] = {
            "raw_s": median(x[f"{action}_s"] for x in raw),
            "product_s": median(x.get(f"{action}_s") for x in prod),
            "lag_s": median(x.get(f"{action}_lag") for x in prod),
            "raw_change": median(x["released" if action == "pause" else "recommitted"] for x in raw),
            "change": median(x.get(f"{action}_change") for x in prod),
            "verdicts": sorted({str(x.get(f"{action}_verdict")) for x in prod}),
        }
    return out


def main() -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sizes", default=None, help="GiB, comma-separated (default 1,4,16,64)")
        p.add_argument("--device", default="cuda:0")
        p.add_argument("--interval", type=float, default=0.005, help="recorder interval for verify (s)")
        p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "GIB,BACKUP": child mode
    args = bench_args("TMS pause/resume latency and GB/s: product (verify) vs raw TMS (GPU machine)",
                      repeats=3, quick_repeats=1, extra=extra)
    if args.one:
        gib, backup, *kinds = args.one.split(",")
        res = measure_config(args, float(gib), backup == "1", tuple(kinds) or ("raw", "product"))
        print("ROW " + json.dumps(res), flush=True)
        # TMS 0.0.10 on CUDA exits 1 in interpreter teardown (see collectors.cli.exit_process)
        os._exit(0)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    index = int(args.device.split(":")[1])
    sizes = [float(s) for s in (args.sizes or ("1" if args.quick else "1,4,16,64")).split(",")]
    print(f"# {torch.cuda.get_device_name(index)}; recorder interval {args.interval * 1e3:g} ms; "
          "each size and backup setting in its own process (TMS keeps freed blocks in its pool)")
    rows = []
    for gib in sizes:
        for backup in (False, True):
            # One process per configuration: freed TMS blocks stay cached in its memory pool, so
            # 64 GiB after smaller sizes would run out of device memory in one process.
            # Sizes above a third of the device also split raw and product into two processes.
            split = gib * GIB * 2.2 > torch.cuda.get_device_properties(index).total_memory
            res: dict[str, Any] = {}
            for kinds in ((["raw"], ["product"]) if split else (["raw", "product"],)):
                cmd = [sys.executable, __file__, "--one", ",".join([f"{gib:g}", str(int(backup)), *kinds]),
                       "--repeats", str(args.repeats), "--device", args.device,
                       "--interval", str(args.interval)]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                line = next((x for x in r.stdout.splitlines() if x.startswith("ROW ")), None)
                part = json.loads(line[4:]) if line else {
                    "error": f"child rc={r.returncode}: " + " ".join((r.stderr or r.stdout)[-160:].split())}
                for action in ("pause", "resume"):
                    merged = res.setdefault(action, {})
                    for k, v in (part.get(action) or {}).items():
                        if k not in merged or merged[k] != merged[k] or merged[k] in (None, []):
                            merged[k] = v
                res["error"] = "; ".join(filter(None, [res.get("error"), part.get("error")]))
            size = int(gib * GIB)
            for action in ("pause", "resume"):
                a = res.get(action) or {}
                rs, ps = a.get("raw_s", float("nan")), a.get("product_s", float("nan"))
                rs, ps = (float("nan") if v is None else v for v in (rs, ps))
                rc, ch = a.get("raw_change"), a.get("change")
                rows.append([
                    f"{gib:g} GiB", "yes" if backup else "no", action,
                    fmt_s(rs), f"{size / GIB / rs:.1f}" if rs == rs else "n/a",
                    fmt_s(ps), f"{size / GIB / ps:.1f}" if ps == ps else "n/a",
                    f"{ps / rs:.2f}x" if rs == rs and ps == ps else "n/a",
                    fmt_s(a.get("lag_s", float("nan"))),
                    f"{rc / GIB:+.2f}" if rc is not None and rc == rc else "n/a",
                    f"{ch / GIB:+.2f}" if ch is not None and ch == ch else "n/a",
                    ",".join(a.get("verdicts") or []) or "-", res.get("error") or "",
                ])
                print("  row:", " | ".join(map(str, rows[-1])), flush=True)  # survives a crash
    print_table("pause/resume per tag size: raw TMS vs the product's verify() (medians)",
                ["size", "cpu backup", "call", "raw TMS time", "raw GiB/s", "product call time",
                 "product GiB/s", "product/raw", "verify lag (from start)", "raw NVML change GiB",
                 "verify change GiB", "verdicts", "error"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
