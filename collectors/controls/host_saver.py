"""The host saver: torch_memory_saver's mechanism on host memory, for machines with no GPU.

Each tag is one private anonymous mapping (``mmap``), filled with nonzero data so its pages are
really resident. ``pause`` = ``madvise(MADV_DONTNEED)``: the kernel takes the physical pages back
at once while the virtual range stays mapped (what TMS does with ``cuMemUnmap`` on a GPU).
``resume`` re-commits by writing one byte per page. The process RSS really drops and rises; the
accounting (bytes allocated in tagged regions, :meth:`HostSaver.accounting_source`) does not:
the same picture as NVML vs ``torch.cuda.memory_allocated``.

Without backup the content is gone after a resume (pages come back zeroed, as TMS's come back
with garbage). With ``backup=True`` the content is copied to an unlinked temporary *file* before
the release and read back on resume, then checked page by page. A file, not a bytes buffer: a
copy in this process's RAM would add back the RSS the release just took away, and the demo
would show nothing; the GPU analogue (device -> host copy) also leaves the measured memory.

>>> saver = HostSaver()
>>> _ = saver.allocate("kv_cache", 8 * 2**20)
>>> saver.pause(["kv_cache"]).ok, saver.state()["kv_cache"].paused
(True, True)
>>> saver.resume().ok
True
>>> saver.close()
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from collectors.controls import DetailedControl, check_tag, resolve_tags
from collectors.controls.base import ControlError, TagState
from collectors.model import DeviceInfo, Discovery, Event, Sample, now
from collectors.sources.base import Source
from collectors.store import Store

__all__ = ["HostSaver", "SaverSource", "PAGE_SIZE"]

PAGE_SIZE = mmap.PAGESIZE
_CHUNK_PAGES = 4096  # pages checked per step when verifying (16 MiB with 4 KiB pages)


@dataclass
class _Region:
    tag: str
    nbytes: int  # page-rounded: what the pages really hold
    mm: mmap.mmap
    backup: bool
    seed: int
    paused: bool = False
    backup_file: IO[bytes] | None = None


def _page_pattern(npages: int, seed: int) -> np.ndarray:
    """One nonzero byte value per page, different for neighbouring pages and tags."""
    return ((np.arange(npages, dtype=np.int64) + seed) % 251 + 1).astype(np.uint8)


class HostSaver(DetailedControl):
    """Tagged host memory that can be released and re-committed, with Events for each call.

    Thread-safe: one lock around every operation (the demo engine calls it from HTTP threads).
    """

    target = "host-saver"

    def __init__(self, store: Store | None = None, *, origin: str = "app",
                 backup_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(store)
        self.origin = origin
        self.backup_dir = backup_dir
        self._regions: dict[str, _Region] = {}
        self._lock = threading.RLock()
        self._seed = 0

    # -- Control API -------------------------------------------------------------------------
    def event_details(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": "host"}

    def state(self) -> dict[str, TagState]:
        with self._lock:
            return {t: TagState(t, r.nbytes, r.paused, r.backup) for t, r in self._regions.items()}

    def allocate(self, tag: str, nbytes: int, backup: bool = False) -> Event:
        """Map ``nbytes`` (rounded up to whole pages) for ``tag`` and make every page resident.

        Bad arguments raise ValueError and change nothing; an mmap failure raises ControlError
        after recording a failed ``allocate`` event.
        """
        check_tag(tag)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ValueError(f"size for tag {tag!r} must be a positive number of bytes, got {nbytes!r}")
        size = -(-int(nbytes) // PAGE_SIZE) * PAGE_SIZE
        with self._lock:
            if tag in self._regions:
                raise ValueError(f"tag {tag!r} is already allocated ({self._regions[tag].nbytes} bytes)")
            t0 = now()
            try:
                mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, OverflowError, MemoryError) as e:
                msg = f"cannot map {size} bytes for tag {tag!r}: {e}"
                self._record("allocate", [tag], t0, ok=False, error=msg, expected_bytes=size)
                raise ControlError(msg) from None
            self._seed += 97
            region = _Region(tag, size, mm, bool(backup), self._seed)
            self._fill(region)
            self._regions[tag] = region
            return self._record("allocate", [tag], t0, expected_bytes=size)

    def free(self, tag: str) -> Event:
        """Unmap a tag (paused or not). Unknown tags raise ValueError."""
        with self._lock:
            region = self._regions.get(tag)
            if region is None:
                raise ValueError(f"unknown tag {tag!r}; held: {', '.join(self._regions) or 'none'}")
            t0 = now()
            del self._regions[tag]
            self._unmap(region)
            return self._record("free", [tag], t0, expected_bytes=region.nbytes)

    def close(self) -> None:
        """Unmap every tag (no events). Safe to call twice."""
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
        for r in regions:
            self._unmap(r)

    def __enter__(self) -> HostSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pause(self, tags: Sequence[str] | None = None) -> Event:
        with self._lock:  # state, expected bytes and the release seen as one step
            return super().pause(tags)

    def resume(self, tags: Sequence[str] | None = None) -> Event:
        with self._lock:
            return super().resume(tags)

    def _pause(self, tags: list[str]) -> None:
        for tag in resolve_tags("pause", tags, self.state()):
            r = self._regions[tag]
            if r.backup:
                f = tempfile.TemporaryFile(dir=self.backup_dir)
                try:
                    f.write(r.mm)
                    f.flush()
                except OSError as e:
                    f.close()
                    raise ControlError(f"backup of tag {tag!r} failed: {e}") from None
                r.backup_file = f
            r.mm.madvise(mmap.MADV_DONTNEED)
            r.paused = True

    def _resume(self, tags: list[str]) -> None:
        for tag in resolve_tags("resume", tags, self.state()):
            r = self._regions[tag]
            if r.backup_file is not None:
                f, r.backup_file = r.backup_file, None
                try:
                    f.seek(0)
                    got = f.readinto(r.mm)  # type: ignore[attr-defined]
                finally:
                    f.close()
                r.paused = False
                if got != r.nbytes or not self._content_ok(r):
                    raise ControlError(f"tag {tag!r}: content differs after resume "
                                       "(backup restore failed)")
            else:
                view = np.frombuffer(r.mm, dtype=np.uint8)
                view[::PAGE_SIZE] = 1  # one write per page re-commits it
                del view
                r.paused = False

    # -- accounting --------------------------------------------------------------------------
    def allocated_bytes(self) -> int:
        """Bytes held in tagged regions, paused or not: the 'accounting', flat across a pause."""
        with self._lock:
            return sum(r.nbytes for r in self._regions.values())

    def accounting_source(self) -> SaverSource:
        return SaverSource(self)

    def content_ok(self, tag: str) -> bool:
        """True when every page of ``tag`` still holds the data written at allocation."""
        with self._lock:
            return self._content_ok(self._regions[tag])

    # -- internals ---------------------------------------------------------------------------
    def _fill(self, r: _Region) -> None:
        pages = np.frombuffer(r.mm, dtype=np.uint8).reshape(-1, PAGE_SIZE)
        pages[:] = _page_pattern(len(pages), r.seed)[:, None]
        del pages

    def _content_ok(self, r: _Region) -> bool:
        pages = np.frombuffer(r.mm, dtype=np.uint8).reshape(-1, PAGE_SIZE)
        try:
            expected = _page_pattern(len(pages), r.seed)
            for i in range(0, len(pages), _CHUNK_PAGES):
                block = pages[i:i + _CHUNK_PAGES]
                want = expected[i:i + _CHUNK_PAGES]
                if not (np.array_equal(block.min(axis=1), want) and np.array_equal(block.max(axis=1), want)):
                    return False
            return True
        finally:
            del pages

    @staticmethod
    def _unmap(r: _Region) -> None:
        if r.backup_file is not None:
            r.backup_file.close()
            r.backup_file = None
        try:
            r.mm.close()
        except BufferError:  # a numpy view still alive somewhere: let GC unmap it
            pass


class SaverSource(Source):
    """The host saver's accounting: ``host/saver/allocated_bytes``, unchanged by a pause."""

    name = "saver"
    default_interval = 0.05
    physical = False

    def __init__(self, saver: HostSaver) -> None:
        super().__init__()
        self.saver = saver

    def discover(self) -> Discovery:
        dev = DeviceInfo("host", self.name, "host saver (bytes allocated in tagged regions)",
                         details={"pid": os.getpid()})
        return Discovery(self.name, True, [dev])

    def read(self) -> list[Sample]:
        return [Sample(now(), "host", self.name, "allocated_bytes", self.saver.allocated_bytes())]
