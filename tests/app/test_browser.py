"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

Starts ``streamlit run app/streamlit_app.py`` on a free local port, reads the planner's step time, changes the
number of nodes and waits for the number to change, and saves a screenshot. Set ``SIMDDP_SCREENSHOT_DIR`` to
also save one screenshot per page there (docs/img was made that way).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app" / "streamlit_app.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PAGES = ["planner", "plan", "timeline", "scaling", "memory", "whatif", "variability", "run", "knobs", "calibration",
         "compare"]

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if not CHROMIUM.exists():
        if os.environ.get("SIMDDP_REQUIRE_BROWSER"):
            pytest.fail("SIMDDP_REQUIRE_BROWSER is set but /usr/bin/chromium is missing (apt-get install chromium)")
        pytest.skip("needs Debian's chromium at /usr/bin/chromium")
    pytest.importorskip("playwright")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start (exit code {proc.poll()})")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_planner_number_changes_in_chromium(server: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1100})
            page.goto(server)
            step = page.get_by_test_id("stMetric").filter(has_text="Step time").get_by_test_id("stMetricValue")
            expect(step).to_have_text(re.compile(r"\d"), timeout=60_000)
            before = step.inner_text()
            nodes = page.get_by_role("spinbutton", name="Number of nodes")
            expect(nodes).to_have_value("16")
            nodes.fill("2")
            start = time.monotonic()
            nodes.press("Enter")
            expect(step).not_to_have_text(before, timeout=30_000)
            planner_s = time.monotonic() - start
            after = step.inner_text()
            assert re.search(r"\d", after) and after != before
            expect(page.get_by_text("on 2 x dgx-h100-80gb")).to_be_visible(timeout=30_000)
            shot = tmp_path / "planner.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            assert page.get_by_test_id("stException").count() == 0

            # A what-if slider: the NIC line rate to its lowest value (25 Gbit/s) in the real browser.
            page.goto(f"{server}/whatif")
            step = page.get_by_test_id("stMetric").filter(has_text="Step time").get_by_test_id("stMetricValue")
            expect(step).to_have_text(re.compile(r"\d"), timeout=60_000)
            before = step.inner_text()
            thumb = page.get_by_role("slider").nth(2)  # bucket cap, nodes, NIC line rate
            thumb.focus()
            start = time.monotonic()
            thumb.press("Home")
            expect(step).not_to_have_text(before, timeout=30_000)
            whatif_s = time.monotonic() - start
            print(f"\nbrowser: planner nodes change {planner_s * 1e3:.0f} ms, what-if slider {whatif_s * 1e3:.0f} ms")
            assert planner_s < 10 and whatif_s < 10  # generous: CI machines vary; docs/dashboard.md has the numbers
        finally:
            browser.close()


def test_run_and_variability_pages_respond_in_chromium(server: str) -> None:
    """The Run page's goodput follows its MTBF input, and the Variability page's p99 follows its jitter slider."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1400})
            page.goto(f"{server}/run")
            goodput = page.get_by_test_id("stMetric").filter(has_text="Goodput").get_by_test_id("stMetricValue")
            expect(goodput).to_have_text(re.compile(r"\d+(\.\d)?%"), timeout=60_000)
            before = goodput.inner_text()
            expect(page.get_by_text("Goodput against the checkpoint interval")).to_be_visible(timeout=60_000)
            mtbf = page.get_by_role("spinbutton", name="MTBF (hours)")
            mtbf.fill("200")
            mtbf.press("Enter")
            expect(goodput).not_to_have_text(before, timeout=30_000)
            assert float(goodput.inner_text().rstrip("%")) < float(before.rstrip("%"))
            assert page.get_by_test_id("stException").count() == 0

            page.goto(f"{server}/variability")
            p99 = page.get_by_test_id("stMetric").filter(has_text="p99 step").get_by_test_id("stMetricValue")
            expect(p99).to_have_text(re.compile(r"\d"), timeout=60_000)
            before = p99.inner_text()
            expect(page.get_by_text("p99 step time against the number of GPUs")).to_be_visible(timeout=60_000)
            slider = page.get_by_role("slider").first  # jitter CV (%)
            slider.focus()
            for _ in range(10):  # 10 x 0.5 points of CV
                slider.press("ArrowRight")
            expect(p99).not_to_have_text(before, timeout=30_000)
            expect(page.get_by_text("Step time over 200 Monte Carlo steps").first).to_be_visible(timeout=30_000)
            assert page.get_by_test_id("stException").count() == 0
        finally:
            browser.close()


def _settle(page) -> None:  # type: ignore[no-untyped-def]
    """Wait for the script run to finish (the status widget shows while it runs) and plotly to draw."""
    from playwright.sync_api import expect

    page.wait_for_timeout(500)
    expect(page.get_by_test_id("stStatusWidget")).to_have_count(0, timeout=60_000)
    page.wait_for_timeout(800)


def test_every_page_renders_in_chromium(server: str, tmp_path: Path) -> None:
    """Each page loads with its charts and no exception; the calibration page takes real uploads.

    With SIMDDP_SCREENSHOT_DIR set, one screenshot per page goes there (docs/img).
    """
    from calibration_data import write_all
    from playwright.sync_api import expect, sync_playwright

    out = Path(os.environ.get("SIMDDP_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    files = write_all(tmp_path)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1800})
            for name in PAGES:
                page.goto(f"{server}/{name}" if name != "planner" else server)
                expect(page.get_by_test_id("stMainBlockContainer").locator("h1").first).to_be_visible(timeout=60_000)
                _settle(page)
                if name == "calibration":
                    uploads = page.get_by_test_id("stFileUploaderDropzoneInput")
                    uploads.nth(0).set_input_files(str(files["profile"]))
                    _settle(page)
                    uploads.nth(1).set_input_files(str(files["ddp"]))
                    expect(page.get_by_test_id("stMetric").filter(has_text="MAPE")).to_be_visible(timeout=60_000)
                    _settle(page)
                if name == "plan":  # search the default model's layouts on one node, in the browser
                    gpus = page.get_by_role("spinbutton", name="GPUs")
                    gpus.fill("8")
                    gpus.press("Enter")
                    _settle(page)
                    page.get_by_role("button", name="Search layouts").click()
                    expect(page.get_by_text("Step time against memory per GPU")).to_be_visible(timeout=180_000)
                    expect(page.get_by_test_id("stMetric").filter(has_text="Layouts evaluated")).to_be_visible()
                    _settle(page)
                if name == "whatif":
                    page.get_by_text("Heatmap", exact=True).click()
                    expect(page.get_by_text("exposed comm (%) over bucket cap")).to_be_visible(timeout=60_000)
                    _settle(page)
                if name == "compare":
                    page.get_by_role("button", name="Add the planner's scenario").click()
                    expect(page.get_by_test_id("stDataFrame").first).to_be_visible(timeout=60_000)
                    _settle(page)
                expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
                assert page.get_by_test_id("stException").count() == 0, f"{name}: exception shown"
                page.screenshot(path=str(out / f"{name}.png"))
        finally:
            browser.close()
