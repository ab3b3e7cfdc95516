"""In-place gradient accumulation in MakeExtraOutput (NVIDIA/TransformerEngine PR #1983,
"Add in_place kwarg to extra tensor ops").

Up to 2.6.0.post1, MakeExtraOutput's backward adds the main output's gradient into the
extra output's gradient in place (`grad_input = grad_extra; grad_input += grad_output`).
Autograd may hand over that gradient as an expanded, stride-0 tensor: the gradient of a
plain `.sum()` of the extra output. Writing into it raises from make_extra_output.py.
Dense gradients (a weighted loss) hide the bug.
"""

from __future__ import annotations

from cases import deviations
from cases.axes import INPUTS_REQUIRING_GRAD, narrowed
from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases


def _backward_reaches_extra_output(case: Case) -> bool:
    # MakeExtraOutput's backward runs when a gradient flows back past it. On the affected
    # releases (up to 2.6) the fuser also marks the caller's input as requiring grad as
    # soon as a parameter does (the behaviour PR #1900 removed), so trainable parameters
    # are enough, whatever the input.
    pipeline = PIPELINES[case.pipeline]
    return case.input in INPUTS_REQUIRING_GRAD or (case.params == "trainable" and pipeline.has_params)


def _separate_extra_gradient(case: Case) -> bool:
    # When MakeExtraOutput is the last op its extra output *is* the main output: autograd
    # sums both gradients into one dense gradient, and nothing expanded reaches the op.
    pipeline = PIPELINES[case.pipeline]
    return pipeline.makes_extra_output and not pipeline.extra_output_is_main_output


def _affected(case: Case) -> bool:
    return case.grad_form == "expanded" and _separate_extra_gradient(case) and _backward_reaches_extra_output(case)


def _unaffected_reason(case: Case) -> str:
    if case.grad_form != "expanded":
        return "a dense upstream gradient can be written into"
    if not PIPELINES[case.pipeline].makes_extra_output:
        return f"{case.pipeline} has no MakeExtraOutput"
    if not _separate_extra_gradient(case):
        return f"in {case.pipeline} the extra output is the main output: its gradient arrives summed and dense"
    return "no gradient flows back through MakeExtraOutput"


def _exclude(case: Case) -> str | None:
    if case.grad_mode != "enabled" or case.sequence != "single":
        return "the bug is in the backward: only a training step with grad enabled reaches it"
    return None


REGRESSION = Regression(
    id="extra_output_inplace_grad",
    title="MakeExtraOutput's backward adds in place into an expanded gradient",
    upstream="NVIDIA/TransformerEngine PR #1983",
    affected=Releases("<2.7.0"),  # MakeExtraOutput behaves so in every release the harness loads (from 2.1.0)
    patches=("extra_output_out_of_place",),
    rules=(
        Rule(
            name="expanded_grad_written",
            applies=_affected,
            symptom=Symptom(
                "RuntimeError 'more than one element of the written-to tensor refers to a single memory location' "
                "from ops/basic/make_extra_output.py",
                error_type="RuntimeError",
                message=r"more than one element of the written-to tensor refers to a single memory location",
                frame="transformer_engine/pytorch/ops/basic/make_extra_output.py",
            ),
            why="grad_input += grad_output writes into the stride-0 gradient of a .sum()",
        ),
    ),
    exclude=_exclude,
    presets={
        "default": narrowed(
            pipeline=("fused_residual_rmsnorm", "residual_layernorm", "extra_output_only", "linear_bias_extra",
                         "residual_mlp", "rmsnorm"),
            input=("leaf", "leaf_requires_grad", "non_leaf"),
            params=("trainable", "frozen"),
            recompute=("none", "checkpoint_non_reentrant"),
            grad_form=("dense", "expanded"),
            dtype=("float32", "bfloat16"),
        ),
        "sweep": narrowed(
            pipeline=("fused_residual_rmsnorm", "rmsnorm"),
            input=("leaf", "non_leaf"),
            grad_form=("dense", "expanded"),
        ),
    },
    default_targets=("te-2.6.0.post1", "te-2.6.0.post1+extra_output_out_of_place", "te-2.7.0"),
    deviations=(deviations.PASS_THROUGH_REQUIRES_GRAD, deviations.MARKS_CALLER_INPUT),
    unaffected_reason=_unaffected_reason,
)
