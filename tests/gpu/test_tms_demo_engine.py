"""The demo engine on a CUDA GPU with real torch_memory_saver, driven over HTTP, recorded
through NVML: every tag's release and resume verifies ok with a measured lag."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch_memory_saver")

from collectors import Recorder, Store  # noqa: E402
from collectors.controls.engine_client import EngineClient  # noqa: E402
from collectors.demo_engine import spawn  # noqa: E402
from collectors.sources import make_source  # noqa: E402
from collectors.verification import format_verification, verify  # noqa: E402


def test_demo_engine_on_cuda_verifies_ok(tmp_path):
    path = tmp_path / "engine.sqlite"
    store = Store(path)
    with spawn(device="cuda", weights="2GiB", kv_cache="4GiB", cuda_graph="512MiB",
               backup=["weights"], ready_timeout=300) as eng:
        rec = Recorder(store, [make_source("nvml")], intervals={"nvml": 0.02}).start()
        client = EngineClient(eng.url, store, timeout=120)
        time.sleep(1.2)
        try:
            plan = [("pause", ["kv_cache"]), ("pause", ["weights"]), ("pause", ["cuda_graph"]),
                    ("resume", ["cuda_graph"]), ("resume", ["weights"]), ("resume", ["kv_cache"]),
                    ("pause", None), ("resume", None)]
            for action, tags in plan:
                ev = getattr(client, action)(tags)
                assert ev.ok, (action, tags, ev.error, eng.log())
                time.sleep(1.5)
        finally:
            rec.stop()
            client.close()
    df = verify(Store.open(path), settle_s=1.0)
    print(format_verification(df))
    assert len(df) == 8 and (df["device"] == "cuda:0").all()
    assert (df["verdict"] == "ok").all(), format_verification(df)
    assert df["lag_s"].notna().all()
