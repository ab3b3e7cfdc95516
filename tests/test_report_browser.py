"""The HTML report in a real browser (headless Chromium through selenium), opened from
file://: no console errors, nothing fetched, one grid cell per combination that ran,
coloured by verdict, one tab stop with arrow keys, accessible names with outcome and
verdict, banner links into the filters, the details beside the grid at 1024 and 1600 px
and under it on a narrow screen, and markup in a message stays text.

Screenshots go to artifacts/report-<width>.png. Skips, with the reason, where selenium,
chromium or chromedriver is missing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro import formats
from tests.conftest import REPO
from tests.test_reports import CRASH_CASE, FIXTURE, HOSTILE, TARGETS, planted, with_regression

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = REPO / "artifacts"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1600,1000")
# Installed before the page's own scripts: an alert from injected markup is recorded, not shown.
RECORD_ALERTS = "window.__alerts = []; window.alert = (m) => { window.__alerts.push(String(m)); };"
CRASH_CELL = "fused_residual_rmsnorm, non_leaf; no_grad, none"


def screenshot(browser: Any, name: str) -> None:
    """Keep what the page looked like under artifacts/. selenium returns False when it cannot write
    the file, so the folder is made here: a test that runs first on its xdist worker has no other
    test to make it."""
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / name)), f"could not write {ARTIFACTS / name}"


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
    path.write_text(formats.render(run, "html"), encoding="utf-8")
    driver.set_window_size(1600, 1000)
    driver.get(path.as_uri())
    return driver


def cells(driver: Any) -> dict[str, Any]:
    """Cells that hold a shown case, by where they are ("row; column")."""
    found = driver.find_elements("css selector", "#case-grid td:not(.empty)")
    return {driver.execute_script("return arguments[0].where", c): c for c in found if c.is_displayed()}


def stripes(cell: Any) -> list[str]:
    return [s.get_attribute("class").split()[1] for s in cell.find_elements("css selector", ".stripe")]


def choose(driver: Any, name: str, text: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", f"filter-{name}")).select_by_visible_text(text)


def test_loads_clean_from_file_url(page: Any) -> None:
    assert page.execute_script("return window.__alerts") == [], "markup from the run data ran a script"
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0, "fetched something"
    assert [e for e in page.get_log("browser") if e["level"] == "SEVERE"] == []


def test_one_cell_per_combination_that_ran_coloured_by_verdict(page: Any, run: dict[str, Any]) -> None:
    combos = {(f"{r['pipeline']}, {r['input']}; {r['grad_mode']}, {r['recompute']}") for r in run["results"]}
    assert set(cells(page)) == combos  # nothing drawn for combinations that never ran
    assert len(page.find_elements("css selector", "#case-grid tbody tr:not([hidden])")) == 4
    crash = cells(page)[CRASH_CELL]
    assert stripes(crash) == ["v-reproduced", "v-regression", "v-fixed", "v-fixed"]
    assert [s.text for s in crash.find_elements("css selector", ".stripe")] == ["R", "!", "✓", "✓"]  # not colour alone
    label = crash.get_attribute("aria-label")
    assert label.startswith(CRASH_CELL + ": 1 cases; te-2.13.0: 1 reproduced (crash); te-2.13.0+backport: 1 regression"
                            " (crash); te-2.16.0: 1 fixed (pass)")
    choose(page, "colour", "outcome")
    assert stripes(cells(page)[CRASH_CELL]) == ["o-crash", "o-crash", "o-pass", "o-pass"]


def test_one_tab_stop_and_arrow_keys(page: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    stops = page.find_elements("css selector", "#case-grid [tabindex='0']")
    assert len(stops) == 1 and len(page.find_elements("css selector", "#case-grid td[tabindex='-1']")) > 1
    first = stops[0]
    first.send_keys(Keys.ARROW_RIGHT)
    moved = page.switch_to.active_element
    assert moved != first and moved.get_attribute("tabindex") == "0" and first.get_attribute("tabindex") == "-1"
    moved.send_keys(Keys.ARROW_DOWN)
    below = page.switch_to.active_element
    assert below.get_attribute("data-row") != moved.get_attribute("data-row")
    below.send_keys(Keys.ENTER)
    assert page.find_element("css selector", "#details .cell-title").text == page.execute_script(
        "return arguments[0].where", below)


def test_filters_and_banner_links(page: Any, run: dict[str, Any]) -> None:
    choose(page, "input", "non_leaf")
    assert all("non_leaf;" in where for where in cells(page))
    choose(page, "input", "any")
    page.find_element("css selector", "a.filter-link[data-verdict='attention']").click()
    assert page.find_element("id", "filter-verdict").get_attribute("value") == "attention"
    assert list(cells(page)) == [CRASH_CELL]
    assert page.find_element("css selector", "#filters .count").text == f"1 of {len(run['results']) // 4} cases shown"
    assert page.find_element("css selector", "#details .cell-title").text == CRASH_CELL  # the link selects it too


def test_click_shows_case_details_and_markup_stays_text(page: Any) -> None:
    cells(page)[CRASH_CELL].click()
    details = page.find_element("id", "details")
    assert details.find_element("css selector", ".case-id").text == CRASH_CASE  # one case: shown at once
    sections = {s.get_attribute("data-target"): s for s in details.find_elements("css selector", ".target-detail")}
    assert list(sections) == TARGETS
    crash = sections["te-2.13.0"]
    assert "verdict reproduced, outcome crash, expected affected" in crash.find_element("css selector", ".outcome").text
    assert crash.find_element("css selector", ".error-message").text == HOSTILE  # shown as text, every character
    assert "Traceback (most recent call last)" in crash.find_element(
        "css selector", ".traceback pre").get_attribute("textContent")
    assert HOSTILE in crash.find_element("css selector", ".detail-lines").text
    assert sections["te-2.13.0+backport"].find_element("css selector", ".verdict-bad").text == "regression"
    script = crash.find_element("css selector", ".script-text").get_attribute("textContent")
    assert script.startswith(f"repro show {CRASH_CASE} --target te-2.13.0 --script --standalone > case.py")
    assert page.execute_script("return document.scripts.length") == 2
    assert page.execute_script("return document.querySelectorAll('img').length") == 0
    assert page.execute_script("return window.__alerts") == []
    assert [e for e in page.get_log("browser") if e["level"] == "SEVERE"] == []


def box(driver: Any, element_id: str) -> dict[str, float]:
    return driver.execute_script("const r = document.getElementById(arguments[0]).getBoundingClientRect();"
                                 "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};", element_id)


@pytest.mark.parametrize("width", [1024, 1600])
def test_grid_and_details_side_by_side(page: Any, width: int) -> None:
    page.set_window_size(width, 900)
    cells(page)[CRASH_CELL].click()
    page.execute_script("document.getElementById('grid-section').scrollIntoView()")
    grid, details = box(page, "grid-wrap"), box(page, "details")
    inner = page.execute_script("return [window.innerWidth, window.innerHeight]")
    assert grid["right"] <= details["left"] and details["right"] <= inner[0]  # both on screen, side by side
    assert details["top"] < inner[1] and grid["top"] < inner[1]
    shown = [c for c in cells(page).values() if c.rect["x"] + c.rect["width"] <= grid["right"]
             and c.rect["y"] < inner[1]]
    assert len(shown) >= 3, "grid cells are visible beside the details"
    screenshot(page, f"report-{width}.png")


def test_details_fold_under_the_grid_on_a_narrow_screen(page: Any) -> None:
    page.set_window_size(800, 900)
    grid, details = box(page, "grid-wrap"), box(page, "details")
    assert details["top"] >= grid["bottom"]


def test_issue22_sized_page_opens_with_cells_beside_the_details(driver: Any, tmp_path: Path) -> None:
    from tests.synthetic import issue22_sized_run

    path = tmp_path / "report.html"
    path.write_text(formats.render(issue22_sized_run(), "html"), encoding="utf-8")
    driver.set_window_size(1024, 900)
    driver.get(path.as_uri())
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    assert driver.find_element("css selector", "#filters .count").text == "6400 of 6400 cases shown"
    found = cells(driver)
    next(iter(found.values())).click()
    driver.execute_script("document.getElementById('grid-section').scrollIntoView()")
    grid, details = box(driver, "grid-wrap"), box(driver, "details")
    assert grid["right"] <= details["left"] <= 1024
    assert len(driver.find_elements("css selector", "#case-grid [tabindex='0']")) == 1
    screenshot(driver, "report-issue22-1024.png")
