"""A stored run's status and counts: pure functions of the stored results, computed here once
and read by every renderer, the status line, the review and the diff.

A run is PASS only when no verdict needs a person, no result is missing, no target had a
target-level problem, and every regression was judged on every target it ran on. A run that a
review made carries the review's verdict (`run["review"]`): its reports say what the review says.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.model import BAD_VERDICTS, Role, Verdict

VERDICTS = (*(v.value for v in Verdict), "skipped")  # "skipped": repro.run/1's infeasible cases
BAD = tuple(v.value for v in Verdict if v in BAD_VERDICTS)
# The verdicts that judged the case for its own regression (pass or fail); the others did not.
JUDGED = tuple(v.value for v in (Verdict.REPRODUCED, Verdict.FIXED, Verdict.UNAFFECTED, Verdict.OTHER_FAILURE,
                                 Verdict.REGRESSION, Verdict.UNEXPECTED_PASS))


def target_specs(run: dict[str, Any]) -> list[str]:
    specs = [t["spec"] for t in run["environment"]["targets"]]
    return specs + [s for s in dict.fromkeys(r["target"] for r in run["results"]) if s not in specs]


def counts(run: dict[str, Any], field: str) -> dict[str, Counter[str]]:
    table: dict[str, Counter[str]] = {spec: Counter() for spec in target_specs(run)}
    for record in run["results"]:
        table[record["target"]][record[field]] += 1
    return table


def _regression_of(record: dict[str, Any]) -> str:
    return record.get("regression") or record["case_id"].partition(":")[0]


def unjudged(run: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, regression, why) for each regression none of whose cases was judged on a target
    that ran it, except where the release predates it: nothing judged is never a pass."""
    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in run["results"]:
        by_pair.setdefault((record["target"], _regression_of(record)), []).append(record)
    roles = {t["spec"]: t.get("roles") or {} for t in run["environment"]["targets"]}
    found = []
    for (spec, regression), records in by_pair.items():
        if any(r["verdict"] in JUDGED for r in records) or roles.get(spec, {}).get(regression) == Role.PREDATES.value:
            continue
        reasons = Counter(r.get("verdict_reason") or r["verdict"] for r in records)
        why, _ = reasons.most_common(1)[0]
        found.append((spec, regression, f"none of its {len(records)} cases was judged ({why})"))
    return found


def unjudged_lines(run: dict[str, Any]) -> list[str]:
    return [f"{regression} could not be judged on {spec}: {why}" for spec, regression, why in unjudged(run)]


def known_bug_counts(run: dict[str, Any], spec: str, regression: str) -> Counter[str]:
    """Per other regression, how many of this regression's cases on the target showed its symptom."""
    return Counter(r.get("attributed_to") or "?" for r in run["results"]
                   if r["target"] == spec and _regression_of(r) == regression and r["verdict"] == Verdict.KNOWN_BUG)


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The run's status and counts, from the stored results only (a pure function).

    FAIL when a verdict needs a person (BAD), the run is incomplete, a target had a problem, a
    record was rejected, a regression could not be judged, or the review that made the run says FAIL."""
    verdicts = Counter(r["verdict"] for r in run["results"])
    bad = sum(verdicts[v] for v in BAD)
    missing = run.get("missing") or 0
    complete = bool(run.get("complete", True)) and not missing
    review = run.get("review")
    if review:
        reasons = list(review.get("fail_reasons") or [])
    else:
        reasons = [f"{verdicts[v]} {v}" for v in BAD if verdicts[v]]
        reasons += [p["problem"] for p in run.get("target_problems") or []]
        if rejected := run.get("rejected"):  # something tried to write results that are not its own
            reasons.append(f"{len(rejected)} records rejected (the first: {rejected[0]})")
        reasons += unjudged_lines(run)
        if not complete:
            reasons.append(f"incomplete: {missing if run.get('missing') is not None else 'unknown number of'}"
                           " results missing")
    excluded = sum(n for by_reason in (run.get("excluded") or {}).values() for n in by_reason.values())
    ran = [r for r in run["results"] if r["outcome"] != "skipped"]  # repro.run/1 stored infeasible cases as skipped
    excluded += len({r["case_id"] for r in run["results"]} - {r["case_id"] for r in ran})
    return {
        "status": "FAIL" if reasons or (review and review.get("status") != "PASS") else "PASS",
        "fail_reasons": reasons, "review": bool(review),
        "recommendation": (review or {}).get("recommendation"),
        "results": len(ran), "cases": len({r["case_id"] for r in ran}),
        "targets": len(target_specs(run)), "missing": run.get("missing"), "complete": complete,
        "excluded": excluded, "needs_attention": bad,
        "verdicts": {v: verdicts[v] for v in VERDICTS if verdicts[v]},
        "by_target": {spec: dict(c) for spec, c in counts(run, "verdict").items()},
        "elapsed_s": run.get("elapsed_s", (run.get("summary") or {}).get("elapsed_s")),
    }
