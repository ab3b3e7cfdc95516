"""Which of upstream's own fuser tests changed result between base and head, and what that
means for the review. Pure functions of the two runs' outcomes (`repro review --upstream-tests`
runs base's tests on base and head's on head)."""

from __future__ import annotations

from typing import Any

# Failures that name what the CPU backend lacks, not what the sync changed (upstream_failures' classes).
BACKEND_LIMITS = ("needs FP8:", "missing kernel:", "CPU autocast:")
ABSENT = "absent"


def changes(base: dict[str, str], head: dict[str, str], head_reasons: dict[str, str]) -> list[dict[str, str]]:
    """Each test whose outcome differs (a test only one side has is `absent` on the other), with
    head's reason where head failed it."""
    return [{"test": test, "base": base.get(test, ABSENT), "head": head.get(test, ABSENT),
             "why": head_reasons.get(test, "") if head.get(test) == "failed" else ""}
            for test in sorted(set(base) | set(head)) if base.get(test) != head.get(test)]


def judged(found: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """(fail reasons, warnings) of the changes: a test that fails at head and did not at base fails
    the review, unless its failure is the CPU backend's limit; one that passed at base and no
    longer runs at head is lost coverage, a warning."""
    failing = [c for c in found if c["head"] == "failed"]
    limits = [c for c in failing if c["why"].startswith(BACKEND_LIMITS)]
    real = [c for c in failing if c not in limits]
    lost = [c for c in found if c["base"] == "passed" and c["head"] in ("skipped", ABSENT)]
    reasons = [_line(real, "fail at head and did not at base", "why")] if real else []
    warnings = [_line(limits, "fail at head and did not at base, on what the CPU backend lacks", "why")] if limits else []
    warnings += [_line(lost, "passed at base and do not run at head", "head")] if lost else []
    return reasons, warnings


def _line(changed: list[dict[str, str]], what: str, detail: str) -> str:
    return f"{len(changed)} of upstream's fuser tests {what} (e.g. {changed[0]['test']}: {changed[0][detail]})"

def unjudged(found: dict[str, Any]) -> list[str]:
    """Fail reasons for a side whose tests cannot be compared (nothing judged is never a pass):
    pytest wrote no results, ended other than by running the tests (exit 2 and above), or
    passed none of them. Without this, a head whose run was lost would show only base's tests
    as "do not run at head", a warning."""
    said = {"no results": "upstream's fuser tests gave no results on {side} (pytest exit {status})",
            "ended early": "upstream's fuser tests on {side} ended with pytest exit {status}",
            "nothing passed": "none of upstream's fuser tests passed on {side}: nothing to compare"}
    reasons = []
    for side in ("base", "head"):
        status = found["status"][side]
        if problem := run_problem(found[side], status):
            reasons.append(said[problem].format(side=side, status=status))
    return reasons


def run_problem(counts: dict[str, int], status: int) -> str | None:
    """Why one run of the tests judges nothing, or None: `no results` (pytest wrote none),
    `ended early` (pytest's exit 2 and above: interrupted, internal or usage error), or
    `nothing passed`. `repro upstream-tests` and the review both read it from here."""
    if not counts:
        return "no results"
    if status not in (0, 1):
        return "ended early"
    return None if counts["passed"] else "nothing passed"


def section(base: Any, head: Any) -> dict[str, Any]:
    """review.json's `upstream_tests`: each side's counts and pytest exit status, and the changed
    tests (runs as repro.upstream_command.UpstreamRun)."""
    found = changes(base.outcomes, head.outcomes, {f.test: f.reason for f in head.failed})
    return {"base": base.counts, "head": head.counts, "status": {"base": base.status, "head": head.status},
            "changes": found}
