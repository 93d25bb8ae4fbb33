"""Screenshot the Recordings page replaying a recording, in Debian's chromium.

For recordings made where no browser runs (the GPU machine):

    python tests/browser/replay_screenshot.py test-artifacts/gpu-app-*.sqlite test-artifacts/gpu-replay.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.browser.server import CHROMIUM, CHROMIUM_ARGS, full_screenshot, serve_dashboard  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recording", type=Path)
    p.add_argument("out", type=Path, help="PNG to write")
    args = p.parse_args(argv)
    if not args.recording.is_file():
        print(f"replay_screenshot: error: {args.recording}: no such file", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="memsaver-replay-") as tmp:
        # The Recordings page lists MEMSAVER_RECORDINGS_DIR, newest first: a dir with only this file.
        shutil.copy2(args.recording, Path(tmp) / args.recording.name)
        with serve_dashboard({"MEMSAVER_RECORDINGS_DIR": tmp}) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                page.set_default_timeout(120_000)
                page.goto(f"{url}/recordings")
                page.get_by_text("Did it really release?").wait_for()
                args.out.parent.mkdir(parents=True, exist_ok=True)
                full_screenshot(page, args.out)
                values = page.locator('[data-testid="stMetric"]').all_inner_texts()
            finally:
                browser.close()
    print(f"wrote {args.out}")
    for v in values:
        print(" | ".join(line for line in v.splitlines() if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
