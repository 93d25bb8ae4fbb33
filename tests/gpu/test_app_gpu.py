"""The dashboard driving real torch_memory_saver on a CUDA GPU, through Streamlit's AppTest
(headless chromium is not available on the GPU machine): allocate the demo tags, pause
kv_cache, and read from the page NVML's physical value drop while torch's accounting stays.

The run is also recorded to a file (plus a standalone HTML report) under $MEMSAVER_GPU_ARTIFACTS
(default test-artifacts/), so it can be replayed — and screenshotted in a browser — on a machine
without a GPU: tests/browser/replay_screenshot.py RECORDING OUT.png.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch_memory_saver", reason="torch_memory_saver is not installed")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import streamlit as st  # noqa: E402
from streamlit import config as st_config  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from app.report import write_report  # noqa: E402
from collectors.store import Store  # noqa: E402
from collectors.units import GiB  # noqa: E402
from tests.helpers.apptest import metric, metric_bytes, rerun_until  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("MEMSAVER_GPU_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture
def app() -> Iterator[AppTest]:
    old = st_config.get_option("server.address")
    st_config.set_option("server.address", "127.0.0.1")
    st.cache_resource.clear()
    try:
        yield AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    finally:
        st.cache_resource.clear()  # closes the workload: frees the tensors
        st_config.set_option("server.address", old)


# The GPU run's first script run starts CUDA and TMS: allow longer than on the host.
rerun_until = functools.partial(rerun_until, timeout=120.0, interval=0.25)


def test_app_drives_tms_on_cuda(app: AppTest) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    recording = ARTIFACTS / f"gpu-app-{time.strftime('%Y%m%d-%H%M%S')}.sqlite"
    at = app.run()
    assert not at.exception, at.exception
    assert at.radio(key="target_choice").options[0] == "This process — torch_memory_saver on cuda:0"
    assert any("torch_memory_saver" in m.value and "NVML" in m.value for m in at.info)

    at.text_input(key="recording_name").set_value(str(recording))
    at.button(key="recording_start").click().run()
    at.button(key="allocate_demo").click().run()
    assert any("Allocated weights 2.00 GiB, kv_cache 4.00 GiB" in m.value for m in at.success), \
        [m.value for m in at.error]

    # Tiles for cuda:0: torch's accounting and NVML's physical used.
    rerun_until(at, lambda a: (v := metric_bytes(a, "Accounting")) is not None and v >= 6 * GiB,
                "torch accounting of the 6 GiB")
    acc_label, acc_before = metric(at, "Accounting")
    phys_label, _ = metric(at, "Physical")
    assert acc_label == "Accounting — torch says" and "NVML" in phys_label, (acc_label, phys_label)
    time.sleep(1.0)  # a settled 'before' for the figures printed below (not an assertion)
    at.run()
    phys_before = metric_bytes(at, "Physical")
    assert phys_before is not None

    at.button(key="pause_kv_cache").click().run()
    assert any(m.value.startswith("Pause kv_cache: done") for m in at.success), [m.value for m in at.error]
    phys_paused = rerun_until(
        at, lambda a: (v := metric_bytes(a, "Physical")) is not None and v < phys_before - 3.5 * GiB and v,
        "NVML drop after pausing 4 GiB")
    assert metric(at, "Accounting")[1] == acc_before  # torch's accounting did not move
    released = metric_bytes(at, "Released")
    sentence = next(m.value for m in at.markdown if m.value.startswith("#### torch says"))
    rerun_until(at, lambda a: len(a.dataframe) and "ok" in set(a.dataframe[0].value["verdict"]),
                "verification verdict ok")
    verification = at.dataframe[0].value

    at.button(key="resume_kv_cache").click().run()
    assert any(m.value.startswith("Resume kv_cache: done") for m in at.success), [m.value for m in at.error]
    phys_resumed = rerun_until(
        at, lambda a: (v := metric_bytes(a, "Physical")) is not None and v > phys_paused + 3.5 * GiB and v,
        "NVML back up after resume")
    rerun_until(at, lambda a: len(a.dataframe[0].value) >= 2, "resume verified")
    at.button(key="recording_stop").click().run()
    assert recording.is_file()

    with Store.open(recording) as store:
        events = store.events()
        assert {"pause", "resume"} <= set(events["action"])
        write_report(store, recording.with_suffix(".html"), title="memsaver dashboard on an H200 (AppTest)")
    figures = {
        "device": torch.cuda.get_device_name(0),
        "accounting_label": acc_label, "accounting": acc_before,
        "physical_label": phys_label,
        "physical_before_gib": phys_before / GiB, "physical_paused_gib": phys_paused / GiB,
        "physical_resumed_gib": phys_resumed / GiB,
        "released_gib": None if released is None else released / GiB,
        "sentence": sentence.removeprefix("#### "),
        "verification": at.dataframe[0].value.to_dict(orient="records"),
        "verification_at_pause": verification.to_dict(orient="records"),
        "recording": str(recording),
    }
    (ARTIFACTS / "gpu-app-figures.json").write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps(figures, indent=2, default=str))
