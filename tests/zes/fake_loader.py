"""Build and drive the fake Level Zero loader (tests/zes/fake_ze_loader.c) for Sysman tests.

The library is compiled once per source version into a cache directory (gcc, no root, nothing
under /usr/lib). pyzes is pointed at it through ``MEMSAVER_ZE_LOADER`` (the product's own
override); the library reads devices/modules/processes from the file in ``FAKE_ZE_CONTROL`` on
every call, so a test rewrites that file to change "free" while a recorder runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["GiB", "FakeDevice", "FakeModule", "FakeProcess", "FakeZe", "ZeHarness", "build", "activate",
           "unbind_pyzes"]

GiB = 1 << 30
SOURCE = Path(__file__).with_name("fake_ze_loader.c")
CONTROL_ENV = "FAKE_ZE_CONTROL"
LOADER_ENV = "MEMSAVER_ZE_LOADER"
VARIANTS = {"full": [], "no_zesinit": ["-DFAKE_ZE_NO_ZESINIT"]}

# ze_result_t codes used by tests (values from ze_api.h)
ZE_RESULT_ERROR_DEVICE_LOST = 0x70000001
ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS = 0x70010000
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003


@dataclass
class FakeModule:
    size: int
    free: int
    location: str = "device"  # or "system"
    subdevice: int | None = None


@dataclass
class FakeProcess:
    pid: int
    mem: int
    shared: int = 0


@dataclass
class FakeDevice:
    name: str = "Intel(R) Data Center GPU Max 1100"
    uuid: str | None = None  # 32 hex digits
    bdf: str | None = None  # dddd:bb:dd.f
    subdevices: int = 0
    modules: list[FakeModule] = field(default_factory=lambda: [FakeModule(48 * GiB, 40 * GiB)])
    processes: list[FakeProcess] = field(default_factory=list)
    results: dict[str, int] = field(default_factory=dict)  # call -> forced ze_result_t
    sleep_ms: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeZe:
    devices: list[FakeDevice] = field(default_factory=lambda: [FakeDevice()])
    drivers: int = 1
    results: dict[str, int] = field(default_factory=dict)
    sleep_ms: dict[str, int] = field(default_factory=dict)
    frozen: bool = False

    def render(self) -> str:
        lines = [f"drivers={self.drivers}", f"devices={len(self.devices)}", f"frozen={int(self.frozen)}"]
        lines += [f"result.{k}={v:#x}" for k, v in self.results.items()]
        lines += [f"sleep_ms.{k}={v}" for k, v in self.sleep_ms.items()]
        for d, dev in enumerate(self.devices):
            p = f"dev{d}."
            lines += [f"{p}name={dev.name}", f"{p}subdevices={dev.subdevices}",
                      f"{p}modules={len(dev.modules)}", f"{p}processes={len(dev.processes)}"]
            if dev.uuid:
                lines.append(f"{p}uuid={dev.uuid}")
            if dev.bdf:
                lines.append(f"{p}bdf={dev.bdf}")
            lines += [f"{p}result.{k}={v:#x}" for k, v in dev.results.items()]
            lines += [f"{p}sleep_ms.{k}={v}" for k, v in dev.sleep_ms.items()]
            for m, mod in enumerate(dev.modules):
                q = f"{p}mod{m}."
                lines += [f"{q}size={mod.size}", f"{q}free={mod.free}", f"{q}location={mod.location}",
                          f"{q}subdevice={-1 if mod.subdevice is None else mod.subdevice}"]
            for i, proc in enumerate(dev.processes):
                q = f"{p}proc{i}."
                lines += [f"{q}pid={proc.pid}", f"{q}mem={proc.mem}", f"{q}shared={proc.shared}"]
        return "\n".join(lines) + "\n"


def build(variant: str = "full") -> Path:
    """Compile the fake loader (cached by source hash); returns the path of libze_loader.so.1.

    The directory also holds a ``libze_loader.so`` link so ``ctypes.util.find_library`` can find
    it through ``LD_LIBRARY_PATH``.
    """
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build the fake Level Zero loader")
    digest = hashlib.sha256(SOURCE.read_bytes() + repr(VARIANTS[variant]).encode()).hexdigest()[:16]
    out_dir = Path(tempfile.gettempdir()) / "memsaver-fake-ze" / f"{digest}-{variant}"
    lib = out_dir / "libze_loader.so.1"
    if not lib.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".build-{os.getpid()}.so"
        subprocess.run(
            [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", *VARIANTS[variant],
             "-Wl,-soname,libze_loader.so.1", "-o", str(tmp), str(SOURCE), "-lpthread"],
            check=True, capture_output=True, text=True, timeout=120,
        )
        os.replace(tmp, lib)  # atomic: concurrent test runs never see half a library
    link = out_dir / "libze_loader.so"
    if not link.exists():
        try:
            link.symlink_to(lib.name)
        except FileExistsError:
            pass
    return lib


@dataclass
class ZeHarness:
    lib: Path
    control: Path

    def write(self, cfg: FakeZe) -> None:
        """Replace the control file atomically (the library re-reads it on every call)."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(cfg.render())
        os.replace(tmp, self.control)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a child process (e.g. ``python -m collectors devices``)."""
        env = dict(os.environ)
        env.update({LOADER_ENV: str(self.lib), CONTROL_ENV: str(self.control)}, **extra)
        return env


def unbind_pyzes() -> None:
    """Forget this process's pyzes module, so the next ``_zes.load()`` imports it afresh.

    pyzes binds one loader per import; tests that bind it to the fake must not leave it bound
    for other tests in the same pytest process (they expect "no loader" on this machine).
    """
    from collectors.sources import _zes

    with _zes._lock:
        _zes._state.update(module=None, path=None)
        sys.modules.pop("pyzes", None)


@contextlib.contextmanager
def activate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: FakeZe | None = None,
             variant: str = "full") -> Iterator[ZeHarness]:
    """Build the library, point this process at it and write ``cfg`` (default: one device);
    on exit pyzes is unbound again."""
    h = ZeHarness(build(variant), tmp_path / "fake_ze.control")
    h.write(cfg or FakeZe())
    monkeypatch.setenv(LOADER_ENV, str(h.lib))
    monkeypatch.setenv(CONTROL_ENV, str(h.control))
    unbind_pyzes()
    try:
        yield h
    finally:
        unbind_pyzes()
