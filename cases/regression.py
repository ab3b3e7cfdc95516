"""What a regression declares, in the style of PyTorch's OpInfo/XFailRule: its scenario
(the trigger), the axes it varies, the symptom each rule predicts, what a fixed target may
do instead of behaving like the reference, the fixes, the releases it affects (specifier
sets) and what a loaded target must offer for its cases to apply.

A regression module under `cases/regressions/` defines one `REGRESSION`. The engine
only observes; `Symptom.matches` and `predict` compare an observation with a rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import InvalidVersion, Version

from cases.case import Case, register_axes
from cases.releases import Releases
from cases.scenario import Scenario
from cases.scenarios import CALL


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
    observed: str | None = None  # regex searched in the scenario's own observations that differ from the reference's
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
        details = observation.get("details") or {}
        if self.observed and not any(re.search(self.observed, o) for o in details.get("observations") or []):
            return False
        gradients = details.get("gradients") or []
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
    """An expected failure: the cases it applies to and the one symptom it predicts. On a
    target expected to be fixed these cases pass, or show one of `fixed_behaviours` (a
    fix that is a clear refusal, e.g. a named exception and message); any other failure
    there is still a regression."""

    name: str
    applies: Callable[[Case], bool]
    symptom: Symptom
    why: str
    fixed_behaviours: tuple[Symptom, ...] = ()
    # The same bug where another behaviour of the release hides the symptom's first sign
    # (still this rule's prediction, each with its own description).
    also_seen_as: tuple[Symptom, ...] = ()
    # The symptom on some releases, where the bug shows otherwise there (a message reworded, a
    # file moved): the first range that holds the target's version replaces `symptom`.
    symptom_by_release: tuple[tuple[Releases, Symptom], ...] = ()

    def on_release(self, version: str | None) -> Rule:
        """This rule with the one symptom it predicts on `version` (its own where no range holds
        it); unchanged where the version is no release number (any of its forms may show)."""
        if not version or not self.symptom_by_release:
            return self
        try:
            parsed = Version(version)
        except InvalidVersion:
            return self
        found = next((s for releases, s in self.symptom_by_release if releases.contains(parsed)), self.symptom)
        return replace(self, symptom=found, symptom_by_release=())

    @property
    def symptoms(self) -> tuple[Symptom, ...]:
        """Every form the bug takes; one not resolved for a release (`on_release`) also holds each release's."""
        return (self.symptom, *self.also_seen_as, *(s for _, s in self.symptom_by_release))

    def observed(self, observation: Mapping[str, Any]) -> Symptom | None:
        """The predicted symptom the observation shows, or None."""
        return next((s for s in self.symptoms if s.matches(observation)), None)


@dataclass(frozen=True)
class Deviation:
    """A known difference from the reference that is not this regression, explained.
    A failure of `check` whose message matches is recorded, not failed, on the cases
    `applies` selects."""

    check: str
    message: str  # regex on the failure text
    applies: Callable[[Case], bool]
    why: str
    # The releases where it was seen; None: every release. A tree whose version is no release
    # number is outside any range: there the failure stays a failure.
    releases: Releases | None = None

    def holds_on(self, version: str) -> bool:
        if self.releases is None:
            return True
        try:
            return self.releases.contains(Version(version))
        except InvalidVersion:
            return False


@dataclass(frozen=True)
class Prediction:
    expected: str  # "affected" or "unaffected"
    rule: Rule | None
    reason: str

    @property
    def fixed_behaviours(self) -> tuple[Symptom, ...]:
        return self.rule.fixed_behaviours if self.rule else ()


@dataclass(frozen=True)
class Regression:
    id: str
    title: str
    upstream: str  # the upstream issue or PR
    affected: Releases  # the releases with the bug, as specifier sets
    patches: tuple[str, ...]  # names in patches/ that fix it
    rules: tuple[Rule, ...]
    exclude: Callable[[Case], str | None]  # why a combination is not a valid case, or None
    presets: dict[str, dict[str, tuple[str, ...]]]  # "default" and others: the axis values
    default_targets: tuple[str, ...]
    deviations: tuple[Deviation, ...] = ()
    unaffected_reason: Callable[[Case], str] = field(default=lambda case: "no rule applies")
    scenario: Scenario = CALL  # the trigger; the call scenario unless the regression brings its own
    # The axes it varies, in case-id order, each with the values it knows (a subset of the
    # scenario's); None: all of the scenario's. An axis not here is not in its case ids.
    own_axes: dict[str, tuple[str, ...]] | None = None
    # Why a loaded target cannot take the regression's cases (an API or symbol it lacks), or None.
    applicable: Callable[[Any], str | None] = lambda target: None

    def __post_init__(self) -> None:
        unknown = {a: v for a, v in self.axes.items()
                   if a not in self.scenario.axes or set(v) - set(self.scenario.axes[a])}
        if unknown:
            raise ValueError(f"regression {self.id}: axes {unknown} are not the {self.scenario.name} scenario's")
        for name, preset in self.presets.items():
            if list(preset) != list(self.axes):
                raise ValueError(f"regression {self.id}: preset {name} names axes {list(preset)}, "
                                 f"its axes are {list(self.axes)}")
        register_axes(self.id, tuple(self.axes))

    @property
    def axes(self) -> dict[str, tuple[str, ...]]:
        return self.own_axes if self.own_axes is not None else self.scenario.axes

    @property
    def first_affected(self) -> str | None:
        bound = self.affected.lower_bound() if self.rules else None  # no rule: no bug to have been affected by
        return str(bound) if bound else None

    @property
    def first_fixed(self) -> str | None:
        bound = self.affected.first_fixed() if self.rules else None
        return str(bound) if bound else None

    def predict(self, case: Case, version: str | None = None) -> Prediction:
        """The rule that applies to the case, with the symptom it predicts on `version` (a target's)."""
        for rule in self.rules:
            if rule.applies(case):
                return Prediction("affected", rule.on_release(version), rule.why)
        return Prediction("unaffected", None, self.unaffected_reason(case))
