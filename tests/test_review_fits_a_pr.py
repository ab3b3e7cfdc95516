"""review.md as a pull request shows it: a review of 120 changed cases in a few signatures stays
short (under 150 lines), and rendered as GitHub renders Markdown (GFM tables, GitHub's own
stylesheet from the npm package github-markdown-css, a 1280-px window) no table is wider than
800 px. The page is drawn by headless Chromium (tests/test_report_browser.py's driver)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from repro.render_review import render_review
from repro.review import review
from tests.synthetic import issue22_sized_run
from tests.test_report_browser import driver, screenshot  # noqa: F401 — the browser fixture

CSS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
    "te-fuser-repro/npm/node_modules/github-markdown-css/github-markdown-light.css"
BASE, HEAD = "te-2.13.0+backport", "te-2.16.0"
WIDEST_TABLE_PX = 800


def changed_review(changes: int = 120) -> dict[str, Any]:
    """A review of base -> head in which `changes` cases that passed now fail, in three signatures."""
    run = issue22_sized_run(600)
    run["results"] = [r for r in run["results"] if r["target"] == BASE]
    head = []
    for n, record in enumerate(copy.deepcopy(run["results"])):
        record["target"] = HEAD
        if n < changes:
            record.update(outcome="crash", verdict="regression", failed_checks=["completion"],
                          error={"type": ("RuntimeError", "ValueError", "CheckpointError")[n % 3],
                                 "location": f"transformer_engine/pytorch/ops/fuser.py:{140 + n % 3}",
                                 "message": "x" * 300})
        head.append(record)
    run["results"] += head
    run["environment"]["targets"] = [{**t, "spec": spec} for t, spec in
                                     zip(run["environment"]["targets"], (BASE, HEAD), strict=False)]
    return review(run, BASE, HEAD, {BASE: [], HEAD: []})


def test_a_review_of_120_changes_is_short() -> None:
    found = changed_review()
    assert sum(g["count"] for g in found["groups"]) == 120 and len(found["groups"]) == 3
    text = render_review(found, {"report.html": "report.html"})
    assert len(text.splitlines()) < 150, len(text.splitlines())
    assert found["status"] == "FAIL" and text.startswith("# ❌ Needs a look: 120 new failures in 3 signatures")


def _github_page(markdown: str, css: str) -> str:
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    return (f"<!doctype html><meta charset='utf-8'><style>{css}\n.markdown-body {{ box-sizing: border-box;"
            " max-width: 980px; margin: 0 auto; padding: 45px; }</style>"
            f"<article class='markdown-body'>{body}</article>")


def test_no_review_table_is_wider_than_a_pull_request_comment(driver: Any, tmp_path: Path) -> None:  # noqa: F811
    if not CSS.is_file():
        pytest.skip(f"{CSS} is missing (bash .ci/install installs github-markdown-css)")
    text = render_review(changed_review(), {"report.html": "report.html"})
    page = tmp_path / "review.html"
    page.write_text(_github_page(text, CSS.read_text()), encoding="utf-8")
    driver.set_window_size(1280, 1000)
    driver.get(page.as_uri())
    widths = driver.execute_script(
        "return [...document.querySelectorAll('table')].map(t => Math.max(t.scrollWidth, t.getBoundingClientRect().width))")
    assert len(widths) >= 2 and max(widths) <= WIDEST_TABLE_PX, widths
    screenshot(driver, "review-1280.png")
