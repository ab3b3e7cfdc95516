"""Run a regression's own scenario (cases/scenario.py): the reference's steps, then the
target's, compared the way the call scenario is (harness/engine/execute.py).

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
import zlib
from collections.abc import Iterator
from typing import Any

import torch

from cases.case import Case
from cases.scenario import Scenario, Steps
from harness.engine import checks, seeding
from harness.engine.execute import checked, observation
from harness.engine.frames import error_record
from harness.model import Outcome


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


class _Side:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.outputs: tuple[Any, ...] = ()

    def run(self) -> None:
        self.before = {n: checks.snapshot(t) for n, t in self.steps.caller.items()}
        try:
            self.outputs = tuple(self.steps.run())
        finally:  # also after a crash: a side effect followed by a crash is recorded as both
            self.after = {n: checks.snapshot(t) for n, t in self.steps.caller.items()}
        self.output_values = [o.detach().clone() for o in self.outputs]

    @property
    def grads(self) -> dict[str, torch.Tensor | None]:
        return {n: t.grad for n, t in self.steps.params.items()}


def _observation_differences(test: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    return [f"{key}: {test.get(key)!r}, reference {reference.get(key)!r}"
            for key in dict.fromkeys([*reference, *test]) if test.get(key) != reference.get(key)]


def run_trial(case: Case, target: Any, scenario: Scenario) -> dict[str, Any]:
    """Observe one case of a scenario with its own steps: the fields of its result record."""
    assert scenario.trial is not None
    started = time.perf_counter()
    seeding.manual_seed(zlib.crc32(case.case_id.split(":", 1)[1].encode()))
    left_behind: list[str] = []
    error = None
    with process_state_kept(left_behind):
        trial = scenario.trial(case, target)
        try:
            ref, test = _Side(trial.reference), _Side(trial.test)
            try:
                ref.run()
            except Exception as exc:  # noqa: BLE001
                return observation(Outcome.HARNESS_ERROR, {"reference": ["the unfused reference itself failed"]},
                                   error_record(exc, None), started, note="the unfused reference itself failed")
            try:
                test.run()
            except Exception as exc:  # noqa: BLE001 — the observation we exist to record
                error = error_record(exc, target.te_dir)
        finally:
            trial.cleanup()
    failed: dict[str, list[str]] = {}
    if differences := _observation_differences(trial.test.observed, trial.reference.observed):
        failed["observations"] = differences
    if error is None:
        if f := checks.check_outputs(test.output_values, ref.output_values, "steps"):
            failed["outputs"] = f
        if f := checks.check_gradients(test.grads, ref.grads):
            failed["gradients"] = f
    if f := checks.check_caller_tensors(test.before, test.after, ref.before, ref.after, flags_only=error is not None):
        failed["caller_tensors"] = f
    note = f"the scenario left {'; '.join(left_behind)} changed (put back)" if left_behind else None
    record = checked(case, failed, error, started, note, target.prepared.version)
    record["observations"] = trial.test.observed
    return record
