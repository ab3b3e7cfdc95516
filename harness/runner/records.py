"""Result records: one per (case, target), as streamed to results.jsonl and kept in run.json.

A record is the observation (from the engine), the prediction (from the case's
regression) and the verdict (their comparison, given the target's role), in the shape
of `harness.model.CaseResult`.
"""

from __future__ import annotations

from typing import Any

from cases.case import Case
from cases.clients import needs_megatron
from cases.regressions import REGRESSIONS
from harness.errors import TargetLoadError
from harness.model import SCHEMA, Outcome, Role
from harness.runner.textsafe import safe_value
from harness.runner.verdicts import judge as judged_by_rules
from harness.runner.verdicts import known_bugs

__all__ = ["SCHEMA", "judge", "lost_case_record"]


def finish(case: Case, spec: str, role: Role, observed: dict[str, Any],
           roles: dict[str, str] | None = None) -> dict[str, Any]:
    """The full record: the case's axes, the observation, the prediction, the verdict (against
    every regression of the catalogue, given the tree's `roles` for each), and whether a
    standalone reproducer can be written for it; its strings safe to send and store
    (harness.runner.textsafe), whatever the target raised."""
    from harness.engine.standalone import standalone_refusal

    observed = safe_value(observed)
    prediction = REGRESSIONS[case.regression].predict(case)
    found = judged_by_rules(prediction, observed, role, known_bugs(REGRESSIONS, roles or {}, case.regression))
    refusal = standalone_refusal(case)
    return {
        "case_id": case.case_id, "target": spec, **case.as_dict(), **observed,
        "standalone": refusal is None, "standalone_refusal": refusal,
        "expected": prediction.expected,
        "predicted": prediction.rule.symptom.description if prediction.rule else None,
        "rule": prediction.rule.name if prediction.rule else None,
        "role": role.value, "verdict": found.verdict.value, "verdict_reason": found.reason,
        "attributed_to": found.attributed_to, "symptom": found.symptom,
    }


def _not_run(outcome: Outcome, check: str, note: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"outcome": outcome.value, "failed_checks": [check] if outcome is Outcome.HARNESS_ERROR else [],
            "details": {}, "error": error, "side_effects": [], "known_deviations": [], "note": note, "duration_s": 0.0}


def judge(case: Case, spec: str, target: Any, role: Role, megatron_error: str | None = None,
          roles: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one case on a loaded target (or record why it cannot run), filed under `spec`
    even when the target never loaded, so its results are counted, never lost. `roles`: the
    tree's role for every regression of the catalogue, so a failure that is another's is named."""
    from harness.engine.execute import call_not_applicable, coverage_gap, run_case
    from harness.engine.trial import run_trial

    if isinstance(target, TargetLoadError):
        return finish(case, spec, role, _not_run(Outcome.HARNESS_ERROR, "load", str(target)))
    if needs_megatron(case) and megatron_error:
        return finish(case, spec, role, _not_run(Outcome.HARNESS_ERROR, "megatron", megatron_error))
    regression = REGRESSIONS[case.regression]
    scenario = regression.scenario
    try:
        own = regression.applicable(target) or scenario.applicable(case, target)
        why = (f"not applicable on this release: {spec}: {own}" if own
               else call_not_applicable(case, target, spec) if scenario.trial is None else None)
        if why:
            gap = coverage_gap(case, target) if not own else None
            return finish(case, spec, role, {**_not_run(Outcome.NOT_APPLICABLE, "applicability", why),
                                             **({"coverage_gap": gap} if gap else {})}, roles)
        observed = run_case(case, target) if scenario.trial is None else run_trial(case, target, scenario)
    except Exception as exc:  # noqa: BLE001 — a failure of the harness itself, never a pass
        observed = _not_run(Outcome.HARNESS_ERROR, "harness", "the harness failed building or judging the case",
                            {"type": type(exc).__name__, "message": str(exc), "location": None})
    return finish(case, spec, role, observed, roles)


LOST_TYPES = {"worker died": "WorkerDied", "per-case timeout": "Timeout",
              "the session's controller died": "ControllerDied"}


def lost_case_record(case_id: str, spec: str, role: Role, why: str, text: str,
                     error_type: str | None = None) -> dict[str, Any]:
    """The record for a case that never wrote its own: its worker or its session's controller
    died, it hung, or it raised what ends a case (`error_type`: that exception's type)."""
    error = {"type": error_type or LOST_TYPES.get(why, "Timeout"), "message": why, "location": None,
             "traceback": text[-4000:]}
    observed = {**_not_run(Outcome.CRASH, "completion", why, error), "failed_checks": ["completion"]}
    return finish(Case.from_id(case_id), spec, role, observed)
