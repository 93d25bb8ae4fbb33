"""The demo engine in real child processes: SGLang's endpoints, its CLI errors, and the
end-to-end check that a recorder sees its RSS drop and rise by the tags' sizes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from collectors import Recorder, Store
from collectors.controls.engine_client import EngineClient
from collectors.demo_engine import READY_MARK, spawn
from collectors.sources.host import HostSource
from collectors.verification import format_verification, verify

MiB = 2**20
WEIGHTS, KV = 64 * MiB, 192 * MiB
# The engine's RSS moves with Python's own allocations while it serves HTTP (a few MiB at most);
# the recorded change must match the tag size within 10% of it.
TOLERANCE = 0.1


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "collectors", "demo-engine", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, msg", [
    (["--weights", "-1"], "--weights: invalid size '-1'"),
    (["--kv-cache", "12XB"], "--kv-cache: invalid size '12XB'"),
    (["--weights", "0", "--kv-cache", "0"], "nothing to hold"),
    (["--device", "tpu"], "--device: unknown device"),
    (["--port", "70000"], "--port: invalid port"),
    (["--backup", "cuda_graph"], "--backup: cuda_graph is not a held tag"),
    (["--busy-for", "soon"], "--busy-for: invalid duration"),
    (["--weights", "1000TiB"], "of host memory available"),
])
def test_cli_rejects_bad_options_with_one_line(args, msg):
    r = _cli(*args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memsaver demo-engine: error: ") and msg in lines[0]


def test_cli_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _cli("--port", str(s.getsockname()[1]), "--weights", "1MiB", "--kv-cache", "1MiB")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "cannot listen on 127.0.0.1" in r.stderr


def test_cli_serves_and_stops_on_sigterm():
    p = subprocess.Popen([sys.executable, "-m", "collectors", "demo-engine", "--port", "0",
                          "--weights", "2MiB", "--kv-cache", "2MiB"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # the engine prints its ready line once bound
        assert line.startswith(READY_MARK), line + p.stderr.read()
        info = json.loads(line[len(READY_MARK):])
        assert info["url"].startswith("http://127.0.0.1:") and info["pid"] == p.pid
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(info["url"] + "/memsaver/status", timeout=5).json()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert status["tags"]["weights"] == {"bytes": 2 * MiB, "paused": False, "backup": False}
    finally:
        p.terminate()
        p.wait(30)


def test_spawn_reports_the_engines_own_error():
    with pytest.raises(RuntimeError, match="invalid size"):
        spawn(weights="12XB")


def test_endpoints_speak_sglang():
    with spawn(weights="4MiB", kv_cache="4MiB", cuda_graph="2MiB", backup=["weights"]) as eng:
        st = httpx.get(eng.url + "/memsaver/status", timeout=10).json()
        assert st["pid"] == eng.pid and st["device"] == "host" and st["busy"] is False
        assert st["tags"]["weights"]["backup"] is True
        assert set(st["tags"]) == {"weights", "kv_cache", "cuda_graph"}
        assert httpx.get(eng.url + "/health", timeout=10).status_code == 200

        r = httpx.post(eng.url + "/release_memory_occupation", json={"tags": ["weights"]}, timeout=30)
        assert r.status_code == 200 and r.json() is None  # SGLang answers 200 with a null body
        r = httpx.post(eng.url + "/resume_memory_occupation", json={"tags": ["kv_cache"]}, timeout=30)
        assert r.status_code == 400 and "never released" in r.json()["error"]["message"]
        r = httpx.post(eng.url + "/resume_memory_occupation", json={"tags": None}, timeout=30)
        assert r.status_code == 200  # null tags = all released tags: brings weights back
        r = httpx.post(eng.url + "/release_memory_occupation", timeout=30)  # no body = all
        assert r.status_code == 200
        tags = httpx.get(eng.url + "/memsaver/status", timeout=10).json()["tags"]
        assert all(t["paused"] for t in tags.values())
        r = httpx.post(eng.url + "/resume_memory_occupation", json={}, timeout=30)
        assert r.status_code == 200
        for body in (b"[1]", b"{not json", b'{"tags": "weights"}'):
            r = httpx.post(eng.url + "/release_memory_occupation", content=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["message"]
        r = httpx.post(eng.url + "/memsaver/busy", json={"seconds": -1}, timeout=10)
        assert r.status_code == 400


def test_busy_for_option_makes_the_engine_refuse_then_accept():
    with spawn(weights="2MiB", kv_cache="2MiB", busy_for="3s") as eng:
        c = EngineClient(eng.url, Store(":memory:"), timeout=30)
        ev = c.pause()
        assert not ev.ok and "no ongoing request" in ev.error
        deadline = time.monotonic() + 60
        status = eng.url + "/memsaver/status"
        while time.monotonic() < deadline and httpx.get(status, timeout=10).json()["busy"]:
            time.sleep(0.1)
        assert c.pause().ok
        c.close()


def _value_at(df, t):
    rows = df[df["t"] <= t]
    return float(rows["value"].iloc[-1])


def test_end_to_end_recorded_rss_matches_tag_sizes(tmp_path):
    """The done-when test: a real child process, real HTTP, real madvise, a real recording."""
    path = tmp_path / "e2e.sqlite"
    store = Store(path)
    with spawn(weights="64MiB", kv_cache="192MiB") as eng:
        rec = Recorder(store, [HostSource(pids=[eng.pid], system=False)], intervals={"host": 0.02}).start()
        client = EngineClient(eng.url, store, timeout=60)

        def wait_recorded(after: float) -> None:
            # the recorder samples every 20 ms; wait until it stored a sample newer than `after`
            # plus a heartbeat (1 s), so the settled value is on record
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if rec.latest() and max(t for t, _ in rec.latest().values()) > after + 1.2:
                    return
                time.sleep(0.05)
            raise AssertionError("recorder stopped sampling")

        wait_recorded(time.time() - 1.0)
        plan = [("pause", ["weights"]), ("pause", ["kv_cache"]), ("resume", ["kv_cache"]),
                ("resume", ["weights"]), ("pause", None), ("resume", None), ("resume", ["weights"])]
        events = []
        for action, tags in plan:
            ev = getattr(client, action)(tags)
            events.append(ev)
            wait_recorded(ev.t_end)
        rec.stop()
        client.close()

    assert [e.ok for e in events] == [True] * 6 + [False]
    samples = store.samples(sources=["host"], metrics=["process_used_bytes"])
    samples = samples[samples["pid"] == eng.pid]
    assert len(samples) > 20
    expected = {("pause", "weights"): -WEIGHTS, ("pause", "kv_cache"): -KV, ("resume", "kv_cache"): KV,
                ("resume", "weights"): WEIGHTS, ("pause", "all"): -(WEIGHTS + KV),
                ("resume", "all"): WEIGHTS + KV}
    for ev in events[:6]:
        before = _value_at(samples, ev.t_start)
        after = _value_at(samples, ev.t_end + 1.0)
        want = expected[(ev.action, ",".join(ev.tags) or "all")]
        assert abs((after - before) - want) <= TOLERANCE * abs(want), (ev.action, ev.tags, after - before)

    df = verify(Store.open(path), settle_s=1.0, tolerance=TOLERANCE)
    print(format_verification(df))
    assert len(df) == 7 and (df["pid"] == eng.pid).all() and (df["source"] == "host").all()
    assert df["verdict"].tolist() == ["ok"] * 6 + ["call failed"]
    ok = df[df["verdict"] == "ok"]
    assert ok["lag_s"].notna().all() and (ok["lag_s"] >= 0).all() and (ok["lag_s"] < 1.0).all()
    assert (ok["expected_bytes"] == [WEIGHTS, KV, KV, WEIGHTS, WEIGHTS + KV, WEIGHTS + KV]).all()
    assert "never released" in df["note"].iloc[-1]
