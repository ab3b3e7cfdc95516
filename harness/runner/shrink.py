"""Shrinking a failing case to a minimal one with the same signature (harness.runner.signature):
fewer ops, then the simplest value of each axis. Greedy delta debugging: each round proposes every
one-step simplification of the current case, all of which run together (one `repro run`), and
the first that still fails the same way becomes the current case; it stops when none does.

The candidates are pure (`candidates`); running them is the caller's (`shrink` takes a runner),
so the judge stays outside the target's process as in any run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cases.case import Case
from cases.matrix import exclusion
from cases.ops.generated import keys_of, name_of, valid
from harness.runner.signature import Signature

# Each axis's values from the simplest: the plainest grad mode, no wrapper, a dense gradient, float32.
SIMPLEST_FIRST: dict[str, tuple[str, ...]] = {
    "recompute": ("none", "checkpoint_non_reentrant", "checkpoint_reentrant", "megatron"),
    "sequence": ("single", "recompute_pattern"),
    "grad_mode": ("enabled", "no_grad", "enable_grad_inside_no_grad", "inference_mode"),
    "input": ("leaf", "leaf_requires_grad", "detached", "non_leaf", "view"),
    "params": ("trainable", "frozen"),
    "grad_form": ("dense", "expanded"),
    "dtype": ("float32", "bfloat16", "float16"),
}
Runner = Callable[[list[Case]], dict[str, Signature | None]]  # case id -> its signature on the target


@dataclass
class Shrunk:
    start: Case
    minimal: Case
    steps: list[str] = field(default_factory=list)  # what each accepted step changed
    tried: int = 0


def _fewer_ops(case: Case) -> list[Case]:
    keys = keys_of(case.get("pipeline") or "")
    if not keys or len(keys) < 2:
        return []
    shorter = [keys[:i] + keys[i + 1:] for i in range(len(keys))]
    return [Case(case.regression, **{**case.axes(), "pipeline": name_of(k)}) for k in shorter if valid(k)]


def _simpler_axes(case: Case) -> list[Case]:
    found = []
    for axis, order in SIMPLEST_FIRST.items():
        value = case.get(axis)
        if value is None or value not in order:
            continue
        for simpler in order[:order.index(value)]:
            found.append(Case(case.regression, **{**case.axes(), axis: simpler}))
    return found


def candidates(case: Case) -> list[Case]:
    """Every one-step simplification of `case` that is a valid case of its regression, fewest ops first."""
    return [c for c in dict.fromkeys([*_fewer_ops(case), *_simpler_axes(case)]) if exclusion(c) is None]


def shrink(case: Case, wanted: Signature, run: Runner, max_rounds: int = 30) -> Shrunk:
    """The smallest case reached from `case` that still shows `wanted`."""
    result = Shrunk(case, case)
    for _ in range(max_rounds):
        proposals = candidates(result.minimal)
        if not proposals:
            break
        seen = run(proposals)
        result.tried += len(proposals)
        kept = next((c for c in proposals if seen.get(c.case_id) == wanted), None)
        if kept is None:
            break
        result.steps.append(_change(result.minimal, kept))
        result.minimal = kept
    return result


def _change(before: Case, after: Case) -> str:
    return ", ".join(f"{axis}: {value} -> {after.get(axis)}" for axis, value in before.axes().items()
                     if after.get(axis) != value)
