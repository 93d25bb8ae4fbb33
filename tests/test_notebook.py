"""Notebooks: the example notebook executed top to bottom in a real kernel (nbclient) on the host
saver, the LiveMonitor's static fallback in a real kernel, and the LiveMonitor in-process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from app.notebook import LiveMonitor, widgets_available
from collectors.controls.host_saver import HostSaver
from collectors.recorder import Recorder
from collectors.sources.host import HostSource
from collectors.store import Store

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.ipynb"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
MiB = 2**20


def _execute(nb: nbformat.NotebookNode, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel is a child process: it finds the repository through PYTHONPATH, like a user
    # who ran `pip install -e .`; it runs in cwd, like a user who opened the notebook there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    NotebookClient(nb, timeout=300, kernel_name="python3", startup_timeout=120,
                   resources={"metadata": {"path": str(cwd)}}).execute()


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list:
    return [o["data"][mime] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if mime in o.get("data", {})]


def _stream(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def _traces(fig: dict) -> dict[str, dict]:
    return {t.get("name"): t for t in fig["data"]}


def _values(arr: object) -> np.ndarray:
    if isinstance(arr, dict) and "bdata" in arr:
        import base64

        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"])).astype(float)
    return np.asarray(arr, dtype=float)


def test_quickstart_notebook_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        'import json\nprint("CHECK " + json.dumps({"verdicts": result["verdict"].tolist(), '
        '"pid": os.getpid(), "widget": monitor.widget, "refreshes": monitor.refreshes}))'))
    _execute(nb, tmp_path, monkeypatch)

    check = json.loads(next(line for line in _stream(nb).splitlines() if line.startswith("CHECK "))[6:])
    assert check["verdicts"] == ["ok", "ok", "ok"]
    assert check["widget"] is True and check["refreshes"] >= 2
    assert "pause    kv_cache" in _stream(nb)

    assert len(_outputs(nb, WIDGET_MIME)) == 1  # the live monitor, as a widget
    figs = _outputs(nb, PLOTLY_MIME)
    assert len(figs) == 4  # timeline, gap, verification table, latency (the summary is a frame)
    timeline = _traces(figs[0])
    phys = timeline[f"physical: RSS of pid {check['pid']} (psutil)"]
    acc = timeline["saver allocated (accounting)"]
    assert _values(acc["y"]).max() == 384  # 128 + 256 MiB, flat through the pauses
    assert np.nanmax(_values(phys["y"])) - np.nanmin(_values(phys["y"])) >= 0.9 * 384
    table = next(f for f in figs if f["data"][0]["type"] == "table")["data"][0]
    header = [h.replace("<b>", "").replace("</b>", "") for h in table["header"]["values"]]
    assert table["cells"]["values"][header.index("verdict")] == ["ok", "ok", "ok"]

    html = " ".join(_outputs(nb, "text/html"))
    assert "RSS of pid" in html and "madvise" in html  # the accounting summary frame
    report = tmp_path / "quickstart-report.html"
    assert report.is_file() and '<table id="environment">' in report.read_text(encoding="utf-8")
    assert (tmp_path / "quickstart.sqlite").is_file()


def test_live_monitor_static_fallback_in_a_real_kernel(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        code("import os, time\n"
             "from collectors import Recorder, Store\n"
             "from collectors.controls.host_saver import HostSaver\n"
             "from collectors.sources.host import HostSource\n"
             "from app.notebook import LiveMonitor\n"
             "store = Store('live.sqlite')\nsaver = HostSaver(store)\n"
             "recorder = Recorder(store, sources=[HostSource(pids=[os.getpid()]), saver.accounting_source()])"
             ".start()\n"
             "monitor = LiveMonitor(recorder, mode='static', interval_s=0.3)\nmonitor"),
        code("saver.allocate('weights', 32 * 2**20)\ntime.sleep(1.5)"),
        code("recorder.stop()\nmonitor.stop()\nsaver.close()"),
    ])
    _execute(nb, tmp_path, monkeypatch)
    first = nb.cells[0].outputs
    assert any("Live widget unavailable" in o.get("data", {}).get("text/html", "") for o in first)
    figs = [o["data"][PLOTLY_MIME] for o in first if PLOTLY_MIME in o.get("data", {})]
    assert len(figs) == 1  # one output, redrawn in place (display_id), not a new one per redraw
    acc = _traces(figs[0])["saver allocated (accounting)"]
    assert _values(acc["y"]).max() == 32  # the redraw after the allocation reached the first cell


def test_live_monitor_widget_follows_a_running_recorder() -> None:
    ok, why = widgets_available()
    if not ok:
        pytest.skip(why)
    store = Store(":memory:")
    saver = HostSaver(store)
    rec = Recorder(store, sources=[HostSource(pids=[os.getpid()]), saver.accounting_source()],
                   intervals={"host": 0.02, "saver": 0.02}).start()
    monitor = LiveMonitor(rec, interval_s=0.1, window_s=30)
    try:
        assert monitor.widget and type(monitor.figure).__name__ == "FigureWidget" and monitor.message is None
        monitor.start()
        saver.allocate("kv_cache", 24 * MiB)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            acc = [t for t in monitor.figure.data if t.name == "saver allocated (accounting)"]
            if acc and np.nanmax(np.asarray(acc[0].y, dtype=float)) == 24:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the widget never showed the allocation ({monitor!r}, {monitor.last_error})")
        widget_before = monitor.figure
        ev = saver.pause(["kv_cache"])
        assert ev.ok
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                "pause kv_cache" in (a.text or "") for a in monitor.figure.layout.annotations):
            time.sleep(0.1)
        assert monitor.figure is widget_before  # updated in place, never replaced
        assert any("pause kv_cache" in (a.text or "") for a in monitor.figure.layout.annotations)
        rec.stop()
        deadline = time.monotonic() + 30
        while monitor.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not monitor.running  # it stops by itself once the recording ends
        assert monitor.errors == 0
    finally:
        rec.stop()
        monitor.stop()
        saver.close()


def test_live_monitor_on_a_finished_store_and_bad_arguments(tmp_path: Path) -> None:
    store = Store(tmp_path / "done.sqlite")
    saver = HostSaver(store)
    with Recorder(store, sources=[saver.accounting_source()], intervals={"saver": 0.02}):
        saver.allocate("weights", 8 * MiB)
        time.sleep(0.3)
    saver.close()
    monitor = LiveMonitor(store, mode="static", window_s=10)
    assert not monitor.widget and "static" in monitor.message
    fig = monitor.refresh()
    acc = [t for t in fig.data if t.name == "saver allocated (accounting)"]
    assert acc and np.nanmax(np.asarray(acc[0].y, dtype=float)) == 8  # window ends at the last sample
    with pytest.raises(ValueError, match="mode"):
        LiveMonitor(store, mode="fancy")
    with pytest.raises(ValueError, match="interval_s"):
        LiveMonitor(store, interval_s=0)
