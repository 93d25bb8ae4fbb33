"""On a real NVIDIA GPU: allocate and free a few GiB, and the NVML step is recorded."""

from __future__ import annotations

import time

from collectors import Recorder, Store
from collectors.sources.nvml import NvmlSource
from collectors.sources.torch_source import TorchSource
from tests.helpers.proc import wait_for

GiB = 2**30


def test_nvml_records_allocate_and_free_step(tmp_path):
    import torch

    store = Store(tmp_path / "gpu.db")
    nvml = NvmlSource(indices=[torch.cuda.current_device()])
    dev = f"cuda:{torch.cuda.current_device()}"
    key = (dev, "nvml", "used_bytes", None)
    with Recorder(store, [nvml, TorchSource(devices=[dev])],
                  intervals={"nvml": 0.02, "torch": 0.05}) as rec:
        wait_for(lambda: key in rec.latest())
        time.sleep(0.3)
        base = rec.latest()[key][1]
        t_alloc = time.time()
        x = torch.empty(4 * GiB, dtype=torch.uint8, device=dev).fill_(1)
        torch.cuda.synchronize()
        wait_for(lambda: rec.latest()[key][1] >= base + 3.9 * GiB)
        time.sleep(0.3)
        t_free = time.time()
        del x
        torch.cuda.empty_cache()
        wait_for(lambda: rec.latest()[key][1] <= base + 0.1 * GiB)
        time.sleep(0.3)
    df = store.samples(devices=[dev], sources=["nvml"], metrics=["used_bytes"])
    during = df[(df.t > t_alloc) & (df.t < t_free)]["value"]
    after = df[df.t > t_free]["value"]
    assert during.max() - df[df.t < t_alloc]["value"].iloc[-1] >= 3.9 * GiB
    assert during.max() - after.iloc[-1] >= 3.9 * GiB
    # torch's accounting saw the allocation too (it is a real allocation, not a TMS pause)
    acc = store.samples(devices=[dev], sources=["torch"], metrics=["allocated_bytes"])["value"]
    assert acc.max() >= 4 * GiB
    info = store.devices()
    nv = info[info.source == "nvml"].iloc[0]
    assert nv["name"] and str(nv["uuid"]).startswith("GPU-")  # the real identity is recorded
    assert nv["details"]["used_semantics"].startswith("v")
    st = rec.stats_dict()["nvml"]
    print(f"\nNVML step recorded: +{during.max() / GiB - base / GiB:.2f} GiB; "
          f"read p50 {st['read_latency_p50_s'] * 1e6:.1f} us, p99 {st['read_latency_p99_s'] * 1e6:.1f} us, "
          f"ticks {st['ticks']}, missed {st['missed_ticks']}")
