"""The memsaver CLI as a user runs it: real processes, real files, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from collectors import Store, StoreError
from tests.helpers.proc import ROOT, run_cli, wait_for

MiB = 2**20


def _one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    err = [line for line in r.stderr.splitlines() if "error" in line]
    assert err and needle in err[-1], r.stderr


def test_devices_lists_every_source_with_reason():
    r = run_cli("devices", "--json", "--sources", "host,nvml,torch")
    assert r.returncode == 0, r.stderr
    found = {d["source"]: d for d in json.loads(r.stdout)}
    assert found["host"]["available"] and found["host"]["devices"][0]["device"] == "host"
    assert not found["nvml"]["available"] and "NVML" in found["nvml"]["reason"]
    assert not found["torch"]["available"] and found["torch"]["reason"]
    text = run_cli("devices", "--sources", "host,nvml")
    assert "nvml    unavailable:" in text.stdout and "host memory" in text.stdout


def test_record_summary_export_roundtrip(tmp_path, allocator_child):
    out = tmp_path / "rec.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors", "record", "--out", str(out), "--interval", "20ms",
         "--duration", "60s", "--sources", "host", "--pid", str(allocator_child.pid)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    wait_for(lambda: out.exists())
    time.sleep(0.5)
    allocator_child.send(f"alloc {128 * MiB}")
    time.sleep(0.5)
    allocator_child.send("free")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: stops, flushes, prints the summary
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "samples stored" in stdout and "read p99" in stdout and "host" in stdout
    with Store.open(out) as s:
        rss = s.samples(metrics=["process_used_bytes"])["value"]
        assert rss.max() - rss.iloc[-1] >= 120 * MiB
        assert s.meta()["stopped_at"] is not None

    r = run_cli("summary", str(out))
    assert r.returncode == 0, r.stderr
    assert f"host/host/process_used_bytes/pid {allocator_child.pid}" in r.stdout
    assert "recorder" in r.stdout and "missed" in r.stdout
    j = json.loads(run_cli("summary", str(out), "--json").stdout)
    assert j["samples"] == len(Store.open(out).samples())

    for fmt in ("csv", "parquet"):
        dest = tmp_path / f"out.{fmt}"
        r = run_cli("export", str(out), "--format", fmt, "--out", str(dest))
        assert r.returncode == 0, r.stderr
        df = pd.read_csv(dest) if fmt == "csv" else pd.read_parquet(dest)
        assert len(df) == j["samples"]
    _one_line_error(run_cli("export", str(out), "--format", "csv", "--out", str(tmp_path / "out.csv")),
                    "exists")


def test_record_with_duration_stops_by_itself(tmp_path):
    out = tmp_path / "d.db"
    r = run_cli("record", "--out", str(out), "--duration", "1s", "--interval", "host=10ms",
                "--sources", "host")
    assert r.returncode == 0, r.stderr
    meta = Store.open(out).meta()
    assert meta["intervals"] == {"host": 0.01} and meta["stats"]["host"]["ticks"] > 10


@pytest.mark.parametrize("args, needle", [
    (["--sources", "host,gpu9"], "unknown source gpu9"),
    (["--duration=-1s"], "invalid duration '-1s'"),
    (["--duration", "abc"], "invalid duration 'abc'"),
    (["--interval", "0ms"], "must be > 0"),
    (["--interval", "nvml=20ms", "--sources", "host"], "not one of the recorded sources"),
    (["--pid", "999999999"], "no such process"),
    (["--sources", "nvml"], "source nvml is unavailable"),
])
def test_record_bad_input_is_one_line_and_creates_nothing(tmp_path, args, needle):
    out = tmp_path / "bad.db"
    r = run_cli("record", "--out", str(out), "--duration", "1s", *args)
    _one_line_error(r, needle)
    assert not out.exists()


def test_record_refuses_existing_or_unwritable_output(tmp_path):
    existing = tmp_path / "exists.db"
    existing.write_text("precious")
    _one_line_error(run_cli("record", "--out", str(existing), "--duration", "1s"), "exists")
    assert existing.read_text() == "precious"
    _one_line_error(run_cli("record", "--out", str(tmp_path / "no" / "dir.db"), "--duration", "1s"),
                    "cannot create")


def test_summary_and_export_of_non_recordings(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    _one_line_error(run_cli("summary", str(junk)), "not a memsaver recording")
    _one_line_error(run_cli("summary", str(tmp_path / "missing.db")), "no such recording")
    _one_line_error(run_cli("export", str(junk), "--format", "csv", "--out", str(tmp_path / "o.csv")),
                    "not a memsaver recording")


def test_kill_9_loses_at_most_the_last_batch(tmp_path):
    out = tmp_path / "k.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "collectors", "record", "--out", str(out), "--interval", "5ms",
         "--sources", "host", "--every-tick"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        wait_for(lambda: _count(out) > 200)
        time.sleep(1.0)
        t_kill = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:  # never leave a recorder running if the test fails early
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    with Store.open(out) as s:  # opens cleanly after the crash
        df = s.samples()
        assert len(df) > 200
        # rows are committed every flush interval (0.2 s): the newest stored row is recent
        assert t_kill - df["t"].max() < 2.0
        assert "stopped_at" not in s.meta()
    r = run_cli("summary", str(out))
    assert r.returncode == 0 and "not stopped cleanly" in r.stdout


def _count(path) -> int:
    try:
        return Store.open(path).sample_count()
    except StoreError:  # not created yet, or schema still being written
        return 0


def test_help_and_version():
    r = run_cli("--version")
    assert r.returncode == 0 and "memsaver" in r.stdout
    r = subprocess.run(["memsaver", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "record" in r.stdout and "devices" in r.stdout
