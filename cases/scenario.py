"""What a scenario is: the steps a case takes on the loaded target and on the unfused
reference, and what is observed. A regression brings its own scenario or picks one from
the shared library (cases/scenarios.py), in the style of PyTorch's ModuleInfo, where each
entry brings its own `module_inputs_func`.

The two sides are declared apart: `trial` builds the target's steps in the worker that loaded
the target; `reference` builds the reference's from the case alone, so the run's judge runs them
in a process that never imported a target (a reference a target's worker computed could be the
target's own choice). Each side draws its values from a generator seeded by the case, so both
see the same ones, whatever a target's constructors draw.

The engine (harness/engine) runs each side the same way, with the caller's tensors
snapshotted before and after; the judge compares completion with the innermost TE frame,
the outputs, the gradients of the declared parameters, the caller's tensors, and the
scenario's own observations (each with the reference's). The worker runs the trial's
`cleanup` whatever happened, so no state is left in it for the next case.
"""

from __future__ import annotations

import zlib
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
    test: Steps  # on the loaded target; the reference's steps are the scenario's `reference`
    cleanup: Callable[[], None] = lambda: None  # undoes what the steps changed in the process


def never(case: Case) -> None:
    return None


def case_generator(case: Case) -> Any:
    """A CPU generator seeded by the case's id: the target's side and the reference's, each built
    in its own process, draw the same values from it."""
    import torch  # where a case runs: the CLI reads the catalogue without it

    return torch.Generator().manual_seed(zlib.crc32(case.case_id.encode()))


@dataclass(frozen=True)
class Scenario:
    """A kind of trigger. `axes` are the axes it can vary, in case-id order (a regression
    varies these or fewer); `exclude` says why a combination cannot run; `trial` builds a
    case's steps on a loaded target (None: the engine's built-in call scenario, see
    cases/scenarios.py); `reference` builds the same case's steps in plain PyTorch with no
    target (a scenario with a `trial` must have one); `applicable` says why the loaded target cannot take the case
    (an API it lacks), or None; `standalone` writes the case's steps as a script that needs
    only torch and TE, or is None when no such script can be written."""

    name: str
    description: str
    axes: dict[str, tuple[str, ...]]
    exclude: Callable[[Case], str | None] = never
    trial: Callable[[Case, Any], Trial] | None = None
    reference: Callable[[Case], Steps] | None = None  # needs no target: run by the judge
    applicable: Callable[[Case, Any], str | None] = lambda case, target: None
    # (case, target spec) -> script source; the call scenario's is the engine's (harness.engine.standalone)
    standalone: Callable[[Case, str], str] | None = None
    standalone_refusal: Callable[[Case], str | None] = never  # why this case has no standalone script

    def __post_init__(self) -> None:
        if self.trial is not None and self.reference is None:
            raise ValueError(f"scenario {self.name}: a trial needs its reference, built without the target")
