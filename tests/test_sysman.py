"""SysmanSource over the real pyzes module bound to a compiled fake libze_loader (tests/zes/).

Every call goes through pyzes's own ctypes structures into C code that fills them with the
layouts of zes_api.h; the values come from a control file the test rewrites.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.model import Sample
from collectors.recorder import Recorder
from collectors.sources import _zes
from collectors.sources.base import SourceError
from collectors.sources.sysman import SysmanSource, telemetry_diagnostics, torch_xpu_uuids
from collectors.store import Store
from tests.zes import fake_loader as fz
from tests.zes.fake_loader import FakeDevice, FakeModule, FakeProcess, FakeZe, GiB

PERMISSION_PHRASE = "needs root or CAP_PERFMON on i915"
UUID_A = "aa" * 16
UUID_B = "bb" * 16


@pytest.fixture
def ze(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[fz.ZeHarness]:
    with fz.activate(tmp_path, monkeypatch) as h:
        yield h


def by_key(samples: list[Sample]) -> dict[tuple, int | float | None]:
    return {(s.device, s.metric, s.pid): s.value for s in samples}


def discover(**kw) -> tuple[SysmanSource, object]:
    src = SysmanSource(**kw)
    return src, src.discovery


def wait_for(cond, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- loading ---------------------------------------------------------------------------------
def test_real_pyzes_is_bound_to_the_fake_loader_through_the_redirect(ze):
    original = ctypes.CDLL
    mod = _zes.load()
    assert mod.__name__ == "pyzes" and "site-packages" in mod.__file__  # the installed binding
    assert mod.gpuLib._name == str(ze.lib)  # its CDLL(Debian path) opened our library
    assert _zes.loader_path() == str(ze.lib)
    assert ctypes.CDLL is original  # the redirect was undone after the import


def test_a_failed_load_is_not_cached(ze, monkeypatch):
    monkeypatch.delenv(fz.LOADER_ENV)
    d = SysmanSource().discovery
    assert not d.available and "libze_loader.so.1 not found" in d.reason
    assert "pyzes" not in sys.modules  # pyzes's import failed on its CDLL; nothing half-made is left
    monkeypatch.setenv(fz.LOADER_ENV, str(ze.lib))  # the user installs/points at a loader: retry works
    assert SysmanSource().discovery.available


def test_loader_without_a_gpu_driver(ze, monkeypatch):
    monkeypatch.delenv(fz.CONTROL_ENV)  # the fake then answers zesInit like a loader with no driver
    d = SysmanSource().discovery
    assert not d.available
    assert "zesInit returned ZE_RESULT_ERROR_UNINITIALIZED" in d.reason and "compute runtime" in d.reason


def test_result_codes_are_named_from_pyzes_constants(ze):
    _zes.load()
    assert _zes.result_name(0x70000001) == "ZE_RESULT_ERROR_DEVICE_LOST (0x70000001)"
    assert _zes.result_name(0x12345) == "ze_result_t 0x00012345"


# -- devices and memory ----------------------------------------------------------------------
def test_one_device_used_is_size_minus_free(ze):
    ze.write(FakeZe([FakeDevice(name="Intel(R) Data Center GPU Max 1100", uuid=UUID_A, bdf="0000:9a:00.0",
                                modules=[FakeModule(48 * GiB, 40 * GiB)])]))
    src, d = discover()
    assert d.available, d.reason
    [info] = d.devices
    assert (info.device, info.total_bytes) == ("xpu:0", 48 * GiB)
    assert info.name == "Intel(R) Data Center GPU Max 1100"
    assert info.uuid == "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
    assert info.details["pci_bus_id"] == "0000:9a:00.0"
    assert info.details["driver_version"] == "1.3.29735"
    values = by_key(src.read())
    assert values[("xpu:0", "used_bytes", None)] == 8 * GiB
    assert values[("xpu:0", "total_bytes", None)] == 48 * GiB
    assert all(isinstance(v, int) for v in values.values())


def test_two_devices_two_modules_and_a_system_module_left_out(ze):
    ze.write(FakeZe([
        FakeDevice(uuid=UUID_A, subdevices=2, modules=[
            FakeModule(32 * GiB, 30 * GiB, subdevice=0),
            FakeModule(32 * GiB, 20 * GiB, subdevice=1),
            FakeModule(16 * GiB, 1 * GiB, location="system"),  # not device-local: never summed
        ]),
        FakeDevice(uuid=UUID_B, modules=[FakeModule(16 * GiB, 15 * GiB), FakeModule(16 * GiB, 12 * GiB)]),
    ]))
    src, d = discover()
    assert d.available, d.reason
    totals = {i.device: i.total_bytes for i in d.devices}
    assert totals == {"xpu:0": 64 * GiB, "xpu:0.0": 32 * GiB, "xpu:0.1": 32 * GiB, "xpu:1": 32 * GiB}
    xpu0 = next(i for i in d.devices if i.device == "xpu:0")
    assert xpu0.details["system_memory_modules"] == 1 and xpu0.details["memory_modules"] == 2
    v = by_key(src.read())
    assert v[("xpu:0", "used_bytes", None)] == 14 * GiB  # (32-30) + (32-20); the system module's 15 GiB not
    assert v[("xpu:0.0", "used_bytes", None)] == 2 * GiB
    assert v[("xpu:0.1", "used_bytes", None)] == 12 * GiB
    assert v[("xpu:1", "used_bytes", None)] == 5 * GiB  # two device-local modules, no tiles
    assert not any(k[0].startswith("xpu:1.") for k in v)


def test_free_change_is_seen_on_the_next_read(ze):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(10 * GiB, 6 * GiB)])])
    ze.write(cfg)
    src, _ = discover()
    assert by_key(src.read())[("xpu:0", "used_bytes", None)] == 4 * GiB
    cfg.devices[0].modules[0].free = 9 * GiB
    ze.write(cfg)
    assert by_key(src.read())[("xpu:0", "used_bytes", None)] == 1 * GiB


def test_processes_per_pid_and_a_gap_when_one_exits(ze):
    dev = FakeDevice(processes=[FakeProcess(4242, 3 * GiB, 64 << 20), FakeProcess(4343, 1 * GiB)])
    cfg = FakeZe([dev])
    ze.write(cfg)
    src, _ = discover()
    v = by_key(src.read())
    assert v[("xpu:0", "process_used_bytes", 4242)] == 3 * GiB
    assert v[("xpu:0", "process_shared_bytes", 4242)] == 64 << 20
    assert v[("xpu:0", "process_used_bytes", 4343)] == 1 * GiB
    dev.processes.pop()
    ze.write(cfg)
    v = by_key(src.read())
    assert v[("xpu:0", "process_used_bytes", 4343)] is None  # one gap so the line stops
    assert v[("xpu:0", "process_used_bytes", 4242)] == 3 * GiB
    assert ("xpu:0", "process_used_bytes", 4343) not in by_key(src.read())


# -- mapping to torch ------------------------------------------------------------------------
def test_names_follow_torch_indices_by_uuid(ze):
    ze.write(FakeZe([FakeDevice(uuid=UUID_A, modules=[FakeModule(8 * GiB, 7 * GiB)]),
                     FakeDevice(uuid=UUID_B, modules=[FakeModule(8 * GiB, 5 * GiB)])]))
    src, d = discover(torch_uuids=lambda: [bytes.fromhex(UUID_B), bytes.fromhex(UUID_A)])
    assert d.details["mapping"] == "uuid"
    assert {i.device: i.uuid[:2] for i in d.devices} == {"xpu:0": "bb", "xpu:1": "aa"}
    assert any("matched by UUID" in m for m in d.diagnostics)
    v = by_key(src.read())
    assert v[("xpu:0", "used_bytes", None)] == 3 * GiB  # Sysman's device 1 is torch's xpu:0
    assert v[("xpu:1", "used_bytes", None)] == 1 * GiB


def test_device_hidden_from_torch_gets_a_spare_name_and_a_diagnostic(ze):
    ze.write(FakeZe([FakeDevice(uuid=UUID_A), FakeDevice(uuid=UUID_B)]))
    _, d = discover(torch_uuids=lambda: [bytes.fromhex(UUID_B)])
    assert {i.uuid[:2]: i.device for i in d.devices} == {"bb": "xpu:0", "aa": "xpu:1"}
    assert any("not one of torch's XPU devices" in m for m in d.diagnostics)


def test_falls_back_to_enumeration_order_and_says_so(ze):
    ze.write(FakeZe([FakeDevice(uuid=UUID_A), FakeDevice(uuid=UUID_B)]))
    _, d = discover(torch_uuids=lambda: [bytes(16)])  # torch sees something else (e.g. FLAT tiles)
    assert d.details["mapping"] == "enumeration"
    assert [i.uuid[:2] for i in d.devices] == ["aa", "bb"]
    assert any("ZE_FLAT_DEVICE_HIERARCHY" in m for m in d.diagnostics)
    _, d = discover(torch_uuids=lambda: None)
    assert d.details["mapping"] == "enumeration"
    assert any("enumeration order" in m for m in d.diagnostics)


def test_torch_xpu_uuids_reads_torch_uuid_bytes(monkeypatch):
    # No XPU torch can run here: a stand-in with torch >= 2.6's shape (uuid.bytes is a list of ints).
    props = [types.SimpleNamespace(uuid=types.SimpleNamespace(bytes=list(range(i, i + 16)))) for i in (0, 16)]
    xpu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                                get_device_properties=lambda i: props[i])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(xpu=xpu))
    assert torch_xpu_uuids() == [bytes(range(16)), bytes(range(16, 32))]


def test_torch_xpu_uuids_never_imports_torch():
    code = ("import sys; from collectors.sources.sysman import torch_xpu_uuids; "
            "r = torch_xpu_uuids(); print(r, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1], check=True).stdout.split()
    assert out == ["None", "False"]


# -- counts of zero --------------------------------------------------------------------------
@pytest.mark.parametrize(("cfg", "words"), [
    (FakeZe(drivers=0), "0 drivers"),
    (FakeZe(devices=[]), "0 devices"),
    (FakeZe([FakeDevice(modules=[])]), "no device-local memory"),
    (FakeZe([FakeDevice(modules=[FakeModule(8 * GiB, 4 * GiB, location="system")])]), "integrated GPU"),
])
def test_zero_counts_make_the_source_unavailable_with_a_reason(ze, cfg, words):
    ze.write(cfg)
    _, d = discover()
    assert not d.available
    assert words in d.reason


def test_integrated_gpu_next_to_a_discrete_one_is_a_diagnostic(ze):
    ze.write(FakeZe([FakeDevice(), FakeDevice(modules=[FakeModule(8 * GiB, 4 * GiB, location="system")])]))
    _, d = discover()
    assert d.available and [i.device for i in d.devices] == ["xpu:0"]
    assert any("xpu:1" in m and "integrated GPU" in m and "only 1 in system memory" in m
               for m in d.diagnostics)


# -- error codes from each call --------------------------------------------------------------
@pytest.mark.parametrize(("call", "code", "words"), [
    ("zesInit", fz.ZE_RESULT_ERROR_UNINITIALIZED, "no Level Zero GPU driver answered"),
    ("zesDriverGet", fz.ZE_RESULT_ERROR_DEVICE_LOST, "ZE_RESULT_ERROR_DEVICE_LOST"),
    ("zesDeviceGet", fz.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS, "group 'render'"),
])
def test_start_up_errors_make_the_source_unavailable(ze, call, code, words):
    ze.write(FakeZe(results={call: code}))
    _, d = discover()
    assert not d.available
    assert call in d.reason and words in d.reason


def test_properties_error_keeps_the_device_without_name_and_uuid(ze):
    ze.write(FakeZe([FakeDevice(results={"zesDeviceGetProperties": fz.ZE_RESULT_ERROR_UNSUPPORTED_FEATURE})]))
    src, d = discover()
    assert d.available
    [info] = d.devices
    assert info.uuid is None and "properties unavailable" in info.name
    assert any("zesDeviceGetProperties returned ZE_RESULT_ERROR_UNSUPPORTED_FEATURE" in m
               for m in d.diagnostics)
    assert by_key(src.read())[("xpu:0", "used_bytes", None)] == 8 * GiB


def test_pci_error_leaves_the_address_unknown(ze):
    code = fz.ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
    ze.write(FakeZe([FakeDevice(results={"zesDevicePciGetProperties": code})]))
    _, d = discover()
    assert d.available and d.devices[0].details["pci_bus_id"] is None
    assert any("PCI address unknown" in m for m in d.diagnostics)


@pytest.mark.parametrize("call", ["zesDeviceEnumMemoryModules", "zesMemoryGetProperties"])
def test_module_errors_leave_that_device_out(ze, call):
    ze.write(FakeZe([FakeDevice(), FakeDevice(results={call: fz.ZE_RESULT_ERROR_DEVICE_LOST})]))
    _, d = discover()
    assert d.available and [i.device for i in d.devices] == ["xpu:0"]
    assert any(f"{call} returned ZE_RESULT_ERROR_DEVICE_LOST" in m for m in d.diagnostics)
    assert any("xpu:1" in m and "left out" in m for m in d.diagnostics)
    assert not any("integrated GPU" in m for m in d.diagnostics)  # an error, not an iGPU
    ze.write(FakeZe([FakeDevice(results={call: fz.ZE_RESULT_ERROR_DEVICE_LOST})]))
    _, d = discover()
    assert not d.available and "ZE_RESULT_ERROR_DEVICE_LOST" in d.reason


def test_memory_state_error_on_one_device_is_a_gap_for_that_device(ze):
    cfg = FakeZe([FakeDevice(), FakeDevice()])
    ze.write(cfg)
    src, _ = discover()
    cfg.devices[1].results["zesMemoryGetState"] = fz.ZE_RESULT_ERROR_DEVICE_LOST
    ze.write(cfg)
    v = by_key(src.read())
    assert v[("xpu:1", "used_bytes", None)] is None  # a gap, never 0
    assert v[("xpu:0", "used_bytes", None)] == 8 * GiB
    [msg] = src.drain_diagnostics()
    assert "xpu:1" in msg and "ZE_RESULT_ERROR_DEVICE_LOST" in msg
    src.read()
    assert src.drain_diagnostics() == []  # said once, not every 200 ms
    cfg.devices[1].results.clear()
    ze.write(cfg)
    assert by_key(src.read())[("xpu:1", "used_bytes", None)] == 8 * GiB


def test_memory_state_error_everywhere_raises_source_error(ze):
    ze.write(FakeZe(results={"zesMemoryGetState": fz.ZE_RESULT_ERROR_DEVICE_LOST}))
    src, d = discover()
    assert d.available and d.devices[0].total_bytes is None  # size unknown until a read works
    assert any("memory state unreadable at start" in m for m in d.diagnostics)
    with pytest.raises(SourceError, match="ZE_RESULT_ERROR_DEVICE_LOST"):
        src.read()


def test_process_list_error_keeps_memory_and_breaks_process_lines(ze):
    cfg = FakeZe([FakeDevice(processes=[FakeProcess(77, 2 * GiB)])])
    ze.write(cfg)
    src, _ = discover()
    assert by_key(src.read())[("xpu:0", "process_used_bytes", 77)] == 2 * GiB
    cfg.devices[0].results["zesDeviceProcessesGetState"] = fz.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS
    ze.write(cfg)
    v = by_key(src.read())
    assert v[("xpu:0", "used_bytes", None)] == 8 * GiB
    assert v[("xpu:0", "process_used_bytes", 77)] is None
    assert any("per-process memory unavailable" in m and "INSUFFICIENT_PERMISSIONS" in m
               for m in src.drain_diagnostics())


# -- telemetry that lies ---------------------------------------------------------------------
def test_free_equals_size_with_a_process_holding_memory_is_diagnosed_at_discovery(ze):
    ze.write(FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 16 * GiB)],
                                processes=[FakeProcess(99, 5 * GiB)])]))
    _, d = discover()
    assert d.available
    assert any(PERMISSION_PHRASE in m and "processes hold 5.00 GiB" in m for m in d.diagnostics)


def test_free_equals_size_for_many_reads_is_diagnosed_once(ze):
    ze.write(FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 16 * GiB)])]))
    src, d = discover(idle_reads_warning=3)
    assert not any(PERMISSION_PHRASE in m for m in d.diagnostics)  # nothing shows memory in use yet
    src.read()
    src.read()
    assert src.drain_diagnostics() == []
    src.read()
    [msg] = src.drain_diagnostics()
    assert "xpu:0" in msg and PERMISSION_PHRASE in msg and "3 reads in a row" in msg
    src.read()
    assert src.drain_diagnostics() == []


def test_process_appearing_while_free_equals_size_is_diagnosed_on_read(ze):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 16 * GiB)])])
    ze.write(cfg)
    src, _ = discover()
    src.read()
    assert src.drain_diagnostics() == []
    cfg.devices[0].processes.append(FakeProcess(1234, 2 * GiB))
    ze.write(cfg)
    src.read()
    [msg] = src.drain_diagnostics()
    assert "processes hold 2.00 GiB" in msg and PERMISSION_PHRASE in msg


def test_free_below_size_is_not_diagnosed(ze):
    ze.write(FakeZe([FakeDevice(modules=[FakeModule(16 * GiB, 15 * GiB)], processes=[FakeProcess(9, GiB)])]))
    src, d = discover(idle_reads_warning=2)
    for _ in range(4):
        src.read()
    assert not any(PERMISSION_PHRASE in m for m in d.diagnostics + src.drain_diagnostics())


def _record_pause(ze, cfg: FakeZe, *, frozen: bool, tmp_path: Path) -> Store:
    """Record Sysman while a 6 GiB pause happens on xpu:0 (the control file frees it)."""
    store = Store(tmp_path / "run.sqlite")
    src = SysmanSource(processes=False)
    with Recorder(store, [src], intervals={"sysman": 0.05}, heartbeat=0.2) as rec:
        key = ("xpu:0", "sysman", "used_bytes", None)
        wait_for(lambda: rec.latest().get(key, (0, None))[1] == 8 * GiB, what="first reading")
        cfg.frozen = frozen
        ze.write(cfg)
        with rec.event("pause", ["weights"], target="tms:xpu:0", expected_bytes=6 * GiB):
            cfg.devices[0].modules[0].free = 46 * GiB  # 6 GiB released
            ze.write(cfg)
        t_end = time.time()
        wait_for(lambda: rec.latest()[key][0] > t_end + 1.0, what="readings after the pause")
    return store


def test_free_changed_mid_recording_is_stored_as_a_step(ze, tmp_path):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(48 * GiB, 40 * GiB)])])
    ze.write(cfg)
    store = _record_pause(ze, cfg, frozen=False, tmp_path=tmp_path)
    used = store.samples(sources=["sysman"], metrics=["used_bytes"], devices=["xpu:0"])
    values = used["value"].astype("int64").tolist()
    assert values[0] == 8 * GiB and values[-1] == 2 * GiB
    step = values.index(2 * GiB)
    assert set(values[:step]) == {8 * GiB} and set(values[step:]) == {2 * GiB}  # one clean step
    ev = store.events()
    assert used["t"].iloc[step] >= ev["t_start"].iloc[0]
    assert telemetry_diagnostics(store.samples(), ev, settle_s=0.5) == []
    assert store.devices()["device"].tolist() == ["xpu:0"]


def test_frozen_free_counter_is_diagnosed(ze, tmp_path):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(48 * GiB, 40 * GiB)])])
    ze.write(cfg)
    store = _record_pause(ze, cfg, frozen=True, tmp_path=tmp_path)
    used = store.samples(sources=["sysman"], metrics=["used_bytes"], devices=["xpu:0"])
    assert set(used["value"].astype("int64")) == {8 * GiB}  # the library really froze it
    [msg] = telemetry_diagnostics(store.samples(), store.events(), settle_s=0.5)
    assert msg.startswith("xpu:0: frozen telemetry") and "6.00 GiB" in msg and "pause weights" in msg


def test_free_equals_size_over_a_recording_is_diagnosed(ze, tmp_path):
    cfg = FakeZe([FakeDevice(modules=[FakeModule(48 * GiB, 48 * GiB)])])
    ze.write(cfg)
    store = Store(tmp_path / "idle.sqlite")
    with Recorder(store, [SysmanSource(processes=False)], intervals={"sysman": 0.05}, heartbeat=0.2) as rec:
        wait_for(lambda: rec.stats["sysman"].ticks >= 3, what="sysman reads")
        with rec.event("pause", ["kv_cache"], target="tms:xpu:0", expected_bytes=4 * GiB):
            pass
        t_end = time.time()
        wait_for(lambda: rec.latest()[("xpu:0", "sysman", "used_bytes", None)][0] > t_end + 0.6,
                 what="readings after the pause")
    [msg] = telemetry_diagnostics(store.samples(), store.events(), settle_s=0.5)
    assert msg.startswith("xpu:0:") and PERMISSION_PHRASE in msg and "free == size on every sample" in msg
    # With nothing showing memory in use, an all-free device is simply idle: no message.
    assert telemetry_diagnostics(store.samples(), store.events().iloc[0:0]) == []


def test_accounting_on_the_device_is_evidence_too(tmp_path):
    store = Store(tmp_path / "acct.sqlite")
    store.add_samples([Sample(1.0, "xpu:0", "sysman", "used_bytes", 0),
                       Sample(2.0, "xpu:0", "sysman", "used_bytes", 0),
                       Sample(1.5, "xpu:0", "torch", "allocated_bytes", 3 * GiB)])
    [msg] = telemetry_diagnostics(store.samples(), store.events())
    assert "accounting shows 3.00 GiB allocated" in msg and PERMISSION_PHRASE in msg


# -- a slow Sysman must not stall other sources ----------------------------------------------
def test_slow_sysman_reads_do_not_stall_the_host_source(ze, tmp_path):
    from collectors.sources.host import HostSource

    ze.write(FakeZe(sleep_ms={"zesMemoryGetState": 300}))
    store = Store(tmp_path / "slow.sqlite")
    rec = Recorder(store, [SysmanSource(processes=False), HostSource()],
                   intervals={"sysman": 0.2, "host": 0.02})
    with rec:
        wait_for(lambda: rec.stats["sysman"].ticks >= 5, what="5 slow sysman reads")
    sysman, host = rec.stats["sysman"], rec.stats["host"]
    # Each sysman read sleeps 300 ms inside the C library; pyzes's CDLL releases the GIL there,
    # so the host thread keeps ticking at 20 ms. Had it been stalled, host would tick about once
    # per sysman read and miss ~15 ticks each time.
    assert host.ticks >= 4 * sysman.ticks, (host.ticks, sysman.ticks)
    assert host.missed_ticks < host.ticks, (host.missed_ticks, host.ticks)
    assert sysman.latency_percentile(50) >= 0.3  # the measured read latency reflects the sleep
    assert store.meta()["stats"]["sysman"]["read_latency_p50_s"] >= 0.3
    assert sysman.missed_ticks > 0  # 300 ms reads at a 200 ms interval: the overrun is counted
