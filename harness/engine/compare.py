"""The judge's side of a case: two raw observations (the target's and the reference's, as
plain data from harness.engine.calls or a scenario's trial) compared, and the result's fields.

It runs in the session's controller, a process that never imports a target, so nothing a
target does at import or in a case can change a tolerance, a check or an outcome.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cases.case import Case
from cases.deviations import split_known
from cases.regressions import REGRESSIONS
from harness.engine import checks, message
from harness.engine.subject import DTYPES
from harness.model import Outcome

OUTCOME_OF_CHECK = {
    "completion": Outcome.CRASH, "outputs": Outcome.WRONG_OUTPUT, "output_requires_grad": Outcome.WRONG_OUTPUT,
    "gradients": Outcome.WRONG_GRAD, "caller_tensors": Outcome.SIDE_EFFECT,
    "observations": Outcome.SIDE_EFFECT,  # a regression's own scenario: what its steps observed differs
}
REFERENCE_FAILED = "the unfused reference itself failed"
UNFUSED = "fused vs unfused TE"
# Errors the CPU backend raises where it stands in for what it lacks (harness/targets/cpu_backend/extension.py).
BACKEND_LIMITS = ("MissingKernel",)


def _observation_differences(test: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    return [f"{key}: {test.get(key)!r}, reference {reference.get(key)!r}"
            for key in dict.fromkeys([*reference, *test]) if test.get(key) != reference.get(key)]


def failed_checks(test: dict[str, Any], reference: dict[str, Any], crashed: bool,
                  label: str | None = None, compute: torch.dtype | None = None) -> dict[str, list[str]]:
    """Each failed check's descriptions. Outputs are compared per call ("call N", or `label` for
    a scenario's steps), with their requires_grad where both sides recorded it; after a crash
    only the caller's tensors' flags are comparable. `compute`: the dtype the case computes in,
    which bounds how close its tensors can be (checks.tolerance_for)."""
    failed: dict[str, list[str]] = {}
    if differences := _observation_differences(test.get("observed") or {}, reference.get("observed") or {}):
        failed["observations"] = differences
    if not crashed:
        if len(test["outputs"]) != len(reference["outputs"]):  # every call, observed or missing
            failed["outputs"] = [f"{len(test['outputs'])} calls observed, reference {len(reference['outputs'])}"]
        if "requires_grad" in reference and len(test.get("requires_grad") or []) != len(reference["requires_grad"]):
            counts = len(test.get("requires_grad") or []), len(reference["requires_grad"])
            failed["output_requires_grad"] = [f"requires_grad of {counts[0]} calls, reference {counts[1]}"]
        flags = zip(test.get("requires_grad") or [], reference.get("requires_grad") or [])
        for call, (actual, expected) in enumerate(zip(test["outputs"], reference["outputs"])):
            what = label or f"call {call + 1}"
            if f := checks.check_outputs(actual, expected, what, compute):
                failed.setdefault("outputs", []).extend(f)
        for call, (actual_flags, expected_flags) in enumerate(flags):
            what = label or f"call {call + 1}"
            if f := checks.check_requires_grad_flags(actual_flags, expected_flags, what):
                failed.setdefault("output_requires_grad", []).extend(f)
        if f := checks.check_gradients(test["grads"], reference["grads"], compute):
            failed["gradients"] = f
    if f := checks.check_caller_tensors(test["before"], test["after"], reference["before"], reference["after"],
                                        flags_only=crashed):
        failed["caller_tensors"] = f
    return failed


def checked(case: Case, failed: dict[str, list[str]], error: dict[str, Any] | None, started: float,
            note: str | None = None, version: str = "") -> dict[str, Any]:
    """The observation from the checks' failures: those a known deviation of the case's
    regression explains set apart, a crash first, the outcome from the first failed check."""
    failed, known = split_known(case, REGRESSIONS[case.regression].deviations, failed, version)
    if error is not None:
        failed = {"completion": [f"{error['type']}: {error['message'].splitlines()[0] if error['message'] else ''}"],
                  **failed}
    outcome = next((OUTCOME_OF_CHECK[c] for c in OUTCOME_OF_CHECK if c in failed), Outcome.PASS)
    record = observation(outcome, failed, error, started, note=note)
    record["known_deviations"] = known
    return record


def observation(outcome: Outcome, failed: dict[str, list[str]], error: dict[str, Any] | None, started: float,
                note: str | None = None, duration_s: float | None = None) -> dict[str, Any]:
    return {
        "outcome": outcome.value, "failed_checks": list(failed), "error": error, "details": failed,
        "side_effects": failed.get("caller_tensors", []), "known_deviations": [], "note": note,
        "duration_s": round(time.perf_counter() - started, 6) if duration_s is None else duration_s,
    }


def _compute_dtype(case: Case) -> torch.dtype | None:
    """The dtype a case's computation runs in (its `dtype` axis), when it has one."""
    return DTYPES.get(str(getattr(case, "dtype", "")))


def compared(case: Case, raw: dict[str, Any], reference: dict[str, Any], version: str) -> dict[str, Any]:
    """A case's observed fields from the target's raw observation and the reference's.
    `raw`: the worker's, with its `test` side (and a `reference` side where the reference needs
    the target, Megatron's block's; harness.engine.reference), the `error` that ended the test
    side, and the observed fields it brings (`fields`: only those harness.engine.message allows,
    so none can set an outcome, a target or a case id); `reference`: a side, or its `error`."""
    started = time.perf_counter()
    duration = raw.get("duration_s", 0.0)
    if reference.get("error") is not None:
        return observation(Outcome.HARNESS_ERROR, {"reference": [REFERENCE_FAILED]}, reference["error"], started,
                           note=REFERENCE_FAILED, duration_s=duration)
    error = raw.get("error")
    if error is not None and error.get("type") in BACKEND_LIMITS:  # the harness's gap, never TE's failure
        note = f"the CPU backend cannot run this case: {error['message'].splitlines()[0] if error['message'] else ''}"
        return observation(Outcome.HARNESS_ERROR, {"harness": [note]}, error, started, note=note, duration_s=duration)
    failed = failed_checks(raw["test"], reference, error is not None, raw.get("label"), _compute_dtype(case))
    unfused = None
    if "unfused" in raw:
        unfused = _against_unfused(case, raw, failed)
    record = checked(case, failed, error, started, raw.get("note"), version)
    record["duration_s"] = duration
    record.update(message.fields_of(raw))
    if unfused is not None:
        record["unfused_te"] = unfused
    return record


def _against_unfused(case: Case, raw: dict[str, Any], failed: dict[str, list[str]]) -> str:
    """The second oracle of a generated case: the fused call against TE's own ops run one
    Sequential each. Its differences join the checks' failures, marked; returns what it said."""
    unfused = raw["unfused"]
    if unfused.get("error") is not None:  # no second oracle for this case; the first one still judged it
        return f"failed: {unfused['error']['type']}"
    differences = failed_checks(raw["test"], unfused, raw.get("error") is not None, raw.get("label"),
                                _compute_dtype(case))
    for check, descriptions in differences.items():
        failed.setdefault(check, []).extend(f"{UNFUSED}: {d}" for d in descriptions)
    # The fused call raised where the same ops unfused completed: the fusion alone fails.
    return "differs" if differences or raw.get("error") is not None else "agrees"
