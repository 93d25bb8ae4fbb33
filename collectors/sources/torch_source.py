"""torch's own view, in-process: allocator accounting and ``mem_get_info``.

``allocated_bytes`` / ``reserved_bytes`` come from torch's caching allocator; they stay flat when
torch_memory_saver releases physical pages (it keeps the virtual addresses). ``used_bytes`` here is
``total - free`` from ``mem_get_info``: on CUDA it follows a release (it asks the driver), on Intel
XPU it stays flat (only Sysman shows the truth). This source only sees the process it runs in, and
querying a CUDA device creates a context on it: choose ``devices`` on multi-GPU hosts.

``memory_allocated`` costs ~60 us on an H200, so the default interval is 100 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collectors.model import DeviceInfo, Discovery, Sample, now
from collectors.sources.base import Source, SourceError

__all__ = ["TorchSource"]


class TorchSource(Source):
    name = "torch"
    default_interval = 0.1
    physical = False

    def __init__(self, devices: Sequence[str] | None = None) -> None:
        super().__init__()
        self.wanted = list(devices) if devices is not None else None
        self._torch: Any = None
        self._devs: list[tuple[str, Any, int]] = []  # (name, backend module, index)

    def discover(self) -> Discovery:
        try:
            import torch
        except ImportError:
            return Discovery.unavailable(self.name, "torch is not installed")
        except Exception as e:  # a broken install must not stop the app
            return Discovery.unavailable(self.name, f"torch failed to import: {e}")
        self._torch = torch
        found: list[tuple[str, Any, int]] = []
        for kind in ("cuda", "xpu"):
            backend = getattr(torch, kind, None)
            try:
                if backend is None or not backend.is_available():
                    continue
                found += [(f"{kind}:{i}", backend, i) for i in range(backend.device_count())]
            except Exception:
                continue
        if self.wanted is not None:
            unknown = set(self.wanted) - {d for d, _, _ in found}
            if unknown:
                return Discovery.unavailable(
                    self.name, f"torch has no device {', '.join(sorted(unknown))} "
                    f"(it sees: {', '.join(d for d, _, _ in found) or 'none'})")
            found = [f for f in found if f[0] in self.wanted]
        if not found:
            return Discovery.unavailable(
                self.name, f"torch {torch.__version__} sees no CUDA or XPU device")
        devices = []
        for dev, backend, i in found:
            props: dict[str, Any] = {}
            try:
                p = backend.get_device_properties(i)
                props = {"name": p.name, "total": int(getattr(p, "total_memory", 0)) or None}
            except Exception:
                pass
            devices.append(DeviceInfo(dev, self.name, props.get("name") or dev,
                                      total_bytes=props.get("total"),
                                      details={"torch_version": torch.__version__,
                                               "has_mem_get_info": hasattr(backend, "mem_get_info")}))
        self._devs = found
        return Discovery(self.name, True, devices)

    def read(self) -> list[Sample]:
        if not self.discovery.available:
            raise SourceError(self.discovery.reason or "torch unavailable")
        out: list[Sample] = []
        for dev, backend, i in self._devs:
            try:
                allocated, reserved = int(backend.memory_allocated(i)), int(backend.memory_reserved(i))
                t = now()  # stamped when the read returned, never before it
                out.append(Sample(t, dev, self.name, "allocated_bytes", allocated))
                out.append(Sample(t, dev, self.name, "reserved_bytes", reserved))
            except Exception as e:
                t = now()
                out.append(Sample(t, dev, self.name, "allocated_bytes", None))
                out.append(Sample(t, dev, self.name, "reserved_bytes", None))
                self.pending_diagnostics.append(f"{dev}: torch accounting read failed ({e})")
                continue
            if hasattr(backend, "mem_get_info"):
                try:
                    free, total = backend.mem_get_info(i)
                    t = now()
                    out.append(Sample(t, dev, self.name, "used_bytes", int(total - free)))
                    out.append(Sample(t, dev, self.name, "total_bytes", int(total)))
                except Exception:
                    out.append(Sample(t, dev, self.name, "used_bytes", None))
        return out
