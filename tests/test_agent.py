"""The agent wraps pause/resume of a torch_memory_saver-shaped object and records each call.

Real TMS needs a GPU (tests/gpu/test_tms_agent.py). Here the wrapped object has TMS's exact
call signature -- ``pause(tag=None)``, ``resume(tag=None)``, ``region(tag=..., enable_cpu_backup=...)``
-- and does real work underneath: the host saver's madvise. Only the wrap/unwrap mechanics,
event writing and sampling are under test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import pytest

import collectors.agent as agent
from collectors.controls.base import ControlError
from collectors.controls.host_saver import HostSaver
from collectors.store import Store

MiB = 2**20


class HostTms:
    """torch_memory_saver's Python API over the host saver (pages really released)."""

    def __init__(self) -> None:
        self.saver = HostSaver()
        self._tag: str | None = None

    @contextlib.contextmanager
    def region(self, tag: str = "default", enable_cpu_backup: bool = False):
        self._tag, self._backup = tag, enable_cpu_backup
        try:
            yield
        finally:
            self._tag = None

    def empty(self, nbytes: int) -> None:  # stands for torch.empty inside a region
        self.saver.allocate(self._tag, nbytes, backup=self._backup)

    def pause(self, tag: str | None = None) -> None:
        ev = self.saver.pause([tag] if tag else None)
        if not ev.ok:
            raise ControlError(ev.error)

    def resume(self, tag: str | None = None) -> None:
        ev = self.saver.resume([tag] if tag else None)
        if not ev.ok:
            raise ControlError(ev.error)


@pytest.fixture
def tms():
    t = HostTms()
    yield t
    agent.uninstall()
    t.saver.close()


def test_import_needs_no_tms_or_torch():
    code = ("import sys, collectors.agent, collectors.verification, collectors.demo_engine, "
            "collectors.controls.tms_workload, collectors.controls.engine_client; "
            "print(sorted(m for m in ('torch', 'torch_memory_saver', 'fastapi', 'uvicorn') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_calls_become_events_with_sizes_from_regions(tms, tmp_path):
    path = tmp_path / "agent.sqlite"
    a = agent.install(path, saver=tms, device="host", probe=tms.saver.allocated_bytes)
    with tms.region(tag="weights"):
        tms.empty(8 * MiB)
    with tms.region(tag="kv_cache", enable_cpu_backup=True):
        tms.empty(16 * MiB)
    assert dict(a.region_bytes) == {"weights": 8 * MiB, "kv_cache": 16 * MiB}
    tms.pause("kv_cache")
    tms.pause()  # every tag still active: weights
    tms.resume(tag="kv_cache")
    with pytest.raises(ControlError, match="never released"):
        tms.resume("kv_cache")
    tms.resume()
    assert a.flush()
    ev = Store.open(path).events()
    assert ev["action"].tolist() == ["pause", "pause", "resume", "resume", "resume"]
    assert ev["tags"].tolist() == [["kv_cache"], [], ["kv_cache"], ["kv_cache"], []]
    assert ev["ok"].tolist() == [True, True, True, False, True]
    assert ev["expected_bytes"].tolist() == [16 * MiB, 8 * MiB, 16 * MiB, 16 * MiB, 8 * MiB]
    assert "never released" in ev["error"].iloc[3]
    assert (ev["origin"] == f"agent:{os.getpid()}").all() and (ev["target"] == "tms:host").all()
    assert all(d["pid"] == os.getpid() and d["device"] == "host" for d in ev["details"])
    assert (ev["duration"] >= 0).all()
    agent.uninstall()


def test_uninstall_restores_the_originals(tms):
    originals = {n: getattr(tms, n) for n in ("pause", "resume", "region")}
    assert not any(n in vars(tms) for n in originals)
    agent.install(Store(":memory:"), saver=tms, probe=tms.saver.allocated_bytes)
    assert all(getattr(getattr(tms, n), "__wrapped__", None) is not None for n in originals)
    assert getattr(tms.pause, "__memsaver_agent__", False)
    with pytest.raises(RuntimeError, match="already installed"):
        agent.install(Store(":memory:"), saver=tms)
    agent.uninstall()
    assert not any(n in vars(tms) for n in originals)
    assert {n: getattr(tms, n) for n in originals} == originals
    assert agent.installed() is None
    agent.uninstall()  # twice is fine


def test_instance_attributes_are_put_back_as_they_were(tms):
    own = tms.pause  # a bound method stored on the instance, like a monkeypatch would
    tms.pause = own
    agent.install(Store(":memory:"), saver=tms)
    assert tms.pause is not own
    agent.uninstall()
    assert vars(tms)["pause"] is own


def test_exceptions_propagate_and_the_call_is_still_recorded(tms):
    store = Store(":memory:")
    a = agent.install(store, saver=tms)
    with pytest.raises(ControlError):
        tms.pause("nope")
    assert a.flush()
    ev = store.events()
    assert ev["ok"].tolist() == [False] and "unknown tag" in ev["error"].iloc[0]


def test_the_wrapped_call_does_not_write_to_the_store(tms):
    """Events are written by the agent's thread, never by the caller's."""
    store = Store(":memory:")
    writers: list[str] = []
    orig = store.add_event
    store.add_event = lambda ev: (writers.append(threading.current_thread().name), orig(ev))[1]
    tms.saver.allocate("weights", MiB)
    a = agent.install(store, saver=tms)
    tms.pause("weights")
    tms.resume("weights")
    assert a.flush()
    assert writers == ["memsaver-agent", "memsaver-agent"]


def test_sampling_writes_extra_sources_and_notes_unavailable_ones(tms):
    store = Store(":memory:")
    tms.saver.allocate("weights", 2 * MiB)
    a = agent.install(store, saver=tms, device="cuda:7", interval=0.01,
                      sources=[tms.saver.accounting_source()])
    tms.pause("weights")
    assert a.flush()
    agent.uninstall()
    s = store.samples(sources=["saver"])
    assert len(s) >= 1 and (s["value"] == 2 * MiB).all()  # accounting flat across the pause
    diag = " ".join(store.diagnostics()["message"])
    assert "torch skipped" in diag  # no such device here: said, not crashed


class _FakeCdll:
    """The binding level only: TMS's exported C counter, as ctypes would expose it."""

    def __init__(self) -> None:
        self.value = 3 * 2**30

    def tms_xpu_committed_bytes(self, index: int) -> int:
        return self.value


def test_tms_xpu_counter_source_reads_the_c_counter():
    saver = type("S", (), {})()
    saver._impl = type("I", (), {})()
    saver._impl._binary_wrapper = type("B", (), {})()
    saver._impl._binary_wrapper.cdll = _FakeCdll()
    src = agent.TmsCounterSource(saver, ["xpu:0"])
    assert src.discovery.available
    (s,) = src.read()
    assert (s.device, s.source, s.metric, s.value) == ("xpu:0", "tms", "used_bytes", 3 * 2**30)
    assert not agent.TmsCounterSource(saver, ["cuda:0"]).discovery.available
    saver._impl._binary_wrapper.cdll = object()  # a CUDA build: no such symbol
    assert "no tms_xpu_committed_bytes" in agent.TmsCounterSource(saver, ["xpu:0"]).discover().reason


def test_install_without_tms_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_memory_saver", None)  # import fails like a missing package
    with pytest.raises(RuntimeError, match="torch_memory_saver is not installed"):
        agent.install(Store(":memory:"))
    assert agent.installed() is None


def test_bad_saver_and_interval():
    with pytest.raises(TypeError, match="pause"):
        agent.install(Store(":memory:"), saver=object())
    with pytest.raises(ValueError, match="interval"):
        agent.install(Store(":memory:"), saver=HostTms(), interval=0)
    assert agent.installed() is None
