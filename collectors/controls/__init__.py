"""Controls: things that pause and resume tagged memory and record each call as an Event.

- ``host``: :class:`collectors.controls.host_saver.HostSaver` (anonymous mmap + madvise, no GPU)
- ``tms``: :class:`collectors.controls.tms_workload.TmsWorkload` (torch_memory_saver, in-process)
- ``engine``: :class:`collectors.controls.engine_client.EngineClient` (SGLang's HTTP API)

Nothing here imports torch, torch_memory_saver or httpx until a control is built.

>>> from collectors.controls import make_control
>>> saver = make_control("host")
>>> _ = saver.allocate("weights", 4 * 2**20)
>>> saver.pause(["weights"]).ok
True
>>> saver.close()
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

from collectors.controls.base import KNOWN_TAGS, Control, ControlError, TagState
from collectors.model import Event, now

__all__ = [
    "CONTROLS",
    "KNOWN_TAGS",
    "Control",
    "ControlError",
    "DetailedControl",
    "TagState",
    "check_tag",
    "make_control",
    "resolve_tags",
]

# kind -> "module:Class"; imported only when asked for (tms needs torch, engine needs httpx).
CONTROLS: dict[str, str] = {
    "host": "collectors.controls.host_saver:HostSaver",
    "tms": "collectors.controls.tms_workload:TmsWorkload",
    "engine": "collectors.controls.engine_client:EngineClient",
}

# SGLang's tags are lowercase words; allow any short identifier-like name, nothing that could
# smuggle a path, a quote or whitespace into a request or a log line.
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


def make_control(kind: str, store: Any = None, **kw: Any) -> Control:
    """Build a control by kind ("host", "tms", "engine"); unknown kinds raise ValueError.

    ``make_control("engine", store, url="http://127.0.0.1:30000")``.
    """
    try:
        target = CONTROLS[kind]
    except KeyError:
        raise ValueError(f"unknown control {kind!r}; known controls: {', '.join(CONTROLS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(store=store, **kw)


def check_tag(tag: object) -> str:
    """Return ``tag`` if it is a valid tag name, else raise ValueError saying why."""
    if not isinstance(tag, str):
        raise ValueError(f"tag must be a string, got {type(tag).__name__} {tag!r}")
    if not _TAG_RE.fullmatch(tag):
        raise ValueError(
            f"invalid tag name {tag!r}: use letters, digits, '_', '.', '-' (at most 64), "
            f"e.g. {', '.join(KNOWN_TAGS)}"
        )
    return tag


def resolve_tags(action: str, tags: Sequence[str], held: dict[str, TagState]) -> list[str]:
    """The tags a pause/resume will act on, checked before anything changes.

    Empty ``tags`` means every tag that can take the action (paused ones are skipped by a
    pause-all, resumed ones by a resume-all). Named tags must be held, and must not already be
    in the target state: torch_memory_saver ends the process (``exit(1)``) when asked to pause
    an allocation that is not active, and SGLang fails to resume a tag it never released.
    Raises ControlError with a user-facing message.
    """
    if not tags:
        return [t for t, st in held.items() if st.paused == (action == "resume")]
    for t in tags:
        try:
            check_tag(t)
        except ValueError as e:
            raise ControlError(str(e)) from None
    unknown = [t for t in tags if t not in held]
    if unknown:
        raise ControlError(f"unknown tag(s) {', '.join(map(repr, unknown))}; this target holds "
                           f"{', '.join(map(repr, held)) or 'no tags'}")
    if len(set(tags)) != len(tags):
        raise ControlError(f"tag listed twice in {list(tags)}")
    for t in tags:
        if action == "pause" and held[t].paused:
            raise ControlError(f"tag {t!r} is already released")
        if action == "resume" and not held[t].paused:
            raise ControlError(f"tag {t!r} was never released (resume needs a release first)")
    return list(tags)


class DetailedControl(Control):
    """A Control whose ``expected_bytes`` counts only the tags that will really change, and which
    records allocate/free events too."""

    def _expected_bytes(self, action: str, tags: list[str], held: dict[str, TagState]) -> int | None:
        try:
            chosen = resolve_tags(action, tags, held)
        except ControlError:
            return None
        sizes = [held[t].bytes for t in chosen]
        if any(b is None for b in sizes):
            return None
        return int(sum(sizes))  # type: ignore[arg-type]

    def _record(self, action: str, tags: list[str], t_start: float, *, ok: bool = True,
                error: str | None = None, expected_bytes: int | None = None) -> Event:
        """Record an allocate/free (or other) event that happened between t_start and now."""
        ev = Event(t_start, now(), action, tags, self.target, ok=ok, error=error, origin=self.origin,
                   expected_bytes=expected_bytes, details=dict(self.event_details()))
        if self.store is not None:
            self.store.add_event(ev)
        return ev
