"""On a real NVIDIA GPU: ``memsaver demo --device cuda`` drives torch_memory_saver, NVML sees the
release, torch's accounting stays flat, and the HTML report says so (GPU name, driver, NVML)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import charts
from collectors.store import Store
from collectors.verification import verify

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def test_memsaver_demo_cuda_report(tmp_path: Path) -> None:
    pytest.importorskip("torch_memory_saver")
    out = Path(os.environ.get("MEMSAVER_DEMO_OUT") or tmp_path)  # keep the files where the lead asks
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    # A child process: TMS is a per-process singleton, other GPU tests in this process may own it.
    r = subprocess.run([sys.executable, "-m", "collectors", "demo", "--device", "cuda", "--out", str(out),
                        "--weights", "2GiB", "--kv-cache", "4GiB", "--settle", "1.5s"],
                       env=env, text=True, capture_output=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    recording = Path(re.search(r"^recording: (.+)$", r.stdout, re.M).group(1))
    report = Path(re.search(r"^report: (.+)$", r.stdout, re.M).group(1))

    with Store.open(recording) as store:
        ver = verify(store)
        nvml = ver[ver["source"] == "nvml"]
        assert len(nvml) == 3 and list(nvml["verdict"]) == ["ok", "ok", "ok"], ver.to_string()
        released = -nvml["change_bytes"].iloc[:2].sum()
        assert released >= 0.9 * 6 * GiB
        summary = charts.accounting_summary(store)
    row = summary.set_index("device").loc["cuda:0"]
    assert row.physical_source.startswith("physical used (NVML v")
    assert row.accounting_source == "torch allocated (accounting)"
    assert row.accounting_bytes >= 6 * GiB  # flat through the pauses, still holding after resume

    text = report.read_text(encoding="utf-8")
    assert "(flat, as expected)" in text
    env_table = re.search(r'<table id="environment">(.*?)</table>', text, re.S).group(1)
    devices = re.search(r'<table id="devices">(.*?)</table>', text, re.S).group(1)
    assert "torch_memory_saver" in env_table and "NVIDIA" in devices
    assert "physical used (NVML v" in devices
