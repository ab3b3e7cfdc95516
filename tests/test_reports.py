"""Reports of a run: Markdown, the CI summary, HTML, JUnit, JSON, `repro diff`, `repro show`.

The reports read the repro.run/2 fixture tests/fixtures/run2-small (made from a real run by
tests/fixtures/make_run2.py); tests plant hostile strings and bad verdicts into copies of it.
tests/synthetic.py gives an issue22-sized run for the size limits. The repro.run/1 fixture
(run-small) still renders, and `repro diff` still reads it.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from repro import formats, reports
from repro.cli import main
from repro.render_html import grid_data, json_for_script
from tests.conftest import REPO, repro
from tests.synthetic import issue22_sized_run

FIXTURE = REPO / "tests" / "fixtures" / "run2-small"
XSD = REPO / "tests" / "schemas" / "junit.xsd"
HOSTILE = "boom </script><script>alert(1)</script> <img src=x onerror=alert(2)> a|b"
CRASH_CASE = "issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
TARGETS = ["te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"]


@pytest.fixture
def run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


@pytest.fixture(scope="module")
def big() -> dict[str, Any]:
    return issue22_sized_run()


def find(run: dict[str, Any], target: str, case_id: str) -> dict[str, Any]:
    return next(r for r in run["results"] if r["target"] == target and r["case_id"] == case_id)


def planted(run: dict[str, Any]) -> dict[str, Any]:
    """A copy whose te-2.13.0 crash carries markup in its message and details."""
    run = copy.deepcopy(run)
    record = find(run, "te-2.13.0", CRASH_CASE)
    assert record["outcome"] == "crash" and record["verdict"] == "reproduced"
    record["error"]["message"] = HOSTILE
    record["details"] = {"outputs": [HOSTILE]}
    return run


def with_regression(run: dict[str, Any]) -> dict[str, Any]:
    """A copy in which the backport crashes on a case it fixed."""
    run = copy.deepcopy(run)
    record = find(run, "te-2.13.0+backport", CRASH_CASE)
    assert record["verdict"] == "fixed"
    record.update(outcome="crash", verdict="regression", failed_checks=["completion"], verdict_reason="planted",
                  error={"type": "RuntimeError", "message": "planted", "location": "x.py:1", "traceback": ""})
    return run


def write_run(run: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run.json").write_text(json.dumps(run))
    return directory


def without_details(markdown: str) -> str:
    return re.sub(r"<details>.*?</details>", "<details/>", markdown, flags=re.DOTALL)


# ---- the summary object ----

def test_summary_passes_a_healthy_run_and_fails_on_bad_verdicts_or_missing(run: dict[str, Any]) -> None:
    summary = reports.summarize(run)
    assert summary["status"] == "PASS" and summary["needs_attention"] == 0
    assert summary["verdicts"] == {"reproduced": 4, "fixed": 12, "unaffected": 32}
    assert summary["excluded"] == 4 and summary["cases"] == 12 and summary["targets"] == 4
    bad = reports.summarize(with_regression(run))
    assert bad["status"] == "FAIL" and bad["fail_reasons"] == ["1 regression"]
    incomplete = copy.deepcopy(run)
    incomplete.update(complete=False, missing=3)
    assert reports.summarize(incomplete)["fail_reasons"] == ["incomplete: 3 results missing"]


# ---- Markdown ----

def test_markdown_puts_the_verdict_first(run: dict[str, Any]) -> None:
    md = formats.render(run, "md")
    lines = [line for line in md.splitlines() if line]
    assert lines[1].startswith("**✅ PASS**: 12 cases on 4 targets, 0 need a look, 4 infeasible combinations not run")
    assert lines[2].startswith("**issue22** (fuser calls requires")
    assert "- backport fixes 4 of 4 affected cases" in lines[3]
    assert md.index("## Verdicts by target") < md.index("## Cases that fail or differ") < md.index("<details>")
    failing = formats.render(with_regression(run), "md")
    assert "**❌ FAIL**" in failing and "Failing because: 1 regression." in failing
    assert "## Needs a look (1)" in failing and f"`{CRASH_CASE}`: **regression** (crash): planted" in failing


def _grid_rows(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("| `") and "✓" in line]


def test_markdown_grid_keeps_only_rows_with_a_failure(run: dict[str, Any]) -> None:
    grid = _grid_rows(formats.render(run, "md"))
    # Both pipelines crash alike on a non-leaf input: one row names both.
    assert grid == ["| `fused_residual_rmsnorm`, `extra_output_only` | `non_leaf` | `C✓✓✓` | `C✓✓✓` |"]
    assert not any("`leaf`" in line for line in grid)  # all-pass rows folded away
    # A pipeline whose cells differ gets its own row again.
    split = _grid_rows(formats.render(with_regression(run), "md"))
    assert len(split) == 2 and any(line.startswith("| `fused_residual_rmsnorm` |") and "C!" in line for line in split)


def test_markdown_tables_are_not_padded(run: dict[str, Any]) -> None:
    md = formats.render(run, "md")
    for line in md.splitlines():
        if line.startswith("|"):
            assert "  |" not in line and "|  " not in line, line
            assert re.fullmatch(r"\|(---\|)+", line) or line.startswith("| "), line
    # One wider cell changes only its own line.
    wider = copy.deepcopy(run)
    wider["environment"]["targets"][0]["fuser_sha"] = "b2df7c3d9b67-and-a-much-longer-hash"
    changed = [(a, b) for a, b in zip(md.splitlines(), formats.render(wider, "md").splitlines()) if a != b]
    assert len(changed) == 1 and "much-longer" in changed[0][1]


def test_markdown_keeps_hostile_message_inside_code(run: dict[str, Any]) -> None:
    md = formats.render(planted(run), "md")
    line = next(line for line in md.splitlines() if "alert(1)" in line and line.startswith("- "))
    assert "`boom </script><script>alert(1)</script> <img src=x onerror=alert(2)> a|b`" in line
    outside_code = re.sub(r"`[^`]*`", "", md)
    assert "<script" not in outside_code and "<img" not in outside_code


def test_markdown_for_an_issue22_sized_run_is_short(big: dict[str, Any]) -> None:
    md = formats.render(big, "md")
    assert len(without_details(md).splitlines()) < 60, without_details(md)
    assert "Environment" not in without_details(md)  # folded away


def test_verdict_markdown_is_free_of_timings_and_machine(run: dict[str, Any]) -> None:
    first = formats.render(run, "verdict-md")
    other = copy.deepcopy(run)
    for record in other["results"]:
        record["duration_s"] = 99.0
    other["environment"].update(machine="elsewhere", platform="Other-OS", python="3.99")
    other["elapsed_s"] = 1234.0
    assert formats.render(other, "verdict-md") == first
    assert "time (s)" not in first and "vm" not in first.split() and "Linux" not in first and "41s" not in first


def test_step_summary_is_appended_when_github_sets_it(run: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    summary_file = tmp_path / "step-summary.md"
    summary_file.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    assert main(["report", str(FIXTURE), "--format", "html", "-o", str(tmp_path / "r.html")]) == 0
    text = summary_file.read_text()
    assert text.startswith("earlier step\n### repro run `smoke`") and "**✅ PASS**" in text
    formats.write_all_formats(run, tmp_path)
    assert summary_file.read_text().count("### repro run") == 2
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert formats.append_step_summary(run) is None


# ---- HTML ----

def data_block(html: str) -> str:
    start = html.index('<script type="application/json" id="run-data">') + len(
        '<script type="application/json" id="run-data">')
    return html[start:html.index("</script>", start)]


def unpack(data: dict[str, Any]) -> dict[str, dict[str, tuple[str, str]]]:
    """The page's unpacking, in Python: case id -> target -> (outcome, verdict)."""
    stride, found = 1 + 2 * len(data["targets"]), {}
    values, outcomes, verdicts = data["values"], data["outcomes"], data["verdicts"]
    for at in range(0, len(data["cases"]), stride):
        code, coordinates = data["cases"][at], []
        for dim in reversed(values):
            coordinates.insert(0, dim[code % len(dim)])
            code //= len(dim)
        case_id = coordinates[0] + ":" + "-".join(coordinates[1:])
        found[case_id] = {t: (outcomes[c // len(verdicts)], verdicts[c % len(verdicts)])
                          for t, c in zip(data["targets"], data["cases"][at + 1:at + stride:2]) if c >= 0}
    return found


def test_html_is_self_contained_and_escaped(run: dict[str, Any]) -> None:
    html = formats.render(planted(run), "html")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html), "the page must fetch nothing"
    assert not re.search(r"\.(inner|outer)HTML\s*[+]?=|insertAdjacentHTML|document\.write", html)
    assert "Content-Security-Policy" in html
    assert "boom &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html  # autoescaped in the table
    assert html.count("<script") == 2 and html.count("</script>") == 2
    block = data_block(html)
    assert "<" not in block
    data = json.loads(block)
    assert any(v.get("error", {}).get("message") == HOSTILE for v in data["pool"])  # intact after the trip


def test_json_for_script_cannot_close_the_block() -> None:
    value = {"m": "</script><!-- <script> & >", "n": [1, None]}
    text = json_for_script(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value


def test_grid_data_unpacks_to_every_result(run: dict[str, Any]) -> None:
    found = unpack(grid_data(run))
    assert len(found) == 12 and set(found) == {r["case_id"] for r in run["results"]}
    for record in run["results"]:
        assert found[record["case_id"]][record["target"]] == (record["outcome"], record["verdict"])
    assert found[CRASH_CASE] == {"te-2.13.0": ("crash", "reproduced"), "te-2.13.0+backport": ("pass", "fixed"),
                                 "te-2.16.0": ("pass", "fixed"), "te-2.20.2": ("pass", "fixed")}


def test_html_banner_status_and_filter_links(run: dict[str, Any]) -> None:
    html = formats.render(with_regression(run), "html")
    assert '<header id="status" class="status-fail">' in html and '<span class="status-word">FAIL</span>' in html
    assert 'data-verdict="regression"' in html and 'data-verdict="attention"' in html
    assert "<title>FAIL: " in html


def test_html_for_an_issue22_sized_run_is_under_500_kb(big: dict[str, Any]) -> None:
    assert len(big["results"]) == 25600
    size = len(formats.render(big, "html").encode())
    assert size < 500_000, size


# ---- JUnit ----

def junit_schema() -> Any:
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema is a dev dependency (pip install -e .[dev])")
    return xmlschema.XMLSchema(str(XSD))


def test_junit_passes_the_xsd_and_reads_verdicts(run: dict[str, Any]) -> None:
    text = formats.render(with_regression(planted(run)), "junit")
    junit_schema().validate(text)
    root = ET.fromstring(text.encode())
    cases = [c for c in root.findall(".//testcase") if c.get("classname") != "repro_verdict"]
    assert len(cases) == len(run["results"])
    (verdict,) = root.findall(".//testcase[@classname='repro_verdict']")  # the run's own verdict, FAIL here
    assert verdict.find("failure").get("message") == "FAIL: 1 regression"
    assert all("." not in c.get("classname") for c in cases)
    assert {s.get("name") for s in root.findall("testsuite")} == {"te-2_13_0", "te-2_13_0+backport", "te-2_16_0",
                                                                    "te-2_20_2", "verdict"}
    xfails = [c for c in cases if c.find("skipped") is not None]
    assert len(xfails) == 4 and all(c.find("skipped").get("type") == "pytest.xfail" for c in xfails)
    assert HOSTILE in next(c for c in xfails if c.get("name") == CRASH_CASE).find("skipped").get("message")
    failures = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name"), c.find("failure").get("type")) for c in failures] == [
        ("issue22_te-2_13_0+backport", CRASH_CASE, "regression")]
    for name in ("tests", "failures", "errors", "skipped"):
        assert int(root.get(name)) == sum(int(s.get(name)) for s in root.findall("testsuite"))
    assert root.get("tests") == "49" and root.get("skipped") == "4" and root.get("failures") == "2"
    suite = root.find("testsuite")
    assert suite.get("hostname") == "vm" and suite.get("timestamp") == "2026-12-01T10:00:00"


def test_junit_lists_only_cases_that_ran(run: dict[str, Any]) -> None:
    record = copy.deepcopy(run["results"][0])
    record.update(case_id=record["case_id"] + "-x", outcome="not_applicable", verdict="not_applicable")
    run["results"].append(record)
    root = ET.fromstring(formats.render(run, "junit").encode())
    assert len(root.findall(".//testcase[@classname!='repro_verdict']")) == 48


def test_junit_xsd_rejects_what_dashboards_misread(run: dict[str, Any]) -> None:
    """The schema check can fail: a dotted classname, or a suite without hostname, is refused."""
    schema = junit_schema()
    text = formats.render(run, "junit")
    assert schema.is_valid(text)
    assert not schema.is_valid(text.replace('classname="issue22_te-2_13_0"', 'classname="te-2.13.0"', 1))
    assert not schema.is_valid(re.sub(r' hostname="[^"]*"', "", text, count=1))
    assert not schema.is_valid(text.replace('type="pytest.xfail" ', "", 1))


# ---- the command, old runs and unfinished runs ----

@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_report_command_writes_each_format(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "sub" / f"report.{fmt}"
    assert main(["report", str(FIXTURE), "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text()
    assert {"md": "## Verdicts by target", "verdict-md": "(verdict report)", "summary": "### repro run",
            "html": 'id="case-grid"', "junit": "<testsuites", "json": '"schema": "repro.run/2"'}[fmt] in text


def test_a_repro_run_1_is_refused_in_one_line(tmp_path: Path) -> None:
    # The repro.run/1 shape, as runs before commit d364ead wrote it: no regressions, infeasible cases as skipped.
    (tmp_path / "run.json").write_text(json.dumps({"schema": "repro.run/1", "results": [{"outcome": "skipped"}]}))
    result = repro("report", str(tmp_path), check_rc=2)
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "is a repro.run/1 run" in result.stderr


def test_write_all_formats(run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    paths = formats.write_all_formats(run, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml", "report.html", "report.md"]
    assert list(paths) == ["report.md", "report.html", "junit.xml"]


def unfinished(run: dict[str, Any], directory: Path, keep: int, meta: bool) -> Path:
    """A run dir as a run that died leaves it: no run.json, part of the JSONL, a torn last line."""
    directory.mkdir()
    lines = [json.dumps(r) for r in run["results"][:keep]]
    (directory / "results.jsonl").write_text("\n".join(lines) + '\n{"case_id": "torn')
    if meta:
        (directory / "run-meta.json").write_text(json.dumps({
            "matrix": "smoke", "targets": TARGETS, "started_at": "2026-12-01T10:00:00+00:00",
            "expected_keys": [[r["target"], r["case_id"]] for r in run["results"]],
            "expected_results": len(run["results"]), "excluded": run["excluded"], "regressions": run["regressions"],
            "roles": {t["spec"]: t["roles"] for t in run["environment"]["targets"]}}))
    return directory


def test_report_from_unfinished_run_says_incomplete(run: dict[str, Any], tmp_path: Path) -> None:
    loaded = reports.load_run(unfinished(run, tmp_path / "dead", keep=20, meta=True))
    assert loaded["complete"] is False and loaded["found_results"] == 20
    assert loaded["missing"] == len(run["results"]) - 20 == len(loaded["missing_results"])
    assert loaded["summary"]["status"] == "FAIL"
    md = formats.render(loaded, "md")
    assert (f"INCOMPLETE: the run did not finish (no run.json); 20 results found in results.jsonl, "
            f"seals unchecked (the run's key went with it), {len(run['results']) - 20} results missing.") in md
    assert "corrupt record skipped" in md  # the torn line is reported, not fatal
    html = formats.render(loaded, "html")
    assert 'id="incomplete"' in html
    found = unpack(json.loads(data_block(html)))
    assert len(found) == 12  # every expected case has an entry, found or not
    assert sum(4 - len(by_target) for by_target in found.values()) == len(run["results"]) - 20
    junit = ET.fromstring(formats.render(loaded, "junit").encode())
    # Never greener than the run: each missing result is an <error> testcase naming the case and why.
    missing = junit.findall(".//testcase/error[@type='missing']")
    assert len(junit.findall(".//testcase")) == 20 + len(loaded["missing_results"]) + 1 == 20 + len(missing) + 1
    assert int(junit.get("errors")) >= len(missing) > 0
    first = loaded["missing_results"][0]
    assert junit.find(f".//testcase[@name='{first['case_id']}']/error[@type='missing']") is not None
    assert junit.find(".//property[@name='incomplete']") is not None


def test_report_from_unfinished_run_without_meta(run: dict[str, Any], tmp_path: Path) -> None:
    loaded = reports.load_run(unfinished(run, tmp_path / "dead", keep=5, meta=False))
    assert "an unknown number of results missing" in formats.render(loaded, "md")


def test_report_bad_dir_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "neither run.json nor results.jsonl" in capsys.readouterr().err


def test_reports_read_only_the_stored_run() -> None:
    """No renderer imports today's case, matrix or oracle modules."""
    for name in ("reports", "render_md", "render_html", "render_junit", "progress", "rerun"):
        source = (REPO / "repro" / f"{name}.py").read_text()
        assert not re.search(r"^\s*(from|import) cases\b", source, re.MULTILINE), name


# ---- diff ----

def test_diff_flags_planted_regression(run: dict[str, Any], tmp_path: Path) -> None:
    a = write_run(run, tmp_path / "a")
    b = write_run(with_regression(run), tmp_path / "b")
    result = repro("diff", str(a), str(b / "run.json"), check_rc=1)
    row = next(line for line in result.stdout.splitlines() if CRASH_CASE in line)
    assert row.startswith("new failure") and "te-2.13.0+backport" in row
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
    assert re.search(rf"^new case\s+{re.escape(dropped['target'])}\s+{re.escape(dropped['case_id'])}\s", out,
                     re.MULTILINE)
