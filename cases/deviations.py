"""Known deviations of TE's fuser from the unfused reference that are not the regression
under test, as targeted rules (PyTorch's XFailRule style). A regression lists the ones
its cases meet; a matching failure is recorded under `known_deviations` instead of
failing the case, and anything else still fails.
"""

from __future__ import annotations

import re

from cases.axes import LEAVES_WITHOUT_GRAD
from cases.case import Case
from cases.regression import Deviation
from cases.releases import Releases


def _fuser_applies_autograd(case: Case) -> bool:
    return case.grad_mode in ("enabled", "enable_grad_inside_no_grad") and case.params == "trainable"


PASS_THROUGH_REQUIRES_GRAD = Deviation(
    check="output_requires_grad",
    message=r"requires_grad=True, reference False",
    applies=_fuser_applies_autograd,
    why="every release: outputs of the fuser's autograd.Function all require grad once any fuser input "
    "(here a trainable parameter) does, even a pass-through extra output",
)

MARKS_CALLER_INPUT = Deviation(
    check="caller_tensors",
    message=r"caller's x\.requires_grad: False -> True",
    applies=lambda case: case.input in LEAVES_WITHOUT_GRAD and _fuser_applies_autograd(case),
    why="releases up to 2.6.0.post1: the fuser's forward calls requires_grad_() on the caller's own input "
    "whenever a parameter needs a gradient (removed by NVIDIA/TransformerEngine PR #1900; seen here up to 2.6.0.post1, not from 2.7.0)",
    releases=Releases("<2.7.0"),
)


def split_known(case: Case, deviations: tuple[Deviation, ...], failed: dict[str, list[str]],
                version: str) -> tuple[dict[str, list[str]], list[str]]:
    """Separate the failures a deviation explains (on the target's `version`) from the rest."""
    remaining: dict[str, list[str]] = {}
    known: list[str] = []
    for check, messages in failed.items():
        for message in messages:
            rule = next((d for d in deviations if d.check == check and re.search(d.message, message)
                         and d.applies(case) and d.holds_on(version)), None)
            if rule:
                known.append(f"{message} [{rule.why}]")
            else:
                remaining.setdefault(check, []).append(message)
    return remaining, known
