"""The HTML report in a real browser (headless Chromium through selenium), opened from
file://: no console errors, nothing fetched, one grid cell per case, filters hide what
they should, a click shows the case, and markup in a message stays text.

Skips, with the reason, where selenium, chromium or chromedriver is missing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.script import render_script
from repro import reports
from tests.conftest import REPO
from tests.test_reports import CRASH_CASE, FIXTURE, HOSTILE, planted, with_regression

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT = REPO / "artifacts" / "report.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1600,1000")
# Installed before the page's own scripts: an alert from injected markup is recorded, not shown.
RECORD_ALERTS = "window.__alerts = []; window.alert = (m) => { window.__alerts.push(String(m)); };"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            pytest.skip(f"{path} is missing (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="repro-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_ALERTS})
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    return with_regression(planted(json.loads((FIXTURE / "run.json").read_text())))


@pytest.fixture
def page(driver: Any, run: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "report.html"
    path.write_text(reports.render(run, "html"), encoding="utf-8")
    driver.get(path.as_uri())
    return driver


def cells(driver: Any) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    return {c.get_attribute("title"): c for c in driver.find_elements(By.CSS_SELECTOR, "#case-grid .cell")}


def visible(driver: Any) -> set[str]:
    return {title for title, cell in cells(driver).items() if cell.is_displayed()}


def choose(driver: Any, name: str, text: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", f"filter-{name}")).select_by_visible_text(text)


def test_loads_clean_from_file_url(page: Any) -> None:
    assert page.execute_script("return window.__alerts") == [], "markup from the run data ran a script"
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0, "fetched something"
    errors = [entry for entry in page.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors


def test_one_cell_per_case(page: Any, run: dict[str, Any]) -> None:
    case_ids = {r["case_id"] for r in run["results"]}
    found = page.find_elements("css selector", "#case-grid .cell")
    assert len(found) == len(case_ids)
    assert set(cells(page)) == case_ids
    stripes = page.find_elements("css selector", f"#case-grid .cell[title='{CRASH_CASE}'] .seg")
    assert [s.get_attribute("class") for s in stripes] == ["seg o-crash", "seg o-crash", "seg o-pass", "seg o-pass"]
    assert "bad" in cells(page)[CRASH_CASE].get_attribute("class")  # the planted regression


def test_filters_hide_cells(page: Any, run: dict[str, Any]) -> None:
    everything = {r["case_id"] for r in run["results"]}
    assert visible(page) == everything
    choose(page, "input", "non_leaf")
    assert visible(page) == {c for c in everything if "-non_leaf-" in c}
    choose(page, "input", "any")
    choose(page, "target", "te-2.13.0")
    choose(page, "outcome", "crash")
    crashed = {r["case_id"] for r in run["results"] if r["target"] == "te-2.13.0" and r["outcome"] == "crash"}
    assert visible(page) == crashed and 0 < len(crashed) < len(everything)
    stripes = page.find_elements("css selector", f"#case-grid .cell[title='{CRASH_CASE}'] .seg")
    assert [s.is_displayed() for s in stripes] == [True, False, False, False]  # only the chosen target's
    choose(page, "target", "any")
    choose(page, "outcome", "any")
    choose(page, "verdict", "needs attention")
    assert visible(page) == {CRASH_CASE}
    assert page.find_element("css selector", "#filters .count").text == f"1 of {len(everything)} cases shown"


def test_click_shows_case_details_and_markup_stays_text(page: Any) -> None:
    cells(page)[CRASH_CASE].click()
    details = page.find_element("id", "details")
    assert details.find_element("css selector", ".case-id").text == CRASH_CASE
    sections = {s.get_attribute("data-target"): s for s in details.find_elements("css selector", ".target-detail")}
    assert list(sections) == ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"]
    crash = sections["te-2.13.0"]
    assert "outcome crash, verdict reproduced" in crash.find_element("css selector", ".outcome").text
    assert crash.find_element("css selector", ".error-message").text == HOSTILE  # shown as text, every character
    assert crash.find_element("css selector", ".error-head").text.startswith(
        "error: RuntimeError at transformer_engine/pytorch/ops/fuser.py:")
    assert "Traceback (most recent call last)" in crash.find_element(
        "css selector", ".traceback pre").get_attribute("textContent")
    assert HOSTILE in crash.find_element("css selector", ".detail-lines").text
    regression = sections["te-2.13.0+backport"]
    assert regression.find_element("css selector", ".verdict-bad").text == "regression"
    for target, section in sections.items():
        script = section.find_element("css selector", ".script-text").get_attribute("textContent")
        assert script == render_script(CRASH_CASE, target)  # the browser fills the template as Python does
    # The message's markup made no element and ran nothing.
    assert page.execute_script("return document.scripts.length") == 2
    assert page.execute_script("return document.querySelectorAll('img').length") == 0
    assert page.execute_script("return window.__alerts") == []
    assert [e for e in page.get_log("browser") if e["level"] == "SEVERE"] == []
    crash.find_element("css selector", ".traceback summary").click()
    page.execute_script("document.getElementById('case-grid-heading').scrollIntoView()")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert page.save_screenshot(str(SCREENSHOT))
