"""The agent on the real torch_memory_saver singleton: calls made directly on TMS are recorded
as events, with tag sizes learned from region(), while NVML (recorded here) drops."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch_memory_saver")
torch = pytest.importorskip("torch")

import collectors.agent as agent  # noqa: E402
from collectors import Recorder, Store  # noqa: E402
from collectors.controls.tms_workload import load_tms  # noqa: E402
from collectors.sources import make_source  # noqa: E402
from collectors.verification import format_verification, verify  # noqa: E402

GiB = 2**30


def test_agent_records_direct_tms_calls(tmp_path):
    path = tmp_path / "agent.sqlite"
    store = Store(path)
    rec = Recorder(store, [make_source("nvml", processes=False)], intervals={"nvml": 0.02}).start()
    tms = load_tms("torch")
    a = agent.install(store, device="cuda:0", interval=0.05)
    try:
        with torch.cuda.device(0), tms.region(tag="agent_weights"):
            x = torch.ones(GiB // 2, dtype=torch.float16, device="cuda:0")  # 1 GiB
        torch.cuda.synchronize()
        assert abs(a.region_bytes["agent_weights"] - GiB) <= 64 * 2**20, dict(a.region_bytes)
        allocated = torch.cuda.memory_allocated(0)
        time.sleep(1.2)
        t_wall_pause = time.time()
        t = time.perf_counter()
        tms.pause("agent_weights")
        pause_s = time.perf_counter() - t
        assert torch.cuda.memory_allocated(0) == allocated
        time.sleep(1.5)
        tms.resume("agent_weights")
        time.sleep(1.5)
        assert a.flush()
    finally:
        agent.uninstall()
        rec.stop()
    del x
    ev = Store.open(path).events()
    mine = ev[ev["origin"] == f"agent:{os.getpid()}"]
    assert mine["action"].tolist() == ["pause", "resume"] and mine["ok"].all()
    assert (mine["expected_bytes"] > 0.9 * GiB).all()
    df = verify(Store.open(path), settle_s=1.0)
    print(f"pause call took {pause_s * 1e3:.2f} ms")
    print(format_verification(df))
    rows = df[df["event_id"].isin(mine["id"])]
    assert (rows["verdict"] == "ok").all(), format_verification(df)
    # torch's accounting is flat across the pause/resume (it was 0 before the allocation)
    acc = Store.open(path).samples(sources=["torch"], metrics=["allocated_bytes"])
    during = acc[acc["t"] >= t_wall_pause - 0.5]["value"].dropna()
    assert len(during) >= 1 and during.min() >= 0.9 * GiB
    assert during.max() - during.min() < 0.1 * GiB
    nv = Store.open(path).samples(sources=["nvml"], metrics=["used_bytes"])
    nv_during = nv[nv["t"] >= t_wall_pause]["value"].dropna()
    assert nv_during.max() - nv_during.min() >= 0.9 * GiB  # while NVML dropped and rose
