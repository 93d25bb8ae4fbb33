"""Reading a Streamlit AppTest page: metric tiles, and reruns until the recorder caught up."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from streamlit.testing.v1 import AppTest

from collectors.units import parse_bytes

__all__ = ["metric", "metric_bytes", "metric_value", "rerun_until"]


def metric(at: AppTest, label_prefix: str) -> tuple[str, str]:
    """(label, value) of the first metric tile whose label starts with ``label_prefix``."""
    found = [(m.label, m.value) for m in at.metric if m.label.startswith(label_prefix)]
    assert found, f"no metric starting with {label_prefix!r}: {[m.label for m in at.metric]}"
    return found[0]


def metric_value(at: AppTest, label_prefix: str) -> str:
    return metric(at, label_prefix)[1]


def metric_bytes(at: AppTest, label_prefix: str) -> int | None:
    text = metric_value(at, label_prefix)
    return None if text in ("n/a", "none") else parse_bytes(text, allow_zero=True)


def rerun_until(at: AppTest, pred: Callable[[AppTest], object], what: str = "condition",
                timeout: float = 90.0, interval: float = 0.2) -> object:
    """Rerun the script until pred(at) holds (the recorder writes on its own threads)."""
    deadline = time.monotonic() + timeout
    while True:
        at.run()
        assert not at.exception, at.exception
        try:
            value = pred(at)
        except AssertionError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not shown within {timeout} s; metrics: "
                        f"{[(m.label, m.value) for m in at.metric]}")
        time.sleep(interval)
