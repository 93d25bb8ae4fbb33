"""What the agent adds to each wrapped pause/resume call (no GPU needed).

    python benchmarks/agent_overhead.py [--calls 20000] [--repeats 5]

Times ``pause(tag)``/``resume(tag)`` of an object with torch_memory_saver's signature whose calls
do nothing, bare and wrapped by ``collectors.agent`` (events queued to a real SQLite file),
interleaved per repeat; prints the median cost per call. A real TMS pause takes milliseconds
(~7 ms for 16 GiB on an H200), so a few microseconds is not measurable there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import collectors.agent as agent  # noqa: E402
from collectors.store import Store  # noqa: E402


class NoopSaver:
    def pause(self, tag=None):
        return None

    def resume(self, tag=None):
        return None


def per_call(saver: NoopSaver, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls // 2):
        saver.pause("kv_cache")
        saver.resume("kv_cache")
    return (time.perf_counter() - t) / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    bare, wrapped, write_s = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):
            s = NoopSaver()
            bare.append(per_call(s, args.calls))
            store = Store(Path(d) / f"r{i}.sqlite")
            a = agent.install(store, saver=s, sample=False)
            wrapped.append(per_call(s, args.calls))
            t = time.perf_counter()
            a.flush(timeout=600)
            write_s.append(time.perf_counter() - t)
            agent.uninstall()
            assert len(store.events()) == args.calls
            store.close()
    b, w = statistics.median(bare), statistics.median(wrapped)
    print(f"calls per repeat: {args.calls}, repeats: {args.repeats}")
    print(f"bare call       median {b * 1e6:8.3f} us")
    print(f"wrapped call    median {w * 1e6:8.3f} us   (+{(w - b) * 1e6:.3f} us per call, in the caller)")
    print(f"flush after the calls: median {statistics.median(write_s):.3f} s for the events still "
          "queued (written by the agent thread, not the caller)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
