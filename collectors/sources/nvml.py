"""NVIDIA GPU memory through NVML: the physical truth on CUDA machines.

Per GPU: ``used_bytes`` and ``total_bytes`` (and ``reserved_bytes`` with the v2 query), plus
``process_used_bytes`` per process at a slower rate. Which ``used`` this is matters: v1 includes
memory the driver reserves, v2 excludes it; ``DeviceInfo.details["used_semantics"]`` says which.

Devices are named ``cuda:N`` by NVML index. NVML orders by PCI bus; CUDA does too only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and without ``CUDA_VISIBLE_DEVICES``; the UUID is stored so a
recording can be matched to torch's devices either way.
"""

from __future__ import annotations

import time
from typing import Any

from collectors.model import DeviceInfo, Discovery, Sample, now
from collectors.sources import _nvml
from collectors.sources.base import Source, SourceError

__all__ = ["NvmlSource"]

USED_SEMANTICS = {
    1: "v1: used includes driver-reserved memory",
    2: "v2: used excludes driver-reserved memory (reserved_bytes shown apart)",
}


class NvmlSource(Source):
    name = "nvml"
    default_interval = 0.02

    def __init__(self, processes: bool = True, process_interval: float = 0.2,
                 indices: list[int] | None = None) -> None:
        super().__init__()
        self.want_processes = processes
        self.process_interval = process_interval
        self.indices = indices
        self._handles: list[tuple[str, Any, int]] = []  # (device, handle, memory version)
        self._last_proc_read = 0.0
        self._failed: set[str] = set()
        self._procs: dict[str, set[int]] = {}

    def discover(self) -> Discovery:
        try:
            _nvml.init()
            count = _nvml.device_count()
        except _nvml.NvmlUnavailable as e:
            return Discovery.unavailable(self.name, str(e))
        except Exception as e:
            return Discovery.unavailable(self.name, f"NVML error: {_nvml.error_text(e)}")
        if count == 0:
            return Discovery.unavailable(self.name, "NVML found no NVIDIA GPU")
        devices, diagnostics = [], []
        for i in self.indices if self.indices is not None else range(count):
            dev = f"cuda:{i}"
            try:
                h = _nvml.handle(i)
                ident = _nvml.device_identity(h)
                version = _nvml.probe_memory_version(h)
                mem = _nvml.memory_info(h, version)
            except Exception as e:
                diagnostics.append(f"{dev}: cannot be read ({_nvml.error_text(e)}); skipped")
                continue
            self._handles.append((dev, h, version))
            devices.append(DeviceInfo(
                dev, self.name, ident["name"], ident["uuid"], mem.total,
                details={"nvml_index": i, "pci_bus_id": ident["pci_bus_id"],
                         "used_semantics": USED_SEMANTICS[version], "memory_info_version": version,
                         "driver_version": _nvml.driver_version()},
            ))
        if not devices:
            return Discovery(self.name, False, reason="; ".join(diagnostics) or "no readable GPU")
        return Discovery(self.name, True, devices, diagnostics=diagnostics,
                         details={"driver_version": _nvml.driver_version()})

    def read(self) -> list[Sample]:
        if not self.discovery.available:
            raise SourceError(self.discovery.reason or "NVML unavailable")
        out: list[Sample] = []
        want_procs = self.want_processes and (
            time.monotonic() - self._last_proc_read >= self.process_interval)
        if want_procs:
            self._last_proc_read = time.monotonic()
        for dev, h, version in self._handles:
            try:
                m = _nvml.memory_info(h, version)
                t = now()  # stamped when the read returned, never before it
            except Exception as e:  # e.g. GPU lost: a gap for this device, the rest goes on
                t = now()
                out.append(Sample(t, dev, self.name, "used_bytes", None))
                if version == 2:
                    out.append(Sample(t, dev, self.name, "reserved_bytes", None))
                if dev not in self._failed:
                    self._failed.add(dev)
                    self.pending_diagnostics.append(f"{dev}: NVML read failed ({_nvml.error_text(e)})")
                continue
            if dev in self._failed:
                self._failed.discard(dev)
                self.pending_diagnostics.append(f"{dev}: NVML reads again")
            out.append(Sample(t, dev, self.name, "used_bytes", m.used))
            out.append(Sample(t, dev, self.name, "total_bytes", m.total))
            if m.reserved is not None:
                out.append(Sample(t, dev, self.name, "reserved_bytes", m.reserved))
            if want_procs:
                try:
                    procs = _nvml.processes(h)
                    t = now()
                except Exception:
                    continue
                seen = set()
                for p in procs:
                    seen.add(p.pid)
                    out.append(Sample(t, dev, self.name, "process_used_bytes", p.used, p.pid))
                # A process that left ends its line with a gap instead of holding its last value.
                for pid in self._procs.get(dev, set()) - seen:
                    out.append(Sample(t, dev, self.name, "process_used_bytes", None, pid))
                self._procs[dev] = seen
        return out
