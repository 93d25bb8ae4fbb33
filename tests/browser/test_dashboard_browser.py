"""A real browser against a real server: ``streamlit run app/main.py`` as a child process on a free
port of 127.0.0.1, Debian's chromium driven by Playwright. Click Pause on a tag and read, from the
page itself, the physical value drop while the accounting value stays; save screenshots to
test-artifacts/ (git-ignored; CI keeps them as artifacts).

Needs: apt chromium (at /usr/bin/chromium), pip playwright (no `playwright install`: the system
chromium is used).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.units import MiB, parse_bytes
from tests.browser.server import CHROMIUM, CHROMIUM_ARGS, ROOT, full_screenshot, serve_dashboard

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts"
TIMEOUT_MS = 90_000  # generous: the machine is shared with other test suites

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not found (apt-get install chromium)", allow_module_level=True)
# Not importorskip: where chromium is installed (CI) a missing playwright is a failure, not a skip.
from playwright import sync_api  # noqa: E402


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[str]:
    """The dashboard served by a real `streamlit run`, until the test ends."""
    with serve_dashboard({"MEMSAVER_RECORDINGS_DIR": str(tmp_path / "recordings")}) as url:
        yield url


def _metric(page, label_prefix: str) -> str:  # noqa: ANN001 - playwright Page
    tile = page.locator('[data-testid="stMetric"]', has_text=label_prefix).first
    return tile.locator('[data-testid="stMetricValue"]').inner_text(timeout=TIMEOUT_MS).strip()


def _bytes(text: str) -> int | None:
    return None if text in ("n/a", "none", "") else parse_bytes(text, allow_zero=True)


def _poll(page, pred, what: str, timeout_s: float = 90.0):  # noqa: ANN001
    """Read the page until pred() holds; the live fragment refreshes every second."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = pred()
        except (ValueError, sync_api.Error):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            shot = ARTIFACTS / f"failed-{re.sub(r'[^a-z]+', '-', what)}.png"
            page.screenshot(path=str(shot), full_page=True)
            pytest.fail(f"{what}: not shown within {timeout_s} s (screenshot {shot})")
        page.wait_for_timeout(250)


def _screenshot(page, name: str) -> None:  # noqa: ANN001
    full_screenshot(page, ARTIFACTS / name)


def test_pause_in_the_browser_drops_physical_keeps_accounting(dashboard: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(dashboard)
            page.get_by_text("GPU memory released — measured").wait_for()
            page.get_by_text("This process — host saver (embedded default)").first.wait_for()

            allocate = page.get_by_role("button", name=re.compile(r"Allocate demo tags"))
            allocate.click()
            # A click that lands while the first script run is still rendering can be dropped:
            # if nothing happened for 20 s and the button is still enabled, click once more.
            try:
                page.get_by_text("Now pause a tag.").wait_for(timeout=20_000)
            except sync_api.TimeoutError:
                _screenshot(page, "allocate-no-answer-after-20s.png")  # for diagnosis
                if allocate.is_enabled():
                    allocate.click()
                page.get_by_text("Now pause a tag.").wait_for()
            pause = page.locator(".st-key-pause_kv_cache button")
            resume = page.locator(".st-key-resume_kv_cache button")
            assert pause.is_enabled() and resume.is_disabled()

            _poll(page, lambda: _metric(page, "Accounting") == "768.00 MiB"
                  and _bytes(_metric(page, "Physical")), "768 MiB allocated")
            before = _bytes(_metric(page, "Physical"))
            assert before is not None and before > 768 * MiB
            _screenshot(page, "dashboard-allocated.png")

            pause.click()
            page.get_by_text(re.compile(r"Pause kv_cache: done in \d+ ms")).wait_for()
            after = _poll(page, lambda: (v := _bytes(_metric(page, "Physical"))) is not None
                          and v < before - 400 * MiB and v, "physical drop after pause")
            assert _metric(page, "Accounting") == "768.00 MiB"  # the accounting did not move
            released = _bytes(_metric(page, "Released"))
            assert released is not None and released > 400 * MiB
            assert resume.is_enabled() and pause.is_disabled()
            # Let the verification settle, so the screenshot shows the verdict too.
            _poll(page, lambda: page.get_by_text(re.compile(r"released .* of 512\.00 MiB")).count(),
                  "verification row")
            _screenshot(page, "dashboard-paused.png")
            print(f"physical before {before / MiB:.1f} MiB, after pause {after / MiB:.1f} MiB; "
                  f"accounting 768.00 MiB; released {released / MiB:.1f} MiB")
        finally:
            browser.close()

