"""Verdicts: an observation judged against its regression's rule and the target's role.
Pure functions of stored facts, so a stored run keeps the meaning it was judged with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cases.regression import Prediction
from harness.model import Outcome, Role, Verdict

EXPECTS_BUG = (Role.UNPATCHED, Role.UNKNOWN)


def verdict(prediction: Prediction, observation: Mapping[str, Any], role: Role) -> tuple[Verdict, str]:
    outcome = Outcome(observation["outcome"])
    if outcome is Outcome.HARNESS_ERROR:
        return Verdict.HARNESS_ERROR, "the harness could not run or judge the case"
    if outcome is Outcome.NOT_APPLICABLE:
        return Verdict.NOT_APPLICABLE, observation.get("note") or "not applicable on this release"
    failed = outcome is not Outcome.PASS
    if prediction.rule is None:
        if failed:
            return Verdict.REGRESSION, f"no rule predicts a failure here ({prediction.reason}), observed {outcome}"
        return Verdict.UNAFFECTED, prediction.reason
    symptom = prediction.rule.symptom
    matched = symptom.matches(observation)
    # A declared fixed behaviour (a clear refusal) counts as fixed, never a different failure.
    as_fixed = next((b for b in prediction.fixed_behaviours if failed and b.matches(observation)), None)
    if role in EXPECTS_BUG:
        if matched:
            return Verdict.REPRODUCED, f"observed the predicted symptom: {symptom.description}"
        if as_fixed and role is Role.UNKNOWN:
            return Verdict.FIXED, f"behaves as a fixed target may: {as_fixed.description}; the target's role is unknown"
        if as_fixed:
            return Verdict.UNEXPECTED_PASS, (f"predicted {symptom.description} on an unpatched target; it behaves "
                                             f"as a fixed one: {as_fixed.description}")
        if failed:
            return Verdict.OTHER_FAILURE, f"predicted {symptom.description}; observed {outcome} without it"
        if role is Role.UNKNOWN:
            return Verdict.FIXED, "passes; the target's role is unknown"
        return Verdict.UNEXPECTED_PASS, f"predicted {symptom.description} on an unpatched target; it passed"
    if as_fixed:
        return Verdict.FIXED, f"behaves as declared for a fixed target: {as_fixed.description}"
    if failed:
        what = "the predicted symptom" if matched else f"{outcome}"
        return Verdict.REGRESSION, f"a {role} target was expected to pass; observed {what}"
    if role is Role.PREDATES:
        return Verdict.UNAFFECTED, "the release predates the regression and passes"
    return Verdict.FIXED, f"passes on a {role} target"
