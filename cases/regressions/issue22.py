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
  consequence; the rule names the side effect itself). Up to 2.6.0.post1 the fuser's next
  forward with grad sets the flag back after building its graph: no side effect shows, and
  x gets no gradient (the rule's second symptom).
The fuser runs with grad disabled under no_grad or inference_mode, in the first forward
of a reentrant checkpoint or Megatron's CheckpointFunction, and in the no_grad step of
recompute_pattern. With grad enabled the calls set True, a legal no-op on a non-leaf.

Through Megatron (cases/clients.py): TEFusedResidualRMSNorm is Sequential(MakeExtraOutput,
RMSNorm), so it hands its input back. `megatron_norm` gets the caller's tensor as the ops
pipelines do. `megatron_block`'s full recompute runs each recomputed layer inside
CheckpointFunction.forward under torch.no_grad(), and layer 0's input_layernorm gets the
block's input, with two differences from the caller's tensor:
- TransformerBlock.forward replaces a view by make_viewless_tensor's copy. With grad enabled
  (the full recompute calls it before checkpointing) the copy is a non-leaf; under no grad it
  is a fresh leaf of Megatron's own, so the caller's tensor is never touched;
- with method uniform every layer is its own CheckpointFunction: layer 1's input is layer 0's
  checkpoint output, a non-leaf that requires grad whenever the caller's input does (always,
  for the inputs a full recompute takes).
"""

from __future__ import annotations

from typing import Any

from cases import deviations
from cases.axes import AXES as CALL_AXES
from cases.axes import INPUTS_REQUIRING_GRAD, NON_LEAF_INPUTS, narrowed
from cases.case import Case
from cases.clients import BLOCK_RECOMPUTES
from cases.pipelines import PIPELINES
from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases
from harness.megatron.frames import REPORT_FRAMES

# Recomputes whose first forward runs the fuser under torch.no_grad(): torch's reentrant
# checkpoint, Megatron's CheckpointFunction, and Megatron's full recompute of a block (which
# runs the same CheckpointFunction around its layers).
NO_GRAD_RECOMPUTES = ("checkpoint_reentrant", "megatron", *BLOCK_RECOMPUTES)
# The report's traceback, as "file:function" (harness/megatron/frames.py holds it with its lines).
REPORT_PATH = tuple(f"{file}:{function}" for file, function, _line in REPORT_FRAMES)
TE_NORM_PATH = REPORT_PATH[2:]  # extensions/transformer_engine.py forward -> sequential -> fuser


def fuser_runs_without_grad(case: Case) -> bool:
    return (
        case.grad_mode in ("no_grad", "inference_mode")
        or case.recompute in NO_GRAD_RECOMPUTES
        or case.sequence == "recompute_pattern"
    )


def exposed_to_fuser(case: Case) -> str | None:
    """What a pass-through op hands back to a fuser running without grad, that requires grad:
    "non_leaf" (requires_grad_ raises), "caller_leaf" (the caller's own leaf: its flag is
    cleared), or None (grad is enabled, nothing is handed back, or it needs no grad)."""
    if not fuser_runs_without_grad(case) or not PIPELINES[case.pipeline].exposes_input:
        return None
    if case.client == "megatron_block":
        if case.recompute == "full_uniform":
            return "non_leaf"  # layer 1 gets layer 0's checkpoint output
        if case.input == "view":  # make_viewless_tensor's copy
            return "non_leaf" if case.recompute in BLOCK_RECOMPUTES else None
    if case.input in NON_LEAF_INPUTS:
        return "non_leaf"
    if case.input in INPUTS_REQUIRING_GRAD:
        return "caller_leaf"
    return None


def _unaffected_reason(case: Case) -> str:
    if not fuser_runs_without_grad(case):
        return "the fuser runs with grad enabled"
    if not PIPELINES[case.pipeline].exposes_input:
        return f"{case.pipeline} hands back no input tensor unchanged"
    if case.client == "megatron_block" and case.input == "view":
        return "TransformerBlock replaces a view by make_viewless_tensor's copy, under no grad a leaf of its own"
    return f"input {case.input} does not require grad"


_CRASH: dict[str, Any] = {"error_type": "RuntimeError", "message": r"you can only change requires_grad flags of leaf variables",
          "frame": "transformer_engine/pytorch/ops/fuser.py"}
_CRASH_TEXT = "RuntimeError 'you can only change requires_grad flags of leaf variables' from ops/fuser.py"


def _crashes(case: Case) -> bool:
    return exposed_to_fuser(case) == "non_leaf"


def _exclude(case: Case) -> str | None:
    if case.grad_form != "dense":
        return "issue 22 does not depend on the gradient's form; dense only"
    return None


# The pipelines issue 22 is tested on, named here so that a pipeline added to the shared
# library for another regression never enters this matrix (or its reviewed report).
AXES = {**CALL_AXES, "pipeline": (
    "fused_residual_rmsnorm", "fused_residual_rmsnorm_inplace", "residual_layernorm", "add_residual_rmsnorm",
    "add_residual_rmsnorm_inplace", "extra_output_only", "identity", "reshape", "rmsnorm", "linear_bias_extra",
    "split_fuser", "residual_mlp")}

REGRESSION = Regression(
    id="issue22",
    title="OperationFuser calls requires_grad_ on a pass-through non-leaf tensor under no-grad",
    upstream="NVIDIA/TransformerEngine PR #2919 (fork issue 22)",
    affected=Releases(">=2.6.0,<2.16.0"),
    patches=("backport",),
    rules=(
        Rule(
            name="megatron_block_crashes_as_reported",
            applies=lambda case: case.client == "megatron_block" and case.recompute in BLOCK_RECOMPUTES
            and _crashes(case),
            symptom=Symptom(
                f"{_CRASH_TEXT}, through the report's frames: {' -> '.join(REPORT_PATH)}",
                **_CRASH, frames=REPORT_PATH,
            ),
            why="the bug report's crash: Megatron's full recompute runs the layer in CheckpointFunction.forward "
            "under no_grad; input_layernorm (TEFusedResidualRMSNorm) hands the non-leaf hidden states back and "
            "the fuser calls requires_grad_ on them",
        ),
        Rule(
            name="megatron_crashes_in_te_fused_norm",
            applies=lambda case: case.client != "ops" and _crashes(case),
            symptom=Symptom(
                f"{_CRASH_TEXT}, through Megatron's TEFusedResidualRMSNorm: {' -> '.join(TE_NORM_PATH)}",
                **_CRASH, frames=TE_NORM_PATH,
            ),
            why="Megatron's TEFusedResidualRMSNorm is Sequential(MakeExtraOutput, RMSNorm): it hands a non-leaf "
            "input back to a fuser running without grad",
        ),
        Rule(
            name="non_leaf_input_crashes",
            applies=_crashes,
            symptom=Symptom(_CRASH_TEXT, **_CRASH),
            why="requires_grad_(False) on a non-leaf input raises",
        ),
        Rule(
            name="leaf_flag_cleared",
            applies=lambda case: exposed_to_fuser(case) == "caller_leaf",
            symptom=Symptom(
                "side effect: the caller's x.requires_grad goes from True to False",
                side_effect=r"caller's x\.requires_grad: True -> False",
            ),
            why="requires_grad_(False) clears the caller's leaf flag",
            also_seen_as=(Symptom(
                "x gets no gradient: on a release whose fuser marks the caller's input again in its next forward "
                "(up to 2.6.0.post1), the flag is set back only after that forward built its graph without x",
                wrong_gradient=r"grad of x: missing",
            ),),
        ),
    ),
    exclude=_exclude,
    presets={
        "default": {**AXES, "grad_form": ("dense",), "dtype": ("float32", "bfloat16"), "device": ("cpu",)},
        "smoke": narrowed(
            AXES,
            pipeline=("fused_residual_rmsnorm", "extra_output_only", "rmsnorm"),
            grad_mode=("enabled", "no_grad"),
            input=("leaf", "non_leaf"),
            recompute=("none", "checkpoint_reentrant"),
        ),
        "full": {**AXES, "grad_form": ("dense",)},
        "sweep": narrowed(
            AXES,
            pipeline=("fused_residual_rmsnorm", "extra_output_only", "rmsnorm"),
            grad_mode=("enabled", "no_grad"),
            input=("leaf", "leaf_requires_grad", "non_leaf"),
        ),
    },
    default_targets=("te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2"),
    deviations=(deviations.PASS_THROUGH_REQUIRES_GRAD, deviations.MARKS_CALLER_INPUT),
    unaffected_reason=_unaffected_reason,
    own_axes=AXES,
)
