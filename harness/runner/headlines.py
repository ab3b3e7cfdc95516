"""Each regression's headline, computed from target roles, never from spec names, so it
reads the same for wheels, `path:` forks and `installed` targets. Counts are of cases
that ran (not `not_applicable`, not harness errors)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.model import BAD_VERDICTS, Outcome, Role, Verdict
from harness.runner.expectations import unmet
from harness.runner.status import known_bug_counts, unjudged

NOT_RUN = (Outcome.NOT_APPLICABLE.value, Outcome.HARNESS_ERROR.value)


def _ran(results: list[dict[str, Any]], spec: str, regression: str) -> dict[str, dict[str, Any]]:
    return {r["case_id"]: r for r in results
            if r["target"] == spec and r["regression"] == regression and r["outcome"] not in NOT_RUN}


def regression_headline(run: dict[str, Any], regression: str) -> list[str]:
    results = run["results"]
    specs_by_role: dict[str, list[str]] = {}
    for target in run["environment"]["targets"]:
        role = target.get("roles", {}).get(regression)
        if role:
            specs_by_role.setdefault(role, []).append(target["spec"])
    lines = []
    if not any(r["expected"] == "affected" for r in results if r["regression"] == regression):
        lines += _without_predictions(results, regression)  # e.g. the generated matrix: the roles say nothing
        specs_by_role = {}
    for spec in specs_by_role.get(Role.UNPATCHED.value, []):
        affected = [r for r in _ran(results, spec, regression).values() if r["expected"] == "affected"]
        reproduced = sum(r["verdict"] == Verdict.REPRODUCED.value for r in affected)
        lines.append(f"{spec} (unpatched) reproduces {reproduced} of {len(affected)} affected cases")
    references = specs_by_role.get(Role.FIXED_UPSTREAM.value, [])
    for spec in specs_by_role.get(Role.PATCHED.value, []):
        ran = _ran(results, spec, regression)
        affected = [r for r in ran.values() if r["expected"] == "affected"]
        fixed = sum(r["verdict"] == Verdict.FIXED.value for r in affected)
        every = " — every one" if affected and fixed == len(affected) else ""
        lines.append(f"{spec} fixes {fixed} of {len(affected)} affected cases{every}")
        for reference in references:
            theirs = _ran(results, reference, regression)
            both = sorted(ran.keys() & theirs.keys())
            differ = [c for c in both if ran[c]["outcome"] != theirs[c]["outcome"]]
            lines.append(f"{spec} matches {reference} on every case both ran ({len(both)})" if not differ else
                         f"{spec} differs from {reference} on {len(differ)} of {len(both)} cases both ran, "
                         f"e.g. {differ[0]}")
    if not specs_by_role.get(Role.PATCHED.value):
        for spec in references:
            affected = [r for r in _ran(results, spec, regression).values() if r["expected"] == "affected"]
            fixed = sum(r["verdict"] == Verdict.FIXED.value for r in affected)
            lines.append(f"{spec} (fixed upstream) passes {fixed} of {len(affected)} affected cases")
    reasons = {t["spec"]: (t.get("role_reasons") or {}).get(regression, "") for t in run["environment"]["targets"]}
    for spec in specs_by_role.get(Role.UNKNOWN.value, []):
        if reasons.get(spec) == "given by the caller":  # the sweep judges every release unknown on purpose
            continue
        affected = [r for r in _ran(results, spec, regression).values() if r["expected"] == "affected"]
        reproduced = sum(r["verdict"] == Verdict.REPRODUCED.value for r in affected)
        lines.append(f"{spec} (role unknown: nothing says whether it has the fix) reproduces {reproduced} of"
                     f" {len(affected)} affected cases; declare it with [expect] {regression} = \"fixed\" or"
                     " \"affected\" in the fork config")
    for spec in dict.fromkeys(r["target"] for r in results):
        if known := known_bug_counts(run, spec, regression):
            lines.append(f"{spec}: {sum(known.values())} cases failed with another catalogue regression's symptom"
                         f" (not judged for {regression}): " + ", ".join(f"{rid} {n}" for rid, n in known.items()))
    causes = Counter((r["target"], r.get("verdict_reason") or "") for r in results
                     if r["regression"] == regression and r["verdict"] == Verdict.HARNESS_ERROR)
    lines += [f"HARNESS ERROR on {spec}: {n} cases: {cause}" for (spec, cause), n in causes.items()]
    gaps = Counter((r["target"], r.get("coverage_gap") or "") for r in results
                   if r["regression"] == regression and r["verdict"] == Verdict.NOT_JUDGED)
    lines += [f"NOT JUDGED on {spec}: {n} cases; {gap}" for (spec, gap), n in gaps.items()]
    lines += [f"COULD NOT BE JUDGED on {spec}: {why}" for spec, rid, why in unjudged(run)
              if rid == regression and spec not in {s for s, _ in causes}]  # a harness error's line says why
    lines += unmet(run, regression)  # first among the attention lines: a declared expectation not met
    bad = Counter(r["verdict"] for r in results if r["regression"] == regression and r["verdict"] in BAD_VERDICTS)
    lines.append("no other failure, regression, harness error or unexpected pass" if not bad else
                 "ATTENTION: " + ", ".join(f"{n} {v}" for v, n in sorted(bad.items())))
    return lines


def _without_predictions(results: list[dict[str, Any]], regression: str) -> list[str]:
    """Where no case is predicted to fail: how many that ran behave as their references, per target."""
    lines = []
    for spec in dict.fromkeys(r["target"] for r in results if r["regression"] == regression):
        ran = _ran(results, spec, regression)
        passed = sum(r["outcome"] == Outcome.PASS.value for r in ran.values())
        lines.append(f"{spec}: {passed} of {len(ran)} cases that ran behave as their references (none is predicted"
                     " to fail)")
    return lines


def headlines(run: dict[str, Any]) -> dict[str, list[str]]:
    return {regression["id"]: regression_headline(run, regression["id"]) for regression in run["regressions"]}
