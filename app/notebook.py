"""A live chart for notebooks: :class:`LiveMonitor` redraws the timeline while other cells run.

In one cell (as its last line, ``monitor`` shows the chart and starts redrawing)::

    from app.notebook import LiveMonitor
    monitor = LiveMonitor(recorder)
    monitor

and in a cell below, while the chart moves::

    saver.pause(["kv_cache"])
    monitor.stop()

With anywidget installed (JupyterLab, VS Code) it is a plotly ``FigureWidget`` updated in place
from a background thread. Where widgets are unavailable it falls back to redrawing a static
figure into the same output (``display_id`` + ``update``), and says so above the chart. Outside
IPython it still works as an object: ``refresh()`` returns the current figure.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import plotly.graph_objects as go

from app import charts
from collectors.recorder import Recorder
from collectors.store import Store

__all__ = ["LiveMonitor", "widgets_available"]

log = logging.getLogger(__name__)


def widgets_available() -> tuple[bool, str | None]:
    """(True, None) when a plotly FigureWidget can be built here, else (False, why)."""
    try:
        import anywidget  # noqa: F401 - plotly's FigureWidget is an anywidget
    except ImportError:
        return False, "anywidget is not installed (pip install anywidget)"
    try:
        go.FigureWidget()
    except Exception as e:  # plotly raises ImportError/ValueError with its own advice
        return False, f"plotly FigureWidget unavailable ({type(e).__name__}: {e})"
    return True, None


def _bundle(fig: go.Figure) -> dict[str, Any]:
    """The figure as the notebook's default plotly renderer would publish it."""
    return fig._repr_mimebundle_()


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


class LiveMonitor:
    """Timeline of ``recorder``'s store over the last ``window_s`` seconds, redrawn every
    ``interval_s`` seconds in place.

    ``mode``: "auto" (a widget when anywidget works, else static redraws), "widget" or "static".
    ``message`` says which one is used and why (shown above the chart in fallback mode).
    The thread stops by itself once the recorder stops (after one last redraw).
    """

    def __init__(self, recorder: Recorder | Store, *, window_s: float | None = 60.0,
                 interval_s: float = 1.0, devices: list[str] | None = None, max_points: int = 2000,
                 mode: str = "auto", height: int | None = None) -> None:
        if mode not in ("auto", "widget", "static"):
            raise ValueError(f"mode must be 'auto', 'widget' or 'static', got {mode!r}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.recorder = recorder if isinstance(recorder, Recorder) else None
        self.store = recorder.store if isinstance(recorder, Recorder) else recorder
        self.window_s = window_s
        self.interval_s = interval_s
        self.devices = devices
        self.max_points = max_points
        self.height = height
        ok, why = widgets_available() if mode != "static" else (False, "static mode was asked for")
        if mode == "widget" and not ok:
            raise RuntimeError(f"cannot build a live widget: {why}")
        self.widget = ok
        self.message = (None if ok else
                        f"Live widget unavailable — {why}. Showing a static chart redrawn every "
                        f"{interval_s:g} s instead.")
        self.figure: go.Figure = go.FigureWidget() if ok else go.Figure()
        self.refreshes = 0
        self.errors = 0
        self.last_error: str | None = None
        self._handle: Any = None  # IPython DisplayHandle in static mode
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._signature: tuple | None = None
        self.refresh()

    # -- drawing -----------------------------------------------------------------------------
    def build(self) -> go.Figure:
        """A fresh timeline figure of the current window."""
        start = None
        if self.window_s is not None:
            start = (time.time() if self._running_recorder() else self._last_t()) - self.window_s
        title = "Live: physical memory vs accounting" + (
            f" (last {self.window_s:g} s)" if self.window_s is not None else "")
        return charts.timeline(self.store, start=start, devices=self.devices, max_points=self.max_points,
                               title=title, height=self.height)

    def _running_recorder(self) -> bool:
        return self.recorder is not None and self.recorder.started_at is not None \
            and self.recorder.stopped_at is None

    def _last_t(self) -> float:
        series = self.store.series()
        return float(series["t_max"].max()) if not series.empty and series["t_max"].notna().any() \
            else time.time()

    def refresh(self) -> go.Figure:
        """Redraw now (from any thread) and return the figure shown."""
        with self._lock:
            new = self.build()
            if self.widget:
                self._update_widget(new)
            else:
                self.figure = new
                if self._handle is not None:
                    self._handle.update(_bundle(new), raw=True)
            self.refreshes += 1
            return self.figure

    def _update_widget(self, new: go.Figure) -> None:
        fw = self.figure
        sig = tuple((t.name, t.xaxis, t.yaxis, t.type) for t in new.data)
        with fw.batch_update():
            if sig == self._signature:
                for old, fresh in zip(fw.data, new.data, strict=True):
                    old.x, old.y = fresh.x, fresh.y
                    if getattr(fresh, "text", None) is not None:
                        old.text = fresh.text
                    if getattr(fresh, "marker", None) is not None and fresh.type == "scatter":
                        old.marker.color = fresh.marker.color
                fw.layout.shapes = new.layout.shapes
                fw.layout.annotations = new.layout.annotations
                fw.layout.title = new.layout.title
            else:  # new devices or series: replace everything (zoom is kept by uirevision)
                fw.data = ()
                fw.add_traces(list(new.data))
                fw.layout = new.layout
        self._signature = sig

    # -- running -----------------------------------------------------------------------------
    def start(self) -> LiveMonitor:
        """Redraw every ``interval_s`` on a daemon thread until ``stop()`` or the recorder stops."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="memsaver-live-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> go.Figure:
        """Stop redrawing; one last redraw from the caller's thread (so saved notebooks hold it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, 3 * self.interval_s))
            self._thread = None
        return self.refresh()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception as e:  # a failed redraw is counted and logged; the next one may work
                self.errors += 1
                if str(e) != self.last_error:
                    log.warning("live monitor redraw failed: %s", e)
                self.last_error = str(e)
            if self.recorder is not None and self.recorder.stopped_at is not None:
                break  # the recording ended: the last redraw above shows all of it

    # -- notebook display --------------------------------------------------------------------
    def show(self) -> LiveMonitor:
        """Display the chart (and the fallback message) in the current cell and start redrawing."""
        from IPython.display import HTML, display

        if self.message:
            display(HTML(f'<div style="padding:6px 10px;border-left:4px solid #ff7f0e;'
                         f'background:#fff4e5">⚠ {self.message}</div>'))
        if self.widget:
            display(self.figure)
        else:
            # A raw mime bundle: a Figure's own _ipython_display_ would ignore display_id, and
            # every redraw would then add an output instead of replacing this one.
            self._handle = display(_bundle(self.figure), raw=True, display_id=True)
        return self.start()

    def _ipython_display_(self) -> None:
        self.show()

    def __enter__(self) -> LiveMonitor:
        return self.show() if _in_ipython() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        kind = "widget" if self.widget else "static redraws"
        return (f"LiveMonitor({kind}, window={self.window_s} s, every {self.interval_s:g} s, "
                f"refreshes={self.refreshes}, running={self.running})")
