"""What a regression declares, in the style of PyTorch's OpInfo/XFailRule: the cases it
is tested on, the symptom each rule predicts, the fixes, and the releases it affects.

A regression module under `cases/regressions/` defines one `REGRESSION`. The engine
only observes; `Symptom.matches` and `predict` compare an observation with a rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cases.case import Case


@dataclass(frozen=True)
class Symptom:
    """Exactly what a rule predicts. An exception (type, message pattern, innermost TE
    frame file), or a named side effect on the caller's tensors, or a named wrong
    gradient. Every field given must match."""

    description: str
    error_type: str | None = None  # the exception's class name
    message: str | None = None  # regex searched in the exception's message
    frame: str | None = None  # the innermost TE frame's file, e.g. "pytorch/ops/fuser.py"
    side_effect: str | None = None  # regex searched in the recorded side effects
    wrong_gradient: str | None = None  # regex searched in the gradient check's failures
    # "file suffix:function" of frames the observed traceback must hold, in this order (others may
    # come between); read from the record's `frames`, which Megatron client cases store.
    frames: tuple[str, ...] = ()

    def matches(self, observation: Mapping[str, Any]) -> bool:
        if self.frames and not _frames_in_order(self.frames, observation.get("frames") or []):
            return False
        error = observation.get("error")
        if self.error_type or self.message or self.frame:
            if not error or (self.error_type and error.get("type") != self.error_type):
                return False
            if self.message and not re.search(self.message, error.get("message") or ""):
                return False
            location = (error.get("location") or "").rsplit(":", 1)[0]
            if self.frame and not location.endswith(self.frame):
                return False
        if self.side_effect and not any(re.search(self.side_effect, s) for s in observation.get("side_effects") or []):
            return False
        gradients = (observation.get("details") or {}).get("gradients") or []
        return not (self.wrong_gradient and not any(re.search(self.wrong_gradient, g) for g in gradients))


def _frames_in_order(expected: tuple[str, ...], observed: list[Mapping[str, Any]]) -> bool:
    remaining = iter(observed)
    for want in expected:
        file, function = want.rsplit(":", 1)
        if not any(f.get("file", "").endswith(file) and f.get("function") == function for f in remaining):
            return False
    return True


@dataclass(frozen=True)
class Rule:
    """An expected failure: the cases it applies to and the one symptom it predicts."""

    name: str
    applies: Callable[[Case], bool]
    symptom: Symptom
    why: str


@dataclass(frozen=True)
class Deviation:
    """A known difference from the reference that is not this regression, explained.
    A failure of `check` whose message matches is recorded, not failed, on the cases
    `applies` selects."""

    check: str
    message: str  # regex on the failure text
    applies: Callable[[Case], bool]
    why: str


@dataclass(frozen=True)
class Prediction:
    expected: str  # "affected" or "unaffected"
    rule: Rule | None
    reason: str


@dataclass(frozen=True)
class Regression:
    id: str
    title: str
    upstream: str  # the upstream issue or PR
    first_affected: str | None  # the first release with the bug, as far as known (None: before 2.1.0)
    first_fixed: str | None
    patches: tuple[str, ...]  # names in patches/ that fix it
    rules: tuple[Rule, ...]
    exclude: Callable[[Case], str | None]  # why a combination is not a valid case, or None
    presets: dict[str, dict[str, tuple[str, ...]]]  # "default" and others: the axis values
    default_targets: tuple[str, ...]
    deviations: tuple[Deviation, ...] = ()
    unaffected_reason: Callable[[Case], str] = field(default=lambda case: "no rule applies")

    def predict(self, case: Case) -> Prediction:
        for rule in self.rules:
            if rule.applies(case):
                return Prediction("affected", rule, rule.why)
        return Prediction("unaffected", None, self.unaffected_reason(case))
