"""A small SGLang-compatible engine that holds tagged memory, for demos and tests.

It speaks exactly SGLang's two memory endpoints:

- ``POST /release_memory_occupation`` and ``POST /resume_memory_occupation``, body
  ``{"tags": [...]}`` (omitted, null or empty = every tag): 200 with a ``null`` body on success,
  400 ``{"error": {"message": ...}}`` on failure. Like SGLang it refuses while requests are in
  flight, and resuming a tag that was never released fails. Unlike SGLang it also refuses an
  unknown tag and a second release of a released tag (TMS would end the process on the latter).

plus a few of its own under ``/memsaver/`` (not in SGLang):

- ``GET /memsaver/status`` -> ``{"pid", "device", "target", "busy", "tags": {tag: {"bytes",
  "paused", "backup"}}}``
- ``POST /memsaver/busy {"seconds": s}``: act as if serving requests for ``s`` seconds (the
  non-idle error path).
- ``POST /memsaver/delay {"seconds": s}``: answer the two memory endpoints ``s`` seconds late
  (a real slow server, for client timeouts).
- ``GET /health``: 200 when up (SGLang has it too).

Memory is held by the host saver (``--device host``, the default with no GPU) or by
torch_memory_saver (``--device cuda`` / ``xpu``). Binds 127.0.0.1 unless told otherwise.

    memsaver demo-engine --port 30000 --weights 2GiB --kv-cache 8GiB --device cuda

From Python (tests, notebooks), in a child process:

>>> with spawn(weights="64MiB", kv_cache="128MiB") as engine:   # doctest: +SKIP
...     EngineClient(engine.url).pause(["kv_cache"])
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at runtime,
# and they name classes imported inside create_app.

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.units import format_bytes, parse_bytes, parse_duration

__all__ = [
    "DemoEngine",
    "DemoEngineProcess",
    "add_arguments",
    "create_app",
    "main",
    "run",
    "spawn",
]

READY_MARK = "MEMSAVER_DEMO_ENGINE_READY "
BUSY_MESSAGE = "release_memory_occupation should be called only when no ongoing request."
_TAG_OPTIONS = (("weights", "weights"), ("kv_cache", "kv-cache"), ("cuda_graph", "cuda-graph"))
_HOST_HEADROOM = 0.8  # refuse host sizes above this share of available memory


class DemoEngine:
    """The engine state behind the HTTP app: a control plus the busy/delay switches."""

    def __init__(self, control: Any, device: str) -> None:
        self.control = control
        self.device = device
        self.busy_until = 0.0
        self.delay_s = 0.0
        self.lock = threading.Lock()  # one memory operation at a time, as SGLang's scheduler

    @property
    def busy(self) -> bool:
        return time.monotonic() < self.busy_until

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "device": self.device, "target": self.control.target,
            "busy": self.busy,
            "tags": {t: {"bytes": s.bytes, "paused": s.paused, "backup": s.backup}
                     for t, s in self.control.state().items()},
        }

    def act(self, action: str, tags: list[str]) -> str | None:
        """Do a release/resume; None on success, else the error message."""
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.busy:
            return BUSY_MESSAGE if action == "pause" else \
                "resume_memory_occupation should be called only when no ongoing request."
        with self.lock:
            ev = self.control.pause(tags) if action == "pause" else self.control.resume(tags)
        return None if ev.ok else ev.error or "failed"


def _tags_from_body(raw: bytes) -> list[str]:
    """SGLang's body: {"tags": [...]} with tags omitted/null/empty meaning all. ValueError if bad."""
    if not raw.strip():
        return []
    try:
        body = json.loads(raw)
    except ValueError:
        raise ValueError("request body is not JSON; send {\"tags\": [\"weights\", ...]}") from None
    if body is None:
        return []
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object like {\"tags\": [\"weights\"]}")
    tags = body.get("tags")
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"\"tags\" must be a list of strings, got {json.dumps(tags)[:100]}")
    return tags


def create_app(engine: DemoEngine, *, status_endpoint: bool = True) -> Any:
    """The FastAPI app. ``status_endpoint=False`` leaves only what a real SGLang server has."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="memsaver demo engine", docs_url=None, redoc_url=None, openapi_url=None)

    def error(message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=400)

    # Sync handlers run in the thread pool: a slow release never blocks /health or /status.
    def memory_call(action: str, raw: bytes) -> Response:
        try:
            tags = _tags_from_body(raw)
        except ValueError as e:
            return error(str(e))
        message = engine.act(action, tags)
        return error(message) if message else JSONResponse(None, status_code=200)

    @app.post("/release_memory_occupation")
    async def release(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(memory_call, "pause", await request.body())

    @app.post("/resume_memory_occupation")
    async def resume(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(memory_call, "resume", await request.body())

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    if status_endpoint:
        @app.get("/memsaver/status")
        def status() -> dict[str, Any]:
            return engine.status()

        @app.post("/memsaver/busy")
        async def busy(request: Request) -> Response:
            seconds = _seconds(await request.body())
            if seconds is None:
                return error("send {\"seconds\": S} with S >= 0")
            engine.busy_until = time.monotonic() + seconds
            return JSONResponse({"busy_for_s": seconds})

        @app.post("/memsaver/delay")
        async def delay(request: Request) -> Response:
            seconds = _seconds(await request.body())
            if seconds is None:
                return error("send {\"seconds\": S} with S >= 0")
            engine.delay_s = seconds
            return JSONResponse({"delay_s": seconds})

    return app


def _seconds(raw: bytes) -> float | None:
    try:
        value = float(json.loads(raw)["seconds"])
    except Exception:
        return None
    return value if 0 <= value < 3600 else None


# -- command line --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", default="30000", help="port (default 30000; 0 = any free port)")
    p.add_argument("--device", default="host",
                   help="host (anonymous mmap, no GPU), cuda[:N] or xpu[:N] (torch_memory_saver)")
    p.add_argument("--weights", default="512MiB", help="size of the 'weights' tag (default 512MiB; 0 = none)")
    p.add_argument("--kv-cache", default="1GiB", help="size of the 'kv_cache' tag (default 1GiB; 0 = none)")
    p.add_argument("--cuda-graph", default="0", help="size of the 'cuda_graph' tag (default 0 = none)")
    p.add_argument("--backup", default="", metavar="TAGS",
                   help="comma-separated tags kept across a release (CPU backup), e.g. weights")
    p.add_argument("--busy-for", default="0s", metavar="DURATION",
                   help="act as if serving requests for this long after start (e.g. 10s)")
    p.add_argument("--no-status", action="store_true",
                   help="serve only SGLang's endpoints (no /memsaver/*), like a real SGLang server")


@dataclass
class _Config:
    host: str
    port: int
    device: str
    sizes: dict[str, int]
    backup: set[str]
    busy_for: float
    status: bool


def _config(args: argparse.Namespace) -> _Config:
    """Check every option before anything is allocated; ValueError with a one-line message."""
    sizes = {}
    for tag, opt in _TAG_OPTIONS:
        text = getattr(args, opt.replace("-", "_"))
        try:
            n = parse_bytes(text, allow_zero=True)
        except ValueError as e:
            raise ValueError(f"--{opt}: {e}") from None
        if n:
            sizes[tag] = n
    if not sizes:
        raise ValueError("nothing to hold: give --weights, --kv-cache or --cuda-graph a size > 0")
    try:
        port = int(args.port)
        assert 0 <= port <= 65535
    except (ValueError, AssertionError):
        raise ValueError(f"--port: invalid port {args.port!r}: use 0..65535") from None
    device = str(args.device).strip().lower()
    kind = device.partition(":")[0]
    if kind not in ("host", "cuda", "xpu") or (kind == "host" and device != "host"):
        raise ValueError(f"--device: unknown device {args.device!r}; use host, cuda[:N] or xpu[:N]")
    if kind != "host" and ":" not in device:
        device += ":0"
    backup = {t.strip() for t in str(args.backup).split(",") if t.strip()}
    if backup - set(sizes):
        raise ValueError(f"--backup: {', '.join(sorted(backup - set(sizes)))} is not a held tag "
                         f"(held: {', '.join(sizes)})")
    try:
        busy_for = parse_duration(args.busy_for, allow_zero=True)
    except ValueError as e:
        raise ValueError(f"--busy-for: {e}") from None
    if device == "host":
        import psutil

        avail = psutil.virtual_memory().available
        if sum(sizes.values()) > _HOST_HEADROOM * avail:
            raise ValueError(f"{format_bytes(sum(sizes.values()))} of tags is more than "
                             f"{_HOST_HEADROOM:.0%} of the {format_bytes(avail)} of host memory available")
    return _Config(args.host, port, device, sizes, backup, busy_for, not args.no_status)


def run(args: argparse.Namespace) -> int:
    """Allocate, bind, serve until SIGINT/SIGTERM. ValueError/OSError for bad options."""
    import uvicorn

    from collectors.controls import make_control

    cfg = _config(args)
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}") from None
    if cfg.device == "host":
        control = make_control("host", origin="demo-engine")
    else:
        control = make_control("tms", device=cfg.device, origin="demo-engine")
    try:
        for tag, n in cfg.sizes.items():
            control.allocate(tag, n, backup=tag in cfg.backup)
        engine = DemoEngine(control, cfg.device)
        engine.busy_until = time.monotonic() + cfg.busy_for
        app = create_app(engine, status_endpoint=cfg.status)
        host, port = sock.getsockname()[:2]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        print(READY_MARK + json.dumps({"url": url, "pid": os.getpid(), "device": cfg.device,
                                       "tags": {t: n for t, n in cfg.sizes.items()}}), flush=True)
        print(f"demo engine on {url}: {', '.join(f'{t}={format_bytes(n)}' for t, n in cfg.sizes.items())}"
              f" on {cfg.device} (pid {os.getpid()})", file=sys.stderr, flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                               timeout_keep_alive=5))
        server.run(sockets=[sock])
    finally:
        sock.close()
        control.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m collectors.demo_engine ...``: the same options as ``memsaver demo-engine``."""
    p = argparse.ArgumentParser(prog="python -m collectors.demo_engine",
                                description="SGLang-compatible demo engine holding tagged memory")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as e:
        print(f"demo-engine: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- child process for tests and demos ----------------------------------------------------------
class DemoEngineProcess:
    """A demo engine running in a child process. ``url``, ``pid``; ``stop()`` ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, info: dict[str, Any], log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.pid = proc.pid
        self.info = info
        self.log_path = log_path
        self._final_log: str | None = None

    def log(self) -> str:
        """What the engine wrote to stderr so far (kept after ``stop()``)."""
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``. Returns the exit code. Safe to call twice."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self._final_log is None:
            self._final_log = self.log()
            shutil.rmtree(self.log_path.parent, ignore_errors=True)
        return self.proc.returncode

    def __enter__(self) -> "DemoEngineProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn(*, port: int = 0, weights: str | int = "64MiB", kv_cache: str | int = "128MiB",
          cuda_graph: str | int = 0, device: str = "host", host: str = "127.0.0.1",
          backup: tuple[str, ...] | list[str] = (), busy_for: str | float = 0, status: bool = True,
          ready_timeout: float = 120.0, extra_env: dict[str, str] | None = None) -> DemoEngineProcess:
    """Start a demo engine in a child process and wait until it answers ``/health``.

    ``port=0`` picks a free port. Raises RuntimeError with the engine's own message when it
    exits or does not become ready within ``ready_timeout`` seconds.
    """
    import httpx

    argv = [sys.executable, "-m", "collectors.demo_engine", "--host", host, "--port", str(port),
            "--device", device, "--weights", str(weights), "--kv-cache", str(kv_cache),
            "--cuda-graph", str(cuda_graph), "--busy-for", str(busy_for)]
    if backup:
        argv += ["--backup", ",".join(backup)]
    if not status:
        argv.append("--no-status")
    workdir = Path(tempfile.mkdtemp(prefix="memsaver-engine-"))
    out_path, log_path = workdir / "stdout", workdir / "stderr"
    env = {**os.environ, **(extra_env or {})}
    # The child must import this very package, wherever the caller runs from.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    with open(out_path, "wb") as out, open(log_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + ready_timeout
    info: dict[str, Any] | None = None
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                msg = log_path.read_text(errors="replace").strip().splitlines()
                raise RuntimeError(f"demo engine exited with code {proc.returncode}: "
                                   f"{msg[-1] if msg else 'no message'}")
            if info is None:
                for line in out_path.read_text(errors="replace").splitlines():
                    if line.startswith(READY_MARK):
                        info = json.loads(line[len(READY_MARK):])
            if info is not None:
                try:
                    if httpx.get(info["url"] + "/health", timeout=2.0).status_code == 200:
                        return DemoEngineProcess(proc, info["url"], info, log_path)
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"demo engine not ready within {ready_timeout:g} s")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
        raise


if __name__ == "__main__":
    from collectors.cli import exit_process

    exit_process(main())
