"""Known, explained deviations of TE's fuser from the unfused reference that are not
issue 22, as targeted rules (in the style of PyTorch's XFailRule): each names the check
and the message it expects, and the cases it applies to. A matching failure is recorded
under `known_deviations` instead of failing the case; anything else still fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cases.matrix import Case


@dataclass(frozen=True)
class DeviationRule:
    check: str
    message: str  # regex on the failure text
    applies: str  # why, shown in reports
    when_fuser_applies_autograd: bool = True


RULES = (
    DeviationRule(
        check="output_requires_grad",
        message=r"requires_grad=True, reference False",
        applies="every release: outputs of the fuser's autograd.Function all require grad once any "
        "fuser input (here a trainable parameter) does, even a pass-through extra output",
    ),
)


def _fuser_applies_autograd(case: Case) -> bool:
    return case.grad_mode in ("enabled", "enable_grad_inside_no_grad") and case.params == "trainable"


def split_known(case: Case, failed: dict[str, list[str]]) -> tuple[dict[str, list[str]], list[str]]:
    """Separate failures explained by a rule from the rest."""
    remaining: dict[str, list[str]] = {}
    known: list[str] = []
    for check, messages in failed.items():
        for message in messages:
            rule = next((r for r in RULES if r.check == check and re.search(r.message, message)
                         and (not r.when_fuser_applies_autograd or _fuser_applies_autograd(case))), None)
            if rule:
                known.append(f"{message} [{rule.applies}]")
            else:
                remaining.setdefault(check, []).append(message)
    return remaining, known
