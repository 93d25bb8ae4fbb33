"""Pause/resume an inference engine over SGLang's HTTP API, one Event per call.

SGLang: ``POST /release_memory_occupation`` and ``POST /resume_memory_occupation`` with body
``{"tags": [...]}`` (no tags = all); 200 on success, 400 ``{"error": {"message": ...}}`` on
failure (a busy server, resuming a tag never released, ...). The demo engine
(``memsaver demo-engine``) speaks the same two endpoints plus ``GET /memsaver/status``
(``{"pid", "device", "tags": {tag: {"bytes", "paused", "backup"}}}``), which this client uses
for the tags' sizes and the engine's pid when it is there; against a real SGLang server it
tracks what it released itself (sizes unknown).

Every request has a timeout; a refused connection, a timeout, a 400 or any other answer becomes
a failed Event whose ``error`` says what happened, never an exception and never a hang.

>>> client = EngineClient("http://127.0.0.1:30000")          # doctest: +SKIP
>>> client.pause(["kv_cache"]).ok                            # doctest: +SKIP
True
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from collectors.controls import DetailedControl, check_tag
from collectors.controls.base import ControlError, TagState
from collectors.store import Store

__all__ = ["EngineClient", "RELEASE_PATH", "RESUME_PATH", "STATUS_PATH"]

RELEASE_PATH = "/release_memory_occupation"
RESUME_PATH = "/resume_memory_occupation"
STATUS_PATH = "/memsaver/status"
_STATUS_TIMEOUT = 5.0  # the status query is small; never wait the full call timeout for it


def check_url(url: str) -> str:
    """Normalise an engine URL; raise ValueError for anything that is not http(s)://host[:port]."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("engine URL is empty; e.g. http://127.0.0.1:30000")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"invalid engine URL {url!r}: use http://HOST:PORT, e.g. http://127.0.0.1:30000")
    try:
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError:
        raise ValueError(f"invalid port in engine URL {url!r}") from None
    return url.strip().rstrip("/")


class EngineClient(DetailedControl):
    """A Control for an SGLang-compatible server at ``url``."""

    def __init__(self, url: str, store: Store | None = None, *, timeout: float = 30.0,
                 origin: str = "app") -> None:
        super().__init__(store)
        import httpx

        self.url = check_url(url)
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.target = self.url
        self.origin = origin
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.url, timeout=self.timeout)
        self._lock = threading.Lock()
        self._released: set[str] = set()  # what this client paused (for servers without status)
        self._has_status: bool | None = None
        self._last_status: dict[str, Any] | None = None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        """The demo engine's status JSON, or None when the server has no status endpoint.

        Raises ControlError when the server cannot be reached.
        """
        if self._has_status is False:
            return None
        resp = self._request("GET", STATUS_PATH, timeout=min(self.timeout, _STATUS_TIMEOUT))
        if resp.status_code == 404:
            self._has_status = False
            return None
        if resp.status_code != 200:
            raise ControlError(f"{self.url}{STATUS_PATH} answered HTTP {resp.status_code}")
        try:
            data = resp.json()
            tags = data["tags"]
            assert isinstance(tags, dict)
        except Exception:
            raise ControlError(f"{self.url}{STATUS_PATH} did not return the expected JSON") from None
        self._has_status = True
        self._last_status = data
        return data

    def state(self) -> dict[str, TagState]:
        data = self.status()
        if data is None:
            return {t: TagState(t, None, True, False) for t in sorted(self._released)}
        return {t: TagState(t, None if v.get("bytes") is None else int(v["bytes"]),
                            bool(v.get("paused")), bool(v.get("backup")))
                for t, v in data["tags"].items()}

    def event_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url}
        st = self._last_status or {}
        for key in ("pid", "device"):
            if st.get(key) is not None:
                out[key] = st[key]
        return out

    # -- calls -------------------------------------------------------------------------------
    def _pause(self, tags: list[str]) -> None:
        self._call(RELEASE_PATH, tags)
        with self._lock:
            self._released.update(tags or self._all_known())

    def _resume(self, tags: list[str]) -> None:
        self._call(RESUME_PATH, tags)
        with self._lock:
            self._released.difference_update(tags or set(self._released))

    def _all_known(self) -> set[str]:
        st = self._last_status or {}
        return set(st.get("tags") or {})

    def _call(self, path: str, tags: list[str]) -> None:
        for t in tags:
            try:
                check_tag(t)
            except ValueError as e:
                raise ControlError(str(e)) from None
        body: dict[str, Any] = {"tags": tags} if tags else {}  # omitted = every tag (SGLang)
        resp = self._request("POST", path, json=body)
        if resp.status_code == 200:
            return
        message = _error_message(resp)
        if resp.status_code == 400:
            raise ControlError(f"engine refused: {message}")
        if resp.status_code == 404:
            raise ControlError(f"{self.url} has no {path} (is it an SGLang server?)")
        raise ControlError(f"engine answered HTTP {resp.status_code}: {message}")

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        httpx = self._httpx
        try:
            return self._client.request(method, path, **kw)
        except httpx.ConnectError:
            raise ControlError(f"cannot reach engine at {self.url} (connection refused: "
                               "is it running?)") from None
        except httpx.TimeoutException:
            t = kw.get("timeout", self.timeout)
            raise ControlError(f"engine at {self.url} did not answer {method} {path} within {t:g} s "
                               "(the call may still complete on the server)") from None
        except httpx.HTTPError as e:
            raise ControlError(f"request to {self.url}{path} failed: {type(e).__name__}: {e}") from None


def _error_message(resp: Any) -> str:
    """SGLang's ``{"error": {"message": ...}}``, else the start of the body."""
    try:
        data = resp.json()
        msg = data["error"]["message"]
        if isinstance(msg, str) and msg:
            return msg
    except Exception:
        pass
    text = (resp.text or "").strip().replace("\n", " ")
    return text[:200] or f"HTTP {resp.status_code} with an empty body"
