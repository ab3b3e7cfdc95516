"""JUnit XML of a run, for CI dashboards: one testsuite per target, one testcase per
(case, target) that ran. Infeasible combinations are not cases and are not listed.

Dashboards read the verdict, not the raw outcome:
- reproduced (an expected failure) is <skipped type="pytest.xfail">, as pytest writes an xfail;
- other_failure, regression, unexpected_pass are <failure>, harness_error is <error>;
- the rest pass.
Classnames carry no dots (Jenkins-style viewers split a classname at its dots into packages):
so the classname is `issue22_te-2_13_0`, and the target spec is a suite property. The root carries the totals.
Suites and classnames carry no machine path or 40-hex id: a review's labels (base, head+backport), else
the spec as a pull request shows it. In a review's run only the failures the review counts (new or
changed at head) are failures; the others are skipped with why, so the counts say what the verdict says.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

from repro import reports
from repro.render_review import pr_spec

# XML 1.0 cannot hold most control characters, which an exception message may carry.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
MESSAGE_CHARS = 500
NOT_RUN = ("not_applicable", "skipped")  # outcomes of results that never ran a case
FAILURE_VERDICTS = tuple(v for v in reports.BAD_VERDICTS if v != "harness_error")


def _text(value: Any) -> str:
    return _NOT_XML.sub("\ufffd", str(value))


def dot_free(name: str) -> str:
    return name.replace(".", "_")


def _summary(record: dict[str, Any]) -> str:
    error = record.get("error")
    if error:
        return f"{record['outcome']}: {error.get('type')} at {error.get('location') or '(no TE frame)'}: " \
               f"{(error.get('message') or '').strip()}"
    if record.get("failed_checks"):
        return f"{record['outcome']}: failed checks {', '.join(record['failed_checks'])}"
    return record["outcome"] + (f": {record['note']}" if record.get("note") else "")


def _body(record: dict[str, Any]) -> str:
    lines = [f"outcome {record['outcome']}, verdict {record['verdict']}, expected {record.get('expected', '?')}"
             + (f", role {record['role']}" if record.get("role") else ""),
             reports.show_command(record["case_id"], record["target"], record.get("standalone"))]
    if record.get("verdict_reason"):
        lines.append(f"why: {record['verdict_reason']}")
    for check, found in (record.get("details") or {}).items():
        lines += [f"{check}: {line}" for line in found]
    lines += [f"side effect: {s}" for s in record.get("side_effects") or []]
    if record.get("error") and record["error"].get("traceback"):
        lines.append(record["error"]["traceback"])
    return "\n".join(lines)


def _testcase(suite: ET.Element, record: dict[str, Any], name: str, counted: set[tuple[str, str]] | None) -> str:
    """Adds the testcase; returns what it counts as: pass, skipped, failure or error. In a review's
    run (`counted` given) only the failures the review counts are failures: base's, the standing
    ones and those raised in a fork's kernel module are listed as skipped, with why."""
    classname = dot_free(f"{reports.regression_of(record)}.{dot_free(name)}")
    case = ET.SubElement(suite, "testcase", classname=_text(classname), name=_text(record["case_id"]),
                         time=f"{record.get('duration_s') or 0.0:.6f}")
    verdict = record["verdict"]
    if verdict == "reproduced":
        message = f"reproduced (expected failure): {_summary(record)}"
        # No body: an expected failure needs no traceback on a dashboard (run.json has it).
        ET.SubElement(case, "skipped", type="pytest.xfail", message=_text(message[:MESSAGE_CHARS]))
        return "skipped"
    if counted is not None and verdict in reports.BAD_VERDICTS and (record["target"], record["case_id"]) not in counted:
        why = "at base" if name.startswith("base") else "unchanged from base, or raised in the fork's own kernels"
        ET.SubElement(case, "skipped", type="not counted by the review",
                      message=_text(f"{verdict} {why}: {_summary(record)}"[:MESSAGE_CHARS]))
        return "skipped"
    if verdict in FAILURE_VERDICTS or verdict == "harness_error":
        kind = "error" if verdict == "harness_error" else "failure"
        message = f"{verdict}: {_summary(record)}"
        element = ET.SubElement(case, kind, type=verdict, message=_text(message[:MESSAGE_CHARS]))
        element.text = _text(_body(record))
        return kind
    return "pass"


def _target_properties(run: dict[str, Any], spec: str) -> list[tuple[str, str]]:
    """A target's version, provenance, patch and role (with its reason) per regression."""
    target = next((t for t in run["environment"]["targets"] if t["spec"] == spec), None)
    if target is None:
        return []
    found = [("version", target.get("version", "?"))]
    found += [(key, value) for key, value in (target.get("provenance") or {}).items()]
    if target.get("patch"):
        found.append(("patch", reports.patch_text(target)))
    found += [(f"role.{reg}", f"{role}: {why}" if why else role)
              for t, reg, role, why in reports.role_reasons(run) if t == spec]
    return found


def _missing(run: dict[str, Any], spec: str) -> list[dict[str, str]]:
    """The target's selected cases without a result, each with why; for a run that lost results
    without saying which, one entry for the count."""
    listed = [*(run.get("not_run") or []), *(run.get("missing_results") or [])]
    mine = [item for item in listed if item.get("target") == spec]
    if not listed and not run.get("complete", True) and spec == reports.target_specs(run)[0]:
        return [{"case_id": "(unknown cases)", "reason": reports.incomplete_note(run) or "results missing"}]
    return mine


def _missing_testcase(suite: ET.Element, spec: str, name: str, item: dict[str, str]) -> str:
    """A missing result is an error: a dashboard is never greener than the run."""
    classname = dot_free(f"{reports.regression_of({'case_id': item['case_id']})}.{dot_free(name)}")
    case = ET.SubElement(suite, "testcase", classname=_text(classname),
                         name=_text(item["case_id"]), time="0")
    why = item.get("reason") or "the run ended before this case recorded a result"
    element = ET.SubElement(case, "error", type="missing", message=_text(f"no result: {why}"[:MESSAGE_CHARS]))
    element.text = _text(f"{item['case_id']} on {spec} has no result: {why}")
    return "error"


def _verdict_suite(root: ET.Element, run: dict[str, Any]) -> Counter[str]:
    """The run's own verdict as one testcase (the review's, for a run a review made): its
    run-level reasons (a target problem, a regression not judged, results missing, the review's
    own) fail it, so the dashboard says what the status line says."""
    summary = reports.summarize(run)
    suite = ET.SubElement(root, "testsuite", name="verdict", tests="1", skipped="0", time="0",
                          failures=str(int(summary["status"] != "PASS")), errors="0",
                          hostname=_text(run["environment"].get("machine") or "unknown"))
    if timestamp := (run.get("started_at") or "")[:19]:
        suite.set("timestamp", timestamp)
    name = "review" if summary.get("review") else "run"
    case = ET.SubElement(suite, "testcase", classname="repro_verdict", name=name, time="0")
    if summary["status"] != "PASS":
        said = summary.get("recommendation") or "; ".join(summary["fail_reasons"])
        element = ET.SubElement(case, "failure", type="verdict", message=_text(f"FAIL: {said}"[:MESSAGE_CHARS]))
        element.text = _text("\n".join(summary["fail_reasons"]))
        return Counter({"failure": 1})
    return Counter()


def suite_names(specs: list[str], labels: dict[str, str]) -> dict[str, str]:
    """Each target's suite name: the review's label, else the spec as a pull request shows it (no machine
    path, no 40-hex id); two trees whose folders share a name get their order in the run after it."""
    names = {spec: labels.get(spec) or pr_spec(spec) for spec in specs}
    seen: dict[str, int] = {}
    for spec, name in names.items():
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            names[spec] = f"{name} ({seen[name]})"
    return names


def render_junit(run: dict[str, Any]) -> str:
    timestamp = (run.get("started_at") or "")[:19]  # xs:dateTime without the zone, as Ant writes it
    hostname = run["environment"].get("machine") or "unknown"
    root = ET.Element("testsuites", name=f"repro {run.get('matrix', '?')}")
    totals: Counter[str] = Counter()
    total_time = 0.0
    review = run.get("review") or {}
    counted = {(t, c) for t, c in review["failing"]} if "failing" in review else None
    names = suite_names(reports.target_specs(run), review.get("labels") or {})
    for spec in reports.target_specs(run):
        label = names[spec]
        ran = [r for r in run["results"] if r["target"] == spec and r["outcome"] not in NOT_RUN]
        suite = ET.SubElement(root, "testsuite", name=_text(dot_free(label)), hostname=_text(hostname))
        if timestamp:
            suite.set("timestamp", timestamp)
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="target", value=_text(spec))
        for name, value in _target_properties(run, spec):
            ET.SubElement(properties, "property", name=name, value=_text(value))
        if note := reports.incomplete_note(run):
            ET.SubElement(properties, "property", name="incomplete", value=_text(note))
        kinds = Counter(_testcase(suite, record, label, counted) for record in ran)
        kinds += Counter(_missing_testcase(suite, spec, label, item) for item in _missing(run, spec))
        tests = sum(kinds.values())
        seconds = sum(r.get("duration_s") or 0.0 for r in ran)
        suite.attrib.update(tests=str(tests), failures=str(kinds["failure"]), errors=str(kinds["error"]),
                            skipped=str(kinds["skipped"]), time=f"{seconds:.3f}")
        totals.update(kinds)
        totals["tests"] += tests
        total_time += seconds
    totals.update(_verdict_suite(root, run))
    totals["tests"] += 1
    root.attrib.update(tests=str(totals["tests"]), failures=str(totals["failure"]), errors=str(totals["error"]),
                       skipped=str(totals["skipped"]), time=f"{total_time:.3f}")
    if timestamp:
        root.set("timestamp", timestamp)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
