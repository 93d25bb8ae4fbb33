"""The data model shared by sources, recorder, store, controls and charts.

Bytes are integers, times are epoch seconds (``time.time()``), missing values are ``None``
(never 0: a 0 would draw a false release on a chart).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ACTIONS",
    "METRICS",
    "SOURCES",
    "PHYSICAL_SOURCES",
    "ACCOUNTING_SOURCES",
    "DeviceInfo",
    "Discovery",
    "Event",
    "Sample",
    "now",
]

# Metric names, declared as data: (name, label, unit).
METRICS: dict[str, tuple[str, str]] = {
    "used_bytes": ("physical used", "bytes"),
    "total_bytes": ("total", "bytes"),
    "reserved_bytes": ("reserved", "bytes"),
    "allocated_bytes": ("allocated", "bytes"),
    "process_used_bytes": ("used by process", "bytes"),
    "process_shared_bytes": ("shared by process", "bytes"),
}

# Source names and what they measure.
SOURCES: dict[str, str] = {
    "host": "host memory and process RSS (psutil)",
    "nvml": "NVIDIA GPU memory (NVML)",
    "sysman": "Intel GPU memory (Level Zero Sysman via pyzes)",
    "torch": "torch allocator accounting and mem_get_info (in-process)",
    "saver": "host saver accounting: bytes allocated in tagged regions (in-process)",
    "tms": "torch_memory_saver's own counters (in-process)",
}
# Sources whose used_bytes is what the device (or host) physically holds.
PHYSICAL_SOURCES = ("nvml", "sysman", "host")
# Sources that report what an allocator believes it holds.
ACCOUNTING_SOURCES = ("torch", "saver", "tms")

ACTIONS = ("pause", "resume", "allocate", "free", "mark")


def now() -> float:
    """The one clock of the product: wall time in epoch seconds."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading. ``value`` is None when the read failed (a gap), never 0 for 'unknown'."""

    t: float
    device: str  # "cuda:0", "xpu:1", "host"
    source: str  # a key of SOURCES
    metric: str  # a key of METRICS
    value: int | float | None
    pid: int | None = None

    @property
    def key(self) -> tuple[str, str, str, int | None]:
        return (self.device, self.source, self.metric, self.pid)


@dataclass(slots=True)
class Event:
    """Something that changed (or should have changed) memory: a pause, a resume, ...

    ``origin`` says who caused it: "app", an engine URL, "agent:pid", "inferred", ...
    ``expected_bytes`` is what the tags hold, where the caller knows it (for verification).
    """

    t_start: float
    t_end: float | None
    action: str
    tags: list[str] = field(default_factory=list)
    target: str = ""
    ok: bool = True
    error: str | None = None
    origin: str = ""
    expected_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown event action {self.action!r}; expected one of {ACTIONS}")

    @property
    def duration(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_start

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["tags"] = json.dumps(self.tags)
        row["details"] = json.dumps(self.details)
        row["ok"] = int(self.ok)
        return row


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A device a source can read. ``total_bytes`` None when unknown."""

    device: str
    source: str
    name: str
    uuid: str | None = None
    total_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Discovery:
    """What a source found: its devices, or why it cannot run (a human reason, not an exception).

    ``diagnostics`` are warnings a user should see even when the source works
    (e.g. "Sysman reports free == size: needs root or CAP_PERFMON").
    """

    source: str
    available: bool
    devices: list[DeviceInfo] = field(default_factory=list)
    reason: str | None = None
    diagnostics: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def unavailable(cls, source: str, reason: str, **details: Any) -> Discovery:
        return cls(source=source, available=False, reason=reason, details=details)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
