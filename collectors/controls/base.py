"""The one interface of everything that can pause and resume tagged memory.

A Control emits an Event for every pause/resume (ok or failed) into the store it was given, on the
same clock as the samples. Failures never raise out of ``pause``/``resume``: they come back as a
failed Event whose ``error`` is the message a user should read (the engine's own where there is
one). Bad arguments (an unknown tag) are rejected before anything changes, also as a failed Event.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from collectors.model import Event, now
from collectors.store import Store

__all__ = ["Control", "ControlError", "TagState", "KNOWN_TAGS"]

# SGLang's tag names (DESIGN.md); controls may hold any subset.
KNOWN_TAGS = ("weights", "kv_cache", "cuda_graph", "weights_drafter")


class ControlError(RuntimeError):
    """A control could not do what was asked; the message is for the user."""


@dataclass
class TagState:
    tag: str
    bytes: int | None  # what the tag holds when resumed; None when the target does not say
    paused: bool
    backup: bool  # enable_cpu_backup (content survives pause/resume)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Control(abc.ABC):
    """``pause(tags)`` / ``resume(tags)``: tags None or empty means every tag."""

    #: what the Event's ``target`` says, e.g. "host-saver", "tms:cuda:0", "http://127.0.0.1:30000"
    target: str = ""
    #: who caused the events, e.g. "app"
    origin: str = "app"

    def __init__(self, store: Store | None = None) -> None:
        self.store = store

    @abc.abstractmethod
    def state(self) -> dict[str, TagState]:
        """Per tag: bytes, paused, backup."""

    @abc.abstractmethod
    def _pause(self, tags: list[str]) -> None:
        """Do the pause; raise ControlError with a user-facing message on failure."""

    @abc.abstractmethod
    def _resume(self, tags: list[str]) -> None:
        """Do the resume; raise ControlError with a user-facing message on failure."""

    def pause(self, tags: Sequence[str] | None = None) -> Event:
        return self._act("pause", tags)

    def resume(self, tags: Sequence[str] | None = None) -> Event:
        return self._act("resume", tags)

    def event_details(self) -> dict[str, Any]:
        """Extra facts for each Event (e.g. {"pid": ..., "device": ...})."""
        return {}

    def _expected_bytes(self, action: str, tags: list[str], held: dict[str, TagState]) -> int | None:
        """Bytes the call should release or re-commit; None when the target does not say."""
        sizes = [held[t].bytes for t in (tags or list(held)) if t in held]
        return None if not sizes or any(b is None for b in sizes) else int(sum(sizes))  # type: ignore[misc]

    def _act(self, action: str, tags: Sequence[str] | None) -> Event:
        tag_list = list(tags or [])
        # Ask for the state before the clock starts: a slow status query is not the call's time.
        try:
            held = self.state()
        except Exception:
            held = {}
        expected = self._expected_bytes(action, tag_list, held) if held else None
        try:
            details = dict(self.event_details())
        except Exception:
            details = {}
        ev = Event(now(), None, action, tag_list, self.target, origin=self.origin,
                   expected_bytes=expected, details=details)
        try:
            (self._pause if action == "pause" else self._resume)(tag_list)
        except ControlError as e:
            ev.ok, ev.error = False, str(e)
        except Exception as e:  # a control bug must still leave a failed event, not a hole
            ev.ok, ev.error = False, f"{type(e).__name__}: {e}"
        ev.t_end = now()
        if self.store is not None:
            self.store.add_event(ev)
        return ev
