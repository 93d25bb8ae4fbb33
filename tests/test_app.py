"""The Streamlit app, driven through Streamlit's AppTest: real pages, real host saver (mmap +
madvise), real recorder threads, a real demo engine over HTTP on 127.0.0.1. Assertions are on
what the page shows: messages, button states, metric tiles, chart annotations, tables.

No fixed sleeps as assertions: values that depend on the recorder are polled with a deadline.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import streamlit as st
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from app.live_target import validate_engine_url
from app.state import REMOTE_CONTROL_ENV
from collectors.units import MiB
from tests.helpers.apptest import metric_bytes, metric_value, rerun_until

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "main.py"
RUN_TIMEOUT = 120  # seconds per script run: generous, other test suites share the 2 cores
KV_CACHE = 512 * MiB  # the demo tag the tests pause


# -- fixtures and helpers ------------------------------------------------------------------------
@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[AppTest]:
    """A fresh app: no cached targets (clearing closes them, freeing the saver's memory),
    bound to 127.0.0.1 as .streamlit/config.toml says, recordings listed from a temp dir."""
    old_address = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    monkeypatch.setenv("MEMSAVER_RECORDINGS_DIR", str(tmp_path / "recordings"))
    monkeypatch.delenv(REMOTE_CONTROL_ENV, raising=False)
    st.cache_resource.clear()
    at = AppTest.from_file(str(MAIN), default_timeout=RUN_TIMEOUT)
    try:
        yield at
    finally:
        st.cache_resource.clear()
        st_config.set_option("server.address", old_address)


def messages(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in getattr(at, kind)]


def chart_annotations(at: AppTest) -> list[str]:
    """Text of every annotation on the page's Plotly charts (event labels live there)."""
    out = []
    for el in at.get("plotly_chart"):
        fig = json.loads(el.proto.spec)
        out += [a.get("text", "") for a in fig["layout"].get("annotations", [])]
    return out


def allocate_demo(at: AppTest) -> None:
    at.button(key="allocate_demo").click().run()
    assert not at.exception, at.exception
    assert any("Allocated weights 256.00 MiB, kv_cache 512.00 MiB" in m for m in messages(at, "success"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the URL check (pure) --------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("  https://gpu-node.example:8443/ ", "https://gpu-node.example:8443"),
    ("http://[::1]:30000", "http://[::1]:30000"),
])
def test_engine_url_accepts_scheme_host_port(text: str, expected: str) -> None:
    assert validate_engine_url(text) == expected


@pytest.mark.parametrize("text, says", [
    ("", "enter the engine's URL"),
    ("127.0.0.1:30000", "must start with http:// or https://"),
    ("ftp://127.0.0.1:30000", "must start with http:// or https://"),
    ("http://:30000", "has no host"),
    ("http://127.0.0.1", "add the port"),
    ("http://127.0.0.1:99999", "not a valid URL"),
    ("http://127.0.0.1:abc", "not a valid URL"),
    ("http://127.0.0.1:0", "port 0"),
    ("http://127.0.0.1:30000/generate", "no path"),
    ("http://user:pw@127.0.0.1:30000", "credentials"),
])
def test_engine_url_rejects_with_a_clear_message(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        validate_engine_url(text)


# -- page flows ------------------------------------------------------------------------------------
def test_first_screen_runs_the_host_saver_demo(app: AppTest) -> None:
    at = app.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "GPU memory released — measured"
    assert at.radio(key="target_choice").options[0] == "This process — host saver (embedded default)"
    assert any("madvise(MADV_DONTNEED)" in m for m in messages(at, "info"))
    demo = at.button(key="allocate_demo")
    assert "weights 256.00 MiB, kv_cache 512.00 MiB" in demo.label and not demo.disabled
    # Nothing to pause or resume yet: both "all" buttons are disabled.
    assert at.button(key="pause_all").disabled and at.button(key="resume_all").disabled
    assert at.button(key="recording_stop").disabled and not at.button(key="recording_start").disabled
    assert [b.label for b in at.download_button] == \
        ["CSV (.zip)", "Parquet (.zip)", "Chart (standalone HTML)"]


def test_allocate_pause_resume_physical_drops_accounting_stays(app: AppTest) -> None:
    at = app.run()
    allocate_demo(at)
    assert not at.button(key="pause_kv_cache").disabled and at.button(key="resume_kv_cache").disabled
    rerun_until(at, lambda a: metric_value(a, "Accounting") == "768.00 MiB"
                and metric_bytes(a, "Physical") is not None, what="768 MiB accounted")
    resident = metric_bytes(at, "Physical")
    assert resident is not None and resident > 768 * MiB  # the tags are resident, plus the interpreter

    at.button(key="pause_kv_cache").click().run()
    assert any(m.startswith("Pause kv_cache: done") for m in messages(at, "success")), messages(at, "error")
    assert at.button(key="pause_kv_cache").disabled and not at.button(key="resume_kv_cache").disabled
    assert not at.button(key="pause_weights").disabled  # the other tag is untouched
    assert any("**paused**" in m for m in (x.value for x in at.markdown))

    # Physical drops by (about) the 512 MiB released; the accounting does not move.
    rerun_until(at, lambda a: (p := metric_bytes(a, "Physical")) is not None and p < resident - 400 * MiB,
                what="physical drop after pause")
    assert metric_value(at, "Accounting") == "768.00 MiB"
    released = metric_bytes(at, "Released")
    assert released is not None and 400 * MiB < released < 600 * MiB
    sentence = [m.value for m in at.markdown if m.value.startswith("#### the saver says 768.00 MiB")]
    assert sentence and "the process holds" in sentence[0] and "released" in sentence[0]

    # The click is an event on the chart, and the verification table judges it.
    rerun_until(at, lambda a: any(t.startswith("pause kv_cache") and t.endswith("ok")
                                  for t in chart_annotations(a)), what="pause event with verdict ok")
    table = at.dataframe[0].value
    row = table[(table["action"] == "pause") & (table["tags"] == "kv_cache")].iloc[0]
    assert "ok" in row["verdict"] and row["measured by"] == "host/process_used_bytes"

    at.button(key="resume_kv_cache").click().run()
    assert any(m.startswith("Resume kv_cache: done") for m in messages(at, "success"))
    assert not at.button(key="pause_kv_cache").disabled and at.button(key="resume_kv_cache").disabled
    paused_level = resident - 400 * MiB
    rerun_until(at, lambda a: (p := metric_bytes(a, "Physical")) is not None and p > paused_level + 300 * MiB,
                what="physical back up after resume")
    assert metric_value(at, "Accounting") == "768.00 MiB"
    rerun_until(at, lambda a: any(t.startswith("resume kv_cache") for t in chart_annotations(a)),
                what="resume event on the chart")
    notes = chart_annotations(at)
    assert any(t.startswith("allocate weights") for t in notes) and \
        any(t.startswith("allocate kv_cache") for t in notes)


def test_pause_all_and_resume_all_follow_the_state(app: AppTest) -> None:
    at = app.run()
    allocate_demo(at)
    assert not at.button(key="pause_all").disabled and at.button(key="resume_all").disabled
    at.button(key="pause_all").click().run()
    assert any(m.startswith("Pause all tags: done") for m in messages(at, "success"))
    assert at.button(key="pause_all").disabled and not at.button(key="resume_all").disabled
    assert at.button(key="pause_weights").disabled and at.button(key="pause_kv_cache").disabled
    at.button(key="resume_all").click().run()
    assert any(m.startswith("Resume all tags: done") for m in messages(at, "success"))
    assert not at.button(key="pause_all").disabled and at.button(key="resume_all").disabled


def test_bad_input_shows_an_error_and_changes_nothing(app: AppTest) -> None:
    at = app.run()
    at.text_input(key="alloc_tag").set_value("bad tag!")
    at.button(key="allocate_custom").click().run()
    assert any("invalid tag name 'bad tag!'" in m for m in messages(at, "error")), messages(at, "error")
    assert not any(b.key and b.key.startswith("pause_") and b.key != "pause_all" for b in at.button)

    allocate_demo(at)
    at.text_input(key="alloc_tag").set_value("weights")
    at.number_input(key="alloc_mib").set_value(64)
    at.button(key="allocate_custom").click().run()
    assert any("'weights' is already allocated" in m for m in messages(at, "error")), messages(at, "error")
    assert "`weights` · 256.00 MiB" in [m.value for m in at.markdown]

    at.button(key="free_weights").click().run()
    assert any(m == "Freed weights." for m in messages(at, "success"))
    assert "`weights` · 256.00 MiB" not in [m.value for m in at.markdown]
    rerun_until(at, lambda a: metric_value(a, "Accounting") == "512.00 MiB", what="accounting after free")


def test_engine_url_errors_are_shown_before_any_request(app: AppTest) -> None:
    at = app.run()
    at.radio(key="target_choice").set_value("engine").run()
    assert any("Enter the engine's URL" in m for m in messages(at, "info"))
    for text, says in [("ftp://127.0.0.1:30000", "must start with http:// or https://"),
                       ("http://127.0.0.1", "add the port"),
                       ("http://127.0.0.1:99999", "not a valid URL")]:
        at.text_input(key="engine_url").set_value(text)
        at.button(key="engine_connect").click().run()
        assert any(says in m for m in messages(at, "error")), (text, messages(at, "error"))
        assert not at.get("plotly_chart")  # nothing connected, no charts
        assert not any(b.key == "pause_all" for b in at.button)


def test_unreachable_engine_says_so(app: AppTest) -> None:
    at = app.run()
    at.radio(key="target_choice").set_value("engine").run()
    at.text_input(key="engine_url").set_value(f"http://127.0.0.1:{free_port()}")
    at.button(key="engine_connect").click().run()
    errors = messages(at, "error")
    assert any("cannot reach" in m and "is it running?" in m for m in errors), errors
    assert not any(b.key == "pause_all" for b in at.button)


def test_demo_engine_pause_and_the_engines_own_refusal(app: AppTest) -> None:
    from collectors.demo_engine import spawn

    with spawn(weights="32MiB", kv_cache="96MiB") as engine:
        at = app.run()
        at.radio(key="target_choice").set_value("engine").run()
        at.text_input(key="engine_url").set_value(engine.url + "/")
        at.button(key="engine_connect").click().run()
        assert not at.exception, at.exception
        assert any("POST /release_memory_occupation" in m for m in messages(at, "info"))
        markdown = [m.value for m in at.markdown]
        assert "`weights` · 32.00 MiB" in markdown and "`kv_cache` · 96.00 MiB" in markdown
        assert not any(b.key == "allocate_demo" for b in at.button)  # an engine allocates its own

        at.button(key="pause_kv_cache").click().run()
        assert any(m.startswith("Pause kv_cache: done") for m in messages(at, "success")), \
            messages(at, "error")
        assert not at.button(key="resume_kv_cache").disabled
        status = httpx.get(engine.url + "/memsaver/status", timeout=10).json()
        assert status["tags"]["kv_cache"]["paused"] is True
        # The engine's RSS is the physical line (it runs here, pid from its status).
        rerun_until(at, lambda a: metric_bytes(a, f"Physical — RSS of pid {engine.pid}"), what="engine RSS")

        # A busy engine refuses: its own message reaches the page, nothing changes.
        httpx.post(engine.url + "/memsaver/busy", json={"seconds": 120}, timeout=10).raise_for_status()
        at.button(key="resume_kv_cache").click().run()
        errors = messages(at, "error")
        assert any(m.startswith("Resume kv_cache failed: engine refused:") and "no ongoing request" in m
                   for m in errors), errors
        assert not at.button(key="resume_kv_cache").disabled  # still paused
        rerun_until(at, lambda a: any(t.startswith("resume kv_cache · FAILED: engine refused")
                                      for t in chart_annotations(a)), what="failed resume on the chart")


def test_engine_without_status_offers_sglangs_tags(app: AppTest) -> None:
    """A real SGLang server has no status endpoint: its usual tags are offered, sizes unknown."""
    from collectors.demo_engine import spawn

    with spawn(weights="16MiB", kv_cache="32MiB", status=False) as engine:
        at = app.run()
        at.radio(key="target_choice").set_value("engine").run()
        at.text_input(key="engine_url").set_value(engine.url)
        at.button(key="engine_connect").click().run()
        assert not at.exception, at.exception
        markdown = [m.value for m in at.markdown]
        for tag in ("weights", "kv_cache", "cuda_graph"):
            assert f"`{tag}` · size not reported" in markdown
        at.button(key="pause_kv_cache").click().run()
        assert any(m.startswith("Pause kv_cache: done") for m in messages(at, "success")), \
            messages(at, "error")
        assert at.button(key="pause_kv_cache").disabled and not at.button(key="resume_kv_cache").disabled
        # "Resume all" sends no tags (SGLang: every tag); the client forgets what it released.
        at.button(key="resume_all").click().run()
        assert any(m.startswith("Resume all tags: done") for m in messages(at, "success")), \
            messages(at, "error")
        assert not at.button(key="pause_kv_cache").disabled


def test_record_to_file_then_replay_it(app: AppTest, tmp_path: Path) -> None:
    path = tmp_path / "recordings" / "demo.sqlite"
    at = app.run()
    allocate_demo(at)
    at.text_input(key="recording_name").set_value(str(path))
    at.button(key="recording_start").click().run()
    assert any(m == f"Recording to {path}." for m in messages(at, "success")), messages(at, "error")
    assert at.button(key="recording_start").disabled and not at.button(key="recording_stop").disabled
    at.button(key="pause_kv_cache").click().run()
    # Wait for the verdict live (enough samples after the pause), then stop.
    rerun_until(at, lambda a: any(t.startswith("pause kv_cache") and t.endswith("ok")
                                  for t in chart_annotations(a)), what="pause verdict")
    at.button(key="recording_stop").click().run()
    assert any(m.startswith(f"Saved {path}.") for m in messages(at, "success"))
    assert path.is_file()

    at.switch_page("views/recordings.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="rec_listed").value == path  # listed from MEMSAVER_RECORDINGS_DIR
    assert metric_value(at, "Events") == "1"  # the pause (the allocations were before the file)
    assert metric_value(at, "Accounting") == "768.00 MiB"
    table = at.dataframe[0].value
    assert list(table["action"]) == ["pause"] and "ok" in table["verdict"].iloc[0]
    assert any(t.startswith("pause kv_cache") for t in chart_annotations(at))
    assert [b.label for b in at.download_button] == \
        ["CSV (.zip)", "Parquet (.zip)", "Chart (standalone HTML)", "Recording (.sqlite)"]


def test_recording_needs_a_new_sqlite_file(app: AppTest, tmp_path: Path) -> None:
    at = app.run()
    at.text_input(key="recording_name").set_value(str(tmp_path / "run.txt"))
    at.button(key="recording_start").click().run()
    assert any("Cannot start recording" in m and "use a .sqlite file name" in m
               for m in messages(at, "error")), messages(at, "error")
    taken = tmp_path / "taken.sqlite"
    taken.write_bytes(b"")
    at.text_input(key="recording_name").set_value(str(taken))
    at.button(key="recording_start").click().run()
    assert any("exists already" in m for m in messages(at, "error")), messages(at, "error")
    assert not at.button(key="recording_start").disabled and at.button(key="recording_stop").disabled


def test_downloads_are_real_csv_parquet_and_html(tmp_path: Path) -> None:
    """What the download buttons hand out (generated on click, so built here directly)."""
    import io
    import zipfile

    import pandas as pd

    from app.sections import export_zip, html_report
    from collectors.controls.host_saver import HostSaver
    from collectors.model import Sample
    from collectors.store import Store

    store = Store(tmp_path / "rec.sqlite")
    store.add_samples([Sample(100.0 + i, "host", "host", "process_used_bytes", (900 - 500 * (i > 2)) * MiB, 7)
                       for i in range(6)])
    saver = HostSaver(store)
    saver.allocate("kv_cache", 4 * MiB)
    saver.pause(["kv_cache"])
    saver.close()
    for fmt, read in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        with zipfile.ZipFile(io.BytesIO(export_zip(store, fmt))) as zf:
            assert sorted(zf.namelist()) == sorted([f"samples.events.{fmt}", f"samples.{fmt}"])
            samples = read(io.BytesIO(zf.read(f"samples.{fmt}")))
            events = read(io.BytesIO(zf.read(f"samples.events.{fmt}")))
        assert len(samples) == 6 and samples["value"].min() == 400 * MiB
        assert list(events["action"]) == ["allocate", "pause"]
    html = html_report(store, "a title").decode()
    assert "a title" in html and "plotly" in html.lower() and len(html) > 100_000  # plotly.js inlined


def test_replay_rejects_a_file_that_is_not_a_recording(app: AppTest, tmp_path: Path) -> None:
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database\n" * 100)
    at = app.run()
    at.switch_page("views/recordings.py").run()
    assert any("No recordings in" in m for m in messages(at, "info"))
    at.radio(key="rec_how").set_value("path").run()
    at.text_input(key="rec_path").set_value(str(bogus)).run()
    assert any(str(bogus) in m and "not a memsaver recording" in m for m in messages(at, "error")), \
        messages(at, "error")
    at.text_input(key="rec_path").set_value(str(tmp_path / "missing.sqlite")).run()
    assert any("no such recording" in m or "No such file" in m for m in messages(at, "error")), \
        messages(at, "error")


def test_exposed_server_keeps_controls_disabled(app: AppTest) -> None:
    st_config.set_option("server.address", "0.0.0.0")
    at = app.run()
    assert any("Controls are disabled" in m and REMOTE_CONTROL_ENV in m for m in messages(at, "warning"))
    assert at.button(key="allocate_demo").disabled and at.button(key="allocate_custom").disabled


def test_about_page_explains_and_lists_sources(app: AppTest) -> None:
    at = app.run()
    at.switch_page("views/about.py").run()
    assert not at.exception, at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "127.0.0.1" in text and "MEMSAVER_ALLOW_REMOTE_CONTROL" in text and "Sysman" in text
    assert any("Controls enabled" in m for m in messages(at, "success"))
    sources = at.dataframe[0].value
    host = sources[sources["source"] == "host"].iloc[0]
    assert bool(host["available"]) and "host" in host["devices"]


def test_an_action_repeated_for_one_click_finds_nothing_to_do() -> None:
    """The rule behind the enabled buttons, checked again inside the action lock: a callback run
    a second time for one click (seen in a real browser) must not act or report a failure."""
    from app.live_target import LiveTarget, TargetSpec

    target = LiveTarget.build(TargetSpec("host"))
    try:
        with target.acting() as held:
            assert held == {} and target.would_act("allocate_demo", None, held)
            for tag, size in {"weights": 4 * MiB, "kv_cache": 8 * MiB}.items():
                assert target.allocate(tag, size).ok
        with target.acting() as held:
            assert not target.would_act("allocate_demo", None, held)  # the demo tags exist
            assert target.would_act("pause", ["kv_cache"], held)
            assert not target.would_act("resume", ["kv_cache"], held)
            assert target.would_act("pause", None, held) and not target.would_act("resume", None, held)
        assert target.pause(["kv_cache"]).ok
        with target.acting() as held:
            assert not target.would_act("pause", ["kv_cache"], held)  # a second run: nothing to do
            assert target.would_act("resume", ["kv_cache"], held)
            assert target.would_act("pause", None, held)  # weights is still resident
            assert target.would_act("free", ["kv_cache"], held)
            assert not target.would_act("free", ["nope"], held)
        assert target.would_act("pause", ["kv_cache"], None)  # state unknown: act, let it report
    finally:
        target.close()
