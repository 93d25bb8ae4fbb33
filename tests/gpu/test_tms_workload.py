"""Real torch_memory_saver on a CUDA GPU: NVML sees each release/resume, torch's accounting
does not, content survives with CPU backup, and the verification says ok with a lag."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch_memory_saver")
torch = pytest.importorskip("torch")

from collectors import Recorder, Store  # noqa: E402
from collectors.controls.tms_workload import TmsWorkload  # noqa: E402
from collectors.sources import make_source  # noqa: E402
from collectors.verification import format_verification, verify  # noqa: E402

GiB = 2**30
TOL = 0.1


def nvml_used(src) -> int:
    return next(s.value for s in src.read() if s.metric == "used_bytes" and s.device == "cuda:0")


def settle(src, want_below=None, want_above=None, timeout=10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        v = nvml_used(src)
        if (want_below is None or v <= want_below) and (want_above is None or v >= want_above):
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(0.02)


def test_tms_workload_release_resume_seen_by_nvml_not_by_torch(tmp_path):
    store = Store(tmp_path / "tms.sqlite")
    wl = TmsWorkload(store, device="cuda:0")
    nvml = make_source("nvml", processes=False)
    assert nvml.discovery.available
    rec = Recorder(store, [nvml, wl.accounting_source()], intervals={"nvml": 0.02, "torch": 0.05}).start()
    try:
        wl.allocate("weights", 2 * GiB, backup=True)
        wl.allocate("kv_cache", 4 * GiB)
        alloc0 = torch.cuda.memory_allocated(0)
        used0 = settle(nvml)
        time.sleep(1.2)

        ev = wl.pause(["kv_cache"])
        assert ev.ok, ev.error
        used1 = settle(nvml, want_below=used0 - (1 - TOL) * 4 * GiB)
        assert used0 - used1 >= (1 - TOL) * 4 * GiB
        assert torch.cuda.memory_allocated(0) == alloc0  # the accounting stays flat
        time.sleep(1.2)

        ev = wl.pause(["kv_cache"])  # TMS would exit(1) here; the workload refuses first
        assert not ev.ok and "already released" in ev.error

        assert wl.pause(["weights"]).ok
        time.sleep(1.2)
        assert wl.resume().ok  # weights' content is checked on the device after resume
        assert wl.content_ok("weights")
        settle(nvml, want_above=used0 - 0.05 * GiB)
        time.sleep(2.2)
    finally:
        rec.stop()
        wl.close()
    df = verify(store, settle_s=1.0)
    print(format_verification(df))
    ok = df[df["event_id"].isin(store.events().query("ok and action in ['pause', 'resume']")["id"])]
    assert (ok["source"] == "nvml").all() and (ok["verdict"] == "ok").all(), format_verification(df)
    assert ok["lag_s"].notna().all()
