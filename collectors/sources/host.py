"""Host memory (psutil): system used/total and the RSS of chosen processes.

On a machine with no GPU this is the physical truth the host saver is measured against:
``madvise(MADV_DONTNEED)`` really returns pages, and the process RSS drops.
"""

from __future__ import annotations

from collections.abc import Iterable

from collectors.model import DeviceInfo, Discovery, Sample, now
from collectors.sources.base import Source

__all__ = ["HostSource"]


class HostSource(Source):
    name = "host"
    default_interval = 0.02

    def __init__(self, pids: Iterable[int] = (), system: bool = True) -> None:
        super().__init__()
        self.pids = list(dict.fromkeys(int(p) for p in pids))
        self.system = system
        self._procs: dict[int, object] = {}
        self._gone: set[int] = set()

    def discover(self) -> Discovery:
        try:
            import psutil
        except ImportError:
            return Discovery.unavailable(self.name, "psutil is not installed (pip install psutil)")
        vm = psutil.virtual_memory()
        diagnostics = []
        for pid in self.pids:
            try:
                self._procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self._gone.add(pid)
                diagnostics.append(f"pid {pid} does not exist")
            except psutil.AccessDenied:
                self._gone.add(pid)
                diagnostics.append(f"pid {pid}: access denied reading its memory")
        dev = DeviceInfo("host", self.name, "host memory", total_bytes=int(vm.total),
                         details={"pids": self.pids})
        return Discovery(self.name, True, [dev], diagnostics=diagnostics)

    def add_pid(self, pid: int) -> None:
        """Start following another process (e.g. a demo engine started after the recorder)."""
        import psutil

        if pid in self._procs:
            return
        self._procs[pid] = psutil.Process(pid)
        self._gone.discard(pid)
        self.pids.append(pid)

    def read(self) -> list[Sample]:
        import psutil

        # Each value is stamped when its read returns: a reading taken after a release must
        # never carry a time from before it (the recorder thread can be descheduled in between).
        out: list[Sample] = []
        if self.system:
            vm = psutil.virtual_memory()
            t = now()
            out.append(Sample(t, "host", self.name, "used_bytes", int(vm.total - vm.available)))
            out.append(Sample(t, "host", self.name, "total_bytes", int(vm.total)))
        for pid, proc in list(self._procs.items()):
            try:
                rss = int(proc.memory_info().rss)  # type: ignore[attr-defined]
                t = now()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied) as e:
                t = now()
                # The process exited: record one gap, then stop following it.
                del self._procs[pid]
                self._gone.add(pid)
                self.pending_diagnostics.append(f"pid {pid} stopped being readable ({type(e).__name__})")
                out.append(Sample(t, "host", self.name, "process_used_bytes", None, pid))
                continue
            out.append(Sample(t, "host", self.name, "process_used_bytes", rss, pid))
        return out
