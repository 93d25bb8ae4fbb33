"""Start the dashboard with a real `streamlit run` on a free 127.0.0.1 port, and drive Debian's
chromium with Playwright. Shared by the browser test and replay_screenshot.py."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "ROOT", "full_screenshot", "serve_dashboard"]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_dashboard(env: dict[str, str] | None = None, ready_timeout: float = 120.0) -> Iterator[str]:
    """Yield the URL of a running dashboard; stop it (SIGTERM, then SIGKILL) afterwards.
    Raises RuntimeError with the end of the server's log when it does not come up."""
    port = _free_port()
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MEMSAVER_ALLOW_REMOTE_CONTROL", None)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    state = f"exited with {proc.returncode}" if proc.poll() is not None else \
                        f"not healthy within {ready_timeout:g} s"
                    raise RuntimeError(f"streamlit {state}: {tail}")
                try:
                    if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def full_screenshot(page: Any, path: Path, width: int = 1440) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden")  # the script run ended
    page.locator(".js-plotly-plot").first.wait_for()
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || 1000")
    page.set_viewport_size({"width": width, "height": min(int(height) + 100, 8000)})
    page.wait_for_timeout(1500)  # let plotly redraw after the resize (cosmetic, not an assertion)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": width, "height": 1000})
