"""Saved tensors unpacked twice (NVIDIA/TransformerEngine PR #1807, "Fix saved_tensors
access in Ops Fuser").

Up to 2.4.0 the fuser's backward reads `func_ctx.saved_tensors` once per basic op, and
every read runs the saved-tensor unpack hooks again. Non-reentrant
`torch.utils.checkpoint` allows one unpack per saved tensor, so a fuser group of two or
more basic ops raises CheckpointError from fuser.py's backward, as soon as a backward
runs through it. A single-op group reads once and is unaffected; so are reentrant and
Megatron checkpointing, which install no saved-tensor hooks.
"""

from __future__ import annotations

from cases import deviations
from cases.axes import INPUTS_REQUIRING_GRAD, narrowed
from cases.case import Case
from cases.pipelines import PIPELINES
from cases.regression import Regression, Rule, Symptom
from cases.releases import Releases


def _backward_runs(case: Case) -> bool:
    return case.input in INPUTS_REQUIRING_GRAD or case.params == "trainable"


def _affected(case: Case) -> bool:
    return (case.recompute == "checkpoint_non_reentrant" and max(PIPELINES[case.pipeline].ops_per_group) >= 2
            and _backward_runs(case))


def _unaffected_reason(case: Case) -> str:
    if case.recompute != "checkpoint_non_reentrant":
        return f"recompute {case.recompute} installs no saved-tensor hooks that count unpacks"
    if max(PIPELINES[case.pipeline].ops_per_group) < 2:
        return f"{case.pipeline} has one basic op per fuser group: saved tensors are read once"
    return "no backward runs: nothing requires grad"


REGRESSION = Regression(
    id="saved_tensors_twice",
    title="Fuser backward unpacks saved tensors once per basic op; non-reentrant checkpoint refuses",
    upstream="NVIDIA/TransformerEngine PR #1807",
    affected=Releases("<2.5.0"),  # as far back as the harness loads (2.1.0)
    patches=("saved_tensors_once",),
    rules=(
        Rule(
            name="second_unpack_refused",
            applies=_affected,
            symptom=Symptom(
                "CheckpointError 'already unpacked once' from ops/fuser.py's backward",
                error_type="CheckpointError",
                message=r"already unpacked once",
                frame="transformer_engine/pytorch/ops/fuser.py",
            ),
            why="the backward reads func_ctx.saved_tensors once per basic op; the checkpoint allows one unpack",
        ),
    ),
    exclude=lambda case: None,
    presets={
        "default": narrowed(
            pipeline=("fused_residual_rmsnorm", "residual_layernorm", "linear_bias_extra", "residual_mlp",
                         "rmsnorm", "extra_output_only"),
            input=("leaf", "leaf_requires_grad", "non_leaf"),
            params=("trainable", "frozen"),
            recompute=("none", "checkpoint_reentrant", "checkpoint_non_reentrant", "megatron"),
            dtype=("float32", "bfloat16"),
        ),
        "sweep": narrowed(
            pipeline=("fused_residual_rmsnorm", "rmsnorm"),
            input=("leaf", "non_leaf"),
            recompute=("none", "checkpoint_non_reentrant"),
        ),
    },
    default_targets=("te-2.4.0", "te-2.4.0+saved_tensors_once", "te-2.5.0"),
    deviations=(deviations.PASS_THROUGH_REQUIRES_GRAD, deviations.MARKS_CALLER_INPUT),
    unaffected_reason=_unaffected_reason,
)
