"""Declared expectations (`[expect]` in a fork config) against what a run observed: one line
per target and regression whose declaration was not met, naming both."""

from __future__ import annotations

from typing import Any

from harness.model import Outcome

NOT_RUN = (Outcome.NOT_APPLICABLE.value, Outcome.HARNESS_ERROR.value)


def unmet(run: dict[str, Any], regression: str) -> list[str]:
    """A tree declared fixed that fails an affected case, or declared affected that passes every one."""
    lines = []
    for target in run["environment"]["targets"]:
        declared = (target.get("expectations") or {}).get(regression)
        if declared is None:
            continue
        affected = [r for r in run["results"] if r["target"] == target["spec"] and r["regression"] == regression
                    and r["expected"] == "affected" and r["outcome"] not in NOT_RUN]
        failing = [r for r in affected if r["outcome"] != Outcome.PASS.value]
        if declared == "fixed" and failing:
            lines.append(f"REGRESSION {regression} on {target['spec']}: declared fixed, yet it fails {len(failing)} of"
                         f" {len(affected)} affected cases (e.g. {failing[0]['case_id']})")
        elif declared == "affected" and affected and not failing:
            lines.append(f"UNMET EXPECTATION {regression} on {target['spec']}: declared affected, yet it passes every"
                         f" one of {len(affected)} affected cases")
    return lines


def all_unmet(run: dict[str, Any]) -> list[str]:
    return [line for regression in run["regressions"] for line in unmet(run, regression["id"])]
