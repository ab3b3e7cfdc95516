"""Verdicts: an observation judged against its regression's rule, the target's role, and every
other regression of the catalogue. Pure functions of stored facts, so a stored run keeps the
meaning it was judged with.

A failure that is not the predicted symptom of the case's own regression is looked up among
the others' symptoms: on a tree expected to have that other bug it is a `known_bug`, named;
on a tree expected to be fixed for it, a `regression` that names it (the bug came back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cases.regression import Prediction, Regression, Symptom
from harness.model import Outcome, Role, Verdict

EXPECTS_BUG = (Role.UNPATCHED, Role.UNKNOWN)


@dataclass(frozen=True)
class KnownBug:
    """Another regression of the catalogue, as the judge needs it: its symptoms and the tree's role for it."""

    regression: str
    role: Role
    symptoms: tuple[Symptom, ...]


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str
    attributed_to: str | None = None  # the other regression whose symptom the failure is
    symptom: bool = False  # the case's own regression's predicted symptom was observed (whatever the role)


def known_bugs(catalogue: Mapping[str, Regression], roles: Mapping[str, str], own: str) -> tuple[KnownBug, ...]:
    """Every regression but `own`, with the tree's role for it (unknown where none was computed)."""
    return tuple(KnownBug(rid, Role(roles.get(rid, Role.UNKNOWN.value)), tuple(s for r in reg.rules for s in r.symptoms))
                 for rid, reg in catalogue.items() if rid != own)


def lost_coverage(prediction: Prediction, observation: Mapping[str, Any], role: Role, release: bool) -> str | None:
    """Why a case that came back not applicable is coverage the run lost, or None: a rule predicts
    it affected, on a tree that is not an upstream release (`release`: a `te-X.Y.Z` spec, with or
    without our patch) and not before the bug's releases (there the case shows the bug or its fix).
    Only the target's own process can say a case does not apply, so a tree could make exactly its
    affected cases vanish that way; a release's word is taken (its API may not exist yet)."""
    if (observation.get("outcome") != Outcome.NOT_APPLICABLE or prediction.rule is None or release
            or role is Role.PREDATES):
        return None
    return (f"lost coverage: the rules predict this case affected and the tree ({role}) says it cannot run it; only"
            " a release is taken at its word, and a run never passes on cases that did not run")


def attribute(observation: Mapping[str, Any], known: Sequence[KnownBug]) -> tuple[KnownBug, Symptom] | None:
    """The other regression whose symptom the observed failure is, preferring one the tree is expected to have."""
    found = [(bug, s) for bug in known for s in bug.symptoms if s.matches(observation)]
    found.sort(key=lambda hit: hit[0].role not in EXPECTS_BUG)
    return found[0] if found else None


def judge(prediction: Prediction, observation: Mapping[str, Any], role: Role,
          known: Sequence[KnownBug] = ()) -> Judgement:
    """The verdict of one observation; `known`: the catalogue's other regressions."""
    outcome = Outcome(observation["outcome"])
    if outcome is Outcome.HARNESS_ERROR:
        return Judgement(*verdict(prediction, observation, role))
    if outcome is Outcome.NOT_APPLICABLE:
        note = observation.get("note") or "not applicable on this release"
        if gap := observation.get("coverage_gap"):
            return Judgement(Verdict.NOT_JUDGED, f"{note}; {gap}")
        return Judgement(Verdict.NOT_APPLICABLE, note)
    failed = outcome is not Outcome.PASS
    ours = prediction.rule is not None and prediction.rule.observed(observation) is not None
    ours = ours or any(b.matches(observation) for b in prediction.fixed_behaviours)
    if failed and not ours and (other := attribute(observation, known)):
        bug, symptom = other
        if bug.role in EXPECTS_BUG:
            return Judgement(Verdict.KNOWN_BUG, f"{bug.regression}'s symptom: {symptom.description} (the tree is"
                                                f" {bug.role} for {bug.regression}); not judged for this regression",
                             bug.regression)
        return Judgement(Verdict.REGRESSION, f"{bug.regression}'s symptom: {symptom.description}, on a tree"
                                             f" {bug.role} for {bug.regression}: it came back", bug.regression)
    verdict_, reason = verdict(prediction, observation, role)
    return Judgement(verdict_, reason, symptom=failed and prediction.rule is not None
                     and prediction.rule.observed(observation) is not None)


def verdict(prediction: Prediction, observation: Mapping[str, Any], role: Role) -> tuple[Verdict, str]:
    """The verdict against the case's own regression alone."""
    outcome = Outcome(observation["outcome"])
    if outcome is Outcome.HARNESS_ERROR:  # its cause, so that it reaches every report once per target
        return Verdict.HARNESS_ERROR, observation.get("note") or "the harness could not run or judge the case"
    if outcome is Outcome.NOT_APPLICABLE:
        return Verdict.NOT_APPLICABLE, observation.get("note") or "not applicable on this release"
    failed = outcome is not Outcome.PASS
    if prediction.rule is None:
        if failed:
            return Verdict.REGRESSION, f"no rule predicts a failure here ({prediction.reason}), observed {outcome}"
        return Verdict.UNAFFECTED, prediction.reason
    seen = prediction.rule.observed(observation)
    symptom = seen or prediction.rule.symptom
    matched = seen is not None
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
