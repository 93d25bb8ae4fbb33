"""The contract every source keeps.

A source knows one backend. It has no threads and no storage: the recorder calls ``read()`` on
its own thread at the source's interval. Optional libraries are imported inside ``discover()``
so that ``import collectors`` never fails for a missing one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from collectors.model import Discovery, Sample

__all__ = ["Source", "SourceError"]


class SourceError(RuntimeError):
    """A read failed as a whole (library gone, device lost). The recorder records a gap."""


class Source(ABC):
    #: registry name, a key of collectors.model.SOURCES
    name: str = ""
    #: seconds between reads when the user does not say
    default_interval: float = 0.02
    #: True when used_bytes of this source is physical truth (NVML, Sysman, host RSS)
    physical: bool = True

    def __init__(self) -> None:
        self._discovery: Discovery | None = None
        # Warnings found while reading (e.g. a pid exited); the recorder drains them.
        self.pending_diagnostics: list[str] = []

    @abstractmethod
    def discover(self) -> Discovery:
        """Find devices. Never raises for a missing library or device: returns unavailable."""

    @abstractmethod
    def read(self) -> list[Sample]:
        """One reading of every device. A failed device yields samples with value None.

        Raises SourceError only when nothing at all could be read.
        """

    def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release library handles. Safe to call twice."""

    @property
    def discovery(self) -> Discovery:
        if self._discovery is None:
            self._discovery = self.discover()
        return self._discovery

    def drain_diagnostics(self) -> list[str]:
        out, self.pending_diagnostics = self.pending_diagnostics, []
        return out
