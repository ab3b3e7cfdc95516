"""What a scenario is: the steps a case takes on the loaded target and on the unfused
reference, and what is observed. A regression brings its own scenario or picks one from
the shared library (cases/scenarios.py), in the style of PyTorch's ModuleInfo, where each
entry brings its own `module_inputs_func`.

The engine (harness/engine) runs any scenario the same way: the reference's steps, then
the target's, each with the caller's tensors snapshotted before and after; it records
completion with the innermost TE frame, the outputs, the gradients of the declared
parameters, the caller's tensors, and the scenario's own observations (each compared
with the reference's), then runs the trial's `cleanup` whatever happened, so no state is
left in the worker for the next case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cases.case import Case


@dataclass
class Steps:
    """One side of a trial. `run` does the steps and returns the outputs to compare;
    it writes what it sees into `observed` as it goes, so an observation made before a
    crash is kept."""

    run: Callable[[], tuple[Any, ...]]
    caller: dict[str, Any] = field(default_factory=dict)  # the caller's tensors, checked as in every scenario
    params: dict[str, Any] = field(default_factory=dict)  # tensors whose .grad is compared after the steps
    observed: dict[str, Any] = field(default_factory=dict)  # scenario observations, e.g. "payload_executed"


@dataclass
class Trial:
    test: Steps  # on the loaded target
    reference: Steps  # the same steps, unfused plain PyTorch
    cleanup: Callable[[], None] = lambda: None  # undoes what the steps changed in the process


def never(case: Case) -> None:
    return None


@dataclass(frozen=True)
class Scenario:
    """A kind of trigger. `axes` are the axes it can vary, in case-id order (a regression
    varies these or fewer); `exclude` says why a combination cannot run; `trial` builds a
    case's steps on a loaded target (None: the engine's built-in call scenario, see
    cases/scenarios.py); `applicable` says why the loaded target cannot take the case
    (an API it lacks), or None; `standalone` writes the case's steps as a script that needs
    only torch and TE, or is None when no such script can be written."""

    name: str
    description: str
    axes: dict[str, tuple[str, ...]]
    exclude: Callable[[Case], str | None] = never
    trial: Callable[[Case, Any], Trial] | None = None
    applicable: Callable[[Case, Any], str | None] = lambda case, target: None
    # (case, target spec) -> script source; the call scenario's is the engine's (harness.engine.standalone)
    standalone: Callable[[Case, str], str] | None = None
    standalone_refusal: Callable[[Case], str | None] = never  # why this case has no standalone script
