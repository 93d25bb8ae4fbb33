"""A child process that allocates and frees real memory on command (stdin), for RSS tests.

Commands, one per line: ``alloc NBYTES`` (touches every page), ``free``, ``exit``.
Answers ``ready`` at start and ``ok <rss>`` after each command.
"""

import sys

import psutil

blocks: list[bytearray] = []
proc = psutil.Process()
print("ready", flush=True)
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "alloc":
        blocks.append(bytearray(int(arg[0])))
        blocks[-1][::4096] = b"\x01" * len(range(0, int(arg[0]), 4096))  # touch every page
    elif cmd == "free":
        blocks.clear()
    elif cmd == "exit":
        break
    print(f"ok {proc.memory_info().rss}", flush=True)
