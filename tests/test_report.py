"""The standalone HTML report and ``memsaver demo``: real scenario runs (host saver, and a demo
engine over real HTTP), the report opened and read back, and rendered by a real chromium."""

from __future__ import annotations

import base64
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.report import write_report
from collectors import __version__
from collectors.scenario import run_scenario
from collectors.store import Store

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
WEIGHTS, KV = 16 * MiB, 48 * MiB


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("report")
    path = run_scenario(device="host", weights=WEIGHTS, kv_cache=KV, out_dir=out, settle_s=0.6, narrate=None)
    return path, write_report(path, out / "report.html", title="test report")


def _decode(value: object) -> object:
    """plotly >= 6 writes numeric arrays as {"dtype", "bdata"(base64)}."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return arr.reshape(value["shape"]) if "shape" in value and isinstance(value["shape"], list) else arr
    return value


def plot_data(text: str, div_id: str) -> tuple[list[dict], dict]:
    """The traces and layout that ``Plotly.newPlot`` draws into ``div_id``, read from the HTML."""
    m = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', text)
    assert m, f"no Plotly.newPlot for {div_id}"
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(text, m.end())
    layout, _ = dec.raw_decode(text, text.index("{", end))
    for trace in data:
        for k in ("x", "y"):
            if k in trace and not (isinstance(trace[k], list) and trace[k] and isinstance(trace[k][0], str)):
                trace[k] = np.asarray(_decode(trace[k]), dtype=float)
    return data, layout


def _table(text: str, table_id: str) -> str:
    m = re.search(rf'<table id="{table_id}">(.*?)</table>', text, re.S)
    assert m, f"no table {table_id}"
    return m.group(1)


def test_report_is_standalone(demo: tuple[Path, Path]) -> None:
    _, report = demo
    text = report.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert re.search(r"plotly\.js v\d+\.\d+", text), "plotly.js is not inlined"
    assert not re.search(r'<script[^>]+src="https?://', text), "the report loads something from the network"
    assert text.count("Plotly.newPlot(") == 3


def test_report_contains_the_charts_data(demo: tuple[Path, Path]) -> None:
    path, report = demo
    text = report.read_text(encoding="utf-8")
    data, layout = plot_data(text, "chart-timeline")
    with Store.open(path) as store:
        pid = store.meta()["pid"]
        rss = store.samples(sources=["host"], metrics=["process_used_bytes"])["value"].dropna() / MiB
        events = store.events()
    names = [t.get("name") for t in data]
    phys = data[names.index(f"physical: RSS of pid {pid} (psutil)")]
    acc = data[names.index("saver allocated (accounting)")]
    assert set(np.round(phys["y"], 6)) <= set(np.round(rss, 6))  # drawn values are recorded values
    assert phys["y"].max() == pytest.approx(rss.max()) and phys["y"].min() == pytest.approx(rss.min())
    assert acc["y"].max() == (WEIGHTS + KV) / MiB
    labels = " | ".join(a.get("text", "") for a in layout.get("annotations", []))
    assert "pause kv_cache" in labels and "resume weights, kv_cache" in labels
    gap, _ = plot_data(text, "chart-gap")
    assert np.nanmax(gap[0]["y"]) == pytest.approx((WEIGHTS + KV) / MiB, rel=0.2)
    lat, _ = plot_data(text, "chart-latency")
    pr = events[events.action.isin(["pause", "resume"])]
    assert np.allclose(lat[0]["y"], pr["duration"].to_numpy() * 1e3)


def test_report_verification_story_and_environment(demo: tuple[Path, Path]) -> None:
    path, report = demo
    text = report.read_text(encoding="utf-8")
    ver = _table(text, "verification")
    assert ver.count(">ok</span>") == 3 and "call failed" not in ver
    assert "Pause of kv_cache on host" in text and "(flat, as expected)" in text
    env = _table(text, "environment")
    for item in (platform.node(), f"memsaver-dashboard {__version__}", str(path), "host, saver",
                 "scenario target", "host-saver", "python"):
        assert item in env, item
    devices = _table(text, "devices")
    assert "host memory" in devices and "physical: RSS of pid" in devices
    assert "<th>physical memory measured by</th>" in devices
    assert "released 48.00 MiB" in text or "48.00 MiB" in ver


def test_report_in_a_real_browser(demo: tuple[Path, Path]) -> None:
    """chromium opens the file with no network and draws all three charts without errors."""
    pw = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no chromium at /usr/bin/chromium")
    _, report = demo
    errors: list[str] = []
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("http*://**", lambda route: route.abort())  # prove it needs no network
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                                   timeout=60_000)
            counts = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                                   ".map(gd => gd.data.length)")
            paths = page.evaluate("document.querySelectorAll('#chart-timeline .scatterlayer path.js-line')"
                                  ".length")
        finally:
            browser.close()
    assert errors == []
    assert len(counts) == 3 and all(c > 0 for c in counts)
    assert paths >= 2  # physical and accounting lines were drawn


def test_report_of_a_demo_engine_over_http(tmp_path: Path) -> None:
    from collectors.demo_engine import spawn

    with spawn(weights="16MiB", kv_cache="32MiB", device="host") as engine:
        path = run_scenario(engine=engine.url, out_dir=tmp_path, settle_s=0.6, narrate=None)
        report = write_report(path, tmp_path / "engine.html")
    text = report.read_text(encoding="utf-8")
    ver = _table(text, "verification")
    assert ver.count(">ok</span>") == 3, ver
    assert f"pid {engine.pid}" in ver
    assert engine.url in _table(text, "environment")


def _memsaver(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "collectors", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def test_memsaver_demo_cli_writes_recording_and_report(tmp_path: Path) -> None:
    r = _memsaver("demo", "--device", "host", "--out", str(tmp_path), "--weights", "16MiB",
                  "--kv-cache", "32MiB", "--settle", "0.5s", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "release the KV cache (pause kv_cache)" in r.stdout and "verdicts: 3 ok" in r.stdout
    report = Path(re.search(r"^report: (.+)$", r.stdout, re.M).group(1))
    recording = Path(re.search(r"^recording: (.+)$", r.stdout, re.M).group(1))
    assert report.parent == tmp_path and report.suffix == ".html" and recording.suffix == ".sqlite"
    assert '<table id="environment">' in report.read_text(encoding="utf-8")
    custom = tmp_path / "custom.html"
    r = _memsaver("demo", "--device", "host", "--out", str(tmp_path), "--weights", "4MiB", "--kv-cache",
                  "4MiB", "--settle", "0", "--report", str(custom), "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert custom.is_file() and "allocate" not in r.stdout  # quiet: only the paths
    fresh = tmp_path / "new-dir"  # one missing level is created
    r = _memsaver("demo", "--device", "host", "--out", str(fresh), "--weights", "4MiB", "--kv-cache",
                  "4MiB", "--settle", "0", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(list(fresh.glob("*.sqlite"))) == 1 and len(list(fresh.glob("*.html"))) == 1


@pytest.mark.parametrize("args, code, words", [
    (["--out", "/nonexistent/dir"], 1, "--out /nonexistent/dir: directory does not exist"),
    (["--weights", "12XB"], 2, "invalid size '12XB'"),
    (["--settle=-1s"], 2, "invalid duration"),
    (["--report", "/nonexistent/r.html"], 1, "directory does not exist"),
    (["--engine", "http://127.0.0.1:9"], 1, "cannot be reached"),
    (["--engine", "ftp://x"], 1, "invalid engine URL"),
])
def test_memsaver_demo_cli_errors(tmp_path: Path, args: list[str], code: int, words: str) -> None:
    r = _memsaver("demo", "--device", "host", "--out", str(tmp_path), *args, cwd=tmp_path)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("memsaver demo: error:") and words in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing recorded, nothing written


def test_demo_on_a_missing_gpu_says_why(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _memsaver("demo", "--device", "cuda", "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("memsaver demo: error: --device cuda: ") and "no cuda device" in r.stderr
    assert list(tmp_path.iterdir()) == []
