"""Reports of a run: Markdown, verdict Markdown, HTML, JUnit, JSON, `repro diff`, `repro show`.

The fixture tests/fixtures/run-small/run.json is a real run (see tests/fixtures/README.md);
tests plant hostile strings and regressions into copies of it.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from repro import reports
from repro.cli import main
from repro.render_html import grid_data, json_for_script
from tests.conftest import REPO, repro

FIXTURE = REPO / "tests" / "fixtures" / "run-small"
HOSTILE = "boom </script><script>alert(1)</script> <img src=x onerror=alert(2)> a|b"
CRASH_CASE = "issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"


@pytest.fixture
def run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def planted(run: dict[str, Any]) -> dict[str, Any]:
    """A copy whose te-2.13.0 crash carries markup in its message and details."""
    run = copy.deepcopy(run)
    record = find(run, "te-2.13.0", CRASH_CASE)
    assert record["outcome"] == "crash"
    record["error"]["message"] = HOSTILE
    record["details"] = {"outputs": [HOSTILE]}
    return run


def find(run: dict[str, Any], target: str, case_id: str) -> dict[str, Any]:
    return next(r for r in run["results"] if r["target"] == target and r["case_id"] == case_id)


def with_regression(run: dict[str, Any]) -> dict[str, Any]:
    """A copy in which the backport crashes on a case it fixed."""
    run = copy.deepcopy(run)
    record = find(run, "te-2.13.0+backport", CRASH_CASE)
    assert record["verdict"] == "fixed"
    record.update(outcome="crash", verdict="regression", failed_checks=["completion"],
                  error={"type": "RuntimeError", "message": "planted", "location": "x.py:1", "traceback": ""})
    return run


def write_run(run: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run.json").write_text(json.dumps(run))
    return directory


# ---- Markdown ----

def table_widths(markdown: str) -> set[int]:
    """Cells per table row, counting only unescaped pipes."""
    return {len(re.findall(r"(?<!\\)\|", line)) for line in markdown.splitlines() if line.startswith("|")}


def test_markdown_has_every_section_and_counts(run: dict[str, Any]) -> None:
    md = reports.render(run, "md")
    for heading in ("## Verdict", "## Environment", "## Per-target totals", "## Outcome grid",
                    "## Failures by error signature", "## Oracle agreement"):
        assert heading in md
    assert "backport fixes 4 of 4 affected cases" in md
    assert "`C✓✓✓`" in md  # te-2.13.0 crashes, the three fixed targets pass
    assert ("repro show issue22:ops-fused_residual_rmsnorm-enabled-non_leaf-trainable-checkpoint_reentrant-single-dense-float32-cpu"
            " --target te-2.13.0 --script") in md  # the plainest failing case is the example
    assert "time (s)" in md and "machine `vm`" in md
    assert "INCOMPLETE" not in md


def test_markdown_keeps_hostile_message_inside_code(run: dict[str, Any]) -> None:
    md = reports.render(planted(run), "md")
    row = next(line for line in md.splitlines() if "alert(1)" in line)
    assert "`boom </script><script>alert(1)</script> <img src=x onerror=alert(2)> a\\|b`" in row
    outside_code = re.sub(r"`[^`]*`", "", md)
    assert "<script" not in outside_code and "<img" not in outside_code
    for block in md.split("\n\n"):
        if block.startswith("|"):
            assert len(table_widths(block)) == 1, block  # the pipe in the message did not add a column


def test_markdown_perf_hook(run: dict[str, Any]) -> None:
    run["perf"] = [{"case": "a", "fused_ms": 1.5}]
    md = reports.render(run, "md")
    assert "## Performance" in md and "fused_ms" in md
    assert "## Performance" not in reports.render(run, "verdict-md")


def test_verdict_markdown_is_free_of_timings_and_machine(run: dict[str, Any]) -> None:
    first = reports.render(run, "verdict-md")
    other = copy.deepcopy(run)
    for record in other["results"]:
        record["duration_s"] = 99.0
    other["environment"].update(machine="elsewhere", platform="Other-OS", python="3.99")
    assert reports.render(other, "verdict-md") == first
    assert "time (s)" not in first and "vm" not in first.split() and "Linux" not in first
    assert "## Outcome grid" in first and "## Oracle agreement" in first


# ---- HTML ----

def data_block(html: str) -> str:
    start = html.index('<script type="application/json" id="run-data">') + len(
        '<script type="application/json" id="run-data">')
    return html[start:html.index("</script>", start)]


def test_html_is_self_contained_and_escaped(run: dict[str, Any]) -> None:
    html = reports.render(planted(run), "html")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html), "the page must fetch nothing"
    assert not re.search(r"\.(inner|outer)HTML\s*[+]?=|insertAdjacentHTML|document\.write", html)
    assert "Content-Security-Policy" in html
    # Autoescaped in the server-rendered failure table.
    assert "boom &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the data block and the page's script
    block = data_block(html)
    assert "<" not in block
    data = json.loads(block)
    assert any(isinstance(v, dict) and v.get("message") == HOSTILE for v in data["pool"])  # intact after the trip
    assert len(data["cases"]) == len({r["case_id"] for r in run["results"]})


def test_json_for_script_cannot_close_the_block() -> None:
    value = {"m": "</script><!-- <script> & >", "n": [1, None]}
    text = json_for_script(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value


def test_grid_data_has_one_entry_per_case_and_target(run: dict[str, Any]) -> None:
    data = grid_data(run)
    assert data["targets"] == ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"]
    entry = next(c for c in data["cases"] if c[0] == CRASH_CASE)
    assert [r[0] for r in entry[5]] == ["crash", "pass", "pass", "pass"]
    assert [r[1] for r in entry[5]] == ["reproduced", "fixed", "fixed", "fixed"]


# ---- JUnit ----

def test_junit_one_testcase_per_case_and_target(run: dict[str, Any]) -> None:
    root = ET.fromstring(reports.render(with_regression(planted(run)), "junit").encode())
    cases = root.findall(".//testcase")
    assert len(cases) == len(run["results"])
    assert {(c.get("classname"), c.get("name")) for c in cases} == {(r["target"], r["case_id"]) for r in run["results"]}
    by_key = {(c.get("classname"), c.get("name")): c for c in cases}
    for record in run["results"]:
        element = by_key[record["target"], record["case_id"]]
        skipped, failure = element.find("skipped"), element.find("failure")
        if record["verdict"] == "reproduced":
            assert skipped is not None and skipped.get("message").startswith("expected failure: issue 22 reproduced")
        elif record["verdict"] == "skipped":
            assert skipped is not None and skipped.get("message") == record["note"]
        elif (record["target"], record["case_id"]) == ("te-2.13.0+backport", CRASH_CASE):
            assert failure is not None and failure.get("type") == "regression"
        else:
            assert skipped is None and failure is None
    assert HOSTILE in by_key["te-2.13.0", CRASH_CASE].find("skipped").get("message")
    suite = root.find("testsuite[@name='te-2.13.0+backport']")
    assert suite.get("failures") == "1"


# ---- the command and unfinished runs ----

@pytest.mark.parametrize("fmt", reports.FORMATS)
def test_report_command_writes_each_format(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / f"report.{fmt}"
    assert main(["report", str(FIXTURE), "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text()
    assert {"md": "## Oracle agreement", "verdict-md": "(verdict report)", "html": 'id="case-grid"',
            "junit": "<testsuites", "json": '"schema": "repro.run/2"'}[fmt] in text


def test_write_all_formats(run: dict[str, Any], tmp_path: Path) -> None:
    reports.write_all_formats(run, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.html", "report.md"]


def unfinished(run: dict[str, Any], directory: Path, keep: int, meta: bool) -> Path:
    """A run dir as a run that died leaves it: no run.json, part of the JSONL, a torn last line."""
    directory.mkdir()
    lines = [json.dumps(r) for r in run["results"][:keep]]
    (directory / "results.jsonl").write_text("\n".join(lines) + '\n{"case_id": "torn')
    if meta:
        (directory / "run-meta.json").write_text(json.dumps({
            "matrix": "smoke", "only": ["pipeline=fused_residual_rmsnorm,extra_output_only"],
            "targets": ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"],
            "expected_results": len(run["results"]),
            "expected_keys": [[r["target"], r["case_id"]] for r in run["results"]]}))
    return directory


def test_report_from_unfinished_run_says_incomplete(run: dict[str, Any], tmp_path: Path) -> None:
    loaded = reports.load_run(unfinished(run, tmp_path / "dead", keep=20, meta=True))
    assert loaded["complete"] is False and loaded["found_results"] == 20
    assert loaded["missing"] == len(run["results"]) - 20
    md = reports.render(loaded, "md")
    assert f"INCOMPLETE: the run did not finish (no run.json); 20 results found in results.jsonl, " \
           f"{len(run['results']) - 20} results missing." in md
    assert "corrupt record skipped" in md  # the torn line is reported, not fatal
    html = reports.render(loaded, "html")
    assert 'id="incomplete"' in html
    data = json.loads(data_block(html))
    assert len(data["cases"]) == len({r["case_id"] for r in run["results"]})  # every expected case has a cell
    assert sum(r is None for c in data["cases"] for r in c[5]) == len(run["results"]) - 20
    junit = ET.fromstring(reports.render(loaded, "junit").encode())
    assert len(junit.findall(".//testcase")) == 20
    assert junit.find(".//property[@name='incomplete']") is not None


def test_report_from_unfinished_run_without_meta(run: dict[str, Any], tmp_path: Path) -> None:
    loaded = reports.load_run(unfinished(run, tmp_path / "dead", keep=5, meta=False))
    assert "an unknown number of results missing" in reports.render(loaded, "md")


def test_report_bad_dir_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "neither run.json nor results.jsonl" in capsys.readouterr().err


# ---- diff ----

def test_diff_flags_planted_regression(run: dict[str, Any], tmp_path: Path) -> None:
    a = write_run(run, tmp_path / "a")
    b = write_run(with_regression(run), tmp_path / "b")
    result = repro("diff", str(a), str(b / "run.json"), check_rc=1)
    row = next(line for line in result.stdout.splitlines() if CRASH_CASE in line)
    assert row.startswith("new regression") and "te-2.13.0+backport" in row
    assert "pass/fixed" in row and "crash/regression" in row
    assert len([line for line in result.stdout.splitlines() if CRASH_CASE in line]) == 1
    back = repro("diff", str(b), str(a), check_rc=0)
    assert next(line for line in back.stdout.splitlines() if CRASH_CASE in line).startswith("newly fixed")


def test_diff_same_run_and_case_set_changes(run: dict[str, Any], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(FIXTURE), str(FIXTURE)]) == 0
    assert "no outcome or verdict changed" in capsys.readouterr().out
    fewer = copy.deepcopy(run)
    dropped = fewer["results"].pop(0)
    assert main(["diff", str(write_run(fewer, tmp_path / "fewer")), str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^new case\s+{re.escape(dropped['target'])}\s+{dropped['case_id']}\s", out, re.MULTILINE)
    assert main(["diff", str(FIXTURE), str(tmp_path / "fewer")]) == 0
    assert "removed case" in capsys.readouterr().out


# ---- show ----

def test_show_prints_axes_and_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", CRASH_CASE]) == 0
    out = capsys.readouterr().out
    assert "grad_mode  no_grad" in out and "predicted  affected, RuntimeError" in out


def test_show_bad_case_id_is_one_line_exit_2() -> None:
    result = repro("show", "fused_residual_rmsnorm-no_grad", "--script", check_rc=2)
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "bad case id" in result.stderr


@pytest.mark.parametrize("target, outcome, rc", [("te-2.13.0", "crash", 1), ("te-2.13.0+backport", "pass", 0)])
def test_show_script_reproduces_the_case(target: str, outcome: str, rc: int, tmp_path: Path) -> None:
    text = repro("show", CRASH_CASE, "--target", target, "--script", check_rc=0).stdout
    script = tmp_path / "case.py"
    script.write_text(text)
    # A separate process, run from elsewhere: the script needs nothing but the installed project.
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            check=False, timeout=300)
    assert result.returncode == rc, result.stdout + result.stderr
    assert f"outcome: {outcome}" in result.stdout
    if outcome == "crash":
        assert "error: RuntimeError at transformer_engine/pytorch/ops/fuser.py:" in result.stdout
        assert "you can only change requires_grad flags of leaf variables" in result.stdout
    else:
        assert "verdict: fixed" in result.stdout and "error: RuntimeError" not in result.stdout
