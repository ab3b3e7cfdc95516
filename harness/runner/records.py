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
from harness.errors import TargetLoadError, UsageError
from harness.model import SCHEMA, Outcome, Role
from harness.runner.textsafe import safe_value
from harness.runner.verdicts import judge as judged_by_rules
from harness.runner.verdicts import known_bugs, lost_coverage

__all__ = ["SCHEMA", "judge", "lost_case_record"]


def finish(case: Case, spec: str, role: Role, observed: dict[str, Any],
           roles: dict[str, str] | None = None, version: str | None = None) -> dict[str, Any]:
    """The full record: the case's axes, the observation, the prediction, the verdict (against
    every regression of the catalogue, given the tree's `roles` for each), and whether a
    standalone reproducer can be written for it; its strings safe to send and store
    (harness.runner.textsafe), whatever the target raised."""
    from harness.engine.standalone import standalone_refusal

    observed = safe_value(observed)
    prediction = REGRESSIONS[case.regression].predict(case, version)  # the symptom on the target's release
    if not observed.get("coverage_gap") and (gap := lost_coverage(prediction, observed, role, _release(spec))):
        observed = {**observed, "coverage_gap": gap}
    found = judged_by_rules(prediction, observed, role, known_bugs(REGRESSIONS, roles or {}, case.regression))
    refusal = standalone_refusal(case)
    own = {"case_id": case.case_id, "target": spec, **case.as_dict()}
    return {
        **own, **observed, **own,  # where the record is filed is the judge's, whatever an observation holds
        "standalone": refusal is None, "standalone_refusal": refusal,
        "expected": prediction.expected,
        "predicted": prediction.rule.symptom.description if prediction.rule else None,
        "rule": prediction.rule.name if prediction.rule else None,
        "role": role.value, "verdict": found.verdict.value, "verdict_reason": found.reason,
        "attributed_to": found.attributed_to, "symptom": found.symptom,
    }


def _release(spec: str) -> bool:
    """Whether a target is an upstream release (`te-X.Y.Z`, with or without our patch): decided from
    the spec the run was given, never from anything the target says."""
    from harness.targets import parse_spec

    try:
        return parse_spec(spec).kind == "wheel"
    except UsageError:  # an older run's spec, or none the harness knows: a tree
        return False


def _not_run(outcome: Outcome, check: str, note: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"outcome": outcome.value, "failed_checks": [check] if outcome is Outcome.HARNESS_ERROR else [],
            "details": {}, "error": error, "side_effects": [], "known_deviations": [], "note": note, "duration_s": 0.0}


NOT_RUN = (Outcome.NOT_APPLICABLE.value, Outcome.HARNESS_ERROR.value)  # what a worker may say without sides


def observe(case: Case, spec: str, target: Any, megatron_error: str | None = None) -> dict[str, Any]:
    """The worker's part: run one case on a loaded target, or say why it cannot run, as a raw
    observation (harness.engine.execute, harness.engine.trial) for the judge (`judged`). Its
    `observed` holds the fields of a case that did not run; a case that ran brings its sides."""
    from harness.engine.execute import call_not_applicable, coverage_gap, observe_case
    from harness.engine.trial import observe_trial

    if isinstance(target, TargetLoadError):
        return {"observed": _not_run(Outcome.HARNESS_ERROR, "load", str(target))}
    if needs_megatron(case) and megatron_error:
        return {"observed": _not_run(Outcome.HARNESS_ERROR, "megatron", megatron_error)}
    regression = REGRESSIONS[case.regression]
    scenario = regression.scenario
    try:
        own = regression.applicable(target) or scenario.applicable(case, target)
        why = (f"not applicable on this release: {spec}: {own}" if own
               else call_not_applicable(case, target, spec) if scenario.trial is None else None)
        if why:
            gap = coverage_gap(case, target) if not own else None
            return {"observed": {**_not_run(Outcome.NOT_APPLICABLE, "applicability", why),
                                 **({"coverage_gap": gap} if gap else {})}}
        from harness.targets.cpu_backend.device import answered_calls

        with answered_calls() as answered:
            raw = observe_case(case, target) if scenario.trial is None else observe_trial(case, target, scenario)
        if answered:
            raw.setdefault("fields", {})["device_calls"] = sorted(answered)
        return raw
    except Exception as exc:  # noqa: BLE001 — a failure of the harness itself, never a pass
        return {"observed": _harness_failure(exc, "the harness failed building or running the case")}


def _harness_failure(exc: BaseException, note: str) -> dict[str, Any]:
    return _not_run(Outcome.HARNESS_ERROR, "harness", note,
                    {"type": type(exc).__name__, "message": str(exc), "location": None})


def judged(case: Case, spec: str, role: Role, raw: Any, reference: dict[str, Any] | None,
           version: str, roles: dict[str, str] | None = None) -> dict[str, Any]:
    """The judge's part, outside the target's process: the raw observation a worker sent compared
    with the reference (the one given for this case, else the side the worker ran beside the
    target, else plain PyTorch's computed here), then judged. A raw observation that is not one
    is a harness error of the case, never a pass."""
    from harness.engine import compare, message, wire
    from harness.engine.reference import REFERENCE_FROM_TARGET, independent, reference_side

    try:
        if not isinstance(raw, dict):
            raise wire.WireError("it is not a mapping")
        if "observed" in raw and isinstance(raw["observed"], dict) and raw["observed"].get("outcome") not in NOT_RUN:
            # A case that ran brings its sides, never a verdict (said first: it is what such a worker tried).
            raise wire.WireError(f"it claims outcome {raw['observed'].get('outcome')!r} without the sides it observed")
        message.check(raw)  # only the fields a worker may send; the record's others are made here
        if "lost" in raw:
            lost = raw["lost"]
            return lost_case_record(case.case_id, spec, role, str(lost["why"]), str(lost["text"]),
                                    None if lost.get("error_type") is None else str(lost["error_type"]))
        if "observed" in raw:
            observed = _not_run_claim(raw["observed"])
        else:
            # A reference that needs no target is never the worker's to send: one it sends is not read.
            side = (reference if reference is not None else reference_side(case)) if independent(case) \
                else raw.get("reference")
            if side is None:
                raise wire.WireError("no reference side came with it")
            observed = compare.compared(case, wire.unpack(raw), wire.unpack(side), version)
            if not independent(case):
                observed["reference_from"] = REFERENCE_FROM_TARGET
    except Exception as exc:  # noqa: BLE001 — a malformed observation: the harness could not judge it
        observed = _harness_failure(exc, f"the worker's observation could not be judged: {exc}")
    if isinstance(raw, dict) and (changed := raw.get("state_changes")):
        observed = _with_state_changes(observed, [str(c) for c in changed])
    return finish(case, spec, role, observed, roles, version)


NOT_RUN_CHECKS = ("load", "megatron", "harness")  # what stopped a case that did not run (a harness error)


def _not_run_claim(claim: Any) -> dict[str, Any]:
    """A worker's word that a case did not run, made into the judge's observation: only its
    outcome (not applicable, or a harness error and the step that failed), note, error and
    coverage gap are the worker's; a case that did not run observed nothing else."""
    from harness.engine.message import check_error
    from harness.engine.wire import WireError

    if not isinstance(claim, dict) or claim.get("outcome") not in NOT_RUN:
        raise WireError("its not-run observation is not one (a mapping whose outcome is one of "
                        f"{', '.join(NOT_RUN)})")
    outcome = Outcome(claim["outcome"])
    checks = claim.get("failed_checks") or []
    if outcome is Outcome.HARNESS_ERROR and (len(checks) != 1 or checks[0] not in NOT_RUN_CHECKS):
        raise WireError(f"a harness error that did not run names failed checks {checks!r}, not one of "
                        f"{', '.join(NOT_RUN_CHECKS)}")
    if outcome is Outcome.NOT_APPLICABLE and checks:
        raise WireError(f"a case not applicable names failed checks {checks!r}")
    if any(claim.get(k) for k in ("details", "side_effects", "known_deviations", "duration_s")):
        raise WireError("a case that did not run claims details, side effects, known deviations or a duration")
    note, error, gap = claim.get("note"), claim.get("error"), claim.get("coverage_gap")
    if not isinstance(note, str) or not isinstance(gap, (str, type(None))):
        raise WireError("its not-run observation's note or coverage gap is not text")
    check_error(error, "not-run observation's error")
    observed = _not_run(outcome, checks[0] if checks else "applicability", note, error)
    return {**observed, "coverage_gap": gap} if gap else observed


def _with_state_changes(observed: dict[str, Any], changed: list[str]) -> dict[str, Any]:
    """A case that left the process's global state changed: named in the record, and a harness
    error (the observation may have been made under another state)."""
    note = "the case changed global state the checks depend on (restored): " + "; ".join(changed)
    return {**observed, "outcome": Outcome.HARNESS_ERROR.value, "failed_checks":
            [*observed["failed_checks"], "global_state"], "details": {**observed["details"], "global_state": changed},
            "note": note}


def judge(case: Case, spec: str, target: Any, role: Role, megatron_error: str | None = None,
          roles: dict[str, str] | None = None) -> dict[str, Any]:
    """Observe and judge one case in this process (a load failure recorded by the controller,
    `repro show --script`); filed under `spec` even when the target never loaded, so its results
    are counted, never lost."""
    version = "" if isinstance(target, TargetLoadError) else target.prepared.version
    return judged(case, spec, role, observe(case, spec, target, megatron_error), None, version, roles)


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
