"""The only module that imports ``pyzes`` (Intel Level Zero Sysman bindings, 0.1.3).

pyzes loads ``/usr/lib/x86_64-linux-gnu/libze_loader.so.1`` when it is imported (a Debian/Ubuntu
path) and its calls return ``ze_result_t`` codes instead of raising. Both are handled here:

- the loader is found in this order: ``$MEMSAVER_ZE_LOADER`` (an explicit path wins), pyzes's own
  Debian path, then ``ctypes.util.find_library("ze_loader")`` (RHEL's /usr/lib64, oneAPI, a
  ``LD_LIBRARY_PATH``). pyzes is pointed at another path by briefly wrapping ``ctypes.CDLL``
  while it is imported;
- every call is checked: a code other than ZE_RESULT_SUCCESS raises ``ZesError`` naming the call
  and the code; a missing binding, loader or symbol raises ``ZesUnavailable`` with a reason a user
  can act on.

Callers get plain dataclasses, never ctypes objects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "DEBIAN_LOADER", "LOADER_ENV", "DeviceProps", "MemModule", "MemState", "ProcessState",
    "Sysman", "ZesError", "ZesUnavailable", "load", "loader_path", "result_name",
]

DEBIAN_LOADER = "/usr/lib/x86_64-linux-gnu/libze_loader.so.1"  # where pyzes 0.1.3 looks
LOADER_ENV = "MEMSAVER_ZE_LOADER"
ZE_RESULT_SUCCESS = 0
ZE_RESULT_ERROR_INVALID_SIZE = 0x78000008

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "path": None}

INSTALL_LOADER = ("install the Level Zero loader (Debian/Ubuntu: libze1, RHEL/SLES: level-zero, "
                  f"or oneAPI) or set {LOADER_ENV}=/path/to/libze_loader.so.1")


class ZesUnavailable(RuntimeError):
    """pyzes or the Level Zero loader cannot be used; the message says why and what to do."""


class ZesError(RuntimeError):
    """A Sysman call returned a ze_result_t other than success."""

    def __init__(self, call: str, code: int) -> None:
        self.call, self.code = call, int(code)
        super().__init__(f"{call} returned {result_name(code)}")


@dataclass(frozen=True)
class DeviceProps:
    name: str
    uuid: bytes  # 16 bytes, the core device UUID (what SYCL/torch report too)
    num_subdevices: int
    vendor_id: int
    device_id: int
    driver_version: str
    serial_number: str


@dataclass(frozen=True)
class MemModule:
    handle: Any  # zes_mem_handle_t; opaque to callers
    index: int
    device_local: bool  # location == ZES_MEM_LOC_DEVICE
    subdevice: int | None  # tile id when the module sits on a sub-device
    physical_size: int  # bytes; 0 when the driver does not say


@dataclass(frozen=True)
class MemState:  # in bytes
    free: int
    size: int


@dataclass(frozen=True)
class ProcessState:  # in bytes
    pid: int
    mem_bytes: int
    shared_bytes: int


def result_name(code: int) -> str:
    """``ZE_RESULT_ERROR_DEVICE_LOST (0x70000001)`` from a ze_result_t, using pyzes's constants."""
    code = int(code) & 0xFFFFFFFF
    mod = _state["module"]
    if mod is not None:
        for name, value in vars(mod).items():
            if name.startswith("ZE_RESULT_") and value == code and name != "ZE_RESULT_FORCE_UINT32":
                return f"{name} (0x{code:08X})"
    return f"ze_result_t 0x{code:08X}"


def loader_path() -> str | None:
    """The loader pyzes was bound to, once ``load()`` succeeded."""
    return _state["path"]


class _RedirectedCDLL(ctypes.CDLL):
    """ctypes.CDLL that opens ``target`` when asked for pyzes's hard-coded Debian path."""

    target: str = DEBIAN_LOADER

    def __init__(self, name: Any, *args: Any, **kwargs: Any) -> None:
        if name == DEBIAN_LOADER:
            name = self.target
        super().__init__(name, *args, **kwargs)


def _import_pyzes(target: str | None) -> ModuleType:
    """Import pyzes; with ``target``, its load of the Debian path opens ``target`` instead.

    pyzes does ``from ctypes import *`` and calls ``CDLL(path)`` at import, so swapping
    ``ctypes.CDLL`` for the duration of the import redirects exactly that one load.
    """
    if target is None:
        return importlib.import_module("pyzes")
    redirected = type("_RedirectedCDLL", (_RedirectedCDLL,), {"target": target})
    original = ctypes.CDLL
    ctypes.CDLL = redirected  # type: ignore[misc]
    try:
        return importlib.import_module("pyzes")
    finally:
        ctypes.CDLL = original  # type: ignore[misc]


def load() -> ModuleType:
    """Import pyzes bound to a Level Zero loader, once per process; raises ZesUnavailable.

    A failure is not cached: installing the loader (or setting the variable) and retrying works.
    """
    with _lock:
        if _state["module"] is not None:
            return _state["module"]
        explicit = os.environ.get(LOADER_ENV) or None
        attempts: list[str] = []
        candidates: list[str | None] = [explicit] if explicit else [None]
        mod = None
        path: str | None = None
        while candidates:
            target = candidates.pop(0)
            try:
                mod = _import_pyzes(target)
                path = target or DEBIAN_LOADER
                break
            except ImportError as e:
                if e.name == "pyzes" or e.name is None and "pyzes" in str(e):
                    raise ZesUnavailable(
                        "pyzes is not installed (pip install 'memsaver-dashboard[xpu]' or "
                        "pip install pyzes==0.1.3)") from None
                raise ZesUnavailable(f"pyzes failed to import: {e}") from None
            except OSError as e:
                attempts.append(str(e))
                if target is None:
                    found = ctypes.util.find_library("ze_loader")
                    if found:
                        candidates.append(found)
            except Exception as e:  # pyzes raises a bare Exception on other platforms
                raise ZesUnavailable(f"pyzes failed to load the Level Zero loader: {e}") from None
        if mod is None:
            if explicit:
                raise ZesUnavailable(f"{LOADER_ENV}={explicit} cannot be loaded ({attempts[-1]}); "
                                     f"point it at libze_loader.so.1 or unset it")
            raise ZesUnavailable(f"libze_loader.so.1 not found (tried {DEBIAN_LOADER} and the library "
                                 f"search path): {INSTALL_LOADER}")
        _state.update(module=mod, path=path)
        return mod


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()


class Sysman:
    """Checked Sysman calls over pyzes's own ctypes structures.

    >>> zs = Sysman()                                                      # doctest: +SKIP
    >>> zs.init()                                                          # doctest: +SKIP
    >>> [zs.device_properties(d).name for drv in zs.drivers() for d in zs.devices(drv)]  # doctest: +SKIP
    ['Intel(R) Data Center GPU Max 1550']
    """

    def __init__(self) -> None:
        self.z = load()
        self.loader = loader_path()

    def _call(self, call: str, *args: Any) -> None:
        try:
            code = getattr(self.z, call)(*args)
        except AttributeError as e:  # the loader lacks the symbol (pyzes resolves it lazily)
            raise ZesUnavailable(
                f"the Level Zero loader at {self.loader} has no {call} ({e}): it is too old "
                "(Debian 12's 1.8 loader is one); install a newer loader, e.g. from Intel's GPU "
                f"package repository or oneAPI, and point {LOADER_ENV} at it") from None
        if code != ZE_RESULT_SUCCESS:
            raise ZesError(call, code)

    def _enum(self, call: str, handle_type: Any, *prefix: Any) -> list[Any]:
        """The Level Zero two-step enumeration: ask the count, then fill an array."""
        count = ctypes.c_uint32(0)
        self._call(call, *prefix, ctypes.byref(count), None)
        if count.value == 0:
            return []
        arr = (handle_type * count.value)()
        self._call(call, *prefix, ctypes.byref(count), arr)
        return [arr[i] for i in range(count.value)]

    def init(self) -> None:
        self._call("zesInit", 0)

    def drivers(self) -> list[Any]:
        return self._enum("zesDriverGet", self.z.zes_driver_handle_t)

    def devices(self, driver: Any) -> list[Any]:
        return self._enum("zesDeviceGet", self.z.zes_device_handle_t, driver)

    def device_properties(self, device: Any) -> DeviceProps:
        p = self.z.zes_device_properties_t()
        p.stype = self.z.ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES
        self._call("zesDeviceGetProperties", device, ctypes.byref(p))
        name = _text(p.core.name) or _text(p.modelName) or "Intel GPU"
        return DeviceProps(
            name=name, uuid=bytes(p.core.uuid.id), num_subdevices=int(p.numSubdevices),
            vendor_id=int(p.core.vendorId), device_id=int(p.core.deviceId),
            driver_version=_text(p.driverVersion), serial_number=_text(p.serialNumber),
        )

    def pci_bdf(self, device: Any) -> str:
        p = self.z.zes_pci_properties_t()
        p.stype = self.z.ZES_STRUCTURE_TYPE_PCI_PROPERTIES
        self._call("zesDevicePciGetProperties", device, ctypes.byref(p))
        a = p.address
        return f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}"

    def memory_handles(self, device: Any) -> list[Any]:
        return self._enum("zesDeviceEnumMemoryModules", self.z.zes_mem_handle_t, device)

    def memory_properties(self, handle: Any, index: int) -> MemModule:
        p = self.z.zes_mem_properties_t()
        p.stype = self.z.ZES_STRUCTURE_TYPE_MEM_PROPERTIES
        self._call("zesMemoryGetProperties", handle, ctypes.byref(p))
        return MemModule(
            handle=handle, index=index, device_local=p.location == self.z.ZES_MEM_LOC_DEVICE,
            subdevice=int(p.subdeviceId) if p.onSubdevice else None,
            physical_size=int(p.physicalSize),
        )

    def memory_state(self, module: MemModule) -> MemState:
        s = self.z.zes_mem_state_t()
        s.stype = self.z.ZES_STRUCTURE_TYPE_MEM_STATE
        self._call("zesMemoryGetState", module.handle, ctypes.byref(s))
        return MemState(free=int(s.free), size=int(s.size))

    def processes(self, device: Any) -> list[ProcessState]:
        """Processes using the device. The list can grow between the count and the fill: the
        driver then answers ZE_RESULT_ERROR_INVALID_SIZE with the new count, so ask again."""
        st = self.z.zes_process_state_t
        for _ in range(4):
            count = ctypes.c_uint32(0)
            self._call("zesDeviceProcessesGetState", device, ctypes.byref(count), None)
            if count.value == 0:
                return []
            n = count.value + 4  # headroom for processes that start meanwhile
            arr = (st * n)()
            for item in arr:
                item.stype = self.z.ZES_STRUCTURE_TYPE_PROCESS_STATE
            count.value = n
            try:
                self._call("zesDeviceProcessesGetState", device, ctypes.byref(count), arr)
            except ZesError as e:
                if e.code == ZE_RESULT_ERROR_INVALID_SIZE:
                    continue
                raise
            return [ProcessState(int(arr[i].processId), int(arr[i].memSize), int(arr[i].sharedSize))
                    for i in range(min(count.value, n))]
        raise ZesError("zesDeviceProcessesGetState", ZE_RESULT_ERROR_INVALID_SIZE)
