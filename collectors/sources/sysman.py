"""Intel GPU memory through Level Zero Sysman (pyzes): the physical truth on XPU machines.

On Intel XPU neither torch's allocator nor ``torch.xpu.mem_get_info()`` moves when
torch_memory_saver releases memory; only Sysman does. Per device ``xpu:N``:

- ``used_bytes`` = sum over device-local memory modules of ``size - free`` (zesMemoryGetState),
  ``total_bytes`` = sum of ``size``; system-memory modules are left out;
- per tile ``xpu:N.T`` the same, when the modules sit on two or more sub-devices;
- ``process_used_bytes`` / ``process_shared_bytes`` per pid (zesDeviceProcessesGetState).

A read can take 100 ms or more; the recorder gives this source its own thread and a 200 ms
default interval so it never stalls NVML or host polling.

Devices are numbered like torch's ``xpu:N`` by matching UUIDs when torch is already imported in
this process and has XPU devices; otherwise by Sysman enumeration order (the recorder does not
import torch itself: that would create a device context in the recorder). Which one was used is in
``Discovery.details["mapping"]`` and a diagnostic.

Telemetry problems that only show over time (free == size while memory is in use, a free counter
that does not move across a release) are found by ``telemetry_diagnostics`` over a recording.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collectors.model import ACCOUNTING_SOURCES, DeviceInfo, Discovery, Sample, now
from collectors.sources import _zes
from collectors.sources.base import Source, SourceError
from collectors.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SysmanSource", "telemetry_diagnostics", "torch_xpu_uuids", "PERMISSION_HINT"]

PERMISSION_HINT = (
    "the telemetry needs root or CAP_PERFMON on i915 (without them Sysman reports free == size); "
    f"run the recorder as root or: sudo setcap cap_perfmon+ep {os.path.realpath(sys.executable)}"
)

# What to do about a ze_result_t, where there is something to say.
_HINTS = {
    0x78000001: "no Level Zero GPU driver answered: install Intel's compute runtime "
                "(intel-level-zero-gpu / libze-intel-gpu1) and check that /dev/dri is visible",
    0x70010000: "permission denied: run as root or grant CAP_PERFMON, and make sure the user "
                "can open /dev/dri/renderD* (group 'render')",
    0x70000001: "the device was lost (reset or hang); see dmesg",
    0x78000003: "this driver does not support the call",
    0x78000002: "the driver is too old for this call",
}


def _explain(e: _zes.ZesError) -> str:
    hint = _HINTS.get(e.code)
    return f"{e}: {hint}" if hint else str(e)


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def torch_xpu_uuids() -> list[bytes] | None:
    """UUIDs of torch's xpu:0..N-1 when torch is already imported here and has XPU devices.

    Never imports torch (that would start a device runtime in a recorder process).
    """
    torch = sys.modules.get("torch")
    xpu = getattr(torch, "xpu", None) if torch is not None else None
    try:
        if xpu is None or not xpu.is_available():
            return None
        out = []
        for i in range(xpu.device_count()):
            u = xpu.get_device_properties(i).uuid
            raw = getattr(u, "bytes", u)  # torch >= 2.6: _XPUuuid with .bytes (a list of ints)
            out.append(bytes(raw) if not isinstance(raw, str) else bytes.fromhex(raw.replace("-", "")))
        return out
    except Exception:  # an old torch without uuid, a broken runtime: fall back to order
        return None


@dataclass
class _Probe:
    props: _zes.DeviceProps | None
    modules: list[_zes.MemModule]  # device-local only
    system_modules: int
    bdf: str | None
    states: list[_zes.MemState]  # first read; empty when it failed
    module_errors: bool = False  # listing or describing a module failed


@dataclass
class _Device:
    name: str  # "xpu:N"
    index: int  # Sysman enumeration order
    handle: Any
    props: _zes.DeviceProps | None
    modules: list[_zes.MemModule]  # device-local only
    tiles: list[int] = field(default_factory=list)  # sub-device ids, when there are >= 2
    pids: set[int] = field(default_factory=set)
    idle_reads: int = 0  # consecutive reads with free == size on every module
    warned: set[str] = field(default_factory=set)  # diagnostics already given (no repeats)


class SysmanSource(Source):
    """Level Zero Sysman memory per Intel GPU (and tile, and process).

    ``torch_uuids`` returns torch's XPU UUIDs in index order (default: ``torch_xpu_uuids``);
    ``idle_reads_warning`` is how many reads in a row of free == size on every module trigger
    the permission diagnostic when nothing else shows that memory is in use.
    """

    name = "sysman"
    default_interval = 0.2

    def __init__(self, processes: bool = True, tiles: bool = True,
                 torch_uuids: Callable[[], list[bytes] | None] | None = None,
                 idle_reads_warning: int = 25) -> None:
        super().__init__()
        self.want_processes = processes
        self.want_tiles = tiles
        self.torch_uuids = torch_uuids or torch_xpu_uuids
        self.idle_reads_warning = idle_reads_warning
        self._zs: _zes.Sysman | None = None
        self._devices: list[_Device] = []

    # -- discovery ---------------------------------------------------------------------------
    def discover(self) -> Discovery:
        try:
            zs = _zes.Sysman()
            zs.init()
            drivers = zs.drivers()
        except _zes.ZesUnavailable as e:
            return Discovery.unavailable(self.name, str(e), loader=_zes.loader_path())
        except _zes.ZesError as e:
            return Discovery.unavailable(self.name, f"Level Zero Sysman could not start: {_explain(e)}",
                                         loader=_zes.loader_path())
        if not drivers:
            return Discovery.unavailable(
                self.name, "no Level Zero driver: zesDriverGet found 0 drivers (install Intel's "
                "compute runtime, e.g. intel-level-zero-gpu / libze-intel-gpu1)", loader=zs.loader)
        diagnostics: list[str] = []
        handles: list[Any] = []
        errors: list[str] = []
        for drv in drivers:
            try:
                handles += zs.devices(drv)
            except _zes.ZesError as e:
                errors.append(_explain(e))
        if not handles:
            if errors:
                return Discovery.unavailable(self.name, f"cannot list devices: {'; '.join(errors)}",
                                             loader=zs.loader)
            return Discovery.unavailable(
                self.name, "the Level Zero driver reports 0 devices (no Intel GPU visible here: check "
                "/dev/dri in containers, the 'render' group, ZE_AFFINITY_MASK)", loader=zs.loader)
        diagnostics += [f"zesDeviceGet: {msg}" for msg in errors]

        found = [self._probe(zs, i, h, diagnostics) for i, h in enumerate(handles)]
        mapping, names = self._map_names(found, diagnostics)
        self._zs = zs
        self._devices = []
        infos: list[DeviceInfo] = []
        for i, (probe, name) in enumerate(zip(found, names, strict=True)):
            props, modules, system_modules, bdf, states = (
                probe.props, probe.modules, probe.system_modules, probe.bdf, probe.states)
            dev = _Device(name, i, handles[i], props, modules)
            label = props.name if props else "Intel GPU (properties unavailable)"
            if not modules and probe.module_errors:
                diagnostics.append(f"{name} ({label}) left out: its memory modules could not be read")
                continue
            if not modules:
                diagnostics.append(
                    f"{name} ({label}): Sysman reports no device-local memory modules"
                    + (f" (only {system_modules} in system memory)" if system_modules else "")
                    + ": an integrated GPU shares system memory, so there is no device memory to watch "
                    "here; use the host source")
                continue
            tiles = sorted({m.subdevice for m in modules if m.subdevice is not None})
            dev.tiles = tiles if self.want_tiles and len(tiles) >= 2 else []
            total = sum(s.size for s in states) if len(states) == len(modules) else None
            details = {"pci_bus_id": bdf, "mapping": mapping, "sysman_index": dev.index,
                       "memory_modules": len(modules), "system_memory_modules": system_modules,
                       "loader": zs.loader}
            if props:
                details.update(driver_version=props.driver_version, pci_device_id=f"{props.device_id:#06x}",
                               sub_devices=props.num_subdevices)
            if dev.tiles:
                details["tiles"] = [f"{name}.{t}" for t in dev.tiles]
            uuid = _uuid_text(props.uuid) if props else None
            infos.append(DeviceInfo(name, self.name, label, uuid, total, details))
            for t in dev.tiles:
                tile_states = [s for m, s in zip(modules, states, strict=False) if m.subdevice == t]
                tile_total = sum(s.size for s in tile_states) if len(states) == len(modules) else None
                infos.append(DeviceInfo(f"{name}.{t}", self.name, f"{label} tile {t}", None, tile_total,
                                        {"parent": name, "tile": t, "mapping": mapping}))
            if states and len(states) == len(modules) and all(s.free == s.size for s in states):
                procs = self._safe_processes(zs, dev, None)
                held = sum(p.mem_bytes for p in procs or [])
                if held > 0:
                    diagnostics.append(
                        self._free_equals_size_msg(dev, f"processes hold {format_bytes(held)}"))
                    dev.warned.add("free==size")
            self._devices.append(dev)
        if not self._devices:
            reason = ("no Intel GPU with readable memory modules: " + "; ".join(diagnostics[:3])
                      if any(p.module_errors for p in found) else
                      "no Intel GPU with device-local memory: Sysman reports no device-local memory "
                      "modules (integrated GPU?)")
            return Discovery(self.name, False, [], reason=reason,
                             diagnostics=diagnostics, details={"loader": zs.loader, "mapping": mapping})
        return Discovery(self.name, True, infos, diagnostics=diagnostics,
                         details={"loader": zs.loader, "mapping": mapping, "drivers": len(drivers)})

    def _probe(self, zs: _zes.Sysman, i: int, h: Any, diagnostics: list[str]) -> _Probe:
        """Properties, device-local modules, count of system modules, BDF, first memory states."""
        where = f"Sysman device {i}"
        props = bdf = None
        try:
            props = zs.device_properties(h)
        except _zes.ZesError as e:
            diagnostics.append(f"{where}: name and UUID unknown: {_explain(e)}")
        try:
            bdf = zs.pci_bdf(h)
        except _zes.ZesError as e:
            diagnostics.append(f"{where}: PCI address unknown: {_explain(e)}")
        modules: list[_zes.MemModule] = []
        system_modules = 0
        module_errors = False
        try:
            mem_handles = zs.memory_handles(h)
        except _zes.ZesError as e:
            diagnostics.append(f"{where}: cannot list memory modules: {_explain(e)}")
            mem_handles, module_errors = [], True
        for j, mh in enumerate(mem_handles):
            try:
                m = zs.memory_properties(mh, j)
            except _zes.ZesError as e:
                diagnostics.append(f"{where}: memory module {j} left out: {_explain(e)}")
                module_errors = True
                continue
            if m.device_local:
                modules.append(m)
            else:
                system_modules += 1
        states: list[_zes.MemState] = []
        try:
            states = [zs.memory_state(m) for m in modules]
        except _zes.ZesError as e:
            diagnostics.append(f"{where}: memory state unreadable at start: {_explain(e)}")
        return _Probe(props, modules, system_modules, bdf, states, module_errors)

    def _map_names(self, found: list[_Probe], diagnostics: list[str]) -> tuple[str, list[str]]:
        """Name devices xpu:N after torch's indices by UUID, else by enumeration order."""
        torch_ids = self.torch_uuids() or []
        if torch_ids:
            names: list[str | None] = []
            for probe in found:
                props = probe.props
                idx = torch_ids.index(props.uuid) if props and props.uuid in torch_ids else None
                names.append(None if idx is None else f"xpu:{idx}")
            if any(n is not None for n in names):
                spare = len(torch_ids)
                out = []
                for i, n in enumerate(names):
                    if n is None:
                        diagnostics.append(f"Sysman device {i} is not one of torch's XPU devices "
                                           f"(hidden by ZE_AFFINITY_MASK?); named xpu:{spare}")
                        n, spare = f"xpu:{spare}", spare + 1
                    out.append(n)
                diagnostics.append("device names match torch's xpu:N indices (matched by UUID)")
                return "uuid", out
            diagnostics.append(
                f"torch has {len(torch_ids)} XPU device(s) but none has a Sysman device's UUID "
                "(with ZE_FLAT_DEVICE_HIERARCHY=FLAT torch sees tiles as devices); "
                "naming by Sysman enumeration order instead")
        else:
            diagnostics.append(
                "device names follow Sysman enumeration order (torch is not imported in this process "
                "or has no XPU devices, so UUIDs could not be matched); with ZE_AFFINITY_MASK or "
                "ONEAPI_DEVICE_SELECTOR set, xpu:N here may not be torch's xpu:N")
        return "enumeration", [f"xpu:{i}" for i in range(len(found))]

    # -- reading -----------------------------------------------------------------------------
    def _warn_once(self, dev: _Device, key: str, msg: str) -> None:
        if key not in dev.warned:
            dev.warned.add(key)
            self.pending_diagnostics.append(msg)

    @staticmethod
    def _free_equals_size_msg(dev: _Device, evidence: str) -> str:
        return (f"{dev.name}: Sysman reports free == size on every memory module while {evidence}: "
                f"{PERMISSION_HINT}")

    def _safe_processes(self, zs: _zes.Sysman, dev: _Device, out: list[Sample] | None
                        ) -> list[_zes.ProcessState] | None:
        try:
            procs = zs.processes(dev.handle)
        except _zes.ZesError as e:
            if out is not None:
                self._warn_once(dev, f"proc:{e.code}", f"{dev.name}: per-process memory unavailable: "
                                                       f"{_explain(e)}")
            return None
        dev.warned.discard("proc-gap")
        return procs

    def read(self) -> list[Sample]:
        zs = self._zs
        if zs is None:
            raise SourceError("Sysman source used before a successful discover()")
        out: list[Sample] = []
        failures: list[str] = []
        for dev in self._devices:
            try:
                states = [zs.memory_state(m) for m in dev.modules]
            except _zes.ZesError as e:
                t = now()
                failures.append(f"{dev.name}: {e}")
                self._warn_once(dev, f"state:{e.code}", f"{dev.name}: memory read failed: {_explain(e)}")
                out.append(Sample(t, dev.name, self.name, "used_bytes", None))
                out += [Sample(t, f"{dev.name}.{tile}", self.name, "used_bytes", None) for tile in dev.tiles]
                states = None
            if states is not None:
                t = now()
                dev.warned = {k for k in dev.warned if not k.startswith("state:")}  # recovered
                out.append(Sample(t, dev.name, self.name, "used_bytes", sum(s.size - s.free for s in states)))
                out.append(Sample(t, dev.name, self.name, "total_bytes", sum(s.size for s in states)))
                for tile in dev.tiles:
                    ts = [s for m, s in zip(dev.modules, states, strict=True) if m.subdevice == tile]
                    out.append(Sample(t, f"{dev.name}.{tile}", self.name, "used_bytes",
                                      sum(s.size - s.free for s in ts)))
                    out.append(Sample(t, f"{dev.name}.{tile}", self.name, "total_bytes",
                                      sum(s.size for s in ts)))
                idle = all(s.free == s.size for s in states)
                dev.idle_reads = dev.idle_reads + 1 if idle else 0
            if self.want_processes:
                self._read_processes(zs, dev, out, idle=states is not None and dev.idle_reads > 0)
            if dev.idle_reads >= self.idle_reads_warning and "free==size" not in dev.warned:
                self._warn_once(dev, "free==size", self._free_equals_size_msg(
                    dev, f"{dev.idle_reads} reads in a row showed no memory in use at all "
                         "(if anything runs on this device)"))
        if self._devices and len(failures) == len(self._devices):
            raise SourceError("zesMemoryGetState failed on every device: " + "; ".join(failures))
        return out

    def _read_processes(self, zs: _zes.Sysman, dev: _Device, out: list[Sample], idle: bool) -> None:
        procs = self._safe_processes(zs, dev, out)
        t = now()
        if procs is None:  # unreadable: break the lines of the pids we were showing
            out += [Sample(t, dev.name, self.name, m, None, pid) for pid in sorted(dev.pids)
                    for m in ("process_used_bytes", "process_shared_bytes")]
            dev.pids.clear()
            return
        seen = set()
        for p in procs:
            seen.add(p.pid)
            out.append(Sample(t, dev.name, self.name, "process_used_bytes", p.mem_bytes, p.pid))
            out.append(Sample(t, dev.name, self.name, "process_shared_bytes", p.shared_bytes, p.pid))
        for pid in sorted(dev.pids - seen):  # exited: one gap, then stop
            out.append(Sample(t, dev.name, self.name, "process_used_bytes", None, pid))
            out.append(Sample(t, dev.name, self.name, "process_shared_bytes", None, pid))
        dev.pids = seen
        held = sum(p.mem_bytes for p in procs)
        if idle and held > 0:
            self._warn_once(dev, "free==size", self._free_equals_size_msg(
                dev, f"processes hold {format_bytes(held)}"))

    def close(self) -> None:
        # pyzes has no shutdown call; drop the handles so a closed source cannot read.
        self._zs = None
        self._devices = []


# -- diagnostics over a recording ----------------------------------------------------------------
def _event_device(ev: Any) -> str | None:
    """The device an event acted on, where it says (details or a "tms:<device>" target)."""
    details = ev.get("details") if isinstance(ev.get("details"), dict) else {}
    device = details.get("device")
    if isinstance(device, str) and device:
        return device
    target = str(ev.get("target") or "")
    return target[4:] if target.startswith("tms:") else None


def telemetry_diagnostics(samples: pd.DataFrame, events: pd.DataFrame | None = None, *,
                          settle_s: float = 2.0) -> list[str]:
    """Sysman telemetry problems visible only over time, as one-line messages.

    ``samples``/``events`` are ``Store.samples()`` / ``Store.events()`` frames. Finds:
    free == size on every sample of a device while something shows memory in use there
    (Sysman's own process list, torch/saver accounting, or a pause/resume of known size), and
    frozen telemetry: used memory that does not move at all across a pause/resume that
    released or re-committed ``expected_bytes`` > 0 on that device.

    >>> from collectors import Store
    >>> s = Store.open("run.sqlite")                        # doctest: +SKIP
    >>> telemetry_diagnostics(s.samples(), s.events())      # doctest: +SKIP
    []
    """
    import pandas as pd

    out: list[str] = []
    if samples is None or samples.empty:
        return out
    sm = samples[samples["source"] == "sysman"]
    used = sm[(sm["metric"] == "used_bytes") & sm["pid"].isna()]
    devices = sorted(d for d in used["device"].unique() if "." not in str(d))
    ev = events if events is not None else pd.DataFrame()
    moving: list[dict[str, Any]] = []
    if not ev.empty:
        for row in ev.to_dict("records"):
            exp = row.get("expected_bytes")
            if (row.get("action") in ("pause", "resume") and bool(row.get("ok"))
                    and exp is not None and not pd.isna(exp) and exp > 0):
                row["device"] = _event_device(row)
                moving.append(row)
    acct = samples[samples["source"].isin(ACCOUNTING_SOURCES)
                   & samples["metric"].isin(["allocated_bytes", "reserved_bytes"])]

    frozen_by_event: dict[int, set[str]] = {}
    unknown_events: dict[int, dict[str, Any]] = {}
    for dev in devices:
        series = used[used["device"] == dev].dropna(subset=["value"]).sort_values("t")
        if series.empty:
            continue
        relevant = [e for e in moving if e["device"] in (None, dev)]
        if (series["value"] == 0).all():
            evidence = []
            procs = sm[(sm["device"] == dev) & (sm["metric"] == "process_used_bytes")]["value"].max()
            if pd.notna(procs) and procs > 0:
                evidence.append(f"Sysman lists processes holding {format_bytes(int(procs))}")
            held = acct[acct["device"] == dev]["value"].max()
            if pd.notna(held) and held > 0:
                evidence.append(f"accounting shows {format_bytes(int(held))} allocated")
            if relevant:
                evidence.append(f"{len(relevant)} pause/resume event(s) of known size ran")
            if evidence:
                out.append(f"{dev}: Sysman reported free == size on every sample while memory was in "
                           f"use ({'; '.join(evidence)}): {PERMISSION_HINT}")
            continue
        t, v = series["t"].to_numpy(), series["value"].to_numpy()
        for e in relevant:
            before = v[t <= e["t_start"]]
            t_end = e["t_end"] if e["t_end"] is not None and not pd.isna(e["t_end"]) else e["t_start"]
            horizon = t_end + settle_s
            if before.size == 0 or t[-1] < horizon:
                continue  # not enough recording around this event to judge
            window = v[(t > e["t_start"]) & (t <= horizon)]
            if (window == before[-1]).all():
                frozen_by_event.setdefault(int(e["id"]), set()).add(dev)
                if e["device"] is None:
                    unknown_events[int(e["id"])] = e
    for dev in devices:
        hits = [eid for eid, devs in frozen_by_event.items() if dev in devs
                and (eid not in unknown_events or devs >= set(devices))]
        if not hits:
            continue
        evs = [e for e in moving if int(e["id"]) in hits]
        biggest = max(int(e["expected_bytes"]) for e in evs)
        first = min(evs, key=lambda e: e["t_start"])
        out.append(
            f"{dev}: frozen telemetry: Sysman used memory did not move across {len(evs)} pause/resume "
            f"event(s) expected to move up to {format_bytes(biggest)} (first: {first['action']} "
            f"{','.join(first['tags']) or 'all tags'}, event {first['id']}); this driver's free counter "
            "is not following releases, so physical memory cannot be verified on this device")
    return out
