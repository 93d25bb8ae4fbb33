"""EngineClient against real HTTP servers on 127.0.0.1: the demo engine (with and without its
status endpoint, i.e. like a plain SGLang server), a slow one, a busy one, and none at all."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from collectors.controls import make_control
from collectors.controls.engine_client import EngineClient
from collectors.demo_engine import spawn
from collectors.store import Store

MiB = 2**20


@pytest.fixture(scope="module")
def engine():
    with spawn(weights="8MiB", kv_cache="16MiB") as eng:
        yield eng


@pytest.fixture
def client(engine):
    store = Store(":memory:")
    c = EngineClient(engine.url, store, timeout=30)
    yield c
    httpx.post(engine.url + "/memsaver/delay", json={"seconds": 0}, timeout=10)
    httpx.post(engine.url + "/memsaver/busy", json={"seconds": 0}, timeout=10)
    paused = [t for t, st in c.state().items() if st.paused]
    if paused:
        assert c.resume(paused).ok
    c.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_state_comes_from_status_endpoint(client, engine):
    st = client.state()
    assert {t: (s.bytes, s.paused) for t, s in st.items()} == {
        "weights": (8 * MiB, False), "kv_cache": (16 * MiB, False)}


def test_pause_resume_events_carry_sizes_pid_and_device(client, engine):
    ev = client.pause(["kv_cache"])
    assert ev.ok, ev.error
    assert ev.target == engine.url and ev.expected_bytes == 16 * MiB
    assert ev.details["pid"] == engine.pid and ev.details["device"] == "host"
    assert client.state()["kv_cache"].paused
    ev = client.resume(["kv_cache"])
    assert ev.ok and ev.expected_bytes == 16 * MiB
    events = client.store.events()
    assert list(events["action"]) == ["pause", "resume"] and events["ok"].all()
    assert (events["t_end"] >= events["t_start"]).all()


def test_all_tags_when_none_given(client):
    ev = client.pause()
    assert ev.ok and ev.tags == [] and ev.expected_bytes == 24 * MiB
    assert all(s.paused for s in client.state().values())
    assert client.resume().ok


def test_400_resume_never_released(client):
    ev = client.resume(["weights"])
    assert not ev.ok and ev.error.startswith("engine refused:") and "never released" in ev.error


def test_400_unknown_tag_and_double_release(client):
    ev = client.pause(["weights_drafter"])
    assert not ev.ok and "unknown tag" in ev.error
    assert client.pause(["weights"]).ok
    ev = client.pause(["weights"])
    assert not ev.ok and "already released" in ev.error


def test_400_busy_server(client, engine):
    httpx.post(engine.url + "/memsaver/busy", json={"seconds": 60}, timeout=10)
    ev = client.pause(["weights"])
    assert not ev.ok and "no ongoing request" in ev.error
    assert not client.state()["weights"].paused


def test_timeout_against_a_slow_server(client, engine):
    httpx.post(engine.url + "/memsaver/delay", json={"seconds": 3}, timeout=10)
    slow = EngineClient(engine.url, Store(":memory:"), timeout=0.5)
    ev = slow.pause(["weights"])
    slow.close()
    assert not ev.ok and "did not answer" in ev.error and "0.5 s" in ev.error
    assert ev.duration < 3  # it gave up at its timeout, it did not wait for the server
    # the server finished the release after the client gave up; the next state shows it
    deadline = time.monotonic() + 30
    while not client.state()["weights"].paused and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.state()["weights"].paused


def test_bad_tag_names_fail_before_any_request(client):
    for bad in (["with space"], ["a/b"], [""], ["x" * 65]):
        ev = client.pause(bad)
        assert not ev.ok and "invalid tag name" in ev.error
    assert not any(s.paused for s in client.state().values())


def test_server_down_is_a_failed_event_not_an_exception():
    store = Store(":memory:")
    c = EngineClient(f"http://127.0.0.1:{free_port()}", store, timeout=5)
    ev = c.pause(["weights"])
    assert not ev.ok and "cannot reach engine" in ev.error
    assert ev.expected_bytes is None and store.events()["ok"].tolist() == [False]
    c.close()


def test_plain_sglang_server_without_status_endpoint():
    with spawn(weights="4MiB", kv_cache="4MiB", status=False) as eng:
        c = EngineClient(eng.url, Store(":memory:"), timeout=30)
        assert c.status() is None and c.state() == {}
        ev = c.pause(["weights"])
        assert ev.ok and ev.expected_bytes is None and "pid" not in ev.details
        assert {t: s.paused for t, s in c.state().items()} == {"weights": True}
        assert c.resume(["weights"]).ok
        assert c.state() == {}
        c.close()


@pytest.mark.parametrize("url", ["", "127.0.0.1:30000", "ftp://x", "http://", "http://h:99999"])
def test_bad_urls_are_rejected(url):
    with pytest.raises(ValueError):
        EngineClient(url)


def test_make_control_engine(engine):
    c = make_control("engine", Store(":memory:"), url=engine.url, timeout=10)
    assert isinstance(c, EngineClient) and c.target == engine.url
    c.close()
