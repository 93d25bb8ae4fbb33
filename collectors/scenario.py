"""The scripted demo: a narrated release/resume sequence, recorded into one recording file.

Allocate weights and KV cache, release the KV cache, release the weights, resume both — on
whatever is here: torch_memory_saver on a GPU (``cuda``/``xpu``), the host saver otherwise, or an
SGLang-compatible engine at a URL (which already holds its memory: no allocation step). Each step
is narrated with what physical memory and the allocator's accounting did, and every call is an
Event in the recording, so ``app.report.write_report(path, ...)`` can show it afterwards.

>>> from collectors.scenario import run_scenario
>>> path = run_scenario(device="host", weights="64MiB", kv_cache="128MiB", out_dir="/tmp")  # doctest: +SKIP

No plotting here (collectors/ never imports plotly); torch and torch_memory_saver are imported
only for a GPU run.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors import __version__
from collectors.controls.base import Control, ControlError
from collectors.model import Event
from collectors.recorder import Recorder
from collectors.sources.base import Source
from collectors.store import Store
from collectors.units import format_bytes, format_duration, parse_bytes

__all__ = ["DEVICES", "Plan", "ScenarioError", "resolve_device", "run_scenario"]

DEVICES = ("auto", "cuda", "xpu", "host")
Narrate = Callable[[str], None]


class ScenarioError(RuntimeError):
    """The scenario cannot run here (e.g. --device cuda without a GPU); the message says why."""


@dataclass
class Plan:
    """What a scenario run uses: the control, the sources, and which series tell the story."""

    kind: str  # "host" | "cuda" | "xpu" | "engine"
    device: str  # "host", "cuda:0", ...
    control: Control
    sources: list[Source]
    physical_key: tuple[str, str, str, int | None] | None
    accounting_key: tuple[str, str, str, int | None] | None
    allocate: bool = True  # an engine already holds its memory
    notes: list[str] = field(default_factory=list)


def _module_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_ready(kind: str) -> str | None:
    """None when torch + torch_memory_saver can drive ``kind`` here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    except Exception as e:  # a broken install reads as such
        return f"torch failed to import ({e})"
    backend = getattr(torch, kind, None)
    try:
        if backend is None or not backend.is_available() or backend.device_count() == 0:
            return f"torch {torch.__version__} sees no {kind} device"
    except Exception as e:
        return f"torch cannot query {kind} ({e})"
    if importlib.util.find_spec("torch_memory_saver") is None:
        return "torch_memory_saver is not installed (pip install torch_memory_saver)"
    return None


def resolve_device(device: str = "auto", engine: str | None = None) -> str:
    """'auto' -> 'cuda' when torch + TMS see a GPU, else 'xpu' likewise, else 'host'.

    An explicit GPU that cannot be used raises ScenarioError saying why (no silent downgrade).
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if engine:
        return "engine"
    if device == "host":
        return "host"
    if device in ("cuda", "xpu"):
        why = _gpu_ready(device)
        if why:
            raise ScenarioError(f"--device {device}: {why}")
        return device
    for kind in ("cuda", "xpu"):
        if _gpu_ready(kind) is None:
            return kind
    return "host"


def _plan(kind: str, store: Store, engine: str | None, timeout: float) -> Plan:
    pid = os.getpid()
    if kind == "host":
        from collectors.controls.host_saver import HostSaver
        from collectors.sources.host import HostSource

        saver = HostSaver(store, origin="demo")
        return Plan("host", "host", saver, [HostSource(pids=[pid]), saver.accounting_source()],
                    ("host", "host", "process_used_bytes", pid), ("host", "saver", "allocated_bytes", None),
                    notes=["host saver: anonymous mmap released with madvise(MADV_DONTNEED); "
                           "physical = this process's RSS, accounting = bytes allocated"])
    if kind in ("cuda", "xpu"):
        from collectors.controls.tms_workload import TmsWorkload

        device = f"{kind}:0"
        wl = TmsWorkload(store, device=device, origin="demo")
        sources: list[Source]
        if kind == "cuda":
            from collectors.sources.nvml import NvmlSource

            # NVML numbers GPUs by PCI bus; with CUDA_VISIBLE_DEVICES set the mapping is unknown,
            # so read them all rather than the wrong one.
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            sources = [NvmlSource(indices=None if visible else [0])]
            phys = (device, "nvml", "used_bytes", None)
        else:
            from collectors.sources.sysman import SysmanSource

            sources = [SysmanSource()]
            phys = (device, "sysman", "used_bytes", None)
        sources.append(wl.accounting_source())
        return Plan(kind, device, wl, sources, phys, (device, "torch", "allocated_bytes", None),
                    notes=[f"torch_memory_saver {_module_version('torch_memory_saver')} "
                           f"(hook_mode=torch) on {device}"])
    # an engine over HTTP: it holds its own memory; follow its pid and device when it says them
    from collectors.controls.engine_client import EngineClient

    client = EngineClient(engine or "", store, timeout=timeout, origin="demo")
    try:
        status = client.status() or {}
    except ControlError as e:
        client.close()
        raise ScenarioError(f"engine {client.url} cannot be reached: {e}") from None
    dev = str(status.get("device") or "")
    epid = status.get("pid")
    sources = []
    phys_key: tuple[str, str, str, int | None] | None = None
    from collectors.sources import make_source

    if dev.startswith("cuda") or (not dev and _nvml_available()):
        sources.append(make_source("nvml"))
        phys_key = (dev or "cuda:0", "nvml", "used_bytes", None)
    elif dev.startswith("xpu"):
        sources.append(make_source("sysman"))
        phys_key = (dev, "sysman", "used_bytes", None)
    host_pids = [int(epid)] if epid else []
    sources.append(make_source("host", pids=host_pids))
    if phys_key is None:
        phys_key = (("host", "host", "process_used_bytes", int(epid)) if epid
                    else ("host", "host", "used_bytes", None))
    notes = [f"engine at {client.url}" + (f", pid {epid} on {dev}" if epid else " (no status endpoint: "
                                          "tag sizes unknown)")]
    return Plan("engine", dev or phys_key[0], client, sources, phys_key, None, allocate=False, notes=notes)


def _nvml_available() -> bool:
    from collectors.sources import make_source

    try:
        return bool(make_source("nvml").discovery.available)
    except Exception:
        return False


def _environment(plan: Plan) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "memsaver-dashboard": __version__, "scenario target": plan.control.target,
    }
    if plan.kind in ("cuda", "xpu"):
        torch = sys.modules.get("torch")
        if torch is not None:
            env["torch"] = torch.__version__
            runtime = getattr(torch.version, "cuda", None) or getattr(torch.version, "xpu", None)
            env["torch cuda/xpu runtime"] = runtime
            try:
                env["torch device name"] = getattr(torch, plan.kind).get_device_name(0)
            except Exception:
                pass
        env["torch_memory_saver"] = _module_version("torch_memory_saver")
    for name in ("nvidia-ml-py", "pyzes", "psutil"):
        v = _module_version(name)
        if v:
            env[name] = v
    return env


class _Narrator:
    def __init__(self, narrate: Narrate, rec: Recorder, plan: Plan) -> None:
        self.say, self.rec, self.plan = narrate, rec, plan
        self.t0 = time.monotonic()

    def line(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.t0:6.2f}s] {text}")

    def _latest(self, key: tuple[str, str, str, int | None] | None) -> float | None:
        if key is None:
            return None
        got = self.rec.latest().get(key)
        return None if got is None or got[1] is None else float(got[1])

    def reading(self) -> tuple[float | None, float | None]:
        return self._latest(self.plan.physical_key), self._latest(self.plan.accounting_key)

    def after(self, ev: Event, before: tuple[float | None, float | None]) -> None:
        if not ev.ok:
            self.line(f"   FAILED: {ev.error}")
            return
        phys, acc = self.reading()
        parts = [f"   done in {format_duration(ev.duration)}"]
        if phys is not None and before[0] is not None:
            parts.append(f"physical {format_bytes(before[0])} -> {format_bytes(phys)} "
                         f"({format_bytes(phys - before[0], signed=True)})")
        if acc is not None and before[1] is not None:
            parts.append(f"accounting {format_bytes(before[1])} -> {format_bytes(acc)} "
                         f"({format_bytes(acc - before[1], signed=True)})")
        self.line("; ".join(parts))


def run_scenario(*, device: str = "auto", engine: str | None = None, weights: str | int = "256MiB",
                 kv_cache: str | int = "512MiB", out_dir: str | os.PathLike[str] = ".",
                 path: str | os.PathLike[str] | None = None, settle_s: float = 1.5,
                 narrate: Narrate | None = print, timeout: float = 60.0) -> Path:
    """Run the narrated sequence and return the recording's path.

    ``device``: auto | cuda | xpu | host (ignored with ``engine``, an SGLang-compatible URL).
    ``settle_s``: seconds between steps, so each state shows as a plateau on the charts.
    Raises ValueError for bad arguments and ScenarioError when the target cannot run; the
    recording of a run that fails midway is kept (its failed events say what happened).
    """
    wbytes, kbytes = parse_bytes(weights), parse_bytes(kv_cache)
    if settle_s < 0:
        raise ValueError(f"settle_s must be >= 0, got {settle_s!r}")
    kind = resolve_device(device, engine)
    out = Path(out_dir)
    if path is None:
        if not out.is_dir():
            raise ValueError(f"{out}: output directory does not exist")
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = out / f"memsaver-demo-{kind}-{stamp}.sqlite"
    path = Path(path)
    if path.exists():
        raise ValueError(f"{path}: already exists; choose another path")
    say = narrate or (lambda _s: None)
    store = Store(path)
    try:
        plan = _plan(kind, store, engine, timeout)
    except BaseException:
        store.close()
        path.unlink(missing_ok=True)
        raise
    rec = Recorder(store, plan.sources)
    n = _Narrator(say, rec, plan)
    try:
        rec.start()
        store.set_meta(scenario={"kind": plan.kind, "device": plan.device, "target": plan.control.target,
                                 "weights_bytes": wbytes, "kv_cache_bytes": kbytes, "settle_s": settle_s,
                                 "notes": plan.notes},
                       environment=_environment(plan))
        for note in plan.notes:
            n.line(note)
        if rec.skipped:
            for name, why in rec.skipped.items():
                n.line(f"source {name} not recorded: {why}")
        n.line(f"recording to {path}; baseline for {settle_s:g} s")
        time.sleep(settle_s)
        if plan.allocate:
            for tag, nbytes in (("weights", wbytes), ("kv_cache", kbytes)):
                n.line(f"allocate {tag}: {format_bytes(nbytes)}")
                before = n.reading()
                ev = plan.control.allocate(tag, nbytes)  # type: ignore[attr-defined]
                time.sleep(settle_s)
                n.after(ev, before)
        steps: list[tuple[str, list[str], str]] = [
            ("pause", ["kv_cache"], "release the KV cache"),
            ("pause", ["weights"], "release the weights"),
            ("resume", ["weights", "kv_cache"], "resume both"),
        ]
        for action, tags, words in steps:
            n.line(f"{words} ({action} {', '.join(tags)})")
            before = n.reading()
            ev = plan.control.pause(tags) if action == "pause" else plan.control.resume(tags)
            time.sleep(settle_s)
            n.after(ev, before)
    finally:
        rec.stop()
        close = getattr(plan.control, "close", None)
        if close is not None:
            try:
                close()
            except Exception as e:  # the recording is what matters now
                say(f"closing {plan.control.target} failed: {e}")
    from collectors.verification import format_verification, verify

    say("")
    say(format_verification(verify(store)))
    store.close()
    say(f"\nrecording: {path}")
    return path
