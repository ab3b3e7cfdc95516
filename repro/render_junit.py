"""JUnit XML of a run, for CI dashboards: one testsuite per target, one testcase per
(case, target), classname the target and name the case id.

A reproduced issue-22 failure is expected, so it is reported as skipped with an
"expected failure" message rather than as a failure; the verdicts that need a person
(regression, harness error, unexpected pass) are failures.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from repro import reports
from repro.summary import BAD_VERDICTS

# XML 1.0 cannot hold most control characters, which an exception message may carry.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
MESSAGE_CHARS = 500


def _text(value: Any) -> str:
    return _NOT_XML.sub("\ufffd", str(value))


def _summary(record: dict[str, Any]) -> str:
    error = record.get("error")
    if error:
        return f"{record['outcome']}: {error.get('type')} at {error.get('location') or '(no TE frame)'}: " \
               f"{(error.get('message') or '').strip()}"
    if record.get("failed_checks"):
        return f"{record['outcome']}: failed checks {', '.join(record['failed_checks'])}"
    return record["outcome"] + (f": {record['note']}" if record.get("note") else "")


def _body(record: dict[str, Any]) -> str:
    lines = [f"outcome {record['outcome']}, verdict {record['verdict']}, oracle {record['expected']}",
             reports.show_command(record["case_id"], record["target"])]
    for check, found in (record.get("details") or {}).items():
        lines += [f"{check}: {line}" for line in found]
    if record.get("error") and record["error"].get("traceback"):
        lines.append(record["error"]["traceback"])
    return "\n".join(lines)


def _testcase(suite: ET.Element, record: dict[str, Any]) -> None:
    case = ET.SubElement(suite, "testcase", classname=_text(record["target"]), name=_text(record["case_id"]),
                         time=f"{record.get('duration_s') or 0.0:.6f}")
    verdict = record["verdict"]
    if verdict == "reproduced":
        message = f"expected failure: issue 22 reproduced ({_summary(record)})"
        ET.SubElement(case, "skipped", message=_text(message[:MESSAGE_CHARS])).text = _text(_body(record))
    elif verdict == "not_applicable":
        ET.SubElement(case, "skipped", message=_text(record.get("note") or "skipped"))
    elif verdict in BAD_VERDICTS:
        message = f"{verdict}: {_summary(record)}"
        element = ET.SubElement(case, "failure", type=verdict, message=_text(message[:MESSAGE_CHARS]))
        element.text = _text(_body(record))


def render_junit(run: dict[str, Any]) -> str:
    root = ET.Element("testsuites", name=f"repro {run.get('matrix', '?')}")
    for spec in reports.target_specs(run):
        found = [r for r in run["results"] if r["target"] == spec]
        skipped = sum(r["verdict"] in ("reproduced", "skipped") for r in found)
        failures = sum(r["verdict"] in BAD_VERDICTS for r in found)
        suite = ET.SubElement(root, "testsuite", name=_text(spec), tests=str(len(found)), failures=str(failures),
                              errors="0", skipped=str(skipped),
                              time=f"{sum(r.get('duration_s') or 0.0 for r in found):.3f}")
        if note := reports.incomplete_note(run):
            ET.SubElement(ET.SubElement(suite, "properties"), "property", name="incomplete", value=_text(note))
        for record in found:
            _testcase(suite, record)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
