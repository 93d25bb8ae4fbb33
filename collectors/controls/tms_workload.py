"""The in-process TMS workload: demo tensors under ``torch_memory_saver.region`` on a GPU.

Each tag holds one uint8 tensor allocated inside ``torch_memory_saver.region(tag=...,
enable_cpu_backup=...)`` on the chosen device (CUDA or XPU), with ``hook_mode = "torch"`` (the
only mode that works in-process; "preload" needs LD_PRELOAD before the process starts).
``pause``/``resume`` call TMS per tag. Tensors are filled with a known pattern; after resuming a
backed-up tag the content is compared on the device.

TMS ends the whole process (``exit(1)``) when asked to pause an allocation that is already
paused, so the workload refuses that itself (a failed Event) before calling TMS.

torch and torch_memory_saver are imported only when a workload is built.

>>> wl = TmsWorkload(device="cuda:0")                        # doctest: +SKIP
>>> wl.allocate("weights", 2 * 2**30)                        # doctest: +SKIP
>>> wl.pause(["weights"]).ok                                 # doctest: +SKIP
True
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectors.controls import DetailedControl, check_tag, resolve_tags
from collectors.controls.base import ControlError, TagState
from collectors.model import Event, now
from collectors.store import Store

__all__ = ["TmsWorkload", "load_tms", "GRANULARITY"]

# TMS maps physical memory in 2 MiB granules; sizes are rounded up to whole granules so the
# tag's bytes are what the device really holds for it.
GRANULARITY = 2 * 2**20
_PATTERN_ROWS = 64  # rows of GRANULARITY bytes compared per step when verifying


def load_tms(hook_mode: str = "torch") -> Any:
    """The torch_memory_saver singleton, configured for ``hook_mode`` if not yet initialised.

    Raises ControlError with what to install when it cannot be imported.
    """
    try:
        import torch_memory_saver
    except ImportError as e:
        raise ControlError(f"torch_memory_saver is not installed ({e}); "
                           "pip install torch_memory_saver (needs a CUDA or XPU torch)") from None
    except Exception as e:  # a broken wheel (wrong CUDA major) must read as such
        raise ControlError(f"torch_memory_saver failed to import: {type(e).__name__}: {e}") from None
    tms = torch_memory_saver.torch_memory_saver
    if getattr(tms, "_impl", None) is None:  # only settable before first use
        tms.hook_mode = hook_mode
    return tms



@dataclass
class _Tensor:
    tag: str
    nbytes: int
    backup: bool
    tensor: Any
    paused: bool = False


class TmsWorkload(DetailedControl):
    """Demo tensors per tag under torch_memory_saver, paused and resumed per tag."""

    def __init__(self, store: Store | None = None, *, device: str = "cuda:0", origin: str = "app") -> None:
        super().__init__(store)
        kind, _, index = device.partition(":")
        if kind not in ("cuda", "xpu") or not (index or "0").isdigit():
            raise ValueError(f"device must look like cuda:0 or xpu:0, got {device!r}")
        self.device = f"{kind}:{int(index or 0)}"
        self.kind, self.index = kind, int(index or 0)
        self.target = f"tms:{self.device}"
        self.origin = origin
        self._tensors: dict[str, _Tensor] = {}
        self._lock = threading.RLock()
        self._torch: Any = None
        self._tms: Any = None
        self._pattern: Any = None

    # -- setup -------------------------------------------------------------------------------
    def _ready(self) -> tuple[Any, Any]:
        if self._tms is None:
            try:
                import torch
            except ImportError:
                raise ControlError("torch is not installed") from None
            backend = getattr(torch, self.kind, None)
            if backend is None or not backend.is_available():
                raise ControlError(f"torch {torch.__version__} has no {self.kind} device")
            if self.index >= backend.device_count():
                raise ControlError(f"{self.device} does not exist (torch sees "
                                   f"{backend.device_count()} {self.kind} device(s))")
            self._torch = torch
            self._tms = load_tms("torch")
        return self._torch, self._tms

    def _backend(self) -> Any:
        return getattr(self._torch, self.kind)

    def _sync(self) -> None:
        self._backend().synchronize(self.index)

    # -- Control API -------------------------------------------------------------------------
    def event_details(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": self.device}

    def state(self) -> dict[str, TagState]:
        with self._lock:
            return {t: TagState(t, x.nbytes, x.paused, x.backup) for t, x in self._tensors.items()}

    def allocate(self, tag: str, nbytes: int, backup: bool = False) -> Event:
        """Allocate ``nbytes`` (rounded up to 2 MiB) for ``tag`` under a TMS region and fill it."""
        check_tag(tag)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"size for tag {tag!r} must be a positive number of bytes, got {nbytes!r}")
        size = -(-nbytes // GRANULARITY) * GRANULARITY
        with self._lock:
            if tag in self._tensors:
                raise ValueError(f"tag {tag!r} is already allocated ({self._tensors[tag].nbytes} bytes)")
            torch, tms = self._ready()
            t0 = now()
            try:
                with self._backend().device(self.index), \
                        tms.region(tag=tag, enable_cpu_backup=bool(backup)):
                    tensor = torch.empty(size, dtype=torch.uint8, device=self.device)
                tensor.view(-1, GRANULARITY).copy_(self._pattern_row().expand(size // GRANULARITY, -1))
                self._sync()
            except Exception as e:  # OOM, driver errors: a failed event and a clear message
                msg = f"cannot allocate {size} bytes for tag {tag!r} on {self.device}: {e}"
                self._record("allocate", [tag], t0, ok=False, error=msg, expected_bytes=size)
                raise ControlError(msg) from None
            self._tensors[tag] = _Tensor(tag, size, bool(backup), tensor)
            return self._record("allocate", [tag], t0, expected_bytes=size)

    def free(self, tag: str) -> Event:
        with self._lock:
            x = self._tensors.get(tag)
            if x is None:
                raise ValueError(f"unknown tag {tag!r}; held: {', '.join(self._tensors) or 'none'}")
            t0 = now()
            if x.paused:  # TMS frees a paused allocation's virtual range only; resume first
                self._tms.resume(tag)
            del self._tensors[tag]
            x.tensor = None
            self._backend().empty_cache()
            return self._record("free", [tag], t0, expected_bytes=x.nbytes)

    def close(self) -> None:
        with self._lock:
            for tag in list(self._tensors):
                try:
                    self.free(tag)
                except Exception:
                    self._tensors.pop(tag, None)

    def pause(self, tags: Sequence[str] | None = None) -> Event:
        with self._lock:
            return super().pause(tags)

    def resume(self, tags: Sequence[str] | None = None) -> Event:
        with self._lock:
            return super().resume(tags)

    def _pause(self, tags: list[str]) -> None:
        chosen = resolve_tags("pause", tags, self.state())
        self._ready()
        self._sync()  # no kernel may still write into pages about to go
        for tag in chosen:
            self._tms.pause(tag)
            self._tensors[tag].paused = True

    def _resume(self, tags: list[str]) -> None:
        chosen = resolve_tags("resume", tags, self.state())
        self._ready()
        for tag in chosen:
            try:
                self._tms.resume(tag)
            except Exception as e:  # e.g. out of memory on the way back
                raise ControlError(f"resume of tag {tag!r} failed: {e}") from None
            self._tensors[tag].paused = False
        self._sync()
        bad = [t for t in chosen if self._tensors[t].backup and not self.content_ok(t)]
        if bad:
            raise ControlError(f"content differs after resume for tag(s) {', '.join(bad)} "
                               "(CPU backup not restored)")

    # -- accounting and checks ---------------------------------------------------------------
    def accounting_source(self) -> Any:
        """torch's accounting for this device (allocated/reserved stay flat across a pause)."""
        from collectors.sources.torch_source import TorchSource

        return TorchSource(devices=[self.device])

    def content_ok(self, tag: str) -> bool:
        with self._lock:
            x = self._tensors[tag]
            if x.paused:
                raise ValueError(f"tag {tag!r} is paused; its content cannot be read")
            rows = x.tensor.view(-1, GRANULARITY)
            want = self._pattern_row()
            for i in range(0, rows.shape[0], _PATTERN_ROWS):
                if not bool((rows[i:i + _PATTERN_ROWS] == want).all()):
                    return False
            return True

    def _pattern_row(self) -> Any:
        if self._pattern is None:
            torch = self._torch
            row = (torch.arange(GRANULARITY, dtype=torch.int64) % 251 + 1).to(torch.uint8)
            self._pattern = row.to(self.device).unsqueeze(0)
        return self._pattern
