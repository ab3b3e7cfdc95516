"""Run a regression's own scenario (cases/scenario.py): the target's steps in the worker that
loaded it, sent raw; the reference's steps, built from the case alone, where the judge runs them,
in a process that never imported a target (harness.engine.reference); the two compared by the
judge the way the call scenario is (harness.engine.compare).

Recorded: completion with the innermost TE frame, the outputs, the gradients of the
declared parameters, the caller's tensors (also when a crash follows), and each of the
scenario's own observations that differs from the reference's. The trial's cleanup runs
whatever happened, and the process-wide state a scenario may touch (grad mode, default
dtype, environment) is put back, so the next case in this worker starts clean.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from cases.case import Case
from cases.scenario import Scenario, Steps
from harness.engine import calls, checks, compare, seeding, wire
from harness.engine.frames import error_record


@contextlib.contextmanager
def process_state_kept(left_behind: list[str]) -> Iterator[None]:
    """Put back what a scenario may change in the process; name in `left_behind` what it left."""
    grad, dtype, environ = torch.is_grad_enabled(), torch.get_default_dtype(), dict(os.environ)
    try:
        yield
    finally:
        if torch.is_grad_enabled() != grad:
            left_behind.append(f"grad mode {torch.is_grad_enabled()}")
            torch.set_grad_enabled(grad)
        if torch.get_default_dtype() != dtype:
            left_behind.append(f"default dtype {torch.get_default_dtype()}")
            torch.set_default_dtype(dtype)
        if changed := sorted(k for k in {*os.environ, *environ} if os.environ.get(k) != environ.get(k)):
            left_behind.append(f"environment variables {', '.join(changed)}")
            os.environ.clear()
            os.environ.update(environ)


def _side(steps: Steps) -> tuple[dict[str, Any], Exception | None]:
    """What one side's steps observed, as plain data for the judge, and the exception that ended
    them: the outputs, the gradients of the declared parameters, the caller's tensors before and
    after (also after a crash: a side effect followed by a crash is recorded as both), and the
    scenario's own observations made before any crash."""
    before = {n: checks.snapshot(t) for n, t in steps.caller.items()}
    outputs: tuple[Any, ...] = ()
    error = None
    try:
        outputs = tuple(steps.run())
    except Exception as exc:  # noqa: BLE001 — the caller records it
        error = exc
    after = {n: checks.snapshot(t) for n, t in steps.caller.items()}
    return {"outputs": [tuple(o.detach().clone() for o in outputs)], "before": before, "after": after,
            "grads": {n: t.grad for n, t in steps.params.items()}, "observed": dict(steps.observed)}, error


def observe_trial(case: Case, target: Any, scenario: Scenario) -> dict[str, Any]:
    """The raw observation of one case of a scenario with its own steps: the target's side, run
    here, judged outside this process against the reference the judge runs (`reference_side`)."""
    assert scenario.trial is not None
    started = time.perf_counter()
    seeding.manual_seed(calls.case_seed(case))
    left_behind: list[str] = []
    raw: dict[str, Any] = {"label": "steps", "error": None}
    with process_state_kept(left_behind):
        trial = scenario.trial(case, target)
        try:
            test, error = _side(trial.test)
            raw.update(test=wire.pack(test), error=error_record(error, target.te_dir) if error else None)
        finally:
            trial.cleanup()
    raw["note"] = f"the scenario left {'; '.join(left_behind)} changed (put back)" if left_behind else None
    raw["fields"] = {"observations": wire.pack(trial.test.observed)}
    raw["duration_s"] = round(time.perf_counter() - started, 6)
    return raw


def reference_side(case: Case, scenario: Scenario) -> dict[str, Any]:
    """The reference's side of one trial case, packed, or {"error": ...} when it failed itself: the
    scenario's reference steps, built from the case alone (no target), under the process's state
    put back afterwards (the judge's process goes on judging)."""
    assert scenario.reference is not None
    with process_state_kept([]):
        side, error = _side(scenario.reference(case))
    return {"error": error_record(error, None)} if error is not None else wire.pack(side)


def run_trial(case: Case, target: Any, scenario: Scenario) -> dict[str, Any]:
    """Observe and judge one trial case in this process (tests); a run judges in the runner."""
    raw = wire.unpack(observe_trial(case, target, scenario))
    return compare.compared(case, raw, wire.unpack(reference_side(case, scenario)), target.prepared.version)
