"""On a CUDA machine with torch_memory_saver: the demo engine over HTTP and the in-process agent,
recorded through NVML, then the verification table.

    python examples/gpu_demo_engine.py [--out run.sqlite] [--weights 2GiB] [--kv-cache 4GiB]

Part 1 spawns ``memsaver demo-engine --device cuda`` (real TMS in a child process), drives every
tag's release and resume through EngineClient while a Recorder samples NVML at 20 ms.
Part 2 allocates tensors under ``torch_memory_saver.region`` in this process, installs the agent,
and calls TMS's own pause/resume: torch's allocated bytes stay flat while NVML drops.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors import Recorder, Store  # noqa: E402
from collectors.controls.engine_client import EngineClient  # noqa: E402
from collectors.demo_engine import spawn  # noqa: E402
from collectors.sources import make_source  # noqa: E402
from collectors.units import format_bytes, parse_bytes  # noqa: E402
from collectors.verification import format_verification, verify  # noqa: E402


def nvml_used(src) -> int:
    return next(s.value for s in src.read() if s.metric == "used_bytes" and s.device == "cuda:0")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_demo.sqlite")
    p.add_argument("--weights", default="2GiB")
    p.add_argument("--kv-cache", default="4GiB")
    p.add_argument("--pause-s", type=float, default=1.5, help="seconds between calls")
    args = p.parse_args()
    out = Path(args.out)
    for f in (out, Path(f"{out}-wal"), Path(f"{out}-shm")):
        f.unlink(missing_ok=True)
    store = Store(out)
    nvml = make_source("nvml")
    rec = Recorder(store, [nvml], intervals={"nvml": 0.02}).start()

    print("== part 1: demo engine (--device cuda, real TMS) over HTTP ==", flush=True)
    with spawn(device="cuda", weights=args.weights, kv_cache=args.kv_cache, cuda_graph="512MiB",
               backup=["weights"], ready_timeout=300) as eng:
        print(f"engine {eng.url} pid {eng.pid}: {eng.info['tags']}", flush=True)
        client = EngineClient(eng.url, store, timeout=120)
        time.sleep(args.pause_s)
        plan = [("pause", ["kv_cache"]), ("resume", ["kv_cache"]), ("pause", ["weights"]),
                ("resume", ["weights"]), ("pause", ["cuda_graph"]), ("resume", ["cuda_graph"]),
                ("pause", None), ("resume", None), ("resume", ["weights"])]
        for action, tags in plan:
            ev = getattr(client, action)(tags)
            print(f"  {action:6} {','.join(tags or ['all']):10} ok={ev.ok} {ev.duration * 1e3:8.1f} ms "
                  f"{ev.error or ''}", flush=True)
            time.sleep(args.pause_s)
        client.close()

    print("== part 2: agent in this process, TMS called directly ==", flush=True)
    import torch

    import collectors.agent as agent
    from collectors.controls.tms_workload import load_tms

    tms = load_tms("torch")
    a = agent.install(store, device="cuda:0", interval=0.05)
    sizes = {"weights": parse_bytes(args.weights), "kv_cache": parse_bytes(args.kv_cache)}
    keep = []
    for tag, n in sizes.items():
        with torch.cuda.device(0), tms.region(tag=tag):
            keep.append(torch.ones(n, dtype=torch.uint8, device="cuda:0"))
    torch.cuda.synchronize()
    print(f"  tag sizes learned from region(): "
          f"{ {t: format_bytes(b) for t, b in a.region_bytes.items()} }", flush=True)
    time.sleep(args.pause_s)

    def show(label: str) -> None:
        print(f"  {label:22} torch allocated {format_bytes(torch.cuda.memory_allocated(0)):>11}   "
              f"NVML used {format_bytes(nvml_used(nvml)):>11}", flush=True)

    show("before")
    for action, tag in [("pause", "kv_cache"), ("pause", "weights"), ("resume", "weights"),
                        ("resume", "kv_cache")]:
        getattr(tms, action)(tag)
        time.sleep(args.pause_s)
        show(f"after {action} {tag}")
    a.flush()
    agent.uninstall()
    rec.stop()
    del keep

    df = verify(Store.open(out), settle_s=1.0)
    print()
    print(format_verification(df))
    print(f"\nrecording: {out.resolve()}")
    bad = df[(df["verdict"] != "ok") & (df["verdict"] != "call failed")]
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
