"""The issue-22 trigger oracle: a prediction from the bug analysis, never an observation.

Rule. On an unpatched fuser, `_OperationFuserAutogradFunction.forward` calls
`requires_grad_(False)` on every output when the fuser runs with grad disabled
(`first_op_requiring_backward` is then the op count). It hurts only when such an
output *is the caller's tensor* and that tensor requires grad:
- a non-leaf (a computed activation or a view): PyTorch raises the RuntimeError;
- a leaf that requires grad: no error, but the caller's flag is silently cleared.
So a case is affected when all three hold:
1. the fuser runs with grad disabled: grad_mode no_grad or inference_mode, a
   recompute whose first forward runs under no_grad (reentrant checkpoint,
   Megatron's CheckpointFunction), or the no_grad step of recompute_pattern;
2. the pipeline exposes its input (MakeExtraOutput's extra output, Identity's output);
3. the input requires grad (leaf_requires_grad, non_leaf, view).
With grad enabled the calls set True, which is a legal no-op on a non-leaf.
"""

from __future__ import annotations

from dataclasses import dataclass

from cases.matrix import Case
from cases.pipelines import PIPELINES

NO_GRAD_RECOMPUTES = ("checkpoint_reentrant", "megatron")
INPUTS_REQUIRING_GRAD = ("leaf_requires_grad", "non_leaf", "view")
NON_LEAF_INPUTS = ("non_leaf", "view")


@dataclass(frozen=True)
class Prediction:
    expected: str  # "affected" or "unaffected"
    effect: str | None  # "crash" or "side_effect" when affected
    reason: str


def fuser_runs_without_grad(case: Case) -> bool:
    return (
        case.grad_mode in ("no_grad", "inference_mode")
        or case.recompute in NO_GRAD_RECOMPUTES
        or case.sequence == "recompute_pattern"
    )


def predict(case: Case) -> Prediction:
    if not fuser_runs_without_grad(case):
        return Prediction("unaffected", None, "the fuser runs with grad enabled")
    if not PIPELINES[case.pipeline].exposes_input:
        return Prediction("unaffected", None, f"{case.pipeline} hands back no input tensor unchanged")
    if case.input not in INPUTS_REQUIRING_GRAD:
        return Prediction("unaffected", None, f"input {case.input} does not require grad")
    if case.input in NON_LEAF_INPUTS:
        return Prediction("affected", "crash", "requires_grad_(False) on a non-leaf input raises")
    return Prediction("affected", "side_effect", "requires_grad_(False) clears the caller's leaf flag")


def verdict(expected: str, outcome: str, target_has_fix: bool) -> str:
    """Compare the observed outcome with the prediction, for one (case, target)."""
    if outcome in ("skipped", "harness_error"):
        return outcome
    failed = outcome != "pass"
    if expected == "affected":
        if target_has_fix:
            return "regression" if failed else "fixed"
        return "reproduced" if failed else "unexpected_pass"
    return "regression" if failed else "unaffected"
