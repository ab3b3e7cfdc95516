"""Compare two runs the way `asv compare` does: per (target, case), keep new regressions,
newly fixed cases, new and removed cases and other changes apart.

A result whose verdict needs a person (regression, harness error, unexpected pass) in
B but not in A is a new regression, and so is such a result for a case A lacks: a new
case that fails is still a failure to look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from repro import reports
from repro.summary import BAD_VERDICTS

KINDS = ("new regression", "newly fixed", "new case", "removed case", "other change")


@dataclass(frozen=True)
class Change:
    kind: str
    target: str
    case_id: str
    before: str  # "outcome/verdict", or "-" when absent
    after: str


def _state(record: dict[str, Any] | None) -> str:
    return f"{record['outcome']}/{record['verdict']}" if record else "-"


def _kind(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None:
        return "new regression" if b and b["verdict"] in BAD_VERDICTS else "new case"
    if b is None:
        return "removed case"
    a_bad, b_bad = a["verdict"] in BAD_VERDICTS, b["verdict"] in BAD_VERDICTS
    if b_bad and not a_bad:
        return "new regression"
    # Newly fixed: a result that needed a person no longer does, or a failure now passes.
    if (a_bad and not b_bad) or (a["outcome"] not in ("pass", "not_applicable") and b["outcome"] == "pass"):
        return "newly fixed"
    return "other change"


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """Every (target, case) whose outcome or verdict differs, or that only one run has."""
    index_a = {(r["target"], r["case_id"]): r for r in a["results"]}
    index_b = {(r["target"], r["case_id"]): r for r in b["results"]}
    changes = []
    for key in list(index_a) + [k for k in index_b if k not in index_a]:
        ra, rb = index_a.get(key), index_b.get(key)
        if ra and rb and (ra["outcome"], ra["verdict"]) == (rb["outcome"], rb["verdict"]):
            continue
        changes.append(Change(_kind(ra, rb), key[0], key[1], _state(ra), _state(rb)))
    order = {spec: i for i, spec in enumerate(dict.fromkeys(reports.target_specs(a) + reports.target_specs(b)))}
    changes.sort(key=lambda c: (KINDS.index(c.kind), order.get(c.target, len(order)), c.case_id))
    return changes


def render_diff(changes: list[Change], a: dict[str, Any], b: dict[str, Any]) -> str:
    lines = []
    for name, run in (("A", a), ("B", b)):
        if note := reports.incomplete_note(run):
            lines.append(f"{name}: {note}")
    if not changes:
        return "\n".join(lines + ["no outcome or verdict changed"])
    counts = {kind: sum(c.kind == kind for c in changes) for kind in KINDS}
    lines.append(", ".join(f"{n} {kind}" for kind, n in counts.items() if n))
    rows = reports.printable([[c.kind, c.target, c.case_id, c.before, c.after] for c in changes])
    lines += ["", tabulate(rows, headers=["change", "target", "case", "A (outcome/verdict)", "B (outcome/verdict)"])]
    return "\n".join(lines)


def exit_status(changes: list[Change], a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> int:
    """1 on a new regression, or when either run is incomplete (its missing results are no "removed cases")."""
    incomplete = any(run is not None and reports.incomplete_note(run) for run in (a, b))
    return 1 if incomplete or any(c.kind == "new regression" for c in changes) else 0
