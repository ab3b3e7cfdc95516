"""Issue 22: under a no-grad context OperationFuser calls `requires_grad_(False)` on the
tensors a pass-through op hands back; a non-leaf input makes that raise.

The rules, from the bug analysis (a prediction, never an observation). On an unpatched
fuser, `_OperationFuserAutogradFunction.forward` calls `requires_grad_(False)` on every
output when the fuser runs with grad disabled (`first_op_requiring_backward` is then
the op count). It hurts only when such an output *is the caller's tensor* and that
tensor requires grad:
- a non-leaf (a computed activation or a view): PyTorch raises the RuntimeError;
- a leaf that requires grad: no error, but the caller's flag is silently cleared (what
  follows from that, a wrong gradient or a recompute wrapper's own complaint, is a
  consequence; the rule names the side effect itself).
The fuser runs with grad disabled under no_grad or inference_mode, in the first forward
of a reentrant checkpoint or Megatron's CheckpointFunction, and in the no_grad step of
recompute_pattern. With grad enabled the calls set True, a legal no-op on a non-leaf.
"""

from __future__ import annotations

from cases import deviations
from cases.axes import AXES, INPUTS_REQUIRING_GRAD, NON_LEAF_INPUTS
from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regression import Regression, Rule, Symptom

NO_GRAD_RECOMPUTES = ("checkpoint_reentrant", "megatron")


def fuser_runs_without_grad(case: Case) -> bool:
    return (
        case.grad_mode in ("no_grad", "inference_mode")
        or case.recompute in NO_GRAD_RECOMPUTES
        or case.sequence == "recompute_pattern"
    )


def _exposed(case: Case) -> bool:
    return fuser_runs_without_grad(case) and PIPELINES[case.pipeline].exposes_input


def _unaffected_reason(case: Case) -> str:
    if not fuser_runs_without_grad(case):
        return "the fuser runs with grad enabled"
    if not PIPELINES[case.pipeline].exposes_input:
        return f"{case.pipeline} hands back no input tensor unchanged"
    return f"input {case.input} does not require grad"


def _exclude(case: Case) -> str | None:
    if case.grad_form != "dense":
        return "issue 22 does not depend on the gradient's form; dense only"
    return None


REGRESSION = Regression(
    id="issue22",
    title="OperationFuser calls requires_grad_ on a pass-through non-leaf tensor under no-grad",
    upstream="NVIDIA/TransformerEngine PR #2919 (fork issue 22)",
    first_affected="2.6.0",
    first_fixed="2.16.0",
    patches=("backport",),
    rules=(
        Rule(
            name="non_leaf_input_crashes",
            applies=lambda case: _exposed(case) and case.input in NON_LEAF_INPUTS,
            symptom=Symptom(
                "RuntimeError 'you can only change requires_grad flags of leaf variables' from ops/fuser.py",
                error_type="RuntimeError",
                message=r"you can only change requires_grad flags of leaf variables",
                frame="transformer_engine/pytorch/ops/fuser.py",
            ),
            why="requires_grad_(False) on a non-leaf input raises",
        ),
        Rule(
            name="leaf_flag_cleared",
            applies=lambda case: _exposed(case) and case.input in INPUTS_REQUIRING_GRAD,
            symptom=Symptom(
                "side effect: the caller's x.requires_grad goes from True to False",
                side_effect=r"caller's x\.requires_grad: True -> False",
            ),
            why="requires_grad_(False) clears the caller's leaf flag",
        ),
    ),
    exclude=_exclude,
    presets={
        "default": {**AXES, "grad_form": ("dense",), "dtype": ("float32", "bfloat16"), "device": ("cpu",)},
        "smoke": {
            **{axis: values[:1] for axis, values in AXES.items()},
            "pipeline": ("fused_residual_rmsnorm", "extra_output_only", "rmsnorm"),
            "grad_mode": ("enabled", "no_grad"),
            "input": ("leaf", "non_leaf"),
            "recompute": ("none", "checkpoint_reentrant"),
        },
        "full": {**AXES, "grad_form": ("dense",)},
        "sweep": {
            **{axis: values[:1] for axis, values in AXES.items()},
            "pipeline": ("fused_residual_rmsnorm", "extra_output_only", "rmsnorm"),
            "grad_mode": ("enabled", "no_grad"),
            "input": ("leaf", "leaf_requires_grad", "non_leaf"),
        },
    },
    default_targets=("te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"),
    deviations=(deviations.PASS_THROUGH_REQUIRES_GRAD, deviations.MARKS_CALLER_INPUT),
    unaffected_reason=_unaffected_reason,
)
