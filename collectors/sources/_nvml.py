"""The only module that imports NVML (package nvidia-ml-py, module ``pynvml``).

Errors become values here: callers get a typed result or an ``NvmlUnavailable`` with a reason a
user can act on. Initialisation is lazy, under a lock, shut down at exit.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["NvmlUnavailable", "MemoryInfo", "ProcessMemory", "init", "device_count", "handle",
           "memory_info", "processes", "device_identity", "driver_version", "error_text"]

_lock = threading.Lock()
_state: dict[str, Any] = {"ok": False, "module": None}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used; the message says why."""


@dataclass(frozen=True)
class MemoryInfo:  # in bytes
    total: int
    used: int
    free: int
    reserved: int | None  # only with the v2 query
    version: int  # 1 or 2: v1 used includes reserved memory, v2 used excludes it


@dataclass(frozen=True)
class ProcessMemory:  # in bytes; None when the driver does not say (e.g. in some containers)
    pid: int
    used: int | None


def _nvml() -> Any:
    mod = _state["module"]
    if mod is None:
        raise NvmlUnavailable("NVML is not initialised")
    return mod


def init() -> Any:
    """Import and initialise NVML once; raises NvmlUnavailable with a reason."""
    with _lock:
        if _state["ok"]:
            return _state["module"]
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable(
                "nvidia-ml-py is not installed (pip install 'memsaver-dashboard[cuda]')"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not start: {e} (no NVIDIA driver or GPU here?)") from None
        except OSError as e:  # libnvidia-ml.so missing
            raise NvmlUnavailable(f"NVML library not found: {e}") from None
        _state.update(ok=True, module=pynvml)
        atexit.register(shutdown)
        return pynvml


def shutdown() -> None:
    with _lock:
        if _state["ok"]:
            try:
                _state["module"].nvmlShutdown()
            except Exception:
                pass
            _state.update(ok=False, module=None)


def error_text(e: BaseException) -> str:
    return str(e) or type(e).__name__


def is_nvml_error(e: BaseException) -> bool:
    mod = _state["module"]
    return mod is not None and isinstance(e, mod.NVMLError)


def device_count() -> int:
    return int(_nvml().nvmlDeviceGetCount())


def handle(index: int) -> Any:
    return _nvml().nvmlDeviceGetHandleByIndex(index)


def driver_version() -> str | None:
    try:
        v = _nvml().nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def device_identity(h: Any) -> dict[str, Any]:
    n = _nvml()

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    out: dict[str, Any] = {"name": text(n.nvmlDeviceGetName(h)), "uuid": text(n.nvmlDeviceGetUUID(h))}
    try:
        out["pci_bus_id"] = text(n.nvmlDeviceGetPciInfo(h).busId)
    except Exception:
        out["pci_bus_id"] = None
    return out


def probe_memory_version(h: Any) -> int:
    """2 when this driver answers the v2 query (used excludes reserved), else 1."""
    n = _nvml()
    try:
        n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        return 2
    except Exception:
        return 1


def memory_info(h: Any, version: int) -> MemoryInfo:
    n = _nvml()
    if version == 2:
        m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        return MemoryInfo(int(m.total), int(m.used), int(m.free), int(m.reserved), 2)
    m = n.nvmlDeviceGetMemoryInfo(h)
    return MemoryInfo(int(m.total), int(m.used), int(m.free), None, 1)


def processes(h: Any) -> list[ProcessMemory]:
    n = _nvml()
    out: dict[int, int | None] = {}
    for fn in (n.nvmlDeviceGetComputeRunningProcesses, n.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            procs = fn(h)
        except Exception:
            continue
        for p in procs:
            used = p.usedGpuMemory
            # NVML_VALUE_NOT_AVAILABLE (ULL max) or None means "not known", never 0.
            if used is None or used >= 2**63:
                used = None
            prev = out.get(int(p.pid))
            out[int(p.pid)] = used if prev is None else (prev + used if used is not None else prev)
    return [ProcessMemory(pid, used) for pid, used in out.items()]
